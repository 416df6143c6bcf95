"""Drop-behind: what a group commit made durable leaves the page cache."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from logstream import Writer, read
from logstream.writer import DROP_BEHIND

from .ondisk import segments

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_pages(path: Path, length: int) -> list[bool]:
    """Whether each page of the first ``length`` bytes of ``path`` is in the page cache
    (mincore of a read-only mapping, which maps without reading)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(-(-length // PAGE))
            assert _libc.mincore(address, length, vector) == 0, os.strerror(ctypes.get_errno())
            return [byte & 1 == 1 for byte in vector.raw]
        finally:
            _libc.munmap(address, length)
    finally:
        os.close(fd)


def test_a_flush_drops_the_durable_pages_but_the_one_still_written_into(tmp_path: Path) -> None:
    """After a flush only the page holding the end of the last record stays cached."""
    with Writer.open(tmp_path, "alpha", segment_size=4 << 20) as w:
        w.append(b"x" * (1 << 20))
        end = w.stats().bytes_written + 64
        assert sum(cached_pages(segments(tmp_path, "alpha")[0], end)) > 200  # just written
        w.flush()
        assert cached_pages(segments(tmp_path, "alpha")[0], end) == [False] * (end // PAGE) + [True]
        w.append(b"y" * 1000)  # the next record goes on in that page
        w.flush()
    assert [r.body[:1] for r in read(tmp_path)] == [b"x", b"y"]


def test_small_group_commits_drop_their_pages_together(tmp_path: Path) -> None:
    """Group commits of a few small records drop nothing until DROP_BEHIND bytes
    of durable pages are cached, then drop them all in one go (one fadvise for
    many commits)."""
    with Writer.open(tmp_path, "alpha", segment_size=4 << 20) as w:
        [path] = segments(tmp_path, "alpha")
        record = b"r" * 3000
        while w.stats().bytes_written + 64 + 2 * len(record) < DROP_BEHIND:
            w.append(record)
            w.flush()
        end = w.stats().bytes_written + 64
        assert all(cached_pages(path, end)[:end // PAGE])  # still cached
        while cached_pages(path, PAGE)[0]:
            w.append(record)
            w.flush()
        end = w.stats().bytes_written + 64
        assert end >= DROP_BEHIND
        assert cached_pages(path, end) == [False] * (end // PAGE) + [True]  # dropped at once


def test_sealing_drops_the_rest_of_the_segment(tmp_path: Path) -> None:
    """A sealed segment keeps no page cached, its last partial page included."""
    with Writer.open(tmp_path, "alpha", segment_size=4 << 20) as w:
        w.append(b"x" * 100_000)
    [path] = segments(tmp_path, "alpha")
    assert not any(cached_pages(path, path.stat().st_size))
