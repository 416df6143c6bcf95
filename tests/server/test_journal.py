"""The journal group-commits appends, holds replies until they are durable, and
once it fails acknowledges nothing more."""

import errno
import os
import threading

import trio
import trio.testing

import logstream
from cqsd.engine import Reason

from .conftest import RECORD, received


async def test_appends_made_while_the_flusher_waits_share_one_fsync(journal, nursery):
    """Three appends made before the flusher runs again are made durable by one
    group commit, and wait_durable returns once the last is on disk."""
    nursery.start_soon(journal.run)
    await trio.testing.wait_all_tasks_blocked()
    before = journal.writer.stats().group_commits
    lsns = [journal.append(RECORD) for _ in range(3)]
    assert lsns == [1, 2, 3] and journal.durable == 0
    assert await journal.wait_durable(3)
    assert journal.durable == 3
    assert journal.writer.stats().group_commits == before + 1


async def test_a_record_nobody_waits_for_does_not_wake_the_flusher(journal, nursery):
    """A lock-only record (urgent=False) stays in the page cache until an urgent
    append's fsync covers it too."""
    nursery.start_soon(journal.run)
    journal.append(RECORD, urgent=False)
    await trio.testing.wait_all_tasks_blocked()
    assert (journal.position, journal.durable) == (1, 0)
    journal.append(RECORD)
    assert await journal.wait_durable(2)
    assert journal.durable == 2


async def test_wait_durable_waits_only_for_what_is_not_yet_durable(journal, nursery):
    """A waiter for a durable LSN returns at once; one for a later LSN waits for
    the flush that covers it."""
    done = []

    async def wait(lsn):
        done.append((lsn, await journal.wait_durable(lsn)))

    journal.append(RECORD, urgent=False)
    nursery.start_soon(wait, 1)
    await trio.testing.wait_all_tasks_blocked()
    assert done == []
    nursery.start_soon(journal.run)
    journal.append(RECORD)
    await trio.testing.wait_all_tasks_blocked()
    assert done == [(1, True)]
    assert await journal.wait_durable(1)


async def test_a_held_reply_goes_out_after_the_flush_that_makes_it_durable(
        journal, connected, nursery):
    """A reply waiting for its record is held by the journal and sent by the
    flusher itself once the fsync is done, not before."""
    session, client = connected(journal)
    lsn = journal.append(RECORD, urgent=False)
    session.reply(7, {"entry_id": 42}, lsn)
    assert received(client) == []
    nursery.start_soon(journal.run)
    journal.append(RECORD)
    assert await journal.wait_durable(lsn)
    assert received(client) == [{"id": 7, "ok": True, "result": {"entry_id": 42}}]
    assert not session.queue


async def test_a_pass_of_the_poller_ends_in_its_own_flush_when_the_fsync_is_fast(
        journal, connected, nursery):
    """Records a poller's rounds took for replies are made durable, and the replies
    sent, by the pass's end itself (pass_ended) while the flusher waits idle: one
    fsync, no wake-up of the flusher. A slow fsync (over INLINE_FSYNC on average)
    goes to the flusher instead, and the pass's end only wakes it."""
    nursery.start_soon(journal.run)
    await trio.testing.wait_all_tasks_blocked()
    session, client = connected(journal)
    before = journal.writer.stats().group_commits
    journal.defer_writes()
    lsns = [journal.append(RECORD) for _ in range(2)]
    journal.write_deferred()
    session.reply(7, {"entry_id": 42}, lsns[-1])
    assert received(client) == [] and journal.durable == 0
    journal.pass_ended()
    assert journal.durable == 2 and journal.writer.stats().group_commits == before + 1
    assert received(client) == [{"id": 7, "ok": True, "result": {"entry_id": 42}}]
    journal._fsync_average = 1.0  # a slow disk
    journal.defer_writes()
    lsn = journal.append(RECORD)
    journal.write_deferred()
    journal.pass_ended()
    assert journal.durable == 2
    assert await journal.wait_durable(lsn)


async def test_a_failed_fsync_turns_held_replies_into_errors_and_stays_failed(
        journal, connected, nursery, monkeypatch):
    """After an fsync error every held reply becomes SHUTTING_DOWN "not
    acknowledged", the daemon is told once, the flusher ends, and nothing is
    appended or acknowledged after."""
    told = []
    journal.on_failure = told.append
    session, client = connected(journal)
    lsn = journal.append(RECORD)
    session.reply(7, {"entry_id": 42}, lsn)

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", eio)
    async with trio.open_nursery() as flusher:
        flusher.start_soon(journal.run)  # it returns once the journal has failed
    [reply] = received(client)
    assert (reply["id"], reply["ok"], reply["reason"]) == (7, False, str(Reason.SHUTTING_DOWN))
    assert reply["message"].startswith("not acknowledged: the log write failed")
    assert told == [journal.failed] and journal.durable == 0
    assert journal.append(RECORD) == 0
    assert not await journal.wait_durable(lsn)
    session.reply(8, {}, lsn)  # a reply that would wait for the log fails at once
    assert [(r["id"], r["reason"]) for r in received(client)] == [(8, "SHUTTING_DOWN")]
    journal.fail(RuntimeError("again"))
    assert len(told) == 1


def failing_writes(monkeypatch) -> None:
    def eio(fd, data, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pwrite", eio)


async def test_a_failed_write_of_a_lock_record_fails_the_log_and_logs_nothing(
        journal, monkeypatch):
    """A lock record written at once (outside a round) whose write fails: the append
    logs nothing (0), and the journal has failed, once. (Compiled, a second test of
    ``failed`` in one method raised TypeError here; see ``_has_failed``.)"""
    told = []
    journal.on_failure = told.append
    failing_writes(monkeypatch)
    assert journal.append(RECORD, urgent=False) == 0
    assert len(told) == 1 and journal.failed is told[0]
    assert journal.append(RECORD) == 0 and len(told) == 1


async def test_a_failed_write_at_a_pass_end_fails_the_log_and_flushes_nothing(
        journal, connected, nursery, monkeypatch):
    """The records a pass took fail to be written at its end: no fsync follows, the
    held reply becomes an error, and the idle flusher ends."""
    nursery.start_soon(journal.run)
    await trio.testing.wait_all_tasks_blocked()
    session, client = connected(journal)
    before = journal.writer.stats().group_commits
    journal.defer_writes()
    lsn = journal.append(RECORD)
    journal.write_deferred()
    session.reply(7, {"entry_id": 42}, lsn)
    failing_writes(monkeypatch)
    journal.pass_ended()
    assert journal.failed is not None
    assert journal.writer.stats().group_commits == before
    [reply] = received(client)
    assert (reply["id"], reply["ok"]) == (7, False)


async def test_a_failed_write_in_the_flusher_ends_it(journal, monkeypatch):
    """The flusher's own write of the taken records fails: it fails the log and
    returns, rather than fsync or raise."""
    failing_writes(monkeypatch)
    journal.append(RECORD)  # urgent: taken for the flusher
    with trio.fail_after(10):
        await journal.run()
    assert journal.failed is not None


async def test_records_after_data_wait_for_the_data_sync_and_keep_their_order(journal, nursery):
    """A record naming blocks, and every record after it, is held back with the LSN
    it will get until sync_data has run; records appended while the held ones are
    written (in a worker thread) queue behind them, so the log keeps request order."""
    synced, release = [], trio.Event()

    async def sync_data():
        synced.append(journal.position)
        await release.wait()

    journal.sync_data = sync_data
    block = {"s": "S", "e": [("B", 1, 256, b"b" * 100_000), ("P", 1)]}
    assert journal.append(RECORD) == 1
    assert journal.append(block, after_data=True) == 2
    assert journal.append(RECORD) == 3
    nursery.start_soon(journal.run)
    await trio.testing.wait_all_tasks_blocked()
    assert synced == [3] and journal.writer.appended_lsn == 1
    assert journal.append(RECORD) == 4  # during the sync: held back too
    release.set()
    assert await journal.wait_durable(4)
    assert synced == [3, 4]
    bodies = [r.body for r in logstream.read(journal.directory)]
    assert [body["e"][0][0] for body in bodies] == ["D", "B", "D", "D"]
    assert bodies[1]["e"][0][3] == b"b" * 100_000 and journal.position == 4


async def test_a_rounds_lock_records_go_in_one_write_before_the_replies_after_them(
        journal, connected, monkeypatch):
    """In a round of the poller, lock records (urgent=False) wait for its end and go
    in one write, and the replies sent after the first of them (on any connection)
    leave only once it is written, so that a daemon killed after a reply still
    finds its lock; outside a round a lock record is written at once."""
    session, client = connected(journal)
    other, other_client = connected(journal)
    writes = []  # the LSN each write of the log follows
    pwrite = os.pwrite

    def counted(fd, data, offset):
        if not threading.current_thread().name.startswith("logstream zeroing"):
            writes.append(journal.writer.appended_lsn)  # not the zeros ahead of the log
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counted)
    journal.defer_writes()
    session.reply(1, {"n": 1})  # no lock record before it: on the spot
    assert [f["id"] for f in received(client)] == [1]
    journal.append(RECORD, urgent=False)
    session.reply(2, {"n": 2})
    journal.append(RECORD, urgent=False)
    other.reply(3, {"n": 3})
    assert received(client) == [] and received(other_client) == []
    assert writes == [] and journal.writer.appended_lsn == 0
    journal.write_deferred()
    assert writes == [0] and journal.writer.appended_lsn == 2  # one write of both
    assert [f["id"] for f in received(client)] == [2]
    assert [f["id"] for f in received(other_client)] == [3]
    assert not session.queue and not other.queue
    journal.append(RECORD, urgent=False)
    assert writes == [0, 2] and journal.writer.appended_lsn == 3


async def test_a_wait_for_a_series_rolled_away_from_ends_at_once(journal, nursery):
    """A wait for an LSN of the series a group node rolled away from (a base image or
    checkpoint whose snapshot was taken before the roll) ends at once: the roll
    acknowledged that series to its end. Measured against the new series, it would
    wait until that one reached the old LSN."""
    nursery.start_soon(journal.run)
    old = journal.writer_id
    for _ in range(5):
        journal.append(RECORD)
    await journal.roll("NODE1-2")
    with trio.fail_after(2):
        assert await journal.wait_durable(5, old)
    assert journal.writer_id == "NODE1-2" and journal.acknowledged == 0
