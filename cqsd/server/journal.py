"""The daemon's side of the logstream: append effects, group-commit them, and
hold replies until what they acknowledge is durable.

Design note. Records are taken on the event loop, in request order, and get
their LSNs there; the flusher task writes all those a pass of the poller took
in one write (a request cost a ``pwrite`` of its own before: 3 of the ~18
system calls of a durable 1 KiB message moved), then runs ``fsync``; whatever
was taken while it ran is covered by the next one, so concurrent clients
share fsyncs (group commit) without any of them waiting for a timer. After
each fsync the flusher itself sends the replies it made durable (sessions
``hold`` them here), so a durable reply costs no other task's wake-up. On a disk
whose fsync is fast, handing it to a worker thread costs more than the fsync
itself (~100 µs of thread and loop wake-ups measured on a 2-core VM against a
~200 µs fsync), so the flusher runs it inline while the moving average stays
under ``INLINE_FSYNC``, and in a thread of its own (syncthread.py) when the disk is slow;
while the flusher is idle and the fsync fast, the poller's pass that took the records
makes that fsync itself at its end (``pass_ended``), sparing the flusher's wake-up. A record
that only locks starts no fsync: nobody waits for it, and the next fsync
covers it; but it is written before any reply leaves after it, so that a
daemon killed once its reply is out still finds it. Taken in a round of the
poller, it is written at the round's end, with the other records the round
took (one ``pwrite`` where each lock cost one of its own: 1.29 against 0.39 a
message moved, read then delete against ``delete_and_read``), and the replies
sent meanwhile wait in their sessions' queues until then (``write_deferred``);
taken anywhere else, it is written at once. A write or
fsync error is final (the fsyncgate lesson): nothing more is acknowledged,
every waiting reply becomes an error, and the daemon stops so that a restart
recovers from what is really on disk.

A record that names message blocks of a data set (an offloaded recoverable put)
must not reach the log before those blocks are on disk: the rule is kept here,
whole, against the ``DataSync`` the journal is made with (the data sets,
smds/datasets.py; as etcd's wal takes its ``Storage``). ``log`` asks it whether
blocks were written since the last record (``take_unsynced``); if so that
record, and every record after it (the log keeps request order), is held back
in memory with the LSN it will get; the flusher fsyncs the data sets
(``DataSync.sync``), then appends what it held and fsyncs the log, both in one worker thread: such
records carry the blocks' data (a 1 MiB message is a 1 MiB record), and copying
it into the page cache on the loop cost the loop a sixth of its time (py-spy,
4 producers and 4 consumers of 1 MiB messages). While the thread writes, the
records stay held back, so that later ones still queue behind them. A request
waits for one more fsync, not for a hand-off of its own. After each flush the
data sets hear the durable LSN (``DataSync.durable``): pages a delete freed are
reusable once the delete is on disk.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import structlog
import trio
import trio.lowlevel

import logstream
from cqsproto.codec import pack_parts
from logstream.record import MAX_BODY
from logstream.series import list_series

from .syncthread import SyncThread

log = structlog.get_logger()
WRITER = "cqsd"  # a daemon on its own; a node of a group writes its own series (docs/group.md)
INLINE_FSYNC = 0.001  # seconds: above this average an fsync would stall the loop too long
# Bytes of the log kept written with zeros past its records, so that a group
# commit's fdatasync finds its blocks written and writes no inode (logstream's
# writer.py): ~1,000 small requests' records; a small commit asks for more once
# half of it is used.
ZERO_AHEAD = 4 * 1024 * 1024


def writer_for(node: str, log_dir: Path) -> str:
    """The series a node of a group writes from this start: ``NODE-N``, N one past
    any incarnation on disk, so a node never appends to a series an earlier run of
    it left (it may be sealed)."""
    prefix = f"{node}-"
    seen = [int(w[len(prefix):]) for w in list_series(log_dir)
            if w.startswith(prefix) and w[len(prefix):].isdigit()]
    return f"{node}-{max(seen, default=0) + 1}"


class Fenced(Exception):
    """Not acknowledged: this group node's lease ran out (docs/group.md)."""


def _always() -> bool:
    return True


def _ignore(why: str) -> None:
    pass


def _nothing() -> None:
    pass


class DataSync(Protocol):
    """What the journal needs of the files that hold message blocks outside the
    log (the data sets): to know whether blocks were written since the last
    record, to make them durable before a record naming them, and to hear
    which LSN is durable."""

    def take_unsynced(self) -> bool:
        """Whether blocks were written since the last call (then cleared)."""

    async def sync(self) -> None:
        """Make every block written so far durable (a worker thread's fsyncs)."""

    def sync_now(self) -> None:
        """``sync`` on the calling thread, for the stop path."""

    def durable(self, lsn: int) -> None:
        """The log is durable up to ``lsn``."""


class NoData:
    """The ``DataSync`` of a daemon whose records never name blocks elsewhere."""

    def take_unsynced(self) -> bool:
        return False

    async def sync(self) -> None:
        pass

    def sync_now(self) -> None:
        pass

    def durable(self, lsn: int) -> None:
        pass


class Journal:
    def __init__(self, directory: Path, segment_size: int, data: DataSync | None = None,
                 writer: str = WRITER, *,
                 on_failure: Callable[[BaseException], None] | None = None,
                 observe: Callable[[float, int], None] | None = None) -> None:
        """``data``: the data sets whose blocks records name; ``writer``: this
        daemon's log series (a node of a group writes its own, docs/group.md);
        ``on_failure`` is called once with the error that ends acknowledgements;
        ``observe`` after each fsync with its seconds and the records it made durable."""
        self.directory = directory
        self.data: DataSync = data if data is not None else NoData()
        self.writer_id = writer
        self.writer = self._open(writer, segment_size)
        if self.writer.repair is not None:
            r = self.writer.repair
            log.warning("log_tail_repaired", file=str(r.path), offset=r.offset,
                        bytes_cut=r.bytes_cut, reason=str(r.reason), copy=str(r.copy))
        self.durable = self.writer.durable_lsn
        # what replies may acknowledge: the durable LSN, as of the last fsync after which
        # this node still owned its structures (a group's lease, docs/group.md)
        self.acknowledged = self.durable
        self._position = self.writer.appended_lsn  # the LSN of the last record appended or held
        self.failed: BaseException | None = None
        self.fenced: BaseException | None = None  # a group node that lost its lease
        self.owner_valid: Callable[[], bool] = _always  # a group's lease, checked after fsync
        self.on_fenced: Callable[[str], None] = _ignore  # the group gives its pairs up
        # a group's check before replies that waited for the log leave (None alone)
        self.gate: Callable[[], bool] | None = None
        self._work = trio.Event()
        # set after each flush for the tasks that wait for one; made only when one waits
        # (a flush with nobody waiting is the common case: an Event a flush was its cost)
        self._flushed: trio.Event | None = None
        self._fsync_average = 0.0
        self._held: set = set()  # sessions with replies waiting for a flush
        # records waiting for DataSync.sync, in order, each with whether it names blocks
        self._held_back: list[tuple[dict, bool]] = []
        self._pending: list[dict] = []  # records taken, written at the flusher's next pass
        self._deferring = False  # in a round of the poller: lock records wait for its end
        self._due = False  # a round took a record a reply waits for: flush at the pass's end
        self._flusher_idle = False  # the flusher waits for work (no flush under way)
        # a lock record is taken and not yet written: replies wait for write_deferred
        self.unwritten = False
        self._awaiting_write: set = set()  # sessions with replies waiting for write_deferred
        self.sync_data = self.data.sync  # awaited before held-back records are written
        self.on_failure = on_failure
        self.observe = observe
        # after records reach the log file, once the writer's ``bytes_written`` is at
        # ``written_due``: the checkpoints' volume trigger (daemon.py), which sets it,
        # looks at the bytes written then, not at every request's append
        self.on_written: Callable[[], None] = _nothing
        self.written_due = 0
        self._syncs = SyncThread()  # a slow disk's fsyncs (syncthread.py)

    @property
    def fsync_average(self) -> float:
        """Seconds an fsync of the log takes, a moving average."""
        return self._fsync_average

    @property
    def position(self) -> int:
        return self._position

    def log(self, parts: list[dict], urgent: bool) -> int:
        """Append a request's record (``parts``: one, or the pieces it was split
        into), behind the blocks its puts wrote if there are any (the module note);
        returns the last LSN, 0 if the log has failed."""
        after_data = self.data.take_unsynced()
        lsn = 0
        for part in parts:
            lsn = self.append(part, urgent, after_data)
        return lsn

    def append(self, body: dict, urgent: bool = True, after_data: bool = False) -> int:
        """Append a record; returns its LSN (0 if the log has failed: nothing is logged).
        ``urgent``: a reply waits for it, so start an fsync now. ``after_data``: it
        names data-set blocks, so it waits for ``DataSync.sync`` (the module note)."""
        if self.failed is not None:
            return 0
        self._position += 1
        if after_data or self._held_back:
            self._held_back.append((body, after_data))
            self._work.set()
        elif urgent:
            self._pending.append(body)
            if self._deferring:
                self._due = True  # the poller's pass ends in a flush (pass_ended)
            else:
                self._work.set()
        else:  # no fsync, but written before any reply after it leaves (the module note)
            self._pending.append(body)
            if self._deferring:
                self.unwritten = True
            else:
                self._write_pending()
        return 0 if self._has_failed() else self._position

    def defer_writes(self) -> None:
        """A round of the poller begins: lock records wait for ``write_deferred``."""
        self._deferring = True

    def write_deferred(self) -> None:
        """The round has ended: write what it took, then send the replies that
        waited for the write (the module note)."""
        self._deferring = False
        self.write_now()
        if not self._awaiting_write:
            return
        waiting, self._awaiting_write = self._awaiting_write, set()
        refused = self.failed or self.fenced
        for session in waiting:
            if session.release(self.acknowledged, refused):
                self._held.add(session)

    def pass_ended(self) -> None:
        """The poller's pass has ended and it is about to yield: flush what its
        rounds took for replies, inline if the fsync is fast and the flusher idle
        (a durable request then costs the flusher task no wake-up: 8% of a
        message's instructions with one producer and one consumer, 3% with four
        of each), else by waking the flusher."""
        if not self._due:
            return
        self._due = False
        if (not self._flusher_idle or self._held_back or self.failed is not None
                or self._fsync_average >= INLINE_FSYNC):
            self._work.set()
            return
        if self._pending:
            self._write_pending()
            if self._has_failed():
                return
        target = self.writer.appended_lsn
        if target <= self.durable:
            return
        before = self.durable
        started = time.perf_counter()
        try:
            durable = self.writer.flush(target)
        except (logstream.LogstreamError, ValueError) as err:
            self.fail(err)
            return
        self._flushed_to(durable, time.perf_counter() - started, target - before)

    def flush_due(self) -> bool:
        """A round of this pass took a record a reply waits for: the pass ends in a flush."""
        return self._due

    def write_now(self) -> None:
        """Write the round's lock records before its end (a large reply goes at once
        rather than be copied into its session's queue)."""
        if self.unwritten:
            self.unwritten = False
            if self._pending and self.failed is None:
                self._write_pending()

    def await_write(self, session) -> None:
        """``session`` queued replies that may leave once the round's records are
        written: ``release`` it in ``write_deferred``."""
        self._awaiting_write.add(session)

    def _write_pending(self) -> None:
        """The records taken since the last pass, in one write."""
        pending, self._pending = self._pending, []
        try:
            self.writer.append_batch(pending)
        except logstream.LogstreamError as err:
            self.fail(err)
        except ValueError as err:  # refused unwritten, but memory already holds its effects
            self.fail(err, "log_record_refused")
        else:
            if self.writer.bytes_written >= self.written_due:
                self.on_written()

    def hold(self, session) -> None:
        """``session`` has replies waiting for a flush: ``release`` it after each."""
        self._held.add(session)

    async def wait_durable(self, lsn: int, writer: str | None = None) -> bool:
        """Wait until ``lsn`` of series ``writer`` (by default the current one) is on
        stable storage and acknowledged; False if it never will be. A series rolled
        away from was acknowledged to its end first (``roll``). Starts an fsync if none
        is due: records that only lock do not start one."""
        writer = writer or self.writer_id
        while self.writer_id == writer and self.acknowledged < lsn:
            if self.ended() is not None:
                return False
            self._work.set()
            await self._next_flush()
        return True

    async def run(self) -> None:
        """The flusher: one fsync at a time, each covering everything appended before it."""
        while self.failed is None:
            self._flusher_idle = True
            await self._work.wait()
            self._flusher_idle = False
            self._work = trio.Event()
            if self._pending:
                self._write_pending()
                if self._has_failed():
                    break
            held = len(self._held_back)  # those whose blocks the sync below covers
            if held:
                await self.sync_data()
            # a fence and a rejoin may ``rotate`` to a new series while a worker thread
            # flushes: that flush stays with the series it began in, and counts for nothing
            writer = self.writer
            target = writer.appended_lsn + held
            if target <= self.durable:
                continue
            before, seconds, durable = self.durable, 0.0, self.durable
            try:
                if held:
                    durable, seconds = await self._syncs.run(
                        self._append_and_flush, self._held_back[:held], target, writer)
                elif self._fsync_average < INLINE_FSYNC:
                    started = time.perf_counter()
                    durable = writer.flush(target)
                    seconds = time.perf_counter() - started
                else:
                    durable, seconds = await self._syncs.run(
                        self._append_and_flush, [], target, writer)
            except (logstream.LogstreamError, ValueError) as err:
                if writer is self.writer:  # else the old series' error: it is left anyway
                    self.fail(err)  # ValueError: a held-back record refused, unwritten
            finally:
                if writer is self.writer:
                    del self._held_back[:held]
            if held and self.writer.bytes_written >= self.written_due:
                self.on_written()
            if writer is not self.writer:
                continue
            self._flushed_to(durable, seconds, target - before)
            if self._work.is_set():  # else the wait above yields: one yield is enough
                await trio.lowlevel.checkpoint()  # the requests that arrived meanwhile append first

    def _flushed_to(self, durable: int, seconds: float, records: int) -> None:
        """After an fsync: acknowledge up to ``durable``, if this node still owns its
        structures, and send the replies it made durable."""
        self.durable = durable
        if self.fenced is None and self.failed is None:
            if self.owner_valid():  # after the fsync: only then is the record ours to ack
                self.acknowledged = self.durable
            else:
                self._lease_ran_out("records were acknowledged")
        self._fsync_average = 0.8 * self._fsync_average + 0.2 * seconds
        if self.observe is not None:
            self.observe(seconds, records)
        self._wake()

    def _append_and_flush(self, held: list[tuple[dict, bool]], target: int,
                          writer: logstream.Writer) -> tuple[int, float]:
        """In a worker thread: append the records held back (their blocks are on
        disk), then fsync up to ``target`` (of ``writer``, the journal's when the flush
        began); the durable LSN and the fsync's seconds."""
        for body, blocks in held:
            if blocks:  # a record naming blocks holds their data: written from where it is
                writer.append_packed(pack_parts(body, MAX_BODY))
            else:
                writer.append(body)
        started = time.perf_counter()
        durable = writer.flush(target)
        return durable, time.perf_counter() - started

    def finish_held_back(self) -> None:
        """At a clean stop: what is still taken or held back, written (the held-back
        records after ``DataSync.sync_now``) and made durable."""
        if self._pending and self.failed is None:
            self._write_pending()
        if self._has_failed():
            return
        held, self._held_back = self._held_back, []
        if held:
            self.data.sync_now()
        try:
            self.durable, _ = self._append_and_flush(held, self.writer.appended_lsn + len(held),
                                                     self.writer)
        except (logstream.LogstreamError, ValueError) as err:
            self.fail(err)
            return
        if self.fenced is None and self.owner_valid():
            self.acknowledged = self.durable

    def guard(self, owner_valid: Callable[[], bool], on_fenced: Callable[[str], None]) -> None:
        """A node of a group: acknowledge only while ``owner_valid()``, checked after each
        fsync and again as replies leave; ``on_fenced`` hears when it stopped."""
        self.owner_valid, self.on_fenced, self.gate = owner_valid, on_fenced, self._still_owner

    def _still_owner(self) -> bool:
        if self.fenced is not None:
            return False
        if self.owner_valid():
            return True
        self._lease_ran_out("replies left")
        return False

    def _lease_ran_out(self, before: str) -> None:
        """A check found this node's lease gone (after an fsync, or as replies left):
        fence, so that the replies every session holds are refused now (after the
        rejoin's rotate they would wait for the new series to reach their old LSNs,
        docs/group.md), then tell the group."""
        fenced = Fenced(f"this node's lease with etcd ran out before its {before}")
        self.fence(fenced)
        self.on_fenced(str(fenced))

    def fence(self, why: BaseException) -> None:
        """Acknowledge nothing more (a group node that lost its lease): replies still
        waiting become errors; the daemon goes on, owning nothing, until ``rotate``."""
        if self.fenced is None:
            self.fenced = why
            self._wake()

    def rotate(self, writer: str) -> None:
        """After a fence: continue in a new series, ``writer``, as a new incarnation.
        The old series is left to be sealed by the structures' next owners."""
        self.writer.close()
        self.writer = self._open(writer, self.writer.segment_size)
        self.writer_id = writer
        self._pending.clear()
        self._held_back.clear()
        self.unwritten = False
        self.durable = self.acknowledged = self.writer.durable_lsn
        self._position = self.writer.appended_lsn
        self.fenced = None

    async def roll(self, writer: str) -> tuple[str, int]:
        """Continue in a new series, ``writer``, while serving (a group node taking back
        a pair its series was cut for): once everything appended is durable and
        acknowledged, with no await between that check and the switch, so no reply
        waits on the old series. Returns the old writer and its last LSN; raises what
        ended the log if it ended."""
        while self._pending or self._held_back or self.acknowledged < self._position:
            if (ended := self.ended()) is not None:
                raise ended
            self._work.set()
            await self._next_flush()
        old, end = self.writer_id, self._position
        self.writer.close()
        self.writer = self._open(writer, self.writer.segment_size)
        self.writer_id = writer
        self.durable = self.acknowledged = self.writer.durable_lsn
        self._position = self.writer.appended_lsn
        return old, end

    def _wake(self) -> None:
        held, self._held = self._held, set()
        refused = self.failed or self.fenced
        for session in held:
            if session.release(self.acknowledged, refused):
                self._held.add(session)
        if self.failed is None:  # what is acknowledged: in a group, within the lease, so
            # a fenced node frees no SMDS page a delete past its seal freed (docs/smds.md)
            self.data.durable(self.acknowledged)
        flushed, self._flushed = self._flushed, None
        if flushed is not None:
            flushed.set()

    async def _next_flush(self) -> None:
        if self._flushed is None:
            self._flushed = trio.Event()
        await self._flushed.wait()

    def fail(self, err: BaseException, event: str | None = "log_write_failed") -> None:
        """Acknowledge nothing more: the log no longer says what memory holds (or
        cannot be written), so the daemon stops and a restart recovers from it."""
        if self.failed is None:
            self.failed = err
            if event is not None:
                log.critical(event, error=str(err),
                             action="no more acknowledgements; stopping for restart and recovery")
            self._wake()
            if self.on_failure is not None:
                self.on_failure(err)

    def _open(self, writer: str, segment_size: int) -> logstream.Writer:
        return logstream.Writer.open(self.directory, writer, segment_size=segment_size,
                                     zero_ahead=ZERO_AHEAD)

    def _has_failed(self) -> bool:
        """``self.failed is not None``, read afresh after a call that may fail the log:
        past a test of ``self.failed``, mypy takes it to be still None, and compiled
        code then checked that type (a TypeError where the flusher should stop)."""
        return self.failed is not None

    def ended(self) -> BaseException | None:
        """Why replies that wait for the log will never be acknowledged, if they won't."""
        return self.failed or self.fenced

    def close(self) -> None:
        """Seal the log and release its lock (the writer skips the seal if it failed)."""
        self._syncs.close()
        self.writer.close()
