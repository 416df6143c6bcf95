"""Takeover: seal the log of a pair's earlier owners, and rebuild the pair from it.

Design note. In a group (docs/group.md) every node writes its own series, one
per incarnation (``NODE1-7``), and a pair's records are spread over the series
of every node that ever owned it. A new owner never writes to, or repairs,
another node's series (BookKeeper's ledger fencing): it *seals* them. It
first fsyncs their segment files itself — on a local file system that makes
durable whatever the old owner wrote and did not yet fsync, so nothing the new
owner folds can later vanish in a power cut — then takes each series' last
good record as its cut. Records of the pair beyond a writer's cut are late
writes of a deposed owner: restart, the reference fold and the Spark jobs read
each series only up to the cut (the ``WRITER=LSN`` cuts they already take).
An owner that lost its lease never writes again under that incarnation, so
one cut per writer and pair is all a fold needs; a pair handed over by a
planned move leaves no records between its seal and a later return.

The rebuild is the crash restart's, for one pair, with a cut per writer: start
from the clean image if the last owner stopped cleanly (non-recoverable
messages then survive the move), else from the newer of the recoverable base
image and the newest checkpoint (SRDS slot), and fold the records after the
positions it covers, in (timestamp, writer, LSN) order. New epochs stamp their
records after the sealed ones (``End.timestamp``), whatever the clocks say,
so that order is the order the owners wrote in.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import logstream
from logstream.durable import fsync_dir
from logstream.scan import scan_to_end
from logstream.series import list_series

from ..engine import Structure
from ..records import EPOCH, OTHERS, OWNER, SEALED, STRUCTURE, WHERE
from ..srds import slots
from ..storage import image
from .fold import fold
from .restart import Rebuilt, from_base, from_slot

__all__ = ["End", "base_rows", "cut_of", "rebuild_pair", "seal"]


@dataclass(frozen=True)
class End:
    """Where a sealed series ends: its last good record and that record's timestamp."""

    lsn: int
    timestamp: int


def seal(log_dir: Path, writers: Iterable[str]) -> dict[str, End]:
    """The end of each of ``writers``' series, made durable first; a writer with no
    series ends at 0. Raises CorruptLog for corruption inside a series."""
    series = list_series(log_dir)
    ends = {}
    for writer in writers:
        segments = series.get(writer, [])
        for seg in segments:
            fd = os.open(seg.path, os.O_RDONLY)
            try:
                os.fsync(fd)  # the old owner's page cache, made durable before we count it
            finally:
                os.close(fd)
        lsn = timestamp = 0
        for seg in reversed(segments):  # the newest record with a timestamp
            scan = scan_to_end(seg, last=seg is segments[-1])
            lsn = max(lsn, scan.next_lsn - 1)
            if scan.last_timestamp is not None:
                timestamp = scan.last_timestamp
                break
        ends[writer] = End(lsn, timestamp)
    return ends


def cut_of(log_dir: Path, structure: str) -> dict[str, int]:
    """The cut a fold of ``structure`` takes from the log alone, without etcd: the
    seal of its newest epoch (whose first record repeats it), every other series to
    its end. For offline checkers and jobs; the daemon has the seals from etcd."""
    newest: tuple[int, dict[str, int]] = (0, {})
    for record in logstream.read(log_dir):
        body = record.body
        if isinstance(body, dict) and EPOCH in body and body.get(STRUCTURE) == structure:
            if body[EPOCH] > newest[0]:
                newest = (body[EPOCH], {str(w): int(n) for w, n in body[SEALED].items()})
    return {**logstream.tail_positions(log_dir), **newest[1]}


def rebuild_pair(structures: list[Structure], images: Path, log_dir: Path, srds: Path,
                 cut: dict[str, int],
                 progress: Callable[[str], None] = lambda text: None) -> list[Rebuilt]:
    """Fill the empty ``structures`` of one pair from their image or checkpoint and the
    log of every writer in ``cut`` up to its LSN there. Raises ImageError, FoldError,
    Trimmed or CorruptLog."""
    gc.disable()
    try:
        return _rebuild(structures, images, log_dir, srds, cut, progress)
    finally:
        gc.enable()


def _rebuild(structures: list[Structure], images: Path, log_dir: Path, srds: Path,
             cut: dict[str, int], progress: Callable[[str], None]) -> list[Rebuilt]:
    plans = {}
    for s in structures:
        t0 = time.perf_counter()
        report = Rebuilt(s.name, clean=image.path_for(images, s.name).exists())
        header, rows = base_rows(s.name, images, srds, report, cut)
        report.image_seconds = time.perf_counter() - t0
        plans[s.name] = (s, report, header.get("lsn", {}), rows, header.get("last_id", 0))
    start: dict[str, int] = {}
    for _, _, covered, _, _ in plans.values():
        for writer in cut:
            at = covered.get(writer, 0) + 1
            start[writer] = min(start.get(writer, at), at)
    t0 = time.perf_counter()
    last_ids = dict.fromkeys(plans, 0)
    progress("folding the sealed log")
    for record in logstream.read(log_dir, start=start, cut=cut):
        body = record.body
        if not isinstance(body, dict):
            continue
        for name in (body.get(STRUCTURE), *body.get(OTHERS, ())):
            plan = plans.get(name)
            if plan is not None and record.lsn > plan[2].get(record.writer, 0):
                last_ids[name] = max(last_ids[name], fold(plan[3], [body], name))
                plan[1].replayed += 1
    replay = time.perf_counter() - t0
    reports = []
    for name, (s, report, _, rows, last_id) in plans.items():
        t0 = time.perf_counter()
        image.restore(s, rows)
        report.image_seconds += time.perf_counter() - t0
        report.replay_seconds = replay
        s.last_id = max(s.last_id, last_id, last_ids[name])
        report.messages = len(rows)
        report.lock_owners = {r[OWNER] for r in rows.values() if r[WHERE] == "locked"}
        clean_path = image.path_for(images, name)
        if report.clean:  # from now on the base a crash restart or takeover starts from
            os.replace(clean_path, clean_path.with_suffix(".base"))
            fsync_dir(clean_path.parent)
        reports.append(report)
    return reports


def base_rows(name: str, images: Path, srds: Path, report: Rebuilt,
              cut: dict[str, int] | None = None) -> tuple[dict, dict]:
    """The rows a pair's structure starts from and the header saying what they cover
    (also a warm standby's start, group/standby.py). A base image that covers a
    writer of ``cut`` past its cut is not used: it would hold late writes of a
    deposed owner (an owner saves one only while it serves the pair,
    server/checkpoints.py, but it may be paused between its check and the write)."""
    clean_path, base_path = image.path_for(images, name), images / f"{name}.base"
    if report.clean:
        report.source = "image"
        return image.read_rows(clean_path, name)
    base = image.read_header(base_path, name) if base_path.exists() else None
    newest = slots.newest_valid(srds, name)
    start = starting_point(newest.lsn if newest is not None else None,
                           base["lsn"] if base is not None else None, cut)
    if start == "slot" and newest is not None:
        return from_slot(newest, report)
    if start == "base":
        return from_base(base_path, name, report)
    return {"lsn": {}, "last_id": 0}, {}


def starting_point(slot: dict[str, int] | None, base: dict[str, int] | None,
                   cut: dict[str, int] | None) -> str | None:
    """Which of a pair's newest SRDS slot and its base image (their log positions)
    a rebuild starts from: ``"slot"``, ``"base"`` or None (the empty structure).
    Also the takeover's estimate of the log it owes (server/checkpoints.py), so the
    two cannot drift apart."""
    if base is not None and cut is not None and not _covers(
            cut, {w: lsn for w, lsn in base.items() if w in cut}):
        base = None
    if slot is not None and (base is None or _covers(slot, base)):
        return "slot"
    return "base" if base is not None else None


def _covers(a: dict[str, int], b: dict[str, int]) -> bool:
    """Whether positions ``a`` cover at least what ``b`` do, writer by writer."""
    return all(a.get(writer, 0) >= lsn for writer, lsn in b.items())

