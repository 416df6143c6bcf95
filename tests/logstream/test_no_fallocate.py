"""A file system without fallocate (FUSE, some NFS servers): the writer reopens its
series after a clean stop. glibc's posix_fallocate then falls back to reading a
byte of each block and writing one where it reads a zero, so the active segment
must be open for reading as well as writing (it was write-only: EBADF)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import logstream
from logstream import durable, segment
from tests.faults.lazyfs import LazyFS

SEGMENT = 64 * 1024


@pytest.fixture
def lazy(tmp_path: Path):
    with LazyFS(tmp_path / "backing", tmp_path / "mnt") as fs:
        yield fs


def test_a_series_reopens_after_a_clean_stop_where_fallocate_is_unsupported(lazy) -> None:
    """Closed cleanly (cut back to its records), reopened: preallocation reads the file."""
    directory = lazy.mountpoint / "logstream"
    with logstream.Writer.open(directory, "node1", segment_size=SEGMENT) as w:
        for i in range(5):
            w.append({"i": i, "pad": "p" * 3000})
        w.flush()
    with logstream.Writer.open(directory, "node1", segment_size=SEGMENT) as again:
        assert again.append({"i": 5}) == 6
        again.flush()
    lazy.drop()  # everything flushed is on the disk: nothing the reopen did is lost
    assert [r.body["i"] for r in logstream.read(directory)] == [0, 1, 2, 3, 4, 5]


def test_a_series_reopens_after_a_crash_while_a_new_segment_was_preallocated(lazy) -> None:
    """A crash (and a power cut) while glibc's fallback was writing a byte per block of
    a new segment: the next open takes the half-preallocated segment as the active
    one, finishes its preallocation (reading the blocks it already has) and appends."""
    directory = lazy.mountpoint / "logstream"
    w = logstream.Writer.open(directory, "node1", segment_size=SEGMENT)
    for i in range(30):  # past one segment: the series rotated at least once
        w.append({"i": i, "pad": "p" * 3000})
    w.flush()
    w.append({"i": 30, "pad": "p" * 60_000})  # rotates: a new segment, preallocated
    w.flush()
    last = sorted(directory.glob("node1.*.seg"))[-1]
    follows = int(last.name.split(".")[1]) + 1  # the LSN after the record in it
    w.close()
    crashed = directory / segment.segment_name("node1", follows)
    fd = durable.create_file(crashed, segment.encode_header("node1", follows))
    for offset in range(4095, SEGMENT // 2, 4096):  # the fallback, cut half-way
        os.pwrite(fd, b"\0", offset)
    os.close(fd)
    assert 64 < crashed.stat().st_size < SEGMENT
    lazy.drop(keep=4)  # and the power cut: some of those pages reached the disk
    with logstream.Writer.open(directory, "node1", segment_size=SEGMENT) as again:
        assert again.append({"i": 31}) == follows
        again.flush()
    lazy.drop()
    assert [r.body["i"] for r in logstream.read(directory)] == list(range(32))
