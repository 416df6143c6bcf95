"""One writer's series: cheap appends, group-committed flushes, sticky failure.

Design note. The daemon appends from its event-loop thread and flushes from
worker threads, so the two paths share as little as possible:

- `_lock` guards the active file, its size and the appended LSN. `append` holds
  it for one `os.pwrite`, so a record is whole in the file before its LSN counts
  as appended, and a flush that snapshots the appended LSN under `_lock` knows
  the file holds everything up to it.
- `_sync` (a Condition) guards the durable LSN, the "an fsync is running" flag
  and the failure. At most one fsync runs at a time; callers arriving meanwhile
  wait on `_sync`, and when it ends one of them leads the next fsync, which
  covers every record appended before it started: that is the group commit.
- The leader fsyncs the active fd borrowed (`_borrow`): a rotation meanwhile
  retires that fd rather than close it, and the last borrower closes it, so an
  fsync never lands on a reused descriptor. (A dup and a close around each
  fsync did the same for two system calls a group commit.)
- Lock order is `_lock` then `_sync`; the leader never holds both.

Preallocation. A segment gets all of its `segment_size` (posix_fallocate,
then fsync) when it becomes active, and each record is written into that
space with pwrite at the writer's own offset `_size` (the fd has no O_APPEND,
which would make Linux's pwrite ignore the offset). Appends then never change
the file's size, so a group commit is an fdatasync with no inode update to
journal (~110 µs instead of ~160 µs measured on ext4). Sealing a segment
(rotation, close) cuts it back to its records, so only a writer that crashed
leaves a zero tail, which scans read as a clean end.

Zeroing ahead. Preallocated space is unwritten extents: the file system
knows it reads as zeros, so the first record written into a block changes the
extent map, and the group commit's fdatasync then writes the inode as well as
the records: two writes and a cache flush instead of one write and the flush.
On ext4 (2-core VM) that was a p50 of ~217 µs a commit against ~143 µs into
blocks already written (benchmarks/zero_ahead.py), and perf found the inode
write in 15% of the daemon's fsync time. A writer opened with `zero_ahead`
keeps that many bytes past its records written with zeros (and made durable)
by a thread of its own, as PostgreSQL zero-fills a WAL segment before using
it, so a commit finds its blocks written.
The thread writes under `_lock`, a ZERO_STEP at a time and a page per pwrite
(a larger write gets large folios, and a commit into one writes all of it),
never below the records' end, so a record is never overwritten; its fdatasync
runs outside the lock on the fd borrowed, like a group commit's. The zeros stay
in the page cache (drop-behind only drops pages below the records), so an
append into them never reads the disk. Only a small group commit (under
ZERO_COMMIT bytes) asks for more zeros: a large one converts its extents once for many records,
and zeros written ahead of a bulk load only doubled its writes. A crash leaves
zeros after the records, which scans read as a clean end, as they read
preallocated space.

Drop-behind. Once a group commit has made a range durable, the writer advises
the kernel to drop its pages from the page cache (POSIX_FADV_DONTNEED, as
PostgreSQL does for a WAL segment it closes: nothing reads them back in normal
operation). The log's pages then stay a few group commits' worth (a drop waits
until DROP_BEHIND bytes of durable pages are cached: small group commits would
each pay an fadvise, ~8 µs, for a page or two), and the next appends get pages
just freed instead of fresh ones. Fresh page-cache pages are
what made a 1 MiB append expensive: 1.0-2.5 ms measured on a 2-core VM against
0.15-0.17 ms when durable pages are dropped (pwrite of 1 MiB + fdatasync, in a
loop). A reader (recovery, a checkpoint job) reads the disk instead of the
cache, which is where it would find a log older than the cache anyway.

Failure is sticky (fsyncgate): after a failed write or fsync the dirty pages
may be gone while a retried fsync reports success, so nothing is retried and
every later append and flush raises LogWriteFailed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import itertools
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from . import durable, record, segment
from .errors import CorruptLog, Damage, LogstreamError, LogWriteFailed, WriterBusy
from .repair import Repair, cut_tail
from .scan import scan_to_end
from .series import SegmentFile, bytes_between, list_segments, read_header
from .trim import trim

DEFAULT_SEGMENT_SIZE: Final = 64 * 1024 * 1024
PAGE: Final = 4096  # drop-behind leaves the page an append may still write into
DROP_BEHIND: Final = 16 * PAGE  # durable bytes cached before a flush drops them (see the note)
# Below this a configuration typo (64 meaning MiB) would make a file per record.
MIN_SEGMENT_SIZE: Final = 4096
ZERO_COMMIT: Final = 64 * 1024  # commits of fewer bytes keep the zeros ahead of the records
ZERO_STEP: Final = 64 * 1024  # zeros written under `_lock` at once (16 pages) while appends wait
_ZEROS: Final = bytes(PAGE)


@dataclasses.dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters for tests and benchmarks; `fsyncs` counts every fsync and fdatasync call."""

    appended_lsn: int
    durable_lsn: int
    records: int  # appended since open
    bytes_written: int  # record bytes written since open
    fsyncs: int  # group commits, preallocations, seals, directories, open
    group_commits: int  # fsyncs issued on behalf of flush callers
    flushes: int  # flush calls
    flush_waiting: int  # flush callers waiting for someone else's fsync right now
    segments_created: int
    zero_bytes: int  # bytes written with zeros ahead of the records (zero_ahead)
    failed: bool

    def __reduce__(self) -> tuple[type[WriterStats], tuple[Any, ...]]:
        # Pickled (and copied) through __init__, as record.Record is, for the same reason.
        return (WriterStats, tuple(getattr(self, field.name) for field in dataclasses.fields(self)))


class Writer:
    """Appends records to one writer's series. Create with `Writer.open`."""

    def __init__(self, directory: Path, writer_id: str, segment_size: int, zero_ahead: int = 0):
        self.directory = directory
        self.writer_id = writer_id
        self.segment_size = segment_size
        self.zero_ahead = zero_ahead
        self.repair: Repair | None = None
        self._lock = threading.Lock()
        # held with ``with self._sync_lock`` (C calls), not through the Condition's
        # interpreted __enter__ and __exit__: every group commit takes it
        self._sync_lock = threading.Lock()
        self._sync = threading.Condition(self._sync_lock)
        self._count_lock = threading.Lock()
        self._lock_fd = -1
        self._fd = -1
        self._borrowed: dict[int, int] = {}  # fd -> fsyncs using it outside `_lock`
        self._path = directory
        self._size = 0
        self._zeroed = 0  # the active segment is written (records or zeros) up to here
        self._committed_bytes = 0  # `_bytes` at the last group commit
        self._zero_wanted = threading.Event()
        self._zeroer: threading.Thread | None = None
        self._zeros_synced = threading.Condition(threading.Lock())
        self._zeros_durable: tuple[Path, int] = (directory, 0)  # a segment, zeroed and durable to
        self._cached_from = 0  # the active segment's pages before this are dropped (drop-behind)
        self._appended_lsn = 0
        self._durable_lsn = 0
        self._last_timestamp = 0
        self._syncing = False
        self._failure: LogWriteFailed | None = None
        self._closed = False
        self._records = self._bytes = self._fsyncs = self._group_commits = 0
        self._flushes = self._waiting = self._segments_created = self._zero_bytes = 0

    # -- opening ----------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        writer_id: str,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        repair: bool = True,
        verify: bool = False,
        zero_ahead: int = 0,
    ) -> Writer:
        """Open (or start) `writer_id`'s series in `directory`, creating the directory.

        Scans the last segment, repairs a torn tail there (or raises TornTail if
        `repair` is false), and with `verify` also scans every earlier segment.
        With `zero_ahead` (bytes), a thread keeps that much of the segment past
        the records written with zeros (see the design note).
        Raises ValueError for a bad id or size, WriterBusy if the series is open
        elsewhere, CorruptLog for corruption, LogWriteFailed if preallocating
        or an fsync fails.
        """
        segment.check_writer_id(writer_id)
        if segment_size < MIN_SEGMENT_SIZE:
            raise ValueError(f"segment_size {segment_size} is below {MIN_SEGMENT_SIZE}")
        if zero_ahead < 0:
            raise ValueError(f"zero_ahead {zero_ahead} is below 0")
        self = cls(Path(directory), writer_id, segment_size, zero_ahead)
        try:
            durable.make_dirs(self.directory, self._fsync)
            self._take_lock()
            self._recover(repair=repair, verify=verify)
        except BaseException:
            self._close_files()
            raise
        if zero_ahead:
            self._zeroer = threading.Thread(target=self._zero_loop, daemon=True,
                                            name=f"logstream zeroing {writer_id}")
            self._zeroer.start()
        return self

    def _take_lock(self) -> None:
        path = self.directory / segment.lock_name(self.writer_id)
        self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WriterBusy(f"{path}: writer {self.writer_id!r} is already open") from None

    def _remove_stale_temps(self) -> None:
        for name in os.listdir(self.directory):
            if name.endswith(durable.TEMP_SUFFIX):
                parsed = segment.parse_segment_name(name[: -len(durable.TEMP_SUFFIX)])
                if parsed is not None and parsed[0] == self.writer_id:
                    os.unlink(self.directory / name)

    def _recover(self, *, repair: bool, verify: bool) -> None:
        self._remove_stale_temps()
        segments = list_segments(self.directory, self.writer_id)
        if not segments:
            self._start_segment(1)
            return
        for seg in segments:
            read_header(seg)
        if verify:
            _verify_complete(segments)
        last = segments[-1]
        scan = scan_to_end(last, last=True)
        if scan.torn is not None:
            if not repair:
                raise scan.torn
            self.repair = cut_tail(scan.torn, self._fsync)
        self._last_timestamp = scan.last_timestamp or 0
        if scan.last_timestamp is None and len(segments) > 1:
            # An empty last segment: timestamps continue from the one before.
            before = scan_to_end(segments[-2], last=False)
            _check_follows(before.next_lsn, last)
            self._last_timestamp = before.last_timestamp or 0
        # Read-write: where the file system has no fallocate, glibc's posix_fallocate
        # reads a byte of each block to find the holes (EBADF on a write-only fd).
        self._fd = os.open(last.path, os.O_RDWR | os.O_CLOEXEC)
        self._path, self._size, self._zeroed = last.path, scan.end_offset, 0
        self._appended_lsn = self._durable_lsn = scan.next_lsn - 1
        # Its fsync also makes durable what a crashed process left in the page cache.
        self._preallocate()

    def _start_segment(self, first_lsn: int) -> None:
        """Durably create the segment starting at `first_lsn` and make it active."""
        path = self.directory / segment.segment_name(self.writer_id, first_lsn)
        header = segment.encode_header(self.writer_id, first_lsn)
        try:
            fd = durable.create_file(path, header, self._fsync)
        except OSError as error:
            raise self._fail(path, error) from error
        old, self._fd, self._path, self._size = self._fd, fd, path, segment.HEADER_SIZE
        self._cached_from = self._zeroed = 0
        self._segments_created += 1
        self._retire(old)
        self._preallocate()

    def _preallocate(self) -> None:
        """Durably give the active segment `segment_size` bytes, unless it has them.

        Where there is no posix_fallocate (macOS), segments grow as they did
        before preallocation, which the format allows as well.
        """
        try:
            if hasattr(os, "posix_fallocate") and os.fstat(self._fd).st_size < self.segment_size:
                os.posix_fallocate(self._fd, 0, self.segment_size)
            self._fsync(self._fd)
        except OSError as error:
            raise self._fail(self._path, error) from error

    # -- appending --------------------------------------------------------

    def append(self, body: Any, timestamp: object = None) -> int:
        """Write one record (not yet durable) and return its LSN.

        `timestamp` (an int; typed object so that, compiled as well, anything else is
        our ValueError, not mypyc's TypeError) defaults to now; it must not be below
        the previous one.
        Raises TypeError/ValueError for a bad body or timestamp (nothing is
        written), LogWriteFailed if the writer has failed or fails now.
        """
        return self.append_packed([record.pack_body(body)], timestamp)

    def append_packed(self, parts: record.Parts, timestamp: object = None) -> int:
        """`append` of a body the caller packed with msgpack, as buffers that joined
        are the packed body: one written from where its parts are (a block of
        message data and the bytes around it, with one `pwritev`) rather than
        copied into the record. Raises ValueError above MAX_BODY bytes."""
        body = sum(len(part) for part in parts)
        if body > record.MAX_BODY:
            raise ValueError(f"record body of {body} bytes exceeds {record.MAX_BODY}")
        explicit = _checked_timestamp(timestamp)
        with self._lock:
            if self._failure is not None:
                raise self._failed()
            if self._closed:
                raise LogstreamError(f"writer {self.writer_id!r} is closed")
            stamp = max(time.time_ns(), self._last_timestamp) if explicit is None else explicit
            if stamp < self._last_timestamp:
                raise ValueError(f"timestamp {stamp} is below {self._last_timestamp}")
            lsn = self._appended_lsn + 1
            if len(parts) == 1:
                frames: record.Parts = [record.encode_packed(lsn, stamp, parts[0])]
            else:
                frames = record.encode_parts(lsn, stamp, parts)
            size = sum(len(part) for part in frames)
            if self._size + size > self.segment_size and self._size > segment.HEADER_SIZE:
                self._rotate(lsn)
            try:
                if len(frames) == 1:
                    _whole(os.pwrite(self._fd, frames[0], self._size), size)
                else:
                    _whole(os.pwritev(self._fd, frames, self._size), size)
            except OSError as error:
                raise self._fail(self._path, error) from error
            self._size += size
            self._appended_lsn = lsn
            self._last_timestamp = stamp
            self._records += 1
            self._bytes += size
        return lsn

    @property
    def last_timestamp(self) -> int:
        """The timestamp of the newest record appended (0 before any)."""
        return self._last_timestamp

    def stamp_after(self, timestamp: int) -> None:
        """Stamp every later record after ``timestamp``, whatever the clock says: a
        series that continues another's work (a new owner of a structure) sorts after it."""
        with self._lock:
            self._last_timestamp = max(self._last_timestamp, timestamp + 1)

    def append_batch(self, bodies: list[Any]) -> int:
        """Write records in order with one write (not yet durable); the LSN of the
        last. A writer that takes each request's record when it flushes (the
        daemon's journal) makes one system call of a group commit's records, not
        one each. A batch that would pass the segment's end is written record by
        record, so that the segment rotates between two of them. Raises as
        `append` does; a body that cannot be packed raises before anything is
        written."""
        packed = record.pack_bodies(bodies)
        with self._lock:
            if self._failure is not None:
                raise self._failed()
            if self._closed:
                raise LogstreamError(f"writer {self.writer_id!r} is closed")
            if not packed:
                return self._appended_lsn
            timestamp = max(time.time_ns(), self._last_timestamp)
            first = self._appended_lsn + 1
            data = record.encode_batch(first, timestamp, packed)
            size = len(data)
            if self._size + size <= self.segment_size:
                try:
                    _whole(os.pwrite(self._fd, data, self._size), size)
                except OSError as error:
                    raise self._fail(self._path, error) from error
                count = len(packed)
                self._size += size
                self._appended_lsn = first + count - 1
                self._last_timestamp = timestamp
                self._records += count
                self._bytes += size
                return self._appended_lsn
        lsn = self._appended_lsn
        for body in bodies:
            lsn = self.append(body)
        return lsn

    def _rotate(self, first_lsn: int) -> None:
        """Seal the active segment and start the next; caller holds `_lock`."""
        self._seal()
        self._start_segment(first_lsn)

    def _seal(self) -> None:
        """Cut the active segment back to its records and fsync it; caller holds `_lock`.

        A sealed segment is then exactly its header and records, with no
        preallocated zeros, and everything appended is durable.
        """
        try:
            os.ftruncate(self._fd, self._size)
            self._fsync(self._fd)
        except OSError as error:
            raise self._fail(self._path, error) from error
        _drop_cache(self._fd, self._cached_from, 0)  # 0: to the end of the file
        with self._sync_lock:
            self._durable_lsn = max(self._durable_lsn, self._appended_lsn)
            self._sync.notify_all()

    # -- zeroing ahead (see the design note) ------------------------------

    def _zero_loop(self) -> None:
        while True:
            self._zero_wanted.wait()
            self._zero_wanted.clear()
            if not self._zero_once():
                return

    def _zero_once(self) -> bool:
        """Write zeros up to `zero_ahead` past the records, then fdatasync them;
        False once the writer is closed or failed."""
        fd, path, done = -1, self._path, 0
        try:
            going = True
            while going:
                with self._lock:
                    if self._closed or self._failure is not None:
                        return False
                    if fd >= 0 and self._path != path:
                        going = False  # rotated: the next wake-up zeros the new segment
                    else:
                        path = self._path
                        start = max(self._zeroed, self._size)
                        end = min(start + ZERO_STEP, self._size + self.zero_ahead,
                                  self.segment_size)
                        if end <= start:
                            done, going = start, False
                        else:
                            fd = self._write_zeros(fd, start, end)
                            self._zeroed = done = end
            if fd >= 0:
                try:
                    self._fdatasync(fd)
                except OSError as error:
                    raise self._fail(path, error) from error
        except LogWriteFailed:
            return False
        finally:
            if fd >= 0:
                self._give_back(fd)
            with self._zeros_synced:
                self._zeros_durable = (path, done)
                self._zeros_synced.notify_all()
        return True

    def _write_zeros(self, fd: int, start: int, end: int) -> int:
        """Write zeros over ``[start, end)`` of the active segment; caller holds `_lock`.
        Returns *fd*, or the segment's fd borrowed for the fdatasync if it is -1."""
        borrowed = fd < 0
        if borrowed:
            fd = self._borrow()
        try:
            # A page a write: the page cache sizes its folios by the write, and a
            # record landing in a 256 KiB folio of zeros would dirty (and make its
            # commit write) all of it.
            for offset in range(start, end, PAGE):
                size = min(PAGE - offset % PAGE, end - offset)
                _whole(os.pwrite(self._fd, _ZEROS[:size], offset), size)
        except OSError as error:
            if borrowed:
                self._return(fd)  # the caller gives back its own
            raise self._fail(self._path, error) from error
        with self._count_lock:
            self._zero_bytes += end - start
        return fd

    def wait_zeroed(self, timeout: float) -> bool:
        """Wait until half `zero_ahead` past the records (where a small commit asks
        for more), or the rest of the segment, is zeros made durable; False if
        *timeout* passed first, or if the writer zeros nothing ahead, failed or
        closed. For tests and benchmarks that want the steady state."""
        def settled() -> int:  # 0: not yet, 1: zeroed, 2: never will be
            with self._lock:
                if self._closed or self._failure is not None or not self.zero_ahead:
                    return 2
                target = min(self._size + self.zero_ahead // 2, self.segment_size)
                synced_path, synced = self._zeros_durable
                return 1 if synced_path == self._path and synced >= target else 0

        with self._zeros_synced:
            return self._zeros_synced.wait_for(settled, timeout) == 1

    # -- flushing ---------------------------------------------------------

    def flush(self, upto: int | None = None) -> int:
        """Make records up to `upto` (default: all appended so far) durable.

        Returns the durable LSN, which is >= `upto`. Raises ValueError if
        `upto` was never appended, LogWriteFailed if the writer has failed
        (even if `upto` was durable before the failure).
        """
        with self._sync_lock:
            self._flushes += 1
            target = self._appended_lsn if upto is None else upto
            if target > self._appended_lsn:
                raise ValueError(f"LSN {upto} has not been appended")
            while True:
                while True:
                    if self._failure is not None:
                        raise self._failed()
                    if self._durable_lsn >= target:
                        return self._durable_lsn
                    if not self._syncing:
                        break
                    self._waiting += 1
                    try:
                        self._sync.wait()
                    finally:
                        self._waiting -= 1
                # This caller leads the next fsync; others wait for its outcome.
                self._syncing = True
                synced = None
                self._sync.release()
                try:
                    synced = self._sync_once()
                finally:
                    self._sync.acquire()
                    self._syncing = False
                    if synced is not None:
                        self._durable_lsn = max(self._durable_lsn, synced)
                        self._group_commits += 1
                    if self._waiting:  # the daemon's flusher alone leads and waits for none
                        self._sync.notify_all()

    def _sync_once(self) -> int | None:
        """Fdatasync everything appended so far; the LSN it covers, or None on failure."""
        with self._lock:
            if self._failure is not None:
                return None  # an append failed meanwhile: no more fsyncs
            if self._fd < 0:
                raise LogstreamError(f"writer {self.writer_id!r} is closed")
            lsn, path, end, start = self._appended_lsn, self._path, self._size, self._cached_from
            # Zeros pay for small commits only: a large one writes whole pages and
            # converts its extents once for many records, and zeroing ahead of a bulk
            # load cost it 10% of its rate (benchmarks/durability.py, restart's build).
            small = self._bytes - self._committed_bytes < ZERO_COMMIT
            self._committed_bytes = self._bytes
            if small and self.zero_ahead and self._zeroed - end < self.zero_ahead // 2:
                self._zero_wanted.set()
            fd = self._borrow()
        try:
            self._fdatasync(fd)
            # Durable now: drop its whole pages (see the design note). The page
            # holding `end` stays, the next append writes into it.
            end -= end % PAGE
            if end - start >= DROP_BEHIND:
                _drop_cache(fd, start, end - start)
                with self._lock:
                    if self._path == path:
                        self._cached_from = max(self._cached_from, end)
        except OSError as error:
            self._fail(path, error)
            return None
        finally:
            self._give_back(fd)
        return lsn

    def _borrow(self) -> int:
        """The active fd, for an fsync outside `_lock`; caller holds `_lock`."""
        fd = self._fd
        self._borrowed[fd] = self._borrowed.get(fd, 0) + 1
        return fd

    def _give_back(self, fd: int) -> None:
        """Done with a borrowed fd: closed here if it was retired meanwhile."""
        with self._lock:
            self._return(fd)

    def _return(self, fd: int) -> None:
        """`_give_back`, for a caller that holds `_lock`."""
        left = self._borrowed[fd] - 1
        if left:
            self._borrowed[fd] = left
        else:
            del self._borrowed[fd]
            if fd != self._fd:
                os.close(fd)

    def _retire(self, fd: int) -> None:
        """No longer the active fd: closed, or by its last borrower; caller holds `_lock`
        (or is the only thread, opening or closing)."""
        if fd >= 0 and fd not in self._borrowed:
            os.close(fd)

    def _fsync(self, fd: int) -> None:
        with self._count_lock:
            self._fsyncs += 1
        os.fsync(fd)

    def _fdatasync(self, fd: int) -> None:
        """Fsync without the inode fields a read does not need (see the design note).

        It still flushes a size change, which a record larger than a segment
        makes. macOS has no fdatasync: an fsync is correct there, only slower.
        """
        with self._count_lock:
            self._fsyncs += 1
        getattr(os, "fdatasync", os.fsync)(fd)

    # -- failure ----------------------------------------------------------

    def _fail(self, path: Path, error: OSError) -> LogWriteFailed:
        """Make the writer failed (once) and wake every flush waiter to see it."""
        with self._sync_lock:
            if self._failure is None:
                self._failure = LogWriteFailed(path, error)
            self._sync.notify_all()
            return self._failed()

    def _failed(self) -> LogWriteFailed:
        # A fresh exception per raise: one instance raised in many threads
        # would share (and tangle) its traceback.
        assert self._failure is not None
        return LogWriteFailed(self._failure.path, self._failure.error)

    @property
    def failure(self) -> LogWriteFailed | None:
        """The write error that killed this writer, if any."""
        return self._failure

    # -- the rest ---------------------------------------------------------

    @property
    def appended_lsn(self) -> int:
        """The LSN of the last record written to the file (durable or not)."""
        return self._appended_lsn

    @property
    def durable_lsn(self) -> int:
        """The LSN up to which every record is known to be durable."""
        return self._durable_lsn

    @property
    def bytes_written(self) -> int:
        """Record bytes appended since open (cheap, for per-caller accounting)."""
        return self._bytes

    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        with self._lock, self._sync, self._count_lock:
            return WriterStats(
                appended_lsn=self._appended_lsn,
                durable_lsn=self._durable_lsn,
                records=self._records,
                bytes_written=self._bytes,
                fsyncs=self._fsyncs,
                group_commits=self._group_commits,
                flushes=self._flushes,
                flush_waiting=self._waiting,
                segments_created=self._segments_created,
                zero_bytes=self._zero_bytes,
                failed=self._failure is not None,
            )

    def bytes_after(self, lsn: int) -> int:
        """Record bytes this series holds after `lsn` (series.bytes_between). Reads only
        the directory and the segments' sizes."""
        with self._lock:
            end, active, active_size = self._appended_lsn + 1, self._path, self._size
        return bytes_between(
            list_segments(self.directory, self.writer_id), lsn, end,
            lambda seg: active_size if seg.path == active else seg.path.stat().st_size)

    def trim(self, before_lsn: int) -> list[Path]:
        """Delete this series' segments whose every LSN is below `before_lsn`."""
        return trim(self.directory, self.writer_id, before_lsn, fsync=self._fsync)

    def close(self) -> None:
        """Seal the active segment (unless failed), then close the files and release the lock.

        Sealing cuts off the preallocated zeros and makes every record durable,
        so a cleanly closed series is just its records. Raises LogWriteFailed if
        sealing fails.
        """
        if self._closed:
            return
        try:
            with self._lock:
                if self._failure is None:
                    self._seal()
        finally:
            with self._lock:
                self._closed = True
                self._close_files()
            if self._zeroer is not None:
                self._zero_wanted.set()
                self._zeroer.join()

    def _close_files(self) -> None:
        fd, self._fd = self._fd, -1
        lock_fd, self._lock_fd = self._lock_fd, -1
        self._retire(fd)
        if lock_fd >= 0:
            os.close(lock_fd)  # releases the flock

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<Writer {self.writer_id!r} in {self.directory} appended={self._appended_lsn}"
            f" durable={self._durable_lsn}{' FAILED' if self._failure else ''}>"
        )


def _checked_timestamp(timestamp: object) -> int | None:
    """An explicit timestamp of `append`, or None for now; ValueError unless an int in range
    (exactly: True is an int in Python, never a timestamp)."""
    if timestamp is None or (type(timestamp) is int and 0 <= timestamp <= record.MAX_U64):
        return timestamp
    raise ValueError(f"timestamp {timestamp!r} is not an int in 0..2**64-1")


def _whole(written: int, size: int) -> None:
    """A write of ``size`` bytes wrote them all. A regular file writes short only when
    it cannot write the rest (a full disk): a failure, not something to retry."""
    if written != size:
        raise OSError(errno.ENOSPC, f"short write: {written} of {size} bytes")


def _drop_cache(fd: int, offset: int, length: int) -> None:
    """Advise the kernel to drop these durable pages from the page cache (drop-behind).

    Only advice: where there is no posix_fadvise (macOS) or it fails, the pages
    stay cached, which costs memory and speed, never a record.
    """
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _check_follows(next_lsn: int, seg: SegmentFile) -> None:
    if seg.first_lsn != next_lsn:
        raise CorruptLog(seg.path, 0, Damage.LSN_GAP, f"expected first LSN {next_lsn}")


def _verify_complete(segments: list[SegmentFile]) -> None:
    """Scan every segment but the last, and check they follow each other."""
    for seg, after in itertools.pairwise(segments):
        _check_follows(scan_to_end(seg, last=False).next_lsn, after)
