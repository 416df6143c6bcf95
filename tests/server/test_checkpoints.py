"""Checkpoints (checkpoints.py) decide when a structure is owed one (by the time
since its last, by the log written since its cut, not again during the back-off
after a failure), what log a slot covers (this daemon's series, and in a group
the sealed writers' cuts of the pair), and which segments may be trimmed.

Real objects on a temporary data directory: a ``DataDir``, a ``Journal`` with
small segments, the ``Registry`` and the SRDS slots. What is outside the module
is faked: the Spark job runner (a structure that holds messages needs one), and
the wall and monotonic clocks, read off trio's mock clock so the triggers'
polls and the back-off move together when the test jumps it.
"""

import functools
import time

import pytest
import structlog
import trio
import trio.testing

from cqsd.config import loads
from cqsd.server import checkpoints as module
from cqsd.server.checkpoints import TRIGGER_POLL, Checkpoints
from cqsd.server.definitions import Definitions
from cqsd.server.jobs import JobFailed
from cqsd.server.journal import WRITER, Journal
from cqsd.server.liveconfig import LiveConfig
from cqsd.server.registry import Registry
from cqsd.server.runtime import Runtime
from cqsd.srds import slots
from cqsd.storage import repository
from cqsd.storage.datadir import DataDir
from logstream.series import list_segments

SEGMENT = 4096  # the least a segment may be: a few records each, so trims are seen
VOLUME = 2048  # checkpoint_log_volume of the volume tests
CONFIG = """
[daemon]
data_dir = "{data}"
checkpoint_interval = {interval}
checkpoint_log_volume = {volume}
dedup_window = {window}
[[structure]]
name = "MSGQ01"
size = "1MiB"
overflow = "MSGQ01OV"
[[structure]]
name = "MSGQ01OV"
size = "1MiB"
[[structure]]
name = "MSGQ02"
size = "1MiB"
"""
NAMES = ["MSGQ01", "MSGQ01OV", "MSGQ02"]
SEALED = "NODE2-1"  # another node's series, sealed when this one took a pair over


class Rooms:
    """The rooms a ``Checkpoints`` is made from, on one data directory."""

    def __init__(self, tmp_path, nursery, opened, *, interval=0, volume=0, window=0):
        config = loads(CONFIG.format(data=tmp_path / "data", interval=interval, volume=volume,
                                     window=window))
        self.config = LiveConfig(config)
        self.datadir = opened.close_after(DataDir(config.daemon.data_dir))
        self.datadir.open()
        self.registry = Registry(self.config, Definitions(config, self.datadir.repository))
        self.registry.open()
        self.nursery, self.opened = nursery, opened
        self.journal = opened.close_after(Journal(self.datadir.logstream, SEGMENT))
        self.runtime = Runtime()
        self.runtime.bind(nursery, lambda: 0, self.journal)
        nursery.start_soon(self.journal.run)

    def restart(self):
        """The journal closed and opened again, as by a daemon's restart."""
        self.journal.close()
        self.journal = self.opened.close_after(Journal(self.datadir.logstream, SEGMENT))
        self.nursery.start_soon(self.journal.run)

    def checkpoints(self):
        return Checkpoints(self.config, self.datadir, self.journal, self.registry.physical,
                           self.runtime)

    async def log(self, *sizes):
        """Append records of about these many bytes each, and wait until they are durable."""
        for size in sizes:
            self.journal.append({"s": "MSGQ01", "e": [("X", b"x" * size)]})
        assert await self.journal.wait_durable(self.journal.position)


@pytest.fixture
def make(tmp_path, nursery, opened):
    """Make the rooms (with the config's triggers); closed after the test."""
    return functools.partial(Rooms, tmp_path, nursery, opened)


class Clock:
    """``time`` as checkpoints.py reads it, off trio's clock: time() is the wall
    clock, monotonic() trio's own."""

    def __init__(self):
        self.offset = None  # the wall clock at trio's time 0, once the run has begun

    def time(self):
        if self.offset is None:
            self.offset = time.time() - trio.current_time()
        return self.offset + trio.current_time()

    def monotonic(self):
        return trio.current_time()


@pytest.fixture
def clock(mock_clock, monkeypatch):
    """The mock clock, also the clocks the checkpoint triggers read (a fixture that
    is not async: pytest-trio runs the test on the clock among its arguments)."""
    monkeypatch.setattr(module, "time", Clock())
    return mock_clock


class FailingJobs:
    """The Spark job runner, failing every job it is asked to run."""

    def __init__(self):
        self.calls = 0

    async def run(self, config, args, background=False):
        self.calls += 1
        raise JobFailed(f"{' '.join(args[:3])} failed (exit 1): planted")


def started(logs):
    """(structure, why) of every checkpoint_started event, in order."""
    return [(e["structure"], e["why"]) for e in logs if e["event"] == "checkpoint_started"]


async def finish(cp):
    """Wait for every checkpoint running now."""
    for name in NAMES:
        await cp.finished(name)


def cut_of(rooms, name):
    """The log position of ``name``'s newest valid slot, None with none."""
    slot = slots.newest_valid(rooms.datadir.srds, name)
    return None if slot is None else slot.lsn


# -- the triggers ----------------------------------------------------------------------


async def test_the_interval_trigger_starts_a_checkpoint_once_the_interval_is_over(
        make, clock, nursery):
    """A structure is due by interval only once checkpoint_interval seconds have
    passed since its last cut (with none, since the log began)."""
    rooms = make(interval=60)
    cp = rooms.checkpoints()
    with structlog.testing.capture_logs() as logs:
        nursery.start_soon(cp.run)
        await trio.testing.wait_all_tasks_blocked()
        clock.jump(59)
        await trio.testing.wait_all_tasks_blocked()
        assert started(logs) == []
        clock.jump(TRIGGER_POLL)  # the next poll, past the interval
        await trio.testing.wait_all_tasks_blocked()
        await finish(cp)
    assert sorted(started(logs)) == [(name, "interval") for name in NAMES]
    assert all(cut_of(rooms, name) == {WRITER: 0} for name in NAMES)


async def test_the_volume_trigger_fires_when_the_log_passes_the_volume(make, nursery):
    """Log written below checkpoint_log_volume starts nothing; the record that
    passes it starts a checkpoint of every structure, by log_volume, and the log
    after their cut is owed afresh."""
    rooms = make(volume=VOLUME)
    cp = rooms.checkpoints()
    with structlog.testing.capture_logs() as logs:
        nursery.start_soon(cp.run)
        await rooms.log(1000)
        cp.note_logged()
        await trio.testing.wait_all_tasks_blocked()
        assert rooms.journal.writer.bytes_written < VOLUME and started(logs) == []
        await rooms.log(1200)
        cp.note_logged()
        await trio.testing.wait_all_tasks_blocked()
        await finish(cp)
        assert sorted(started(logs)) == [(name, "log_volume") for name in NAMES]
        assert all(cut_of(rooms, name) == {WRITER: 2} for name in NAMES)
        await rooms.log(1000)
        cp.note_logged()
        await trio.testing.wait_all_tasks_blocked()
    assert len(started(logs)) == 3 and cp.owed("MSGQ02") < VOLUME


async def test_a_log_on_disk_past_the_volume_is_owed_at_start(make, tmp_path):
    """At start the log a structure's newest cut leaves behind is owed at once:
    due by log_volume with no checkpoint, not due behind a cut at the log's end."""
    rooms = make(volume=VOLUME)
    await rooms.log(1500, 1500)
    slots.empty_checkpoint(rooms.datadir.srds, "MSGQ02", {WRITER: 2}, 0)
    rooms.restart()
    with structlog.testing.capture_logs() as logs:
        rooms.checkpoints()
    due = [(e["structure"], e["why"]) for e in logs if e["event"] == "checkpoint_due"]
    assert due == [("MSGQ01", "log_volume"), ("MSGQ01OV", "log_volume")]


async def test_a_failed_checkpoint_is_retried_after_a_doubling_back_off(make, clock, nursery):
    """A checkpoint whose job fails stays owed, but the triggers leave it alone for
    5 s, then 10, 20, ... up to 300 s between attempts."""
    rooms = make(volume=VOLUME)
    rooms.registry.pairs["MSGQ01"].put("TRAN", "Q", b"m")  # a job, not an empty slot
    # a slot already: without one, a checkpoint of another structure starts its first
    slots.empty_checkpoint(rooms.datadir.srds, "MSGQ01", {WRITER: 0}, 0)
    cp = rooms.checkpoints()
    cp.jobs = jobs = FailingJobs()
    attempts = []
    with structlog.testing.capture_logs() as logs:
        nursery.start_soon(cp.run)
        await rooms.log(3000)
        cp.note_logged()
        await trio.testing.wait_all_tasks_blocked()
        await finish(cp)
        attempts.append(0)
        for second in range(1, 1000):
            clock.jump(1)
            if second == 4:
                cp.note_logged()  # still owed, and woken: not before its back-off
            await trio.testing.wait_all_tasks_blocked()
            await finish(cp)
            if jobs.calls > len(attempts):
                attempts.append(second)
            if len(attempts) == 9:
                break
    assert jobs.calls == 9
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    # the wake at 4 s found it backing off; the poll after it (4 + 5 s) retried it
    assert gaps == [9, 10, 20, 40, 80, 160, 300, 300]
    failed = [e for e in logs if e["event"] == "checkpoint_failed"]
    assert [e["retry_in"] for e in failed] == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0,
                                               300.0, 300.0]
    assert {e["structure"] for e in failed} == {"MSGQ01"} and cp.owed("MSGQ01") >= VOLUME
    assert cut_of(rooms, "MSGQ01") == {WRITER: 0}


async def test_a_failed_first_checkpoint_waits_out_its_back_off_too(make, clock, nursery):
    """A structure with messages and no slot whose job fails is not started again at
    once when another structure's checkpoint then succeeds (a loop of Spark jobs, one
    after another): only once its back-off has passed."""
    rooms = make(volume=VOLUME)
    rooms.registry.pairs["MSGQ01"].put("TRAN", "Q", b"m")  # a job, not an empty slot
    cp = rooms.checkpoints()
    cp.jobs = jobs = FailingJobs()
    nursery.start_soon(cp.run)
    with pytest.raises(JobFailed):
        await cp.take("MSGQ01", "operator")
    await cp.take("MSGQ02", "operator")  # an empty slot: then the rest are covered
    await trio.testing.wait_all_tasks_blocked()
    await finish(cp)
    assert jobs.calls == 1
    clock.jump(6)  # past its back-off: the next checkpoint that covers the rest starts it
    await cp.take("MSGQ02", "operator")
    await trio.testing.wait_all_tasks_blocked()
    await finish(cp)
    assert jobs.calls == 2


async def test_an_overflow_structures_checkpoint_covers_its_empty_primary_and_ends(make):
    """A checkpoint of an overflow structure alone, its primary empty and never
    checkpointed: the primary gets its empty slot, and both end. (The primary's was
    taken with its pair, so it waited for the overflow structure's checkpoint, which
    waited for it: neither ended, and the log was never trimmed again. The group
    fuzz's checkpoint of MSGQ01OV found it.)"""
    rooms = make()
    await rooms.log(100)
    cp = rooms.checkpoints()
    with trio.fail_after(10):
        result = await cp.take("MSGQ01OV", "operator")
    assert result["slot"] == "SRDS1"
    assert slots.newest_valid(rooms.datadir.srds, "MSGQ01").lsn == {WRITER: 1}


# -- what a checkpoint covers ------------------------------------------------------------


async def test_an_empty_structure_gets_an_empty_slot_and_a_repository_row(make):
    """A structure that holds no message is checkpointed at once, without a job: an
    empty slot at the log's end, recorded in the repository as a job's would be."""
    rooms = make()
    await rooms.log(100, 100, 100)
    cp = rooms.checkpoints()
    result = await cp.take("MSGQ02", "operator")
    assert (result["slot"], result["lsn"], result["rows"]) == ("SRDS1", {WRITER: 3}, 0)
    slot = slots.newest_valid(rooms.datadir.srds, "MSGQ02")
    assert (slot.name, slot.lsn, slot.rows) == ("SRDS1", {WRITER: 3}, 0)
    [row] = repository.backups(rooms.datadir.repository, "MSGQ02")
    assert (row["slot"], row["status"], row["lsn_from"], row["lsn_to"], row["rows"]) == (
        "SRDS1", "ok", {}, {WRITER: 3}, 0)
    await rooms.log(100)
    result = await cp.take("MSGQ02", "operator")
    rows = repository.backups(rooms.datadir.repository, "MSGQ02")
    assert result["slot"] == "SRDS2" and [r["lsn_from"] for r in rows] == [{WRITER: 3}, {}]


async def test_a_first_checkpoint_gives_every_structure_without_one_its_own(make):
    """The log is trimmed only behind every structure's slots, so a checkpoint
    gives each empty structure that has none a first one; a pair's overflow
    structure is checkpointed with its primary."""
    rooms = make()
    await rooms.log(100)
    cp = rooms.checkpoints()
    with structlog.testing.capture_logs() as logs:
        result = await cp.take("MSGQ01", "operator")
    assert result["overflow"]["structure"] == "MSGQ01OV"
    assert sorted(started(logs)) == [("MSGQ01", "operator"), ("MSGQ01OV", "operator"),
                                     ("MSGQ02", "first")]
    assert all(cut_of(rooms, name) == {WRITER: 1} for name in NAMES)


async def test_alone_a_slot_covers_only_this_daemons_series(make):
    """A daemon on its own cuts only its own series."""
    rooms = make()
    await rooms.log(100, 100)
    result = await rooms.checkpoints().take("MSGQ01", "operator")
    assert result["lsn"] == result["overflow"]["lsn"] == {WRITER: 2}


async def test_in_a_group_a_slot_covers_the_pairs_sealed_series_too(make):
    """With a group's sealed cuts, a slot covers the writers sealed for its pair
    (for an overflow structure, its primary's) and this daemon's series."""
    rooms = make()
    await rooms.log(100, 100)
    cp = rooms.checkpoints()
    cuts = {"MSGQ01": {SEALED: 17}, "MSGQ02": {"NODE3-2": 5}}
    cp.sealed = lambda name: dict(cuts.get(name, {}))
    await cp.take("MSGQ01", "operator")
    assert cut_of(rooms, "MSGQ01") == cut_of(rooms, "MSGQ01OV") == {SEALED: 17, WRITER: 2}
    assert cut_of(rooms, "MSGQ02") == {"NODE3-2": 5, WRITER: 2}


async def test_a_slot_begun_before_the_series_rolls_covers_the_series_it_was_taken_in(make):
    """A group node may roll to a new series while a checkpoint waits for its records
    to be durable: the slot still covers the series and position it was taken at
    (read afterwards, it named the new series at the old position: records it never
    held)."""
    rooms = make()
    await rooms.log(100)
    cp, journal = rooms.checkpoints(), rooms.journal

    class RollsMeanwhile:
        """The journal as the checkpoints see it, rolling while they wait on it."""

        def __getattr__(self, name):
            return getattr(journal, name)

        async def wait_durable(self, lsn, writer=None):
            await journal.roll("NODE1-2")
            journal.append({"s": "MSGQ01", "e": []})  # the new series moves on
            return await journal.wait_durable(lsn, writer)

    cp.journal = RollsMeanwhile()
    await cp.take("MSGQ02", "operator")  # it holds no message: a slot at once
    assert cut_of(rooms, "MSGQ02") == {WRITER: 1}


# -- trimming ----------------------------------------------------------------------------


async def segments_of(rooms, records=12):
    """Log ``records`` records over several segments; their first LSNs."""
    await rooms.log(*[1500] * records)
    firsts = [s.first_lsn for s in list_segments(rooms.datadir.logstream, WRITER)]
    assert len(firsts) >= 4
    return firsts


def kept(rooms):
    """The first LSN of the oldest segment left."""
    return list_segments(rooms.datadir.logstream, WRITER)[0].first_lsn


def holding(firsts, lsn):
    """The first LSN of the segment that holds record ``lsn``."""
    return max(first for first in firsts if first <= lsn)


async def test_a_trim_keeps_the_log_after_every_structures_older_slot(make):
    """Segments are deleted up to the one holding the record after the oldest cut
    any slot still needs: a structure's older slot counts, not only its newest."""
    rooms = make()
    firsts = await segments_of(rooms)
    srds = rooms.datadir.srds
    for name in ("MSGQ01", "MSGQ01OV"):
        slots.empty_checkpoint(srds, name, {WRITER: 12}, 0)
    slots.empty_checkpoint(srds, "MSGQ02", {WRITER: 7}, 0)
    slots.empty_checkpoint(srds, "MSGQ02", {WRITER: 12}, 0)
    rooms.checkpoints().trim()
    assert kept(rooms) == holding(firsts, 8) > 1


async def test_a_trim_keeps_the_segments_of_the_dedup_window(make):
    """Segments written in the last ``dedup_window`` seconds stay, whatever the slots
    cover: a start reads the idempotency keys of that window back from them."""
    rooms = make(window=120)
    await segments_of(rooms)
    for name in NAMES:
        slots.empty_checkpoint(rooms.datadir.srds, name, {WRITER: 12}, 0)
    rooms.checkpoints().trim()
    assert kept(rooms) == 1


class Ahead:
    """``time`` as a node whose wall clock runs five minutes ahead reads it."""

    def time(self):
        return time.time() + 300

    def monotonic(self):
        return time.monotonic()


async def test_a_node_whose_clock_runs_ahead_keeps_the_segments_of_the_dedup_window(
        make, monkeypatch):
    """A segment's age is counted on the clock that set its file's time, not on this
    node's: five minutes ahead, every segment of the window looked old enough to go,
    and a takeover after it could not read back the keys the window promises."""
    rooms = make(window=120)
    await segments_of(rooms)
    for name in NAMES:
        slots.empty_checkpoint(rooms.datadir.srds, name, {WRITER: 12}, 0)
    monkeypatch.setattr(module, "time", Ahead())
    rooms.checkpoints().trim()
    assert kept(rooms) == 1


async def test_a_structure_without_a_checkpoint_keeps_the_whole_log(make):
    """While one structure has no slot, its recovery needs every record: no trim."""
    rooms = make()
    await segments_of(rooms)
    for name in ("MSGQ01", "MSGQ01OV"):
        slots.empty_checkpoint(rooms.datadir.srds, name, {WRITER: 12}, 0)
    rooms.checkpoints().trim()
    assert kept(rooms) == 1


@pytest.mark.parametrize(("group", "lsn", "cut", "held", "needs_from"), [
    (True, {SEALED: 40}, {SEALED: 40}, False, None),
    (True, {SEALED: 40, WRITER: 5}, {SEALED: 40, WRITER: 5}, True, 6),
    (True, {SEALED: 40}, {SEALED: 40, WRITER: 30}, False, 1),
    (True, {SEALED: 40}, {SEALED: 40}, True, 1),
    (False, {SEALED: 40}, {}, False, 1),
], ids=["group, not named", "group, named", "group, sealed here, not named",
        "group, held here, not named", "alone"])
async def test_a_pair_another_node_owns_needs_this_series_only_where_its_slots_name_it(
        make, group, lsn, cut, held, needs_from):
    """In a group, a pair this node does not hold needs none of this node's series
    unless its slots name it, this node owned the pair while writing the series, or
    a seal of the pair cut it: the series may hold the pair's records from then, and
    no slot since holds them (a trim of them left the pair's next takeover failing
    with Trimmed, for ever: once after a planned move, once after a fence, before
    any seal of the pair cut the series). A daemon alone keeps the whole log for a
    failed structure whose slots do not name its series."""
    rooms = make()
    firsts = await segments_of(rooms)
    srds = rooms.datadir.srds
    for name in ("MSGQ01", "MSGQ01OV"):
        slots.empty_checkpoint(srds, name, {WRITER: 10}, 0)
    slots.empty_checkpoint(srds, "MSGQ02", lsn, 0)
    rooms.registry.fail("MSGQ02")  # not held here
    cp = rooms.checkpoints()
    if group:
        cp.sealed = lambda name: dict(cut) if name == "MSGQ02" else {}
    if held:  # owned here earlier in this series, and lost since
        cp.held("MSGQ02")
    cp.trim()
    assert kept(rooms) == (holding(firsts, 11) if needs_from is None
                           else holding(firsts, needs_from))


# -- dead series (a group's) ----------------------------------------------------------

DEAD = "NODE2-1"


def dead_series(rooms, age=3600):
    """A series another node wrote and left (killed, fenced), last written ``age``
    seconds ago: its segment files."""
    import os

    import logstream

    w = logstream.Writer.open(rooms.datadir.logstream, DEAD, segment_size=SEGMENT)
    for _ in range(3):
        w.append({"s": "MSGQ01", "e": []})
    w.close()
    files = list_segments(rooms.datadir.logstream, DEAD)
    then = time.time() - age
    for seg in files:
        os.utime(seg.path, (then, then))
    return files


def slots_naming(rooms, dead=True, skip=()):
    for name in NAMES:
        if name not in skip:
            slots.empty_checkpoint(rooms.datadir.srds, name,
                                   {WRITER: 1, **({DEAD: 3} if dead else {})}, 0)


async def test_a_dead_series_every_checkpoint_covers_is_retired(make):
    """In a group, a series no live node writes, named by every slot of every
    structure and older than the windows, is deleted whole: each takeover would
    otherwise list it and cut it again, for ever."""
    rooms = make()
    await rooms.log(100)
    files = dead_series(rooms)
    slots_naming(rooms)
    cp = rooms.checkpoints()
    cp.sealed = lambda pair: {DEAD: 3}  # each slot names it at its cut
    cp.live_series = lambda: {WRITER}
    with structlog.testing.capture_logs() as logs:
        cp.trim()
    assert not any(seg.path.exists() for seg in files)
    assert not (rooms.datadir.logstream / f"{DEAD}.lock").exists()
    assert [e["writer"] for e in logs if e["event"] == "series_retired"] == [DEAD]
    assert list_segments(rooms.datadir.logstream, WRITER)  # this node's own stays


async def test_a_dead_series_another_node_retires_meanwhile_is_passed_over(make, monkeypatch):
    """Every node of a group retires the dead series: another one may delete a series
    between this node's listing and its look at the files. It is passed over, not an
    error (the group fuzz met ``series_retire_failed``, ENOENT, once it ran the
    checkpoint jobs)."""
    from cqsd.server import checkpoints

    rooms = make()
    await rooms.log(100)
    files = dead_series(rooms)
    slots_naming(rooms)
    cp = rooms.checkpoints()
    cp.sealed = lambda pair: {DEAD: 3}
    cp.live_series = lambda: {WRITER}
    listing = checkpoints.list_series

    def listed_then_retired_elsewhere(directory):
        series = listing(directory)
        for seg in files:
            seg.path.unlink(missing_ok=True)
        return series

    monkeypatch.setattr(checkpoints, "list_series", listed_then_retired_elsewhere)
    with structlog.testing.capture_logs() as logs:
        cp.trim()
    assert [e for e in logs if e["log_level"] == "error"] == []
    assert list_segments(rooms.datadir.logstream, WRITER)


async def test_a_takeover_whose_cut_names_a_retired_series_owes_none_of_it(make):
    """A seal's cut names every series the group has written, a retired one too:
    counting what a takeover owes finds none of its segments, and counts nothing
    for it. (It raised ValueError from bytes_between, and the task's death
    stopped the node, once the fault loop's checkpoint jobs could run.)"""
    rooms = make()
    await rooms.log(100)
    files = dead_series(rooms)
    slots_naming(rooms)
    cp = rooms.checkpoints()
    cp.live_series = lambda: {WRITER}
    cp.trim()
    assert not any(seg.path.exists() for seg in files)
    await cp.taken_over("MSGQ01", {DEAD: 3, WRITER: 1})
    assert cp.owed("MSGQ01") == cp.owed("MSGQ01OV") == 0  # every slot covers the cut


@pytest.mark.parametrize("why", ["live", "recent", "a slot without it", "a base without it",
                                 "a slot short of its cut", "the group not yet read",
                                 "alone"])
async def test_a_series_some_recovery_may_still_read_is_kept(make, why):
    """Kept: a series a live node writes, one written lately, one a slot or a base
    image of some structure does not name (a rebuild from it reads the series), or
    names short of the cut a seal of its pair made of it (a slot its writer took
    while it was live: a checkpoint job from it reads on to the cut), and any
    series of a daemon on its own, or of a node that has not yet read its group (at
    its start every other series looked dead)."""
    rooms = make()
    await rooms.log(100)
    files = dead_series(rooms, age=10 if why == "recent" else 3600)
    skip = ("MSGQ02",) if why in ("a slot without it", "a slot short of its cut") else ()
    slots_naming(rooms, skip=skip)
    if why == "a slot without it":
        slots.empty_checkpoint(rooms.datadir.srds, "MSGQ02", {WRITER: 1}, 0)
    if why == "a slot short of its cut":
        slots.empty_checkpoint(rooms.datadir.srds, "MSGQ02", {WRITER: 1, DEAD: 2}, 0)
    cp = rooms.checkpoints()
    cp.sealed = lambda pair: {DEAD: 3}  # every pair's seal cut the dead series at its end
    if why == "a base without it":
        from cqsd.storage import image
        image.write_rows(rooms.datadir.images / "MSGQ01OV.base", "MSGQ01OV", {}, 0,
                         {WRITER: 1}, 0)
    if why == "the group not yet read":
        cp.live_series = lambda: None
    elif why != "alone":
        cp.live_series = lambda: {WRITER, DEAD} if why == "live" else {WRITER}
    cp.trim()
    assert all(seg.path.exists() for seg in files)
