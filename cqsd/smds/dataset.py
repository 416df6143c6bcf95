"""One data set file, ``<data_dir>/smds/<STRUCTURE>/<CLIENT>.smds`` (in a group
``<CLIENT>.<NODE>-<N>.smds``, docs/smds.md): the storage shell.

The only module of ``cqsd.smds`` that touches files (docs/architecture.md); the formats,
the space map and the checks are the pure modules beside it, and this one
applies them in the order docs/smds.md gives:

- ``create``: a temporary file given all its space (``posix_fallocate``, zeros),
  copy A of the header (sequence 1, OPEN), fsync, rename, fsync the directory;
  so a data set file has a whole header or does not exist.
- ``open``: read and validate the header; use the saved space map only when the
  header has one, OPEN is clear and its timestamp is the caller's (the
  repository's), else say a rebuild is needed and why; then write the header
  with OPEN set and no checkpoint, fdatasync, and truncate to the extent, so a
  crash can never make a stale map look current.
- ``write``/``read``: positioned I/O of message blocks (``pwritev`` of prefixes and
  slices of the payload, a run of consecutive blocks at a time; ``preadv`` into
  pool buffers), every block checked by ``DataMap.assemble`` before a byte is
  returned. The blocks of a message an fdatasync will soon follow have their
  disk writes started at once (``posix_fadvise`` DONTNEED, on Linux the start
  of writeback for dirty pages), so that the group commit's fdatasync waits for
  the rest rather than all of it, and a commit's data sets are written together
  rather than one fdatasync after another (benchmarks/README.md, "Writeback
  started with the write").
- ``expand``: 20% more, up to ``dsmax``; a refusal is ``ExpandFailed`` by name.
  Its I/O (``extend``) may run in a worker thread while the loop goes on
  writing inside the current extent; ``grew`` then makes the new size current.
- ``close``: the space map after the extent, fdatasync, the header naming it
  with OPEN clear, fdatasync.
- ``inherit``: in a group, another incarnation's data set opened read-only:
  its messages are read, nothing is ever written to it (docs/smds.md, "In a
  group of daemons").

Write errors are sticky, as the log's (docs/logstream.md): once a write or fdatasync fails, every
later write, sync, expansion and close raises the same ``WriteFailed``. The
methods block; the daemon calls them from a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from logstream.durable import TEMP_SUFFIX, fsync_dir, make_dirs

from .bufferpool import Buffer, BufferPool, Held
from .datamap import Block, DataMap, dataset_name
from .errors import (
    BadPrefix,
    BadSpaceMap,
    ExpandFailed,
    ReadFailed,
    ShortDataSet,
    SmdsError,
    WriteFailed,
)
from .header import OPEN, PARTIAL_RECOVERY, Header, pack_header, read_header, validate
from .pages import PAGE, PREFIX, Range
from .spacemap import SpaceMap, expanded_size, whole_blocks

SUFFIX = ".smds"
# Buffers one positioned write gathers at most: half of Linux's IOV_MAX (1,024), so a
# 100 MiB message in 8 KiB blocks (25,600 buffers) is written in runs the kernel takes.
RUN_PARTS = 512
# Linux starts writeback of a range's dirty pages for DONTNEED (mm/fadvise.c) and
# drops only its clean ones; elsewhere there is no such call, or it does nothing.
START_WRITEBACK = getattr(os, "POSIX_FADV_DONTNEED", None)
T = TypeVar("T")


def path_of(data_dir: str | os.PathLike[str], structure: str, owner: str,
            writer: str | None = None) -> Path:
    """Where the data set of (``structure``, ``owner``) lives, in a group the one
    incarnation ``writer`` of a node put in (docs/smds.md)."""
    return Path(data_dir) / "smds" / structure / f"{dataset_name(owner, writer)}{SUFFIX}"


def extent(data_dir: str | os.PathLike[str], structure: str, owner: str, dsblock: int) -> int:
    """The size of a data set that is not open, for the displays: the extent its header
    records, or with no header to trust the whole blocks its file holds; 0 with no
    file. Reads two pages and writes nothing."""
    path = path_of(data_dir, structure, owner)
    try:
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            try:
                return read_header(f.read(2 * PAGE)).size
            except SmdsError:
                return length // dsblock * dsblock
    except OSError:
        return 0


class DataSet:
    """A data set open for update. ``space`` is its space map: loaded, new, or None
    until the caller rebuilds it (``rebuild_reason`` says why one is needed)."""

    def __init__(self, path: Path, fd: int, header: Header, pool: BufferPool | None,
                 inherited: bool = False) -> None:
        self.path = path
        self.name = path.name.removesuffix(SUFFIX)  # the data set's name in its structure
        self._fd: int | None = fd
        self.header = header
        self.pool = pool
        self.space: SpaceMap | None = None
        self.rebuild_reason: str | None = None
        self.failure: WriteFailed | None = None
        self.inherited = inherited  # read-only: another incarnation's (``inherit``)
        self._fd_lock = threading.Lock()  # ``extend`` in a worker thread against ``abandon``
        self._extending = False

    def __repr__(self) -> str:
        return f"DataSet({str(self.path)!r}, size={self.size}, failure={self.failure})"

    @property
    def structure(self) -> str:
        return self.header.structure

    @property
    def owner(self) -> str:
        return self.header.owner

    @property
    def size(self) -> int:
        return self.header.size

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        return self._fd

    # -- create and open -------------------------------------------------------------

    @classmethod
    def create(cls, data_dir: str | os.PathLike[str], structure: str, owner: str, *,
               dsblock: int, dssize: int, pool: BufferPool | None = None,
               replace: bool = False, writer: str | None = None) -> DataSet:
        """Format a new data set of ``dssize`` rounded up to whole blocks, open for
        update with an empty space map. Raises FileExistsError if the file exists
        and not ``replace`` (a NEW or EMPTY data set is formatted over), OSError
        when the space or the file cannot be had, ValueError for a bad name."""
        path = path_of(data_dir, structure, owner, writer)
        if path.exists() and not replace:
            raise FileExistsError(f"{path} already exists")
        size = whole_blocks(dssize, dsblock)
        now = time.time_ns()
        header = Header(structure, owner, dsblock, size, created=now, updated=now)
        page = pack_header(header)  # a bad name fails here, before any file exists
        make_dirs(path.parent)
        temp = path.with_name(path.name + TEMP_SUFFIX)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # left by a crash during an earlier create
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            _pwrite_all(fd, [page], 0)
            os.fsync(fd)
            os.rename(temp, path)
            fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        dataset = cls(path, fd, header, pool)
        dataset.space = SpaceMap(dsblock, size)
        return dataset

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], structure: str, owner: str, *,
             map_time: int | None, created: int | None = None, recovering: bool = False,
             pool: BufferPool | None = None, writer: str | None = None) -> DataSet:
        """Open the data set for update (docs/smds.md, "Restart processing" 1, 3, 5).

        ``map_time`` is the space-map timestamp the repository holds (None if
        none); ``created`` the identity it recorded when the data set became
        ACTIVE. Raises FileNotFoundError, or the header's named damage
        (Unformatted, ShortDataSet, ForeignHeader, TornHeader, UnsupportedVersion,
        Recreated, IncompleteRecovery) or ReadFailed, with nothing written;
        WriteFailed if the header update fails.

        A file shorter than the extent its header records is a smaller copy of
        the data set (seed 000, "Data set needs to be moved or reallocated"): it
        is taken at the whole blocks it holds, and a rebuild of its space map
        (``rebuild_reason`` ``smaller-copy``) must show that no block in use lay
        beyond them. Fewer than two blocks is ShortDataSet.
        """
        path = path_of(data_dir, structure, owner, writer)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            header = read_header(_pread(fd, 2 * PAGE, 0, path))
            validate(header, structure=structure, owner=owner, created=created,
                     recovering=recovering)
            extent = os.fstat(fd).st_size // header.dsblock * header.dsblock
            if extent < 2 * header.dsblock:
                raise ShortDataSet("short", f"{path} holds {extent // header.dsblock} whole "
                                            f"blocks, fewer than the two a data set needs")
            dataset = cls(path, fd, header, pool)
            if extent < header.size:  # a smaller copy (seed 000, "moved or reallocated")
                dataset.rebuild_reason = "smaller-copy"
            else:
                dataset.space, dataset.rebuild_reason = dataset._saved_map(map_time)
            dataset._write_header(header.next(flags=header.flags | OPEN, updated=time.time_ns(),
                                              size=min(extent, header.size),
                                              map_page=0, map_pages=0, map_time=0))
            dataset._guard("write", lambda: os.ftruncate(fd, dataset.size))
            dataset.sync()
        except BaseException:
            os.close(fd)
            raise
        return dataset

    @classmethod
    def inherit(cls, data_dir: str | os.PathLike[str], structure: str, owner: str, writer: str,
                *, created: int | None = None, pool: BufferPool | None = None) -> DataSet:
        """Open another incarnation's data set read-only (docs/smds.md, "In a group of
        daemons"): the header read and validated, nothing written, no saved map
        used; the caller rebuilds the space map from the entries naming it, to
        know when the last is gone. A file shorter than its extent is taken at
        its whole blocks, as ``open`` takes it. Raises what ``open`` raises, but
        never WriteFailed."""
        path = path_of(data_dir, structure, owner, writer)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            header = read_header(_pread(fd, 2 * PAGE, 0, path))
            validate(header, structure=structure, owner=owner, created=created)
            extent = os.fstat(fd).st_size // header.dsblock * header.dsblock
            if extent < 2 * header.dsblock:
                raise ShortDataSet("short", f"{path} holds {extent // header.dsblock} whole "
                                            f"blocks, fewer than the two a data set needs")
        except BaseException:
            os.close(fd)
            raise
        dataset = cls(path, fd, dataclasses.replace(header, size=min(extent, header.size)), pool,
                      inherited=True)
        dataset.rebuild_reason = "inherited"
        return dataset

    def _saved_map(self, map_time: int | None) -> tuple[SpaceMap | None, str | None]:
        """(the saved space map, None) when it may be used, else (None, why not)."""
        h = self.header
        if not h.map_page:
            return None, "no-map"
        if h.is_open:
            return None, "not-closed"
        if map_time != h.map_time:
            return None, "timestamp"
        raw = _pread(self.fd, h.map_pages * PAGE, h.map_page * PAGE, self.path)
        try:
            space, saved = SpaceMap.from_bytes(raw, h.dsblock, h.size)
        except BadSpaceMap as bad:
            return None, bad.reason
        return (space, None) if saved == h.map_time else (None, "timestamp")

    # -- writing ---------------------------------------------------------------------

    def write(self, blocks: Iterable[Block], synced: bool = False) -> None:
        """Write message blocks (``DataMap.blocks``) where they belong, prefix and
        payload slice together, one positioned write for each run of blocks that
        follow each other on disk (a 1 MiB message in consecutive 256 KiB blocks:
        one ``pwritev``, not five). Not durable until ``sync``; ``synced``: one
        will follow soon, so the disk starts on them now (the module note).
        Raises WriteFailed (sticky)."""
        self._check()
        runs: list[tuple[int, list[bytes | memoryview]]] = []
        ends: list[int] = []  # where each run ends
        written = []
        for position, prefix, data in blocks:
            pages = -(-(len(prefix) + len(data)) // PAGE)
            written.append(Range(position // PAGE, pages))
            if not ends or position != ends[-1] or len(runs[-1][1]) >= RUN_PARTS:
                runs.append((position, []))
                ends.append(position)
            runs[-1][1].extend((prefix, data))
            ends[-1] = position + len(prefix) + len(data)
        if self.pool is not None:
            self.pool.invalidate(self.name, written)
        for position, parts in runs:
            self._guard("write", functools.partial(_pwrite_all, self.fd, parts, position))
        if synced and START_WRITEBACK is not None:
            for (position, _), end in zip(runs, ends, strict=True):
                with contextlib.suppress(OSError):  # a hint: the fdatasync decides
                    os.posix_fadvise(self.fd, position, end - position, START_WRITEBACK)

    def write_message(self, datamap: DataMap, entry_id: int, payload: bytes | memoryview,
                      synced: bool = False) -> None:
        """Write every block of ``payload`` stored by ``datamap`` for entry ``entry_id``
        (``synced``: as for ``write``); the pool holds the blocks of a ``bytes`` payload
        (one that cannot change)."""
        blocks = datamap.blocks(entry_id, payload)
        self.write(blocks, synced)
        if self.pool is not None and type(payload) is bytes:
            offset = 0  # the blocks cut the payload in order
            for position, prefix, data in blocks:
                self.pool.hold((self.name, position // PAGE), len(prefix) + len(data),
                               Held(entry_id, offset, data))
                offset += len(data)

    def sync(self) -> None:
        """fdatasync: every write so far is on disk. Raises WriteFailed (sticky)."""
        self._check()
        self._guard("sync", lambda: os.fdatasync(self.fd))

    # -- reading ---------------------------------------------------------------------

    def read(self, datamap: DataMap, entry_id: int) -> bytes:
        """The payload of entry ``entry_id``, once every block's prefix and CRC and the
        whole payload's CRC are right. Blocks come from the pool when it holds
        them; blocks it holds as written need no checks. Raises BadPrefix (nothing
        returned), ReadFailed."""
        leases: list[Buffer] = []
        reads: list[memoryview | Held] = []
        try:
            for (page, _), offset, nbytes in datamap.pieces():
                reads.append(self._read_block(page * PAGE, PREFIX + nbytes, leases,
                                              (entry_id, offset)))
            try:
                return datamap.assemble(entry_id, reads)
            except BadPrefix:
                for buffer in leases:  # bytes that failed their checks are not kept
                    self._release(buffer, keep=False)
                leases.clear()
                raise
        finally:
            reads.clear()  # views of pool buffers go before the buffers are reused
            for buffer in leases:
                self._release(buffer)

    def read_raw(self, position: int, nbytes: int) -> bytes:
        """``nbytes`` at ``position``, or fewer at the end of the file (the down-level
        check reads a first block this way). Raises ReadFailed."""
        return bytes(self._read_into(bytearray(nbytes), position))

    def _read_block(self, position: int, nbytes: int, leases: list[Buffer],
                    piece: tuple[int, int]) -> memoryview | Held:
        """The block at ``position`` (``nbytes`` with its prefix), from the pool if it
        is there: as read, or as written for ``piece`` (entry id, payload offset)."""
        pool = self.pool
        if pool is None:
            return self._read_into(bytearray(nbytes), position)
        key = (self.name, position // PAGE)
        buffer = pool.lookup(key, nbytes)
        if buffer is not None:
            leases.append(buffer)
            held = buffer.held
            if held is None:
                return buffer.view()[:nbytes]
            if held[:2] == piece and len(held.data) + PREFIX == nbytes:
                return held
            leases.pop()  # not this piece as written: the disk and its checks decide
            self._release(buffer, keep=False)
        buffer = pool.take()
        if buffer is None:  # every buffer in use (a wait): read into memory of our own
            return self._read_into(bytearray(nbytes), position)
        leases.append(buffer)
        got = self._read_into(buffer.memory, position, nbytes)
        if len(got) == nbytes:  # a short block is not worth keeping
            pool.fill(buffer, key, nbytes)
        return got

    def _read_into(self, memory: bytearray, position: int, nbytes: int | None = None) -> memoryview:
        view = memoryview(memory)[:len(memory) if nbytes is None else nbytes]
        return _read_at(self.fd, view, position, self.path)

    def _release(self, buffer: Buffer, *, keep: bool = True) -> None:
        assert self.pool is not None
        self.pool.release(buffer, keep=keep)

    # -- expansion -------------------------------------------------------------------

    def expand(self, dsmax: int) -> int:
        """Grow the data set by 20% (whole blocks, at least one, up to ``dsmax``): the
        new extent given its space and fsynced, then the header naming it, then
        the space map grown. Returns the new size.

        Raises ExpandFailed (``at-dsmax``, or the errno's name such as ``ENOSPC``;
        header and map unchanged), WriteFailed if the header update fails.
        """
        self._check()
        new = expanded_size(self.size, self.header.dsblock, dsmax)
        if new is None:
            raise ExpandFailed("at-dsmax", f"{self.path} is {self.size} bytes, dsmax {dsmax}",
                               size=self.size, dsmax=dsmax)
        self.grew(self.extend(new, dsmax))
        return new

    def extend(self, new: int, dsmax: int) -> Header:
        """The I/O of an expansion to ``new`` bytes: the new extent given its space
        (``posix_fallocate``, zeros) and fsynced, then the header naming it written
        and fdatasynced. Returns that header without making it current: ``grew``
        does, with the space map, once this has returned, so nothing sees pages
        that are not yet durable. Made to run in a worker thread while the loop
        writes and reads blocks inside the current extent; the file stays open
        until it returns, even if ``abandon`` is called meanwhile.

        Raises ExpandFailed (the errno's name; file and header as they were),
        WriteFailed if the header update fails, ValueError if closed already.
        """
        with self._fd_lock:
            self._check()
            fd = self.fd
            self._extending = True
        try:
            try:
                os.ftruncate(fd, self.size)  # bytes past the extent must read as zeros
                os.posix_fallocate(fd, self.size, new - self.size)
                os.fsync(fd)
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self.size)  # give back what was had
                reason = errno.errorcode.get(error.errno or 0, "EIO")
                raise ExpandFailed(reason, f"{self.path} from {self.size} to {new} bytes: "
                                           f"{error.strerror}", size=self.size,
                                   dsmax=dsmax) from error
            header = self.header.next(size=new, updated=time.time_ns())
            self._put_header(fd, header)
            return header
        finally:
            with self._fd_lock:
                self._extending = False
                if self._fd is None:  # abandoned meanwhile: closed now that it is unused
                    os.close(fd)

    def grew(self, header: Header) -> None:
        """An expansion ``extend`` made durable: its header current, the space map
        grown to its size."""
        self.header = header
        if self.space is not None:
            self.space.grow(header.size)

    # -- media recovery --------------------------------------------------------------

    def mark_recovery(self, partial: bool) -> None:
        """Set (recovery starts writing blocks) or clear (every block is back and
        synced) PARTIAL_RECOVERY in the header: an open outside recovery refuses a
        data set whose recovery did not finish (seed 000). Raises WriteFailed."""
        self._check()
        flags = self.header.flags | PARTIAL_RECOVERY if partial else \
            self.header.flags & ~PARTIAL_RECOVERY
        self._write_header(self.header.next(flags=flags, updated=time.time_ns()))

    def grow_to(self, nbytes: int) -> None:
        """Expand until the extent holds ``nbytes`` (recovery writing blocks a smaller
        data set has no room for). Raises ExpandFailed, WriteFailed."""
        while self.size < nbytes:
            self.expand(max(nbytes, self.size + self.header.dsblock))

    # -- closing ---------------------------------------------------------------------

    def close(self) -> int:
        """Clean close: the space map saved after the extent, fdatasync, the header
        naming it with OPEN clear, fdatasync, the file closed. Returns the map's
        timestamp, for the repository. Raises ValueError without a space map,
        WriteFailed (the header stays OPEN: the next open rebuilds)."""
        self._check()
        if self.space is None:
            raise ValueError(f"{self.path}: close needs the space map (rebuild it first)")
        stamp = time.time_ns()
        saved = self.space.to_bytes(stamp)
        saved += bytes(-len(saved) % PAGE)
        self._guard("write", lambda: _pwrite_all(self.fd, [saved], self.size))
        self.sync()
        self._write_header(self.header.next(flags=self.header.flags & ~OPEN, updated=stamp,
                                            map_page=self.size // PAGE,
                                            map_pages=len(saved) // PAGE, map_time=stamp))
        self.abandon()
        return stamp

    def abandon(self) -> None:
        """Close the file without a clean close (after a failure, or at a crash in
        tests): the header stays as it is on disk. During an ``extend`` in another
        thread the descriptor is closed when it returns, never under it."""
        with self._fd_lock:
            fd, self._fd = self._fd, None
            if fd is not None and not self._extending:
                os.close(fd)

    # -- inside ----------------------------------------------------------------------

    def _write_header(self, header: Header) -> None:
        """Write ``header`` over the copy not in force and fdatasync (docs/smds.md)."""
        self._put_header(self.fd, header)
        self.header = header

    def _put_header(self, fd: int, header: Header) -> None:
        page = pack_header(header)
        self._guard("write", lambda: _pwrite_all(fd, [page], header.copy * PAGE))
        self._guard("sync", lambda: os.fdatasync(fd))

    def _check(self) -> None:
        if self.inherited:  # a bug: the rule of docs/smds.md, "In a group of daemons"
            raise ValueError(f"{self.path} is another incarnation's: never written")
        if self.failure is not None:
            raise self.failure

    def _guard(self, reason: str, act: Callable[[], T]) -> T:
        """Run ``act``; an OSError becomes the sticky WriteFailed."""
        try:
            return act()
        except OSError as error:
            self.failure = WriteFailed(reason, f"{self.path}: {error.strerror}", error.errno)
            raise self.failure from error


def _read_at(fd: int, view: memoryview, position: int, path: Path) -> memoryview:
    """Read into ``view`` at ``position``; what was read, short only at the end of the
    file. Raises ReadFailed."""
    done = 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], position + done)
        except OSError as error:
            raise ReadFailed("read", f"{path} at byte {position + done}: {error.strerror}",
                             error.errno) from error
        if not got:
            break
        done += got
    return view[:done]


def _pread(fd: int, nbytes: int, position: int, path: Path) -> bytes:
    """Up to ``nbytes`` at ``position``; fewer only at the end of the file."""
    return bytes(_read_at(fd, memoryview(bytearray(nbytes)), position, path))


def _pwrite_all(fd: int, parts: list[bytes | memoryview], position: int) -> None:
    """Write ``parts`` one after another at ``position``; a short write is continued."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        written = os.pwritev(fd, views, position)
        if written <= 0:
            raise OSError(errno.ENOSPC, "pwritev wrote nothing")
        position += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
