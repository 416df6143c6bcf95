"""A warm standby: the rows of every pair this node could take, kept current by
tailing the shared log, so a takeover is the seal and the last records.

Design note (docs/group.md). A cold standby rebuilds a pair at takeover from
its base (the clean or base image, or the newest SRDS slot) and the whole log
after it; a warm one (``standby = "warm"``) does that once, at start, and then
folds what the owner appends, every ``poll`` seconds. At takeover it folds only
the records between its position and the seal's cut and restores the rows.

Which records a pass may fold. A pair's records come from one writer at a time
(its owner), and a new epoch stamps its records after the sealed ones, so the
(timestamp, writer, LSN) order of a fold is each epoch's series in LSN order,
one epoch after the other. A pass therefore reads, from the view of etcd it
starts with, only the *sealed* writers up to their cuts and the *owner's*
series to its current end, and merges them in that order. A writer that is
neither (a dead owner not yet sealed, another node's series) is not read at all
until a seal says where it ends: a seal is recorded in etcd only after the
sealed series were made durable, so the first pass that sees a seal reads every
sealed record, and they all sort before the new owner's. Records of a pair
beyond a writer's cut are never folded, with one exception the tail cannot
avoid: records the owner wrote but which a later seal leaves out (un-fsynced
writes lost with its machine, or late writes of a paused owner read before
the seal appeared). ``WarmPair.overshoots`` finds those against every new seal,
and the pair is then loaded again from its base (rare; logged as
``warm_image_reloaded``); at takeover it falls back to the cold rebuild.

Reading is incremental (``Follower``): a cursor per writer keeps the segment
and file offset of its next record, so a pass reads only the new bytes, not
the segment again from its start, and stops quietly at a record still being
written (it is read whole the next pass). The bookkeeping (``WarmPair``) is
pure; the file reading and the loop (``Tailer``) are the shell, the passes run
in a worker thread so the event loop never stalls.

The tail also keeps the pair's idempotency keys of the last ``dedup_window``
seconds (exactly-once puts, cqsd/dedup.py): those of the records its base covers
are read from the log at load (cqsd/recovery/keys.py), the others remembered as
they are folded, so a warm takeover answers a resend without reading them back.

Lag for operators: after each pass, the records the pass had to fold and how
old the oldest of them was are this node's lag behind the owner; the node
publishes it per pair in etcd (``standby/<PAIR>/<NODE>``, bound to its lease,
at most once a second, with the owner's series and the LSN read there) so any
node can answer ``display owners``.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from logstream import record, segment
from logstream.errors import CorruptLog, Damage, Trimmed
from logstream.record import Frame, NeedData, Record
from logstream.series import SegmentFile, check_header, list_series

from ..dedup import Remembered, key_of_record
from ..engine import Structure
from ..records import KEY, OTHERS, OWNER, STRUCTURE, WHERE
from ..recovery.fold import fold
from ..recovery.keys import remembered
from ..recovery.restart import Rebuilt
from ..recovery.sealed import base_rows
from ..storage import image
from .etcd import EtcdError
from .ownership import View, key

if TYPE_CHECKING:
    from .node import GroupNode

log = structlog.get_logger()

__all__ = ["END", "Follower", "Lag", "Tailer", "WarmPair", "limits"]

END = 2**63  # "to the end of the series as it is now"
READ = 256 * 1024  # bytes read at a time past a cursor
PUBLISH_EVERY = 1.0  # seconds between two lag updates of one pair in etcd


def limits(owner_writer: str | None, cuts: Mapping[str, int]) -> dict[str, int]:
    """The last LSN a pass may fold of each writer: the sealed ones to their cuts, the
    owner's series to its end; writers not named are not read (module docstring)."""
    out = dict(cuts)
    if owner_writer is not None:
        out[owner_writer] = END
    return out


@dataclass
class Lag:
    """How far behind the owner the last pass found this standby."""

    records: int = 0
    seconds: float = 0.0


@dataclass
class WarmPair:
    """The rows of one pair's structures and what of the log they cover (pure)."""

    names: tuple[str, ...]
    rows: dict[str, dict[int, list[Any]]]
    covered: dict[str, dict[str, int]]  # structure -> writer -> LSN its base covers
    last_ids: dict[str, int]
    sources: dict[str, str]
    folded: dict[str, int] = field(default_factory=dict)  # writer -> newest LSN of ours folded
    replayed: int = 0
    # the pair's idempotency keys of the last dedup_window seconds (cqsd/dedup.py), kept
    # current as the rows are: a takeover need not read them back from the log
    keys: Remembered = field(default_factory=lambda: Remembered(0))

    def start(self, writer: str) -> int:
        """The first LSN to read of ``writer``: one past what every base covers."""
        return min(c.get(writer, 0) for c in self.covered.values()) + 1

    def apply(self, rec: Record) -> bool:
        """Fold ``rec`` if it is of this pair and its base does not cover it."""
        body = rec.body
        if not isinstance(body, dict):
            return False
        hit = False
        for name in (body.get(STRUCTURE), *body.get(OTHERS, ())):
            if name in self.rows and rec.lsn > self.covered[name].get(rec.writer, 0):
                self.last_ids[name] = max(self.last_ids[name], fold(self.rows[name], [body], name))
                hit = True
        if hit:
            self.folded[rec.writer] = rec.lsn
            self.replayed += 1
            if KEY in body and (found := key_of_record(body)) is not None:
                self.keys.remember(found[0], found[1], rec.timestamp)
        return hit

    def overshoots(self, cut: Mapping[str, int], *, sealed_only: bool = False) -> list[str]:
        """The writers of which a record beyond ``cut`` was folded: the rows hold what
        the log no longer counts. ``sealed_only`` (while tailing) leaves out writers
        not in ``cut``: the owner, and an owner gone whose seal is still to come."""
        return sorted(w for w, lsn in self.folded.items()
                      if (w in cut or not sealed_only) and lsn > cut.get(w, 0))


class Follower:
    """Per-writer read cursors over a log directory: each read goes on where the last
    stopped (shell). A cursor moves only past records handed to the caller, so a
    caller may stop reading at any record and lose none."""

    def __init__(self, log_dir: Path, start: Callable[[str], int]) -> None:
        self.log_dir = log_dir
        self.start = start  # where a writer not read before starts
        self.next: dict[str, int] = {}  # writer -> next LSN to read
        self.at: dict[str, tuple[int, int]] = {}  # writer -> (segment first LSN, offset)

    def read(self, until: Mapping[str, int]) -> Iterator[Record]:
        """Every writer of ``until`` up to its LSN there (or its current end), merged
        in (timestamp, writer, LSN) order. Raises Trimmed or CorruptLog."""
        series = list_series(self.log_dir)
        streams = []
        for writer, last in until.items():
            if writer not in self.next:
                self.next[writer] = self.start(writer)
            if self.next[writer] <= last and writer in series:
                streams.append(self._series(writer, series[writer], last))
        for rec, at in heapq.merge(*streams, key=_order):
            self.next[rec.writer], self.at[rec.writer] = rec.lsn + 1, at
            yield rec

    def _series(self, writer: str, segments: list[SegmentFile], last: int
                ) -> Iterator[tuple[Record, tuple[int, int]]]:
        firsts = [s.first_lsn for s in segments]
        nxt, at = self.next[writer], self.at.get(writer, (0, 0))
        while nxt <= last:
            i = bisect.bisect_right(firsts, nxt) - 1
            if i < 0:
                raise Trimmed(f"{segments[0].path}: writer {writer!r} starts at LSN "
                              f"{firsts[0]}, records from {nxt} were trimmed")
            for rec, after in self._segment(segments[i], nxt, at, last):
                nxt, at = rec.lsn + 1, after
                yield rec, after
            if i + 1 == len(segments) or firsts[i + 1] != nxt:
                return  # the end for now (a record being written is read next time)

    @staticmethod
    def _segment(seg: SegmentFile, nxt: int, at: tuple[int, int], last: int
                 ) -> Iterator[tuple[Record, tuple[int, int]]]:
        """Records ``nxt`` to ``last`` of one segment, from offset ``at`` if it is there."""
        try:
            f = open(seg.path, "rb")
        except FileNotFoundError:
            raise Trimmed(f"{seg.path} was trimmed while being tailed") from None
        with f:
            if at[0] != seg.first_lsn:  # a segment new to this cursor
                check_header(seg, f.read(segment.HEADER_SIZE))
                offset, expect = segment.HEADER_SIZE, seg.first_lsn
            else:
                offset, expect = at[1], nxt
                f.seek(offset)
            buf, pos, base = b"", 0, offset
            while True:
                found = record.decode(buf, pos)
                if isinstance(found, Frame):
                    if found.lsn != expect:
                        raise CorruptLog(seg.path, base + pos, Damage.LSN_MISMATCH,
                                         f"expected LSN {expect}, found {found.lsn}")
                    if found.lsn > last:
                        return
                    expect += 1
                    pos = found.end
                    if found.lsn >= nxt:  # not before the start of a new cursor
                        yield (Record(seg.writer, found.lsn, found.timestamp,
                                      record.unpack_body(found.body)),
                               (seg.first_lsn, base + pos))
                    continue
                if isinstance(found, NeedData):
                    more = f.read(max(READ, found.size - (len(buf) - pos)))
                    if more:
                        buf, base, pos = buf[pos:] + more, base + pos, 0
                        continue
                return  # zeros, a record not yet whole, or damage a seal will judge


def _order(item: tuple[Record, tuple[int, int]]) -> tuple[int, str, int]:
    rec = item[0]
    return (rec.timestamp, rec.writer, rec.lsn)


def load(structures: list[Structure] | tuple[str, ...], images: Path, srds: Path,
         log_dir: Path, until: Mapping[str, int], window: float = 0
         ) -> tuple[WarmPair, Follower]:
    """A pair's base, and the log up to ``until`` folded into it (as a cold rebuild
    does, but keeping the cursors); with the idempotency keys of the last ``window``
    seconds, those the base covers read from the log, the rest as they are folded.
    Raises ImageError, FoldError, Trimmed, CorruptLog."""
    names = tuple(s if isinstance(s, str) else s.name for s in structures)
    rows, covered, last_ids, sources = {}, {}, {}, {}
    for name in names:
        report = Rebuilt(name, clean=False)
        header, rows[name] = base_rows(name, images, srds, report)
        covered[name], last_ids[name], sources[name] = (
            dict(header.get("lsn", {})), header.get("last_id", 0), report.source)
    warm = WarmPair(names, rows, covered, last_ids, sources)
    covers = {w: min(lsn, warm.start(w) - 1) for w, lsn in until.items()}
    warm.keys = remembered(log_dir, covers, dict.fromkeys(names, names[0]), window,
                           time.time_ns())[names[0]]
    follower = Follower(log_dir, warm.start)
    for rec in follower.read(until):
        warm.apply(rec)
    return warm, follower


@dataclass
class Standing:
    """One pair this node stands by for: the rows, the cursors, the last lag."""

    warm: WarmPair
    follower: Follower
    lag: Lag = field(default_factory=Lag)
    published: float = float("-inf")
    owner_writer: str | None = None  # the series the last pass tailed to its end


class Tailer:
    """Keeps a ``Standing`` for every pair this node could take and does not own."""

    def __init__(self, node: GroupNode, pairs: Mapping[str, tuple[str, ...]], images: Path,
                 srds: Path, log_dir: Path, poll: float, window: float = 0) -> None:
        self.node = node  # the GroupNode: its view, what it owns, its etcd and lease
        self.pairs = dict(pairs)  # primary -> the names of the pair's structures
        self.images, self.srds, self.log_dir = images, srds, log_dir
        self.poll = poll
        self.window = window  # dedup_window: the keys each pair's tail keeps
        self.standing: dict[str, Standing] = {}
        self.locks: dict[str, trio.Lock] = {name: trio.Lock() for name in pairs}
        self.claiming: set[str] = set()  # pairs a takeover waits for
        self.cpu = 0.0  # thread CPU seconds spent tailing, for the benchmarks

    def wanted(self) -> list[str]:
        me, node = self.node.group.node, self.node
        return [name for name in sorted(self.pairs)
                if name not in node.owned and name not in node.taking
                and me in (node.pairs.get(name) or (me,))]

    async def run(self) -> None:
        await self.node.seen.wait()  # before, no owner or seal is known: a load folds nothing
        while True:
            for name in self.wanted():
                async with self.locks[name]:
                    if name not in self.wanted():
                        continue
                    view = self.node.view
                    try:
                        await trio.to_thread.run_sync(self._pass, name, view)
                    except Exception as err:  # a base or log it cannot read now: next pass
                        self.standing.pop(name, None)
                        log.warning("warm_standby_failed", structure=name,
                                    error=f"{type(err).__name__}: {err}",
                                    action="loading again at the next pass")
                        continue
                await self._publish(name)
            await trio.sleep(self.poll)

    def _pass(self, name: str, view: View) -> None:
        t0 = time.thread_time()
        try:
            owner = view.owners.get(name)
            owner_writer = owner.writer if owner is not None else None
            cuts = view.cuts(name)
            until = limits(owner_writer, cuts)
            s = self.standing.get(name)
            if s is not None and (over := s.warm.overshoots(cuts, sealed_only=True)):
                log.warning("warm_image_reloaded", structure=name, writers=over,
                            why="records folded here lie beyond a newer seal")
                s = None
            if s is None:
                gc.disable()
                try:
                    warm, follower = load(self.pairs[name], self.images, self.srds,
                                          self.log_dir, until, self.window)
                finally:
                    gc.enable()
                self.standing[name] = Standing(warm, follower)
                log.info("warm_standby_loaded", structure=name, sources=warm.sources,
                         records_replayed=warm.replayed,
                         messages=sum(len(r) for r in warm.rows.values()))
                return
            s.owner_writer, count, oldest = owner_writer, 0, None
            for rec in s.follower.read(until):
                s.warm.apply(rec)
                count += 1
                oldest = rec.timestamp if oldest is None else min(oldest, rec.timestamp)
                if name in self.claiming:
                    break  # a takeover waits: it folds the rest itself
            s.lag = Lag(count, 0.0 if oldest is None
                        else max(0.0, round((time.time_ns() - oldest) / 1e9, 3)))
        finally:
            self.cpu += time.thread_time() - t0

    async def _publish(self, name: str) -> None:
        """This node's lag for ``name`` in etcd, bound to its lease, at most once a second."""
        s, node = self.standing.get(name), self.node
        at = time.monotonic()
        if s is None or at - s.published < PUBLISH_EVERY or not node.lease.lease:
            return
        s.published = at
        with trio.move_on_after(node.etcd.timeout):
            try:
                await node.etcd.put(key(node.group.name, "standby", name, node.group.node),
                                    json.dumps({"records": s.lag.records,
                                                "seconds": s.lag.seconds,
                                                "writer": s.owner_writer,
                                                "read": s.follower.next.get(
                                                    s.owner_writer or "", 1) - 1}),
                                    lease=node.lease.lease)
            except EtcdError:
                pass  # the lag is advisory; the next pass tries again

    async def claim(self, name: str) -> Standing | None:
        """At takeover: the pair's warm rows, out of the tail (None if there are none)."""
        self.claiming.add(name)  # a pass under way stops at its next record
        try:
            async with self.locks[name]:
                return self.standing.pop(name, None)
        finally:
            self.claiming.discard(name)


def finish(standing: Standing, structures: list[Structure], cut: Mapping[str, int]
           ) -> list[Rebuilt] | None:
    """Fold the records between the tail and the seal's ``cut`` and restore the rows
    into the empty ``structures``; None if the rows went past the cut (rebuild cold)."""
    warm = standing.warm
    if warm.overshoots(cut):
        return None
    t0 = time.perf_counter()
    gc.disable()
    try:
        before = warm.replayed
        for rec in standing.follower.read(cut):
            warm.apply(rec)
        replay = time.perf_counter() - t0
        reports = []
        for s in structures:
            t1 = time.perf_counter()
            rows = warm.rows[s.name]
            image.restore(s, rows)
            s.last_id = max(s.last_id, warm.last_ids[s.name])
            reports.append(Rebuilt(
                s.name, clean=False, source="warm", messages=len(rows),
                replayed=warm.replayed - before, image_seconds=time.perf_counter() - t1,
                replay_seconds=replay,
                lock_owners={r[OWNER] for r in rows.values() if r[WHERE] == "locked"}))
        return reports
    finally:
        gc.enable()
