"""A group node's journal moves to a new series at a rejoin (``Journal.rotate``) even
while its flusher fsyncs the old one in a worker thread."""

import os
import threading

import trio

from cqsd.server.journal import Fenced, Journal
from cqsproto import FrameDecoder

from .conftest import MAX_FRAME, RECORD, SEGMENT, unsocketed


async def test_a_rotation_during_a_threaded_flush_leaves_the_new_series_alone(tmp_path,
                                                                              nursery,
                                                                              monkeypatch):
    """Fenced and rejoined (rotated) while a worker thread fsyncs the old series: that
    flush counts for nothing, and the journal goes on in the new series (it used to
    flush the new writer up to the old one's LSN, fail, and stop the daemon)."""
    journal = Journal(tmp_path / "log", SEGMENT, writer="NODE1-1")
    journal._fsync_average = 1.0  # slow fsyncs: the flusher fsyncs in a worker thread
    started, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow(fd):  # the old series' fsync, the first, lasts until released
        if not started.is_set():
            started.set()
            release.wait(10)
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    try:
        nursery.start_soon(journal.run)
        for _ in range(3):
            journal.log([RECORD], urgent=True)
        await trio.to_thread.run_sync(started.wait, 10)
        journal.fence(Fenced("the test: its lease ran out"))
        journal.rotate("NODE1-2")
        release.set()
        journal.log([RECORD], urgent=True)
        with trio.fail_after(10):
            assert await journal.wait_durable(1)
        assert journal.failed is None and journal.writer_id == "NODE1-2"
        assert journal.durable == journal.acknowledged == 1
    finally:
        release.set()
        journal.close()


def test_a_fence_found_as_replies_leave_refuses_the_replies_others_hold(tmp_path):
    """The lease ran out while a reply waited for its fsync, and a session's replies
    leaving found it (the gate): the replies other sessions hold become errors at
    once. Left held, the rejoin's rotate made them wait for the new series to reach
    their old LSNs: their connections never ended, and the node that took the pair
    back refused their clients' names as CLIENT_ACTIVE (the takeover fault loop, a
    partition after a pause)."""
    journal = Journal(tmp_path / "log", SEGMENT, writer="NODE1-1")
    valid, fenced = [True], []
    journal.guard(lambda: valid[0], fenced.append)
    try:
        held = unsocketed(journal)
        lsn = journal.log([RECORD], urgent=True)
        held.reply(7, {"entry_id": 1}, lsn)
        assert [waits for waits, _, _ in held.queue] == [lsn]  # for its fsync
        valid[0] = False
        assert journal.gate is not None and not journal.gate()  # another's replies
        assert fenced and "before its replies left" in fenced[0]
        [(waits, _, frame)] = held.queue
        decoder = FrameDecoder(MAX_FRAME)
        decoder.receive_data(frame)
        reply = decoder.next_frame()
        assert waits == 0 and reply["id"] == 7 and reply["reason"] == "STRUCTURE_FAILED"
        assert "not acknowledged" in reply["message"]
        journal.rotate("NODE1-2")
        assert [waits for waits, _, _ in held.queue] == [0]  # nothing of the old series
    finally:
        journal.close()
