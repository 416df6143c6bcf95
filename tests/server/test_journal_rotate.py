"""A group node's journal moves to a new series at a rejoin (``Journal.rotate``) even
while its flusher fsyncs the old one in a worker thread."""

import os
import threading

import trio

from cqsd.server.journal import Fenced, Journal

from .conftest import RECORD, SEGMENT


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
