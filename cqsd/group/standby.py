"""A warm standby: a live engine pair for every pair this node could take, kept
current by tailing the shared log, so a takeover is the seal, the last records,
and listening.

Design note (docs/group.md). A cold standby rebuilds a pair at takeover from
its base (the clean or base image, or the newest SRDS slot) and the whole log
after it, then restores the rows into the engine (at 10^6 messages the restore
alone is seconds: an entry object and a sorted map slot per message). A warm
one (``standby = "warm"``) does all of that once, at start, into an engine pair
of its own that no client sees, and then applies what the owner appends, every
``poll`` seconds. At takeover it applies only the records between its position
and the seal's cut, and the daemon installs that pair as it stands.

How a record is applied. The reference fold stays the judge (recovery/fold.py):
for each record, the messages it touches are taken out of the engine as image
rows (``row_of``), the fold applies the record to those rows, and the engine
entries are replaced by the rows as they now are (``Structure.forget``, then
``restore``, as an image load would make them). So the live pair is, record by
record, what restoring the fold's rows would give, without ever holding a
second copy of the messages.

Which records a pass may fold. A pair's records come from one writer at a time
(its owner), and a new epoch stamps its records after the sealed ones, so the
(timestamp, writer, LSN) order of a fold is each epoch's series in LSN order,
one epoch after the other. A pass therefore reads, from the view of etcd it
starts with, only the *sealed* writers up to their cuts and the *owner's*
series to its current end (with those the owner rolled away from while owning
the pair, to where they end: its owner key names them), and merges them in
that order. A writer that is neither (a dead owner not yet sealed, another
node's series) is not read at all until a seal says where it ends: a seal is
recorded in etcd only after the sealed series were made durable, so the first
pass that sees a seal reads every sealed record, and they all sort before the
new owner's. For the same reason the owner's series is not read until the view
holds the seal of its epoch: the pass reads the files after the view, and would
fold records of the new epoch before sealed records the view does not cut yet.
Records of a pair beyond a writer's cut are never folded, with one exception
the tail cannot avoid: records the owner wrote but which a later seal leaves
out (un-fsynced writes lost with its machine, or late writes of a paused owner
read before the seal appeared). ``WarmPair.overshoots`` finds those against
every new seal, and the pair is then loaded again from its base (rare; logged
as ``warm_image_reloaded``); at takeover it falls back to the cold rebuild.

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
from ..engine import Structure, StructurePair
from ..records import EFFECTS, KEY, OTHERS, STRUCTURE, row_of
from ..recovery.fold import fold
from ..recovery.keys import remembered
from ..recovery.restart import Rebuilt
from ..recovery.sealed import base_rows
from ..srds import slots
from ..storage import image
from .etcd import EtcdError
from .ownership import Owner, View, key

if TYPE_CHECKING:
    from .node import GroupNode

log = structlog.get_logger()

__all__ = ["END", "Follower", "Lag", "Tailer", "WarmPair", "limits"]

END = 2**63  # "to the end of the series as it is now"
READ = 256 * 1024  # bytes read at a time past a cursor
PUBLISH_EVERY = 1.0  # seconds between two lag updates of one pair in etcd


def followed(view: View, name: str) -> Owner | None:
    """The owner of pair ``name`` whose series a pass reads: None until the view holds
    the seal of its epoch. The owner writes nothing of the pair before its seal, but
    a pass reads its series after the view was read, and may then find records of
    the new epoch while the view does not cut yet the sealed records they follow."""
    owner, seals = view.owners.get(name), view.seals.get(name)
    return owner if owner is not None and seals and seals[-1].epoch == owner.epoch else None


def limits(owner: Owner | None, cuts: Mapping[str, int]) -> dict[str, int]:
    """The last LSN a pass may fold of each writer: the sealed ones to their cuts, the
    owner's series to its end, and those it rolled away from while owning the pair
    to where they end; writers not named are not read (module docstring)."""
    if owner is None:
        return dict(cuts)
    return {**owner.rolled, **cuts, owner.writer: END}


@dataclass
class Lag:
    """How far behind the owner the last pass found this standby."""

    records: int = 0
    seconds: float = 0.0


@dataclass
class WarmPair:
    """One pair's structures, live engine structures kept as the reference fold of
    the log they cover would have them (pure: no I/O)."""

    structures: dict[str, Structure]
    covered: dict[str, dict[str, int]]  # structure -> writer -> LSN its base covers
    last_ids: dict[str, int]
    sources: dict[str, str]
    folded: dict[str, int] = field(default_factory=dict)  # writer -> newest LSN of ours folded
    replayed: int = 0
    # the pair's idempotency keys of the last dedup_window seconds (cqsd/dedup.py), kept
    # current as the rows are: a takeover need not read them back from the log
    keys: Remembered = field(default_factory=lambda: Remembered(0))
    # structure -> its SRDS purges as counted before its base was read: after another,
    # the log folded here no longer counts (``purged``)
    purges: dict[str, int] = field(default_factory=dict)

    def start(self, writer: str) -> int:
        """The first LSN to read of ``writer``: one past what every base covers."""
        return min(c.get(writer, 0) for c in self.covered.values()) + 1

    def targets(self, rec: Record) -> list[str]:
        """The structures of this pair that ``rec`` changes and their base does not cover."""
        body = rec.body
        if not isinstance(body, dict):
            return []
        return [name for name in dict.fromkeys((body.get(STRUCTURE), *body.get(OTHERS, ())))
                if name in self.covered and rec.lsn > self.covered[name].get(rec.writer, 0)]

    def counted(self, rec: Record) -> None:
        """``rec`` was folded (overshoots judges the newest of each writer)."""
        self.folded[rec.writer] = rec.lsn
        self.replayed += 1
        body = rec.body
        if KEY in body and (found := key_of_record(body)) is not None:
            self.keys.remember(found[0], found[1], rec.timestamp)

    def apply(self, rec: Record) -> bool:
        """Fold ``rec`` into the structures if it is of this pair and not covered. The
        reference fold is the judge: the rows of the messages the record touches are
        taken from the engine, folded, and put back in place of the old entries.
        Raises FoldError (an effect on a message not here)."""
        names = self.targets(rec)
        for name in names:
            self.last_ids[name] = max(self.last_ids[name],
                                      mirror(self.structures[name], rec.body, name))
        if names:
            self.counted(rec)
        return bool(names)

    def overshoots(self, cut: Mapping[str, int], *, sealed_only: bool = False) -> list[str]:
        """The writers of which a record beyond ``cut`` was folded: the structures hold
        what the log no longer counts. ``sealed_only`` (while tailing) leaves out
        writers not in ``cut``: the owner, and an owner gone whose seal is still to come."""
        return sorted(w for w, lsn in self.folded.items()
                      if (w in cut or not sealed_only) and lsn > cut.get(w, 0))


def mirror(s: Structure, body: dict[str, Any], name: str) -> int:
    """Apply one record of ``name`` to the live structure ``s`` through the reference
    fold (recovery/fold.py): the touched messages as rows, folded, restored. Returns
    the highest entry id the record put (0 if none). Raises FoldError."""
    ids = {effect[1] for effect in body[EFFECTS]} if body.get(STRUCTURE) == name else set()
    others = body.get(OTHERS)
    if others and name in others:
        ids.update(effect[1] for effect in others[name])
    rows = {i: row_of(s.entry(i)) for i in ids if s.holds(i)}
    last_id = fold(rows, [body], name)
    for i in sorted(ids):
        if s.holds(i):
            s.forget(i)
        row = rows.get(i)
        if row is not None:
            s.restore(*row)
    s.events.clear()  # nobody listens to a standby's structures: the takeover announces
    return last_id


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


def purged(warm: WarmPair, srds: Path) -> bool:
    """Whether a structure of ``warm`` had its checkpoints purged since its base was
    read (RECOVER --purge, a structure delete, by its owner): the purge drops messages
    without a record of it in the log, so the rows folded here still hold them, and a
    takeover from them served what the owner had purged, and logged effects on them
    that no later fold could apply. Raises ManifestError."""
    return any(slots.purges(srds, name) != count for name, count in warm.purges.items())


def _order(item: tuple[Record, tuple[int, int]]) -> tuple[int, str, int]:
    rec = item[0]
    return (rec.timestamp, rec.writer, rec.lsn)


def load(structures: list[Structure], images: Path, srds: Path, log_dir: Path,
         until: Mapping[str, int], window: float = 0) -> tuple[WarmPair, Follower]:
    """Fill a pair's empty ``structures`` from their base and the log up to ``until``
    (as a cold rebuild does, but keeping the cursors); with the idempotency keys of
    the last ``window`` seconds, those the base covers read from the log, the rest as
    they are folded. Raises ImageError, FoldError, Trimmed, CorruptLog."""
    rows, covered, last_ids, sources = {}, {}, {}, {}
    purges = {s.name: slots.purges(srds, s.name) for s in structures}  # before the bases
    for s in structures:
        report = Rebuilt(s.name, clean=False)
        header, rows[s.name] = base_rows(s.name, images, srds, report)
        covered[s.name], last_ids[s.name], sources[s.name] = (
            dict(header.get("lsn", {})), header.get("last_id", 0), report.source)
    warm = WarmPair({s.name: s for s in structures}, covered, last_ids, sources,
                    purges=purges)
    primary = structures[0].name
    covers = {w: min(lsn, warm.start(w) - 1) for w, lsn in until.items()}
    warm.keys = remembered(log_dir, covers, dict.fromkeys(warm.structures, primary), window,
                           time.time_ns(), 0)[primary]
    follower = Follower(log_dir, warm.start)
    for rec in follower.read(until):  # folded as rows: a bulk load beats entry by entry
        names = warm.targets(rec)
        for name in names:
            last_ids[name] = max(last_ids[name], fold(rows[name], [rec.body], name))
        if names:
            warm.counted(rec)
    for s in structures:
        image.restore(s, rows.pop(s.name))
        s.last_id = max(s.last_id, last_ids[s.name])
    return warm, follower


@dataclass
class Standing:
    """One pair this node stands by for: its live structures, the cursors, the last lag."""

    pair: StructurePair
    warm: WarmPair
    follower: Follower
    lag: Lag = field(default_factory=Lag)
    published: float = float("-inf")
    owner_writer: str | None = None  # the series the last pass tailed to its end


class Tailer:
    """Keeps a ``Standing`` for every pair this node could take and does not own."""

    def __init__(self, node: GroupNode, pairs: Mapping[str, tuple[str, ...]], images: Path,
                 srds: Path, log_dir: Path, poll: float,
                 new_pair: Callable[[str], StructurePair], window: float = 0) -> None:
        self.node = node  # the GroupNode: its view, what it owns, its etcd and lease
        self.pairs = dict(pairs)  # primary -> the names of the pair's structures
        self.new_pair = new_pair  # an empty pair as the daemon's definitions say
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
                await self.publish(name)
            await trio.sleep(self.poll)

    def _pass(self, name: str, view: View) -> None:
        t0 = time.thread_time()
        try:
            owner = followed(view, name)
            owner_writer = owner.writer if owner is not None else None
            cuts = view.cuts(name)
            until = limits(owner, cuts)
            s = self.standing.get(name)
            if s is not None and (over := s.warm.overshoots(cuts, sealed_only=True)):
                log.warning("warm_image_reloaded", structure=name, writers=over,
                            why="records folded here lie beyond a newer seal")
                s = None
            if s is not None and purged(s.warm, self.srds):
                log.warning("warm_image_reloaded", structure=name,
                            why="its owner purged its checkpoints")
                s = None
            if s is None:
                pair = self.new_pair(name)
                gc.disable()
                try:
                    warm, follower = load(pair.structures(), self.images, self.srds,
                                          self.log_dir, until, self.window)
                finally:
                    gc.enable()
                gc.freeze()  # as after a restart: the collector never walks the loaded pair
                self.standing[name] = Standing(pair, warm, follower,
                                               owner_writer=owner_writer)
                log.info("warm_standby_loaded", structure=name, sources=warm.sources,
                         records_replayed=warm.replayed,
                         messages=sum(s.message_count() for s in pair.structures()))
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

    async def publish(self, name: str, at_once: bool = False) -> None:
        """This node's lag for ``name`` in etcd, bound to its lease, at most once a second;
        after every pass while a planned move brings the pair here (its owner waits for
        it to hand the pair over), and ``at_once`` as such a move begins."""
        s, node = self.standing.get(name), self.node
        at = time.monotonic()
        often = at_once or name in node.receiving
        if s is None or (at - s.published < PUBLISH_EVERY and not often) \
                or not node.lease.lease:
            return
        s.published = at
        with trio.move_on_after(node.etcd.timeout):
            try:
                await node.etcd.put(key(node.group.name, "standby", name, node.group.node),
                                    json.dumps({"records": s.lag.records,
                                                "seconds": s.lag.seconds,
                                                "writer": s.owner_writer,
                                                "read": s.follower.next.get(
                                                    s.owner_writer or "", 1) - 1,
                                                "receiving": name in node.receiving}),
                                    lease=node.lease.lease)
            except EtcdError:
                pass  # the lag is advisory; the next pass tries again

    async def claim(self, name: str) -> Standing | None:
        """At takeover: the pair as the tail left it, out of the tail (None if there is none)."""
        self.claiming.add(name)  # a pass under way stops at its next record
        try:
            async with self.locks[name]:
                return self.standing.pop(name, None)
        finally:
            self.claiming.discard(name)


def finish(standing: Standing, cut: Mapping[str, int]) -> list[Rebuilt] | None:
    """Fold the records between the tail and the seal's ``cut`` into the standing
    pair, which is then the pair to serve; None if it went past the cut (rebuild
    cold). Raises FoldError, Trimmed, CorruptLog."""
    warm = standing.warm
    if warm.overshoots(cut):
        return None
    t0 = time.perf_counter()
    before = warm.replayed
    for rec in standing.follower.read(cut):
        warm.apply(rec)
    replay = time.perf_counter() - t0
    return [Rebuilt(s.name, clean=False, source="warm", messages=s.message_count(),
                    replayed=warm.replayed - before, replay_seconds=replay,
                    lock_owners=set(s.locks.by_owner))
            for s in standing.pair.structures()]
