"""The daemon's SMDS room (cqsd/server/smds/): an offloaded put's blocks go to the
data set of its owner and are synced before the record naming them; its read
comes back from the data set; a delete's pages wait for the delete to be
durable; the displays show the data set. The daemon runs in-process on a real
data directory, as in test_dispatch.py."""

import itertools

import pytest
import trio
import trio.testing

from cqsd.config import loads
from cqsd.server.daemon import Daemon
from cqsd.server.smds.syncs import Syncs
from cqsd.smds import SmdsError
from cqsd.smds.states import Status
from cqsproto import PROTOCOL_VERSION

from .conftest import received

CONFIG = """
[daemon]
data_dir = "{data}"
socket = "{socket}"
max_message = "1MiB"
log_segment = "4MiB"
checkpoint_interval = 0
checkpoint_log_volume = 0
[[structure]]
name = "SMDS1"
size = "64MiB"
offload = "smds"
dssize = "1MiB"
dsblock = "8KiB"
"""
BIG = bytes(range(256)) * 400  # 100 KiB: past entry_max, so offloaded
_ids = itertools.count(1)


@pytest.fixture
async def daemon(tmp_path, tmp_path_factory):
    socket = tmp_path_factory.mktemp("sock") / "s"
    d = Daemon(loads(CONFIG.format(data=tmp_path / "data", socket=socket)))
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        yield d
        d.stop("end of test")


@pytest.fixture
def client(daemon, connected):
    session, end = connected(daemon.journal)
    send(daemon, session, "register", client="APP1", version=PROTOCOL_VERSION)
    [reply] = received(end)
    assert reply["ok"], reply
    return session, end


def send(d, session, op, **fields):
    rid = next(_ids)
    d.dispatch(session, {"id": rid, "op": op, **fields})
    return rid


async def put_durably(d, session, end, data=BIG):
    send(d, session, "put", structure="SMDS1", queue="Q", data=data)
    assert await d.journal.wait_durable(d.journal.position)
    [reply] = received(end)
    assert reply["ok"], reply
    return reply["result"]["entry_id"]


async def test_an_offloaded_put_is_read_back_from_its_owners_data_set(daemon, client):
    """The payload of a put past entry_max lives in the data set of its owner, and
    a read returns it byte for byte."""
    session, end = client
    await put_durably(daemon, session, end)
    sets = daemon.datasets.open_sets
    assert list(sets.open) == [("SMDS1", "APP1")]
    [entry] = list(daemon.registry.pairs["SMDS1"])
    assert entry.map is not None and entry.map.owner == "APP1"
    send(daemon, session, "read", structure="SMDS1", queue="Q")
    [reply] = received(end)
    assert reply["result"]["messages"][0]["data"] == BIG


async def test_the_record_of_an_offloaded_put_waits_for_the_data_sync(daemon, client):
    """A recoverable offloaded put's blocks are fdatasynced while its record is not
    yet in the log: the record is written after the sync, then made durable."""
    session, end = client
    journal, seen = daemon.journal, []
    synced = journal.sync_data

    async def sync_data():  # the data sets' sync, watched
        seen.append(journal.writer.appended_lsn)
        await synced()

    journal.sync_data = sync_data
    before = journal.writer.appended_lsn
    send(daemon, session, "put", structure="SMDS1", queue="Q", data=BIG, recoverable=True)
    assert not daemon.datasets.syncs.unsynced  # taken by the put's record
    assert await journal.wait_durable(journal.position)
    assert seen == [before] and journal.writer.appended_lsn == before + 1
    [reply] = received(end)
    assert reply["ok"]


async def test_a_deletes_pages_wait_for_the_delete_to_be_durable(daemon, client):
    """The pages of a deleted recoverable offloaded message stay pending until the
    delete's record is durable, then are free for reuse."""
    session, end = client
    send(daemon, session, "put", structure="SMDS1", queue="Q", data=BIG, recoverable=True)
    assert await daemon.journal.wait_durable(daemon.journal.position)
    received(end)
    [entry] = list(daemon.registry.pairs["SMDS1"])
    space = daemon.datasets.open_sets.open[("SMDS1", "APP1")].space
    send(daemon, session, "delete", structure="SMDS1", entry_id=entry.entry_id, operator=True)
    assert space.pending_pages
    assert await daemon.journal.wait_durable(daemon.journal.position)
    assert not space.pending_pages


async def test_the_displays_show_the_activated_data_set(daemon, client):
    """display smds, cfstatus and smdsconn each have one row for the data set a put
    activated, with its states."""
    session, end = client
    await put_durably(daemon, session, end)
    displays = daemon.datasets.displays
    [row] = displays.rows("SMDS1")
    assert (row["owner"], row["status"], row["available"]) == ("APP1", "ACTIVE", True)
    assert row["dsbufs"] == daemon.datasets.tuning.dsbufs(("SMDS1", "APP1"))
    [cf] = displays.cfstatus(None)
    [conn] = displays.smdsconn("SMDS1")
    assert (cf["status"], conn["status"], conn["openmode"]) == ("ACTIVE", "OPEN", "UPDATE")


async def test_damage_found_in_use_makes_the_data_set_failed(daemon, client):
    """A read that finds damage closes the data set without its map and makes it
    FAILED; a read then is refused with SMDS_UNAVAILABLE naming why."""
    session, end = client
    await put_durably(daemon, session, end)
    key = ("SMDS1", "APP1")
    sets = daemon.datasets.open_sets
    sets.damaged(key, "read", SmdsError("planted"))
    assert key not in sets.open and daemon.datasets.states.state(key).status == Status.FAILED
    send(daemon, session, "read", structure="SMDS1", queue="Q")
    [reply] = received(end)
    assert reply["reason"] == "SMDS_UNAVAILABLE" and "planted" in reply["message"]


async def test_a_failed_sync_names_the_data_set_and_forgets_it():
    """The syncs room hands back the data sets whose fdatasync failed, and syncs a
    data set once however often it was written."""
    class Set:
        def __init__(self, fails):
            self.fails, self.calls = fails, 0

        def sync(self):
            self.calls += 1
            if self.fails:
                raise SmdsError("disk gone")

    syncs, good, bad = Syncs(), Set(False), Set(True)
    for s in (good, good, bad):
        syncs.wrote(s)
    assert syncs.take_unsynced() and not syncs.take_unsynced()
    failed = await syncs.sync()
    assert [(s, str(err)) for s, err in failed] == [(bad, "disk gone")]
    assert (good.calls, bad.calls) == (1, 1)
    assert await syncs.sync() == []
