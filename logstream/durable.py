"""Making files and directory entries durable: the only fsync recipes we use.

A new file is written under a temporary name, fsynced, renamed into place and
its directory fsynced; so after a crash it either exists whole or not at all,
and a reader never has to guess whether a half-written header is damage.

Every function takes the fsync to call, so a writer can count its fsyncs and
tests can make them fail; it defaults to `os.fsync` looked up at call time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

Fsync = Callable[[int], None]

TEMP_SUFFIX = ".tmp"
# No O_APPEND: Linux's pwrite ignores its offset on an O_APPEND descriptor. Read-write:
# where the file system has no fallocate, glibc's posix_fallocate reads a byte of each
# block the file already has (EBADF on a write-only descriptor), so the fd a new
# segment is preallocated through must read as well as the one a reopen gets.
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _fsync_of(fsync: Fsync | None) -> Fsync:
    return os.fsync if fsync is None else fsync


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data`; a short write is continued, not ignored."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # a regular file says ENOSPC rather than 0; be safe anyway
            raise OSError(28, "write wrote nothing")
        view = view[written:]


def replace_file(path: Path, data: bytes, mode: int = 0o644,
                 fsync: Fsync | None = None) -> None:
    """Replace the file at `path` with `data` durably and atomically: written under a
    temporary name, fsynced, renamed over it, its directory fsynced."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        _fsync_of(fsync)(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_dir(path.parent, fsync)


def fsync_dir(path: str | os.PathLike[str], fsync: Fsync | None = None) -> None:
    """Make the entries of directory `path` (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _fsync_of(fsync)(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, fsync: Fsync | None = None) -> None:
    """Create `path` and missing parents, fsyncing each parent that gained an entry."""
    if path.is_dir():
        return
    make_dirs(path.parent, fsync)
    try:
        os.mkdir(path)
    except FileExistsError:
        if path.is_dir():
            return  # another process made it; its creator makes it durable
        raise
    fsync_dir(path.parent, fsync)


def create_file(path: Path, data: bytes, fsync: Fsync | None = None) -> int:
    """Durably create `path` holding `data`; return an fd open for reading and writing,
    at its end.

    Raises FileExistsError if `path` exists: we never replace a log file.
    """
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    sync = _fsync_of(fsync)
    temp = path.with_name(path.name + TEMP_SUFFIX)
    # Callers hold the series lock, so a temp file here is left by a crash.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    fd = os.open(temp, _CREATE, 0o644)
    try:
        write_all(fd, data)
        sync(fd)
        os.rename(temp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    try:
        fsync_dir(path.parent, sync)
    except BaseException:
        os.close(fd)
        raise
    return fd

