"""Sticky write errors: a failed write or fsync kills the writer, loudly and for good."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from logstream import LogWriteFailed, Writer, read
from logstream.segment import segment_name


def failing(code: int, calls: list[int] | None = None):  # type: ignore[no-untyped-def]
    """A stand-in for os.fsync / os.write that counts its calls and raises OSError(code)."""

    def fail(*args: object) -> int:
        if calls is not None:
            calls.append(1)
        raise OSError(code, os.strerror(code))

    return fail


def test_an_fsync_error_fails_the_flush_and_everything_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After fsync raises EIO, flush and append raise LogWriteFailed and fsync is never retried."""
    w = Writer.open(tmp_path, "alpha")
    lsn = w.append("first")
    w.flush()
    w.append("second")
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", failing(errno.EIO, calls))
    with pytest.raises(LogWriteFailed) as caught:
        w.flush()
    assert caught.value.error.errno == errno.EIO
    assert caught.value.path == str(tmp_path / segment_name("alpha", 1))
    assert "alpha.00000000000000000001.seg" in str(caught.value)
    with pytest.raises(LogWriteFailed):
        w.append("third")
    with pytest.raises(LogWriteFailed):
        w.flush()
    with pytest.raises(LogWriteFailed):
        w.flush(lsn)  # durable before the failure, but the writer is dead
    assert calls == [1]
    assert w.stats().failed and w.failure is not None
    w.close()


def test_a_write_error_fails_the_append_and_everything_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync_counter: list[int]
) -> None:
    """After os.write raises ENOSPC, append and flush raise, and nothing is written or synced."""
    w = Writer.open(tmp_path, "alpha")
    w.append("kept")
    calls: list[int] = []
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC, calls))
    with pytest.raises(LogWriteFailed) as caught:
        w.append("lost")
    assert caught.value.error.errno == errno.ENOSPC
    assert w.appended_lsn == 1
    synced = len(fsync_counter)
    with pytest.raises(LogWriteFailed):
        w.append("also lost")
    with pytest.raises(LogWriteFailed):
        w.flush()
    assert calls == [1] and len(fsync_counter) == synced
    w.close()


def test_every_waiting_flush_gets_the_fsync_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers queued behind a failing fsync all raise LogWriteFailed, none hang."""
    w = Writer.open(tmp_path, "alpha")
    release = threading.Event()
    entered = threading.Event()

    def stuck_then_eio(fd: int) -> None:
        entered.set()
        release.wait(10)
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", stuck_then_eio)
    outcomes: list[BaseException | int] = []

    def flusher() -> None:
        lsn = w.append("x")
        try:
            outcomes.append(w.flush(lsn))
        except BaseException as error:
            outcomes.append(error)

    leader = threading.Thread(target=flusher)
    leader.start()
    assert entered.wait(10)
    waiters = [threading.Thread(target=flusher) for _ in range(8)]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 10
    while w.stats().flush_waiting < 8 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w.stats().flush_waiting == 8
    release.set()
    for t in [leader, *waiters]:
        t.join(10)
    assert len(outcomes) == 9
    assert all(isinstance(o, LogWriteFailed) for o in outcomes), outcomes
    w.close()


def test_a_failed_rotation_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync error while sealing a full segment fails the append that rotated."""
    w = Writer.open(tmp_path, "alpha", segment_size=4096)
    w.append("x" * 3000)
    monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    with pytest.raises(LogWriteFailed):
        w.append("y" * 3000)
    with pytest.raises(LogWriteFailed):
        w.flush()
    w.close()


def test_a_partial_write_leaves_a_tail_that_reopening_repairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write fails the writer; reopening cuts the half record and keeps the rest."""
    w = Writer.open(tmp_path, "alpha")
    for i in range(3):
        w.append(i)
    w.flush()
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:10]))
    with pytest.raises(LogWriteFailed):
        w.append("torn")
    monkeypatch.undo()
    w.close()
    with Writer.open(tmp_path, "alpha") as again:
        assert again.repair is not None and again.repair.bytes_cut == 10
        assert again.append(3) == 4
    assert [r.body for r in read(tmp_path)] == [0, 1, 2, 3]


def test_closing_a_failed_writer_releases_the_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed writer closes without flushing, and the series can be reopened."""
    w = Writer.open(tmp_path, "alpha")
    w.append(1)
    monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    with pytest.raises(LogWriteFailed):
        w.flush()
    w.close()
    monkeypatch.undo()
    with Writer.open(tmp_path, "alpha") as again:
        assert again.appended_lsn == 1
