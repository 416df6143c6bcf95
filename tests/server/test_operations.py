"""What operators do to whole structures (operations.py): fail a pair for a drill,
alter its current size, copy it to a new instance (rebuild), recover it (in a
group, up to the seals' cuts), and rebuild every structure at start.

Real rooms on a temporary data directory (registry, definitions in the
repository, clients, waiters, data sets, journal, checkpoints); the runtime is
bound to the test's nursery with a settle step that only counts its calls (the
dispatcher's, outside this module).
"""

import functools
from unittest.mock import ANY

import pytest
import structlog

from cqsd.config import loads
from cqsd.engine import CQSError, QueueType, Reason
from cqsd.engine.entry import ELEMENT
from cqsd.server.checkpoints import Checkpoints
from cqsd.server.clients import Clients
from cqsd.server.definitions import Definitions
from cqsd.server.journal import Journal
from cqsd.server.limits import Limits
from cqsd.server.liveconfig import LiveConfig
from cqsd.server.operations import Operations
from cqsd.server.registry import Registry
from cqsd.server.runtime import Runtime
from cqsd.server.smds.datasets import DataSets
from cqsd.server.waiters import ReadWaiters, Waiter
from cqsd.srds import slots
from cqsd.storage import repository
from cqsd.storage.datadir import DataDir

SEGMENT = 1024 * 1024
KiB = 1024
CONFIG = """
[daemon]
data_dir = "{data}"
checkpoint_interval = 0
checkpoint_log_volume = 0
[[structure]]
name = "MSGQ01"
size = "1MiB"
initsize = "512KiB"
overflow = "MSGQ01OV"
[[structure]]
name = "MSGQ01OV"
size = "1MiB"
"""
GROUP = '[group]\nname = "CQSG1"\nnode = "NODE1"\netcd = ["http://127.0.0.1:2379"]\n'
KEY = (QueueType.TRAN, "Q")


class Rooms:
    """The rooms an ``Operations`` is made from, as the daemon makes them."""

    def __init__(self, tmp_path, nursery, opened, *, group=False):
        config = loads(CONFIG.format(data=tmp_path / "data") + (GROUP if group else ""))
        self.config = live = LiveConfig(config)
        self.datadir = opened.close_after(
            DataDir(config.daemon.data_dir, "NODE1" if group else None))
        self.datadir.open()
        self.registry = Registry(live, Definitions(config, self.datadir.repository))
        self.registry.open()
        limits = Limits(config.daemon.max_message)
        self.settled = 0
        self.runtime = Runtime()
        self.clients = Clients(live, self.registry, self.runtime)
        self.waiters = ReadWaiters(limits.reply_bytes)
        datasets = DataSets(live, self.datadir.root, self.datadir.repository, self.registry,
                            limits, self.runtime)
        self.journal = opened.close_after(Journal(self.datadir.logstream, SEGMENT, datasets))
        self.runtime.bind(nursery, self._settle, self.journal)
        checkpoints = Checkpoints(live, self.datadir, self.journal, self.registry.physical,
                                  self.runtime)
        self.operations = Operations(live, self.datadir, self.registry, self.clients,
                                     self.journal, checkpoints, self.waiters, datasets,
                                     self.runtime)

    def _settle(self):
        self.settled += 1
        return 0

    @property
    def pair(self):
        return self.registry.pairs["MSGQ01"]

    def fill(self, count, size=30 * KiB):
        """Put ``count`` messages of ``size`` bytes on queue Q; the first is read by A."""
        for _ in range(count):
            self.pair.put(*KEY, b"x" * size)
        self.pair.read("A", *KEY)


@pytest.fixture
def make(tmp_path, nursery, opened):
    """Make the rooms (alone, or a node of a group); closed after the test."""
    return functools.partial(Rooms, tmp_path, nursery, opened)


def contents(pair):
    """Every message of a pair as (id, structure, queue, where, owner, length)."""
    return sorted((e.entry_id, s.name, e.name, e.where, e.owner, e.length)
                  for s in pair.structures() for e in s)


def refused(call, *args):
    """The reason and message of the CQSError ``call(*args)`` raises."""
    with pytest.raises(CQSError) as caught:
        call(*args)
    return caught.value.reason, caught.value.message


# -- fail ----------------------------------------------------------------------------


async def test_fail_takes_the_pair_out_and_ends_its_waiting_reads(make, nursery):
    """A failed pair answers STRUCTURE_FAILED (its overflow structure with it), its
    waiting reads end unserved, and the failed flag is kept in the repository so a
    restart keeps the drill."""
    rooms = make()
    rooms.fill(3)
    waiter, answered = Waiter(None, 1, "B", 1, None, 60.0), []
    rooms.waiters.answer = answered.append
    rooms.waiters.park(rooms.pair, KEY, waiter)
    with structlog.testing.capture_logs() as logs:
        result = rooms.operations.fail("MSGQ01")
    assert result == {"structure": "MSGQ01", "status": "failed", "messages": 3}
    assert refused(rooms.registry.structure, "MSGQ01")[0] == Reason.STRUCTURE_FAILED
    assert rooms.registry.physical("MSGQ01OV") is None
    assert waiter.failed and answered == [waiter]
    assert repository.structures(rooms.datadir.repository)["MSGQ01"]["failed"]
    [event] = [e for e in logs if e["event"] == "structure_failed"]
    assert (event["structure"], event["why"], event["messages"]) == (
        "MSGQ01", "operator fail", 3)


async def test_an_overflow_structures_fail_is_refused_naming_its_primary(make):
    """The pair fails as one: failing its overflow structure is INVALID_REQUEST,
    saying to fail the primary, and nothing fails."""
    rooms = make()
    reason, message = refused(rooms.operations.fail, "MSGQ01OV")
    assert reason == Reason.INVALID_REQUEST and "fail MSGQ01," in message
    assert rooms.registry.failed == {} and rooms.registry.physical("MSGQ01OV") is not None


async def test_a_second_fail_is_structure_failed(make):
    """A pair failed already cannot be failed again."""
    rooms = make()
    rooms.operations.fail("MSGQ01")
    assert refused(rooms.operations.fail, "MSGQ01")[0] == Reason.STRUCTURE_FAILED


# -- alter ---------------------------------------------------------------------------


async def test_alter_changes_the_current_size_and_settles(make):
    """An alter within SIZE changes the structure's current size (the overflow
    structure's own, when it is named) and is settled like a request."""
    rooms = make()
    row = rooms.operations.alter("MSGQ01", 768 * KiB)
    assert (row["name"], row["current_size"], row["elements_total"]) == (
        "MSGQ01", 768 * KiB, 768 * KiB // ELEMENT)
    row = rooms.operations.alter("MSGQ01OV", 256 * KiB)
    assert (row["name"], row["current_size"]) == ("MSGQ01OV", 256 * KiB)
    assert rooms.pair.primary.stats()["current_size"] == 768 * KiB
    assert rooms.settled == 2


async def test_alter_below_what_is_in_use_is_refused(make):
    """Shrinking below the data elements in use is INVALID_REQUEST, and the size stays."""
    rooms = make()
    rooms.fill(5)
    used = rooms.pair.primary.stats()["elements_used"]
    reason, message = refused(rooms.operations.alter, "MSGQ01", 64 * KiB)
    assert reason == Reason.INVALID_REQUEST and f"{used} are in use" in message
    assert rooms.pair.primary.stats()["current_size"] == 512 * KiB and rooms.settled == 0


# -- rebuild -------------------------------------------------------------------------


async def test_a_rebuild_copies_every_message_to_a_new_pair_of_the_new_size(make):
    """The new instance holds every message as it was (ids, queues, the lock and
    its owner), at the SIZE asked for, which the repository keeps."""
    rooms = make()
    rooms.fill(5)
    rooms.pair.overflow.put(*KEY, b"moved")
    old, before = rooms.pair, contents(rooms.pair)
    row = rooms.operations.rebuild("MSGQ01", 900 * KiB)
    assert rooms.pair is not old and contents(rooms.pair) == before
    assert (row["size"], row["current_size"], row["messages"]) == (900 * KiB, 900 * KiB, 5)
    assert rooms.pair.last_id == old.last_id
    stored = repository.structures(rooms.datadir.repository)["MSGQ01"]
    assert (stored["size"], stored["current_size"], stored["changed_by"]) == (
        900 * KiB, 900 * KiB, "rebuild")


@pytest.mark.parametrize(("size", "says"), [
    (64 * KiB, "65536 bytes is less than the"),
    (0, "the size must be between 512 and 1099511627776 bytes"),
    (2**64 - 1, "the size must be between 512 and 1099511627776 bytes"),
], ids=["below what is in use", "not positive", "past any SIZE"])
async def test_a_rebuild_to_a_size_that_cannot_hold_the_messages_is_refused(make, size, says):
    """A rebuild to a size below the bytes in use, or not a size a structure may be
    configured with, is INVALID_REQUEST saying why, and the pair and its definition stay
    as they were. (Past SQLite's integers, the pair was installed, then the repository
    refused its definition: an internal error, found by the group fuzz.)"""
    rooms = make()
    rooms.fill(5)
    old, before = rooms.pair, contents(rooms.pair)
    reason, message = refused(rooms.operations.rebuild, "MSGQ01", size)
    assert reason == Reason.INVALID_REQUEST and says in message
    assert rooms.pair is old and contents(rooms.pair) == before
    assert repository.structures(rooms.datadir.repository)["MSGQ01"]["size"] == 1024 * KiB


# -- a node of a group ---------------------------------------------------------------


async def test_in_a_group_a_purge_covers_the_sealed_series_at_their_cuts(make):
    """In a group, recover --purge leaves an empty slot covering the pair's sealed
    series at their cuts as well as this node's: a later takeover folds none of
    the purged records of earlier owners back."""
    rooms = make(group=True)
    rooms.operations.checkpoints.sealed = lambda name: {"NODE2-1": 7, "NODE3-2": 11}
    rooms.fill(3)
    assert rooms.operations.fail("MSGQ01")["status"] == "failed"
    done = await rooms.operations.recover("MSGQ01", purge=True)
    assert (done["source"], done["messages"]) == ("purge", 0)
    for name in ("MSGQ01", "MSGQ01OV"):
        slot = slots.newest_valid(rooms.datadir.srds, name)
        assert slot.lsn == {"NODE2-1": 7, "NODE3-2": 11, rooms.journal.writer_id: ANY}, slot.lsn


class RollsWhileWaiting:
    """The journal, which rolls to a new series during the first wait for durability
    (a group node taking back a pair it had handed over, while a recovery waits)."""

    def __init__(self, journal) -> None:
        self.journal, self.rolled = journal, None

    async def wait_durable(self, lsn, writer=None):
        writer = writer or self.journal.writer_id  # the series it waits in: the caller's
        if self.rolled is None:
            self.rolled = await self.journal.roll("NODE1-2")
        return await self.journal.wait_durable(lsn, writer)

    def __getattr__(self, name):
        return getattr(self.journal, name)


async def test_a_purge_whose_wait_met_a_roll_covers_the_new_series_as_far_as_it_goes(make,
                                                                                   nursery):
    """The series rolls while a purge waits for the log: the empty checkpoint covers
    the new series to its own end, not to where the old one ended. (It covered the
    new series up to the old one's LSN: records the new series took later, for the
    pair purged, were then covered by a checkpoint without them, and every fold of
    the pair met them as effects on messages not there: found by the group fuzz.)"""
    rooms = make(group=True)
    rooms.operations.checkpoints.sealed = lambda name: {}
    nursery.start_soon(rooms.journal.run)  # the flusher, which the roll waits for
    for _ in range(5):
        rooms.journal.append({"s": "EMHQ01", "e": []})
    rooms.operations.journal = rolling = RollsWhileWaiting(rooms.journal)
    rooms.operations.fail("MSGQ01")
    await rooms.operations.recover("MSGQ01", purge=True)
    assert rolling.rolled is not None and rolling.rolled[1] == 5
    for name in ("MSGQ01", "MSGQ01OV"):
        slot = slots.newest_valid(rooms.datadir.srds, name)
        assert slot.lsn == {"NODE1-2": rooms.journal.position}, slot.lsn


async def test_a_recovery_whose_pair_went_to_another_owner_installs_nothing(make):
    """A node fenced while recovering a pair loses it (membership.py takes it off the
    failed pairs): the recovery ends STRUCTURE_FAILED and installs nothing."""
    rooms = make(group=True)
    rooms.operations.fail("MSGQ01")
    real = rooms.operations._rebuild

    async def fenced_meanwhile(*args):
        replayed = await real(*args)
        del rooms.registry.failed["MSGQ01"]  # what Membership.lose does
        rooms.registry.standby.add("MSGQ01")
        return replayed

    rooms.operations._rebuild = fenced_meanwhile
    with pytest.raises(CQSError) as caught:
        await rooms.operations.recover("MSGQ01", purge=True)
    assert caught.value.reason == Reason.STRUCTURE_FAILED
    assert "lost the structure while recovering it" in caught.value.message
    assert "MSGQ01" not in rooms.registry.pairs


# -- restart -------------------------------------------------------------------------


async def test_a_restart_on_an_empty_data_directory_rebuilds_empty_structures(make):
    """With no image, slot or log, every structure is rebuilt empty from nothing,
    and no client's locks are held over."""
    rooms = make()
    with structlog.testing.capture_logs() as logs:
        held, crashed = rooms.operations.restart()
    assert (held, crashed) == (set(), set())
    rebuilt = [(e["structure"], e["clean"], e["source"], e["messages"], e["records_replayed"])
               for e in logs if e["event"] == "structure_rebuilt"]
    assert rebuilt == [("MSGQ01", False, "empty", 0, 0), ("MSGQ01OV", False, "empty", 0, 0)]
    assert rooms.pair.stats()["messages"] == 0
