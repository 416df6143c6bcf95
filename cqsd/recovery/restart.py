"""Restart: rebuild every structure from its image and the log tail (docs/recovery.md)."""

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import logstream
from logstream.durable import fsync_dir
from logstream.series import list_segments

from ..engine import Structure
from ..errors import DaemonError
from ..records import DATA, MAP, OWNER, RECOVERABLE, WHERE
from ..srds import slots
from ..storage import image
from .fold import fold


@dataclass
class Rebuilt:
    structure: str
    clean: bool  # from a clean-shutdown image
    # image, base, srds (a checkpoint folded here) or spark (the recovery job)
    source: str = "empty"
    messages: int = 0
    replayed: int = 0  # records of this structure folded
    image_seconds: float = 0.0
    replay_seconds: float = 0.0
    lock_owners: set[str] = field(default_factory=set)


class LogBehindImage(DaemonError):
    """An image covers log records the log no longer has: the two do not belong together."""


PROGRESS_EVERY = 200_000  # log records folded between two progress reports


def rebuild_all(structures: list[Structure], images: Path, log_dir: Path, writer: str,
                log_end: int, srds: Path, spark_recover=None,
                spark_records: int = 0, progress=None) -> list[Rebuilt]:
    """Load images and fold the log into ``structures`` (empty, as configured).

    After a crash each structure starts from the newer of its base image and its
    newest valid checkpoint (SRDS slot). From a checkpoint whose log tail is longer
    than ``spark_records`` records, ``spark_recover(name) -> image path`` (the Spark
    recovery job) does the fold instead of this process.

    The garbage collector is paused meanwhile (a million new rows and entries would
    trigger collections that find nothing) and what survives is frozen out of it.

    ``progress(text)``, if given, hears how far it got (the daemon tells systemd).
    ``log_end`` is the last LSN of ``writer`` on disk. Raises LogBehindImage if an
    image records a later position, ImageError, FoldError or a logstream error.
    """
    gc.disable()
    try:
        return _rebuild_all(structures, images, log_dir, writer, log_end, srds, spark_recover,
                            spark_records, progress or (lambda text: None))
    finally:
        gc.enable()
        gc.freeze()


def _rebuild_all(structures: list[Structure], images: Path, log_dir: Path, writer: str,
                 log_end: int, srds: Path, spark_recover, spark_records: int,
                 progress) -> list[Rebuilt]:
    plans = []
    for i, s in enumerate(structures, 1):
        progress(f"recovering: loading {s.name} ({i} of {len(structures)})")
        clean_path, base_path = image.path_for(images, s.name), images / f"{s.name}.base"
        t0 = time.perf_counter()
        report = Rebuilt(s.name, clean=clean_path.exists())
        if report.clean:
            report.source = "image"
            header, rows = image.read_rows(clean_path, s.name)
        else:
            header, rows = _crash_start(s.name, base_path, srds, writer, log_end,
                                        spark_recover, spark_records, report)
        report.image_seconds = time.perf_counter() - t0
        covered = header.get("lsn", {}).get(writer, 0)
        if covered > log_end:
            raise LogBehindImage(
                f"{clean_path if report.clean else base_path} covers log position {covered} "
                f"but the log in {log_dir} ends at {log_end}: records were lost"
            )
        plans.append((s, report, header, rows, clean_path))

    t0 = time.perf_counter()
    start = {s.name: header.get("lsn", {}).get(writer, 0) for s, _, header, _, _ in plans}
    segments = list_segments(log_dir, writer)
    first = segments[0].first_lsn if segments else 1  # earlier records were trimmed
    for name, covered in start.items():
        if covered == 0 and first > 1:  # a structure new to this data directory
            start[name] = first - 1
        elif covered + 1 < first:
            raise LogBehindImage(f"structure {name} starts from log position {covered} but "
                                 f"the log in {log_dir} was trimmed up to {first - 1}")
    by_name = {s.name: (s, report, rows) for s, report, _, rows, _ in plans}
    last_ids = dict.fromkeys(by_name, 0)
    first_lsn = min(start.values(), default=0) + 1
    for n, record in enumerate(logstream.read(log_dir, start={writer: first_lsn},
                                              cut={writer: log_end})):
        if n % PROGRESS_EVERY == 0:
            progress(f"recovering: folding the log, record {record.lsn} of {log_end}")
        body = record.body
        if not isinstance(body, dict):
            continue
        for name in (body.get("s"), *body.get("x", ())):  # "x": an overflow move's other side
            if name in by_name and record.lsn > start[name]:
                _, report, rows = by_name[name]
                last_ids[name] = max(last_ids[name], fold(rows, [body], name))
                report.replayed += 1
    replay = time.perf_counter() - t0

    for s, report, header, rows, clean_path in plans:
        report.replay_seconds = replay
        t0 = time.perf_counter()
        image.restore(s, rows)
        report.image_seconds += time.perf_counter() - t0  # reading plus loading the rows
        s.last_id = max(s.last_id, header.get("last_id", 0), last_ids[s.name])
        report.messages = len(rows)
        report.lock_owners = {r[OWNER] for r in rows.values() if r[WHERE] == "locked"}
        if report.clean:  # from now on it is the base that a crash restart starts from
            os.replace(clean_path, clean_path.with_suffix(".base"))
            fsync_dir(clean_path.parent)
    return [p[1] for p in plans]


def _crash_start(name: str, base_path: Path, srds: Path, writer: str, log_end: int,
                 spark_recover, spark_records: int, report: Rebuilt) -> tuple[dict, dict]:
    """The starting rows of a crash restart: the recoverable rows of the base image or
    of the newest valid checkpoint, whichever covers more of the log."""
    base = image.read_header(base_path, name) if base_path.exists() else None
    newest = slots.newest_valid(srds, name)
    base_at = base["lsn"].get(writer, 0) if base else -1
    if newest is not None and newest.lsn.get(writer, 0) >= base_at:
        tail = log_end - newest.lsn.get(writer, 0)
        recovered = spark_recover(name) if spark_recover and tail > spark_records else None
        if recovered is not None:
            report.source = "spark"
            header, rows = image.read_rows(recovered, name)
            return header, _maps_only(rows)
        return from_slot(newest, report)
    if base is not None:
        return from_base(base_path, name, report)
    return {"lsn": {}, "last_id": 0}, {}


def from_slot(slot: slots.Slot, report: Rebuilt) -> tuple[dict, dict]:
    """A structure's starting rows from a checkpoint slot; offloaded bytes stay in
    their data sets (the rows hold maps only)."""
    report.source = "srds"
    return ({"lsn": dict(slot.lsn), "last_id": slot.last_id},
            slots.read_rows(slot, offloaded_data=False))


def from_base(base_path: Path, name: str, report: Rebuilt) -> tuple[dict, dict]:
    """A structure's starting rows from its base image: only the recoverable ones,
    since a crash took the others."""
    report.source = "base"
    header, rows = image.read_rows(base_path, name)
    return header, {i: r for i, r in rows.items() if r[RECOVERABLE]}


def _maps_only(rows: dict[int, list]) -> dict[int, list]:
    """Rows as a restart holds them: an offloaded row's bytes are in its data set."""
    for row in rows.values():
        if row[MAP] is not None:
            row[DATA] = b""
    return rows


def load_recovered(s: Structure, path: Path, log_dir: Path, cut: dict[str, int],
                   offloaded=None) -> Rebuilt:
    """Fill the empty structure ``s`` from a recovery job's image plus the log records
    after the position it covers up to ``cut`` (the durable end of the live log).

    Both are materialising (docs/recovery.md): the rows of offloaded messages come
    with their payloads as well as their maps, for data sets to be rebuilt from;
    ``offloaded(row)``, if given, is called with each before its payload is
    dropped from memory (the structure keeps only the map).
    """
    report = Rebuilt(s.name, clean=False, source="spark")
    t0 = time.perf_counter()
    header, rows = image.read_rows(path, s.name)
    report.image_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    start = {w: lsn + 1 for w, lsn in header.get("lsn", {}).items()}

    def bodies():
        for record in logstream.read(log_dir, start=start, cut=cut):
            if isinstance(record.body, dict):
                report.replayed += 1
                yield record.body

    last_id = fold(rows, bodies(), s.name, materialise=True)
    report.replay_seconds = time.perf_counter() - t0
    for row in rows.values():
        if row[MAP] is not None:
            if offloaded is not None:
                offloaded(row)
            row[DATA] = b""
    image.restore(s, rows)
    s.last_id = max(s.last_id, header.get("last_id", 0), last_id)
    report.messages = len(rows)
    report.lock_owners = {r[OWNER] for r in rows.values() if r[WHERE] == "locked"}
    return report
