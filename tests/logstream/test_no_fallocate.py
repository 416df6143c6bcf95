"""A file system without fallocate (FUSE, some NFS servers): the writer reopens its
series after a clean stop. glibc's posix_fallocate then falls back to reading a
byte of each block and writing one where it reads a zero, so the active segment
must be open for reading as well as writing (it was write-only: EBADF)."""

from __future__ import annotations

from pathlib import Path

import pytest

import logstream
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
