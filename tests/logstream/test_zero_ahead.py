"""Zeroing ahead: the blocks past the records are written before a record lands in
them, so a group commit's fdatasync changes no extent map (logstream/writer.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import struct
import threading
from pathlib import Path

import pytest

from logstream import LogWriteFailed, Writer, read

from .ondisk import data_end, segments

SEGMENT = 1024 * 1024
AHEAD = 256 * 1024

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_HEAD = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3
EXTENTS = 64


def unwritten(path: Path, start: int, length: int) -> list[tuple[int, int]] | None:
    """The unwritten (preallocated, never written) extents of *path* that meet
    ``[start, start+length)``, from FIEMAP; None where the file system cannot say."""
    buffer = bytearray(FIEMAP_HEAD.size + EXTENTS * FIEMAP_EXTENT.size)
    FIEMAP_HEAD.pack_into(buffer, 0, start, length, FIEMAP_FLAG_SYNC, 0, EXTENTS, 0)
    with open(path, "rb") as f:
        try:
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buffer)
        except OSError as error:
            if error.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                return None
            raise
    mapped = FIEMAP_HEAD.unpack_from(buffer, 0)[3]
    found = []
    for i in range(mapped):
        logical, _, size, _, _, flags, *_ = FIEMAP_EXTENT.unpack_from(
            buffer, FIEMAP_HEAD.size + i * FIEMAP_EXTENT.size)
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            found.append((logical, size))
    return found


def fill(w: Writer, records: int) -> None:
    """Small commits (10 KB), which are what keep the zeros ahead."""
    for i in range(records):
        w.append(b"r%06d" % i + b"x" * 1000)
        if i % 10 == 9:
            w.flush()
    w.flush()


def test_the_blocks_past_the_records_are_written_zeros(tmp_path: Path) -> None:
    """With zero_ahead, the next AHEAD bytes after the records are zeros that the file
    system holds as written; without it they are preallocated (unwritten) space."""
    with Writer.open(tmp_path / "plain", "alpha", segment_size=SEGMENT) as plain:
        fill(plain, 100)
        [path] = segments(tmp_path / "plain", "alpha")
        before = unwritten(path, data_end(path), AHEAD)
        assert before is None or before != []  # the check below can fail

    with Writer.open(tmp_path / "zeroed", "alpha", segment_size=SEGMENT,
                     zero_ahead=AHEAD) as w:
        fill(w, 100)
        assert w.wait_zeroed(30)
        [path] = segments(tmp_path / "zeroed", "alpha")
        end = data_end(path)
        with open(path, "rb") as f:
            f.seek(end)
            assert f.read(AHEAD) == bytes(AHEAD)
        assert unwritten(path, end, AHEAD // 2) in (None, [])
        assert w.stats().zero_bytes >= AHEAD


def written_bytes() -> int:
    """What this process has made dirty for the disk (/proc/self/io, a folio at a time)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


def test_a_commit_into_the_zeros_writes_only_the_pages_it_touched(tmp_path: Path) -> None:
    """The zeros are written a page at a time: written in larger pieces, the page cache
    holds them in large folios (Linux 6.16+), and each small commit then dirtied and
    wrote a whole folio of zeros (95 KB a 4 KB commit measured, not 8)."""
    with Writer.open(tmp_path, "alpha", segment_size=4 * SEGMENT, zero_ahead=AHEAD) as w:
        fill(w, 1000)  # on past the first pages, which are small folios whatever is written
        assert w.wait_zeroed(30)
        before = written_bytes()
        for i in range(200):
            w.append(b"%03d" % i)
            w.flush()
        assert written_bytes() - before <= 200 * 2 * 4096


def test_records_are_never_overwritten_by_the_zeros(tmp_path: Path) -> None:
    """Appends of every size race the zeroing thread across rotations (small steps
    ahead, small segments); every record reads back, and a copy taken while the
    writer lives (a crash) reopens with nothing to repair."""
    rng = random.Random(7)
    bodies = [rng.randbytes(rng.randrange(1, 3000)) for _ in range(3000)]
    live = tmp_path / "live"
    with Writer.open(live, "alpha", segment_size=64 * 1024, zero_ahead=8 * 1024) as w:
        for i, body in enumerate(bodies):
            if i % 7 == 0:
                w.append_batch([body])
            else:
                w.append(body)
            if i % 5 == 0:
                w.flush()
            if i == 2000:
                w.flush()
                crashed = tmp_path / "crashed"
                shutil.copytree(live, crashed)
        assert w.stats().segments_created > 10 and w.stats().zero_bytes > 0
    assert [r.body for r in read(live)] == bodies
    with Writer.open(crashed, "alpha", segment_size=64 * 1024) as again:
        assert again.repair is None
        assert again.appended_lsn == 2001
    assert [r.body for r in read(crashed)] == bodies[:2001]


def test_a_bulk_load_writes_no_zeros(tmp_path: Path) -> None:
    """Large commits convert their extents once for many records: no zeros for them."""
    with Writer.open(tmp_path, "alpha", segment_size=8 * SEGMENT, zero_ahead=AHEAD) as w:
        fill(w, 10)
        assert w.wait_zeroed(30)
        before = w.stats().zero_bytes
        for _ in range(20):
            w.append_batch([b"x" * 1000] * 200)
            w.flush()
        assert w.stats().zero_bytes == before
        fill(w, 10)  # small commits again: the zeros catch up
        assert w.wait_zeroed(30) and w.stats().zero_bytes > before


def test_close_ends_the_zeroing_thread(tmp_path: Path) -> None:
    w = Writer.open(tmp_path, "alpha", segment_size=SEGMENT, zero_ahead=AHEAD)
    fill(w, 10)
    assert any(t.name == "logstream zeroing alpha" for t in threading.enumerate())
    w.close()
    assert not any(t.name == "logstream zeroing alpha" for t in threading.enumerate())
    assert not w.wait_zeroed(0)


@pytest.mark.parametrize("call, code", [("fdatasync", errno.EIO), ("pwrite", errno.ENOSPC)])
def test_a_failed_fsync_or_write_of_the_zeros_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, code: int
) -> None:
    """The zeros' fdatasync may have lost records' pages with them (fsyncgate), and
    their pwrite fails on a full disk as a record's would: either way the writer
    fails, nothing more is appended or acknowledged, and the descriptor the zeroing
    borrowed is given back."""
    real = getattr(os, call)

    def broken(fd: int, *args: object) -> object:
        if threading.current_thread().name.startswith("logstream zeroing"):
            raise OSError(code, "simulated")
        return real(fd, *args)

    monkeypatch.setattr(os, call, broken)
    w = Writer.open(tmp_path, "alpha", segment_size=SEGMENT, zero_ahead=AHEAD)
    try:
        w.append(b"small")
        try:
            w.flush()  # a small commit: the zeros are asked for
        except LogWriteFailed:
            pass  # the zeros failed before this flush returned: the same failure
        assert not w.wait_zeroed(30)
        assert w.failure is not None and w.failure.error.errno == code
        with pytest.raises(LogWriteFailed):
            w.append(b"after")
    finally:
        w.close()
    # after close, which joins the zeroing thread: wait_zeroed returns once the failure
    # is set, which a failed fdatasync sets before the thread gives its descriptor back
    assert w._borrowed == {}


def test_a_negative_zero_ahead_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="zero_ahead"):
        Writer.open(tmp_path, "alpha", zero_ahead=-1)

