"""The SRDS jobs: checkpoint, recover and report (docs/srds.md).

Each returns the result object the CLI prints. A checkpoint and a recovery run
one Spark action each (reading the slot and the log, folding, writing Parquet
are one pipeline), so the log is decoded once; their stages are timed from the
driver, with the action split at the moment the last log segment was decoded.
"""

import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import structlog
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

import logstream
from logstream.durable import make_dirs

from ..storage import image, repository
from ..storage.datadir import DataDir
from . import fold, manifest, parts, segments, slotfiles, slots

log = structlog.get_logger()


class JobError(Exception):
    """A job that cannot run as asked; the message says why."""


class Stages:
    """Wall-clock seconds per stage, each logged as an ``srds_stage`` event when it ends."""

    def __init__(self, job: str, structure: str) -> None:
        self.job, self.structure = job, structure
        self.seconds: dict[str, float] = {}
        self.began = time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[dict]:
        """Time a stage; fields put in the yielded dict go into its event."""
        info: dict = {}
        t0 = time.perf_counter()
        yield info
        self.add(name, time.perf_counter() - t0, **info)

    def add(self, name: str, seconds: float, **info) -> None:
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 3)
        log.info("srds_stage", job=self.job, structure=self.structure, stage=name,
                 seconds=round(seconds, 3), elapsed=round(self.total, 3), **info)

    @property
    def total(self) -> float:
        return time.perf_counter() - self.began


def checkpoint(spark: SparkSession, data_dir: Path, structure: str,
               cut: dict[str, int] | None = None, stages: Stages | None = None) -> dict:
    """Fold the newest valid slot and the log after it up to ``cut`` (default: the
    end of the log now) into the other slot, make it current, and record it in
    the repository. Raises JobError, SlotError, ManifestError, FoldError, a
    logstream error or RepositoryError; the previous slot stays current."""
    slots.check_structure_name(structure)
    stages = stages or Stages("checkpoint", structure)
    layout, started = DataDir(str(data_dir)), time.time()
    attempt: dict = {"slot": None, "lsn_from": {}, "lsn_to": {}}
    try:
        with slots.locked(layout.srds, structure) as directory:
            slots.clear_leftovers(directory)
            base, tasks = _plan(stages, layout, structure, cut, attempt)
            target = slots.other(base.name if base else None)
            attempt["slot"] = target
            staged = slots.staging_dir(directory, "checkpoint")
            try:
                coverage, last_id, _ = _fold_into(staged, spark, stages, structure, base, tasks,
                                                  parts.SLOT)
                with stages.stage("commit") as info:
                    slot = slots.install(directory, staged, target, attempt["lsn_to"], last_id,
                                         started)
                    info.update(slot=slot.name, rows=slot.rows)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
    except Exception as err:
        _record(layout, structure, attempt, started, None, None, err)
        raise
    _record(layout, structure, attempt, started, slot.rows, coverage.matched, None)
    return {"structure": structure, "slot": slot.name, "lsn": slot.lsn, "rows": slot.rows,
            "last_id": slot.last_id, "records": coverage.matched, "scanned": coverage.records,
            "seconds": round(stages.total, 3), "stages": stages.seconds}


def recover(spark: SparkSession, data_dir: Path, structure: str,
            to_image: Path | None = None, stages: Stages | None = None,
            cut: dict[str, int] | None = None) -> dict:
    """Fold the newest valid slot (or nothing) and the log after it up to ``cut``
    (default: the end of the log now) into a structure image at ``to_image``
    (default ``images/<S>.recovered``). In a group the cut holds the seals' cuts:
    a deposed owner's records past them are never folded (docs/group.md). Raises
    what ``checkpoint`` raises, and ImageError."""
    stages = stages or Stages("recover", structure)
    layout = DataDir(str(data_dir))
    path = Path(to_image) if to_image else layout.images / f"{structure}.recovered"
    attempt: dict = {"lsn_from": {}, "lsn_to": {}}
    with slots.locked(layout.srds, structure, exclusive=False) as directory:
        base, tasks = _plan(stages, layout, structure, cut, attempt)
        staged = slots.staging_dir(directory, "recover")
        try:
            coverage, last_id, chunks = _fold_into(staged, spark, stages, structure, base,
                                                   tasks, parts.IMAGE)
            with stages.stage("image") as info:
                count = sum(c.rows for c in chunks)
                make_dirs(path.parent)
                image.write_packed(path, structure, parts.image_chunks(staged, chunks), count,
                                   attempt["lsn_to"], last_id)
                info.update(rows=count)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    return {"structure": structure, "image": str(path), "from_slot": base.name if base else None,
            "lsn": attempt["lsn_to"], "rows": count, "last_id": last_id,
            "records": coverage.matched, "scanned": coverage.records,
            "seconds": round(stages.total, 3), "stages": stages.seconds}


def recover_together(spark: SparkSession, data_dir: Path, structures: list[str],
                     stages: Stages | None = None, cut: dict[str, int] | None = None) -> dict:
    """RECOVER CFSTRUCT of several structures at once (seed 002: "you can recover
    several CF structures simultaneously"): each one's newest valid slot and the log
    after it, folded in one Spark action, into ``images/<S>.recovered`` each, as
    ``recover`` makes one. A structure whose plan, log or image fails is reported
    with its error in ``failed``, and gets no image; the others are recovered. Only
    an error of the action itself that no structure's log explains fails them all
    (raised). ``cut``, as ``recover``'s, holds for every structure."""
    stages = stages or Stages("recover", ",".join(structures))
    layout = DataDir(str(data_dir))
    failed: dict[str, str] = {}
    plans: dict[str, tuple[slots.Slot | None, fold.LogEvents, dict]] = {}
    with ExitStack() as held:
        frames: list = []
        tasks: list[segments.Task] = []
        for structure in structures:
            try:
                directory = held.enter_context(
                    slots.locked(layout.srds, structure, exclusive=False))
                attempt: dict = {"lsn_from": {}, "lsn_to": {}}
                base, planned = _plan(stages, layout, structure, cut, attempt)
            except Exception as err:  # noqa: BLE001 - this structure's failure, named
                failed[structure] = _named(err)
                continue
            events = fold.LogEvents(spark, planned, {structure}, first=len(tasks))
            tasks += planned
            plans[structure] = (base, events, attempt)
            frame = events.frame
            if base is not None:
                frame = frame.unionByName(fold.slot_events(fold.read_slot(spark, base),
                                                           structure))
            frames.append(frame)
        if not frames:
            return {"recovered": {}, "failed": failed, "seconds": round(stages.total, 3),
                    "stages": stages.seconds}
        staged = slots.staging_dir(directory, "recover")
        try:
            chunks = _fold_together(staged, spark, stages, frames, tasks,
                                    {s: p[1] for s, p in plans.items()}, failed)
            recovered = {s: _image_of(layout, stages, staged, s, plans[s], chunks, failed)
                         for s in plans if s not in failed}
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    return {"recovered": {s: r for s, r in recovered.items() if r is not None},
            "failed": failed, "seconds": round(stages.total, 3), "stages": stages.seconds}


def _fold_together(staged: Path, spark: SparkSession, stages: Stages, frames: list,
                   tasks: list[segments.Task], events: dict[str, fold.LogEvents],
                   failed: dict[str, str]) -> list[parts.Chunk]:
    """The one action of ``recover_together``: every structure's rows folded into
    image files in ``staged``; their index. A structure whose log tasks reported
    damage is put in ``failed``, and the others with it, naming them (they were
    folded in the same action); an action failure none explains is raised."""
    began = time.time()
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    staged.mkdir()
    try:
        with fold.raised():
            index = fold.by_entry(frame).mapInArrow(
                parts.writer(tasks, str(staged), parts.IMAGE),
                from_arrow_schema(parts.INDEX)).collect()
    except Exception:
        explained = False
        for structure, logged in events.items():
            try:
                segments.raise_reported(logged.summaries())
            except Exception as damage:  # noqa: BLE001 - this structure's log, named
                failed[structure] = _named(damage)
                explained = True
        if not explained:
            raise
        damaged = [s for s in events if s in failed]
        for structure in events:
            failed.setdefault(structure, f"not recovered: the fold it shared failed on the "
                                         f"log of {', '.join(damaged)}; recover it again")
        return []
    ended = time.time()
    read_ends = [s["ended"] for e in events.values() for s in e.summaries() if "ended" in s]
    read = min(ended, max(read_ends, default=began)) - began
    stages.add("read", read)
    stages.add("fold", ended - began - read)
    return [parts.Chunk(**row.asDict()) for row in index]


def _image_of(layout: DataDir, stages: Stages, staged: Path, structure: str,
              plan: tuple[slots.Slot | None, fold.LogEvents, dict], chunks: list[parts.Chunk],
              failed: dict[str, str]) -> dict | None:
    """``images/<S>.recovered`` from the folded chunks of ``structure``, and what
    ``recover`` reports of it; None (and the error in ``failed``) if its log was
    not all read or the image cannot be written."""
    base, events, attempt = plan
    path = layout.images / f"{structure}.recovered"
    try:
        coverage = events.check()
        mine = [c for c in chunks if c.structure == structure]
        last_id = max(base.last_id if base else 0, coverage.last_ids.get(structure, 0))
        with stages.stage("image") as info:
            count = sum(c.rows for c in mine)
            make_dirs(path.parent)
            image.write_packed(path, structure, parts.image_chunks(staged, mine), count,
                               attempt["lsn_to"], last_id)
            info.update(image=structure, rows=count)
    except Exception as err:  # noqa: BLE001 - this structure's failure, named
        failed[structure] = _named(err)
        return None
    return {"structure": structure, "image": str(path),
            "from_slot": base.name if base else None, "lsn": attempt["lsn_to"], "rows": count,
            "last_id": last_id, "records": coverage.matched, "scanned": coverage.records}


def _named(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"


def report(data_dir: Path, structure: str) -> dict:
    """The slots of ``structure`` (valid, or why not), the log tail after the newest
    valid one per writer, whether that tail is all still there, and the last
    recorded checkpoints. Starts no Spark."""
    layout = DataDir(str(data_dir))
    directory = slots.structure_dir(layout.srds, structure)
    current = manifest.load(directory, structure)["current"]
    listed = slots.listed(layout.srds, structure)
    newest = next((slot for _, slot, problem in listed if problem is None), None)
    after = dict(newest.lsn) if newest else {}
    ends = logstream.tail_positions(layout.logstream) if layout.logstream.is_dir() else {}
    problem = None
    try:
        segments.plan(layout.logstream, after, ends)
    except (logstream.Trimmed, segments.LogTooShort) as err:
        problem = str(err)
    behind = [w for w, lsn in after.items() if ends.get(w, 0) < lsn]
    if behind and problem is None:
        problem = f"the log of writer(s) {', '.join(behind)} ends before the newest slot"
    return {
        "structure": structure, "current": current,
        "slots": [_describe(name, slot, why) for name, slot, why in listed],
        "tail": {w: {"after": after.get(w, 0), "end": ends.get(w, 0),
                     "records": max(0, ends.get(w, 0) - after.get(w, 0))}
                 for w in sorted(set(after) | set(ends))},
        "recoverable": problem is None, "problem": problem,
        "backups": repository.backups(layout.repository, structure)[:5],
    }


def _describe(name: str, slot: slots.Slot | None, problem: str | None) -> dict:
    described: dict = {"name": name, "valid": problem is None, "problem": problem}
    if slot is not None:
        described.update(lsn=slot.lsn, time=slot.time, rows=slot.rows, last_id=slot.last_id,
                         files=len(slot.files), bytes=sum(s for s, _ in slot.files.values()))
    return described


def _plan(stages: Stages, layout: DataDir, structure: str, cut: dict[str, int] | None,
          attempt: dict) -> tuple[slots.Slot | None, list[segments.Task]]:
    """The slot to start from, the positions covered, and the segments to read."""
    with stages.stage("plan") as info:
        if not layout.logstream.is_dir():
            raise JobError(f"{layout.logstream}: no logstream here; is {layout.root} a cqsd "
                           "data directory?")
        taken = dict(cut) if cut is not None else logstream.tail_positions(layout.logstream)
        base = slots.newest_valid(layout.srds, structure)
        start = dict(base.lsn) if base else {}
        for writer, lsn in taken.items():
            if base is not None and lsn < start.get(writer, 0):
                raise JobError(f"the cut {writer}={lsn} is behind slot {base.name} of "
                               f"{structure}, which holds {writer} up to LSN {start[writer]}")
        attempt["lsn_from"], attempt["lsn_to"] = start, {**start, **taken}
        tasks = segments.plan(layout.logstream, start, taken)
        info.update(slot=base.name if base else None, segments=len(tasks))
    return base, tasks


def _fold_into(staged: Path, spark: SparkSession, stages: Stages, structure: str,
               base: slots.Slot | None, tasks: list[segments.Task], kind: str
               ) -> tuple[segments.Coverage, int, list[parts.Chunk]]:
    """Fold the base slot and the planned segments into ``kind`` files in ``staged``
    (parts.py), in one Spark action; then check the tasks read the whole range.
    Returns what they read, the last entry id and the files' index.

    "read" runs from building the DataFrames to the end of the last log task,
    "fold" is the rest of the action. A damaged log explains any failure
    downstream of it (a missing record makes a later effect an orphan), so
    damage the tasks reported is raised in preference to the action's own error.
    """
    began = time.time()
    events = fold.LogEvents(spark, tasks, {structure})
    frame = events.frame
    if base is not None:
        frame = frame.unionByName(fold.slot_events(fold.read_slot(spark, base), structure))
    staged.mkdir()
    try:
        with fold.raised():
            index = fold.by_entry(frame).mapInArrow(
                parts.writer(tasks, str(staged), kind), from_arrow_schema(parts.INDEX)).collect()
    except Exception:
        segments.raise_reported(events.summaries())
        raise
    chunks = [parts.Chunk(**row.asDict()) for row in index]
    if kind == parts.SLOT and not chunks:  # a slot has a file even when it holds nothing
        slotfiles.write_empty(staged / "part-00000.parquet")
    ended = time.time()
    coverage = events.check()
    read = min(ended, coverage.read_ended or began) - began
    stages.add("read", read, records=coverage.records, matched=coverage.matched)
    stages.add("fold", ended - began - read)
    return coverage, max(base.last_id if base else 0, coverage.last_ids.get(structure, 0)), chunks


def _record(layout: DataDir, structure: str, attempt: dict, started: float, rows: int | None,
            records: int | None, error: Exception | None) -> None:
    """Note the job in the repository; failing to note a failure must not hide it."""
    try:
        repository.record_backup(
            layout.repository, structure=structure, slot=attempt.get("slot"),
            lsn_from=attempt["lsn_from"], lsn_to=attempt["lsn_to"], started=started,
            finished=time.time(), rows=rows, records=records,
            status="ok" if error is None else "failed",
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
    except repository.RepositoryError as err:
        if error is None:
            raise
        log.warning("srds_repository_unavailable", structure=structure, error=str(err))
