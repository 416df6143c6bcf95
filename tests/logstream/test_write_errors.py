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
    """A stand-in for a sync or a write that counts its calls and raises OSError(code)."""

    def fail(*args: object) -> int:
        if calls is not None:
            calls.append(1)
        raise OSError(code, os.strerror(code))

    return fail


def test_an_fsync_error_fails_the_flush_and_everything_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After fdatasync raises EIO, flush and append raise LogWriteFailed and it is never retried."""
    w = Writer.open(tmp_path, "alpha")
    lsn = w.append("first")
    w.flush()
    w.append("second")
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", failing(errno.EIO, calls))
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
    """After os.pwrite raises ENOSPC, append and flush raise, and nothing is written or synced."""
    w = Writer.open(tmp_path, "alpha")
    w.append("kept")
    calls: list[int] = []
    monkeypatch.setattr(os, "pwrite", failing(errno.ENOSPC, calls))
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

    monkeypatch.setattr(os, "fdatasync", stuck_then_eio)
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
    w = Writer.open(tmp_path, "alpha", segment_size=4096)
    for i in range(3):
        w.append(i)
    w.flush()
    real = os.pwrite
    torn: list[bytes] = []

    def short_pwrite(fd: int, data: bytes, offset: int) -> int:
        torn.append(bytes(data)[:10])
        return real(fd, torn[-1], offset)

    monkeypatch.setattr(os, "pwrite", short_pwrite)
    with pytest.raises(LogWriteFailed):
        w.append("torn")
    monkeypatch.undo()
    w.close()
    with Writer.open(tmp_path, "alpha", segment_size=4096) as again:
        repair = again.repair
        assert repair is not None and repair.bytes_cut == 4096 - repair.offset  # zeros included
        # The ten bytes end inside the length field, whose zeros are not kept.
        assert repair.copy.read_bytes() == torn[0].rstrip(b"\0") == torn[0][:9]
        assert again.append(3) == 4
    assert [r.body for r in read(tmp_path)] == [0, 1, 2, 3]


def test_closing_a_failed_writer_releases_the_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed writer closes without flushing, and the series can be reopened."""
    w = Writer.open(tmp_path, "alpha")
    w.append(1)
    monkeypatch.setattr(os, "fdatasync", failing(errno.EIO))
    with pytest.raises(LogWriteFailed):
        w.flush()
    w.close()
    monkeypatch.undo()
    with Writer.open(tmp_path, "alpha") as again:
        assert again.appended_lsn == 1


def test_a_failed_preallocation_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC reserving the next segment fails the rotating append for good; reopening recovers."""
    w = Writer.open(tmp_path, "alpha", segment_size=4096)
    w.append("x" * 3000)
    monkeypatch.setattr(os, "posix_fallocate", failing(errno.ENOSPC))
    with pytest.raises(LogWriteFailed) as caught:
        w.append("y" * 3000)
    assert caught.value.error.errno == errno.ENOSPC
    assert caught.value.path == str(tmp_path / segment_name("alpha", 2))
    assert (w.appended_lsn, w.durable_lsn) == (1, 1)
    with pytest.raises(LogWriteFailed):
        w.append("z")
    with pytest.raises(LogWriteFailed):
        w.flush()
    w.close()
    monkeypatch.undo()
    with Writer.open(tmp_path, "alpha", segment_size=4096) as again:
        assert again.repair is None and again.append("y" * 3000) == 2
    assert [r.lsn for r in read(tmp_path)] == [1, 2]


def test_opening_fails_if_the_last_segment_cannot_be_preallocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer.open raises LogWriteFailed, for a new series or an existing one, and lets go."""
    monkeypatch.setattr(os, "posix_fallocate", failing(errno.ENOSPC))
    with pytest.raises(LogWriteFailed):
        Writer.open(tmp_path, "alpha")
    with pytest.raises(LogWriteFailed):
        Writer.open(tmp_path, "alpha")  # now the header-only segment exists
    monkeypatch.undo()
    with Writer.open(tmp_path, "alpha") as again:
        assert again.append(1) == 1


def test_a_failed_seal_at_close_is_a_write_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If cutting off the unused space fails, close raises LogWriteFailed and still lets go."""
    w = Writer.open(tmp_path, "alpha", segment_size=4096)
    w.append(1)
    monkeypatch.setattr(os, "ftruncate", failing(errno.EIO))
    with pytest.raises(LogWriteFailed) as caught:
        w.close()
    assert caught.value.error.errno == errno.EIO and w.failure is not None
    monkeypatch.undo()
    with Writer.open(tmp_path, "alpha", segment_size=4096) as again:
        assert again.appended_lsn == 1
