"""The traffic report (docs/srds.md): what the logstream says happened to each queue,
as Parquet tables for further analysis; ``plots.py`` draws them.

Design note. The log holds the effect of every request on every recoverable
message (docs/recovery.md), each stamped with its record's time: a ``P`` is a
put, an ``L`` a read with a lock (the count of deliveries rises by one), a
``D`` a delete, an ``R`` a message ready again (unlocked, moved, requeued,
suspended: the effect carries the outcome), ``O``/``I`` an overflow move. Each
message's history is its rows in log order, partitioned by (structure, id) as
in the fold (fold.py), so one window over them answers everything per
message: the queue it was on at each effect, when it was put, which delivery a
read was, how long a lock was held (from the ``L`` to the effect that ended
it). The tables aggregate those rows; ``--since`` filters effects by their
time after the window, so a message put before it still has its put time.

Segments are read as the checkpoint reads them (segments.plan/scan/check, one
task per segment, effects.rows_of), with every structure kept, and the payload
bytes dropped in the task: only their length travels.

What the log does not hold comes from the rest of the data directory, read
only: checkpoint durations from the repository's backup records, and the
structure-full and overflow episodes from the daemon's event log, when it is
given (``log_file``). Non-recoverable messages, browses and reads without a
lock are never logged, so they are not in the report.
"""

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

import logstream
from logstream.series import list_series

from ...engine.qtypes import QueueType
from ...records import (
    BLOCK,
    COLD_BY,
    DELETE,
    LEASED,
    LOCK,
    MAPPED,
    MOVED_IN,
    MOVED_OUT,
    NOT_BEFORE_AT,
    PUT,
    READY_AT,
)
from ...storage.datadir import DataDir
from .. import effects, segments
from ..fold import Summaries

KEPT = ["structure", "id", "ts", "writer", "lsn", "part", "idx", "kind", "qtype", "name",
        "put_time", "count", "home_qtype", "home_name"]
SCHEMA = pa.schema([effects.SCHEMA.field(c) for c in KEPT] + [pa.field("size", pa.int64())])
ORDER = ["ts", "writer", "lsn", "part", "idx"]
QUEUE = ["structure", "qtype", "queue"]
SUSPEND = int(QueueType.TRAN_SUSPEND)
LARGEST = 20  # messages in the largest-messages table
NS = 1_000_000_000
UTC_TIME = pa.timestamp("us", tz="UTC")
# The daemon's events that begin and end an episode (cqsd/server/eventlog.py).
EPISODES = {"structure_full": ("full", True), "structure_not_full": ("full", False),
            "overflow_mode": ("overflow mode", None), "overflow_status": ("overflow status", None)}


class Everything:
    """Every structure: the report keeps the effects on all of them."""

    def __contains__(self, name: object) -> bool:
        return True


@dataclass
class Report:
    """The report's tables (pyarrow), and where its figures came from."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    records: int = 0  # log records read
    span: tuple[float, float] | None = None  # epoch seconds of the first and last effect
    problems: list[str] = field(default_factory=list)  # what could not be read, and why
    sources: dict[str, str] = field(default_factory=dict)  # table -> where its figures came from


def plan(log_dir: Path) -> list[segments.Task]:
    """Every segment still in the log, up to each writer's end now (a live daemon
    goes on appending; the report stops there)."""
    series = list_series(log_dir) if log_dir.is_dir() else {}
    start = {w: segs[0].first_lsn - 1 for w, segs in series.items() if segs}
    ends = {w: lsn for w, lsn in logstream.tail_positions(log_dir).items() if lsn} if series \
        else {}
    return segments.plan(log_dir, start, ends)


def build(spark: SparkSession | None, data_dir: Path, tasks: list[segments.Task],
          since: float | None = None, events: Path | None = None,
          structure: str | None = None) -> Report:
    """The report's tables for the ``tasks`` (``plan``) of the log in ``data_dir``
    (effects at or after ``since``, epoch seconds; every structure, or only
    ``structure``); ``spark`` may be None when there are no tasks. Raises what
    segments.check raises for a damaged or trimmed log."""
    layout = DataDir(str(data_dir))
    report = Report()
    since_ns = int(since * NS) if since is not None else 0
    if not tasks or spark is None:
        report.problems.append(f"{layout.logstream}: no log records"
                               if layout.logstream.is_dir() else
                               f"{layout.logstream}: no logstream here; is {layout.root} a "
                               "cqsd data directory?")
    else:
        summaries = spark.sparkContext.accumulator([], Summaries())
        rows = spark.range(0, len(tasks), 1, numPartitions=len(tasks)).mapInArrow(
            _reader(tasks, summaries), from_arrow_schema(SCHEMA))
        if structure is not None:
            rows = rows.where(F.col("structure") == structure)
        history = _histories(rows).persist()
        try:
            kept = history.where(F.col("ts") >= since_ns)
            tables, report.span = _traffic(kept)
            report.tables.update(tables)
            report.records = segments.check(tasks, summaries.value).records
        finally:
            history.unpersist()
        for name in ("minutes", "queues", "residence", "locks", "largest"):
            report.sources[name] = "the logstream"
    report.tables["checkpoints"] = checkpoints(layout.repository, since, structure,
                                               report.problems)
    report.sources["checkpoints"] = f"the repository's backup records ({layout.repository})"
    if events is not None:
        report.tables["episodes"] = episodes(events, since, structure, report.problems)
        report.sources["episodes"] = f"the daemon's event log ({events})"
    return report


def write(report: Report, out: Path) -> list[Path]:
    """Each table as ``out/<name>.parquet``; returns the files."""
    files = []
    for name, table in report.tables.items():
        path = out / f"{name}.parquet"
        pq.write_table(table, path)
        files.append(path)
    return files


# -- reading the log -------------------------------------------------------------


def _reader(tasks: list[segments.Task], summaries):
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for numbers in batches:
            for number in numbers.column(0).to_pylist():
                summary: dict = {}
                for batch in segments.scan(tasks[number], Everything(), summary):
                    yield slim(batch)
                summaries.add([summary])
    return read


# Rows no table counts: blocks, and the leases (T) and delays (N) of docs/recovery.md,
# which would otherwise stand between a read's L and what ended its lock.
UNCOUNTED = pa.array([BLOCK, LEASED, NOT_BEFORE_AT])


def slim(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Effect rows without payloads: blocks, leases and delays go, and a put or an
    offloaded message's map keeps only its length (``size``)."""
    batch = batch.filter(pc.invert(pc.is_in(batch.column("kind"), value_set=UNCOUNTED)))
    size = pc.binary_length(batch.column("data")).cast(pa.int64()).to_pylist()
    kinds = batch.column("kind").to_pylist()
    if MAPPED in kinds:
        maps = batch.column("map").to_pylist()
        size = [_mapped_length(m) if k == MAPPED else s
                for k, s, m in zip(kinds, size, maps, strict=True)]
    return pa.RecordBatch.from_arrays([*(batch.column(c) for c in KEPT),
                                       pa.array(size, pa.int64())], schema=SCHEMA)


def _mapped_length(packed: bytes | None) -> int | None:
    """The payload length in an M effect's data map, [owner, length, crc, ranges, (writer)]."""
    try:
        return int(msgpack.unpackb(packed)[1])
    except (TypeError, ValueError, IndexError, msgpack.UnpackException):
        return None


# -- each message's history ---------------------------------------------------------


def _histories(rows: DataFrame) -> DataFrame:
    """Each effect row with what its message's history says at that point: the queue
    it is on (``qtype``, ``queue``), the queue and time it was put (``put_qtype``,
    ``put_queue``, ``put_ns``), its payload length, which delivery a read is, and
    the next effect (for lock hold times)."""
    kind = F.col("kind")
    entry = Window.partitionBy("structure", "id")
    ordered = entry.orderBy(*ORDER)
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    adds, resets = kind.isin(PUT, MOVED_IN), kind.isin(PUT, MOVED_IN, READY_AT)
    rows = rows.select(
        *[c for c in SCHEMA.names if c not in ("qtype", "name", "size")],
        F.last("qtype", ignorenulls=True).over(upto).alias("qtype"),
        F.last("name", ignorenulls=True).over(upto).alias("queue"),
        F.first(F.when(adds, F.col("qtype")), ignorenulls=True).over(whole).alias("put_qtype"),
        F.first(F.when(adds, F.col("name")), ignorenulls=True).over(whole).alias("put_queue"),
        F.last(F.when(adds, F.col("put_time")), ignorenulls=True).over(upto).alias("put_ns"),
        F.max("size").over(whole).alias("size"),
        F.lead("kind").over(ordered).alias("next_kind"),
        F.lead("ts").over(ordered).alias("next_ts"),
        F.sum(resets.cast("int")).over(upto).alias("epoch"),
    )
    # Deliveries since the last reset (P, I: its count; R: the count it set), plus
    # the reads after it: a read's number is that count.
    life = Window.partitionBy("structure", "id", "epoch").orderBy(*ORDER).rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return rows.withColumn("delivery", F.first("count", ignorenulls=True).over(life)
                           + F.sum((kind == LOCK).cast("int")).over(life))


def _traffic(rows: DataFrame) -> tuple[dict[str, pa.Table], tuple[float, float] | None]:
    """The tables of the log's effects, in three Spark actions (per queue and minute,
    percentiles per queue, the largest messages), and the time they span."""
    kind = F.col("kind")
    suspend = (kind == READY_AT) & (F.col("qtype") == SUSPEND) & F.col("home_qtype").isNotNull()
    # A suspend counts against the queue the message was suspended from.
    per_queue = rows.select(
        "structure", "ts", "kind", "size",
        F.when(suspend, F.col("home_qtype")).otherwise(F.col("qtype")).alias("qtype"),
        F.when(suspend, F.col("home_name")).otherwise(F.col("queue")).alias("queue"),
        suspend.alias("suspend"), ((kind == LOCK) & (F.col("delivery") > 1)).alias("again"))
    minute = F.timestamp_seconds(F.floor(F.col("ts") / (60 * NS)) * 60).alias("minute")
    minutes = _named(per_queue.groupBy(*QUEUE, minute).agg(
        *(F.sum(test.cast("long")).alias(name) for name, test in (
            ("puts", kind == PUT), ("reads", kind == LOCK), ("deletes", kind == DELETE),
            ("redeliveries", F.col("again")), ("suspends", F.col("suspend")),
            ("moved_out", kind == MOVED_OUT), ("moved_in", kind == MOVED_IN))),
        F.max(F.when(kind == PUT, F.col("size"))).alias("largest_bytes"),
        F.min("ts").alias("first_ns"), F.max("ts").alias("last_ns"),
    ).orderBy("minute", *QUEUE).toArrow())

    # put -> delete, by the queue it was put to; read -> what ended the lock
    deleted = rows.where((kind == DELETE) & F.col("put_ns").isNotNull()).select(
        F.lit("residence").alias("measure"), "structure", F.col("put_qtype").alias("qtype"),
        F.col("put_queue").alias("queue"),
        (F.greatest(F.col("ts") - F.col("put_ns"), F.lit(0)) / NS).alias("seconds"))
    ends = F.col("next_kind").isin(DELETE, READY_AT, MOVED_OUT, COLD_BY)
    held = rows.where((kind == LOCK) & ends).select(
        F.lit("locks").alias("measure"), *QUEUE, ((F.col("next_ts") - F.col("ts")) / NS
                                                  ).alias("seconds"))
    p = F.percentile_approx("seconds", [0.5, 0.9, 0.99], 10_000)
    stats = _named(deleted.unionByName(held).groupBy("measure", *QUEUE).agg(
        F.count("seconds").alias("count"), p.alias("p"), F.max("seconds").alias("max"),
        F.avg("seconds").alias("mean"),
    ).select("measure", *QUEUE, "count", *(F.col("p")[i].alias(n) for i, n in
                                            enumerate(("p50", "p90", "p99"))),
             "max", "mean").orderBy("measure", *QUEUE).toArrow())

    largest = _named(rows.where(kind.isin(PUT, MOVED_IN) & F.col("size").isNotNull()).select(
        "structure", "id", *QUEUE[1:], F.col("size").alias("bytes"),
        F.timestamp_micros(F.floor(F.col("put_ns") / 1000)).alias("put_time"),
    ).orderBy(F.col("bytes").desc(), "structure", "id").limit(LARGEST).toArrow())

    tables = {name: _measure(stats, name) for name in ("residence", "locks")}
    tables["queues"] = _queues(minutes, tables)
    tables["minutes"] = minutes.drop_columns(["largest_bytes", "first_ns", "last_ns"])
    tables["largest"] = largest
    return tables, _span(minutes)


def _span(minutes: pa.Table) -> tuple[float, float] | None:
    """Epoch seconds of the first and the last effect counted."""
    if not minutes.num_rows:
        return None
    return pc.min(minutes["first_ns"]).as_py() / NS, pc.max(minutes["last_ns"]).as_py() / NS


def _measure(stats: pa.Table, name: str) -> pa.Table:
    return stats.filter(pc.equal(stats["measure"], name)).drop_columns(["measure"])


def _queues(minutes: pa.Table, stats: dict[str, pa.Table]) -> pa.Table:
    """One row per queue: its totals, residence and lock percentiles, largest message."""
    counts = [c for c in minutes.column_names if c not in (*QUEUE, "minute", "first_ns",
                                                           "last_ns", "largest_bytes")]
    totals = minutes.group_by(QUEUE, use_threads=False).aggregate(
        [(c, "sum") for c in counts] + [("largest_bytes", "max")])
    totals = totals.rename_columns([n.removesuffix("_sum").removesuffix("_max")
                                    for n in totals.column_names])
    by_queue = {name: {_key(r): r for r in t.to_pylist()} for name, t in stats.items()}
    out = []
    for r in sorted(totals.to_pylist(), key=_sort_key):
        row = {**{c: r[c] for c in QUEUE}, **{c: r[c] for c in counts}}
        for name, found in by_queue.items():
            stat = found.get(_key(r), {})
            for p in ("p50", "p90", "p99", "max"):
                row[f"{name.removesuffix('s')}_{p}"] = stat.get(p)
        row["largest_bytes"] = r["largest_bytes"]
        out.append(row)
    return pa.Table.from_pylist(out) if out else pa.table({c: pa.array([], pa.string())
                                                           for c in QUEUE})


def _key(row: dict) -> tuple:
    return row["structure"], row["qtype"], row["queue"]


def _sort_key(row: dict) -> tuple:
    return tuple(v or "" for v in _key(row))


def _named(table: pa.Table) -> pa.Table:
    """Queue types by name (TRAN, TRAN_SUSPEND, ...), as the SDK shows them."""
    if "qtype" not in table.column_names:
        return table
    names = [_qtype_name(q) for q in table.column("qtype").to_pylist()]
    return table.set_column(table.column_names.index("qtype"), "qtype", pa.array(names,
                                                                                pa.string()))


def _qtype_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return QueueType(number).name
    except ValueError:
        return str(number)


# -- what else is on disk ------------------------------------------------------------


def checkpoints(repository: Path, since: float | None, structure: str | None,
                problems: list[str]) -> pa.Table:
    """The checkpoints the repository recorded (started at or after ``since``), opened
    read-only: the report writes nothing of the data directory."""
    rows: list[dict] = []
    if repository.exists():
        try:
            db = sqlite3.connect(f"{repository.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
            try:
                db.row_factory = sqlite3.Row
                found = db.execute(
                    "SELECT structure, slot, started, finished, finished - started AS seconds,"
                    " rows, records, status, error FROM backups WHERE started >= ?"
                    " AND (? IS NULL OR structure = ?) ORDER BY started, id",
                    (since or 0, structure, structure)).fetchall()
            finally:
                db.close()
            rows = [{**dict(r), "started": _utc(r["started"]), "finished": _utc(r["finished"])}
                    for r in found]
        except sqlite3.Error as err:
            problems.append(f"{repository}: cannot read the backup records ({err})")
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("structure", pa.string()), ("slot", pa.string()), ("started", UTC_TIME),
        ("finished", UTC_TIME), ("seconds", pa.float64()), ("rows", pa.int64()),
        ("records", pa.int64()), ("status", pa.string()), ("error", pa.string())]))


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def episodes(path: Path, since: float | None, structure: str | None,
             problems: list[str]) -> pa.Table:
    """Structure-full, overflow-mode and overflow-status episodes from the daemon's
    event log (JSON lines): each from the event that began it to the one that ended
    it (``end`` null: still on when the log ends)."""
    schema = pa.schema([("structure", pa.string()), ("kind", pa.string()),
                        ("queue", pa.string()), ("start", UTC_TIME), ("end", UTC_TIME),
                        ("seconds", pa.float64())])
    begun: dict[tuple, datetime] = {}
    rows: list[dict] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if not any(f'"{name}"' in line for name in EPISODES):
                    continue  # most lines: cheaply skipped
                try:
                    event = json.loads(line)
                    at = datetime.fromisoformat(event["timestamp"])
                    kind, on = EPISODES[event["event"]]
                except (ValueError, KeyError, TypeError):
                    continue
                if structure is not None and event.get("structure") != structure:
                    continue
                on = event.get("on") if on is None else on
                queue = (f"{event['qtype']} {event['queue']}" if "queue" in event else None)
                key = (event.get("structure"), kind, queue)
                if on and key not in begun:
                    begun[key] = at
                elif not on and key in begun:
                    start = begun.pop(key)
                    rows.append({"structure": key[0], "kind": kind, "queue": queue,
                                 "start": start, "end": at,
                                 "seconds": (at - start).total_seconds()})
    except OSError as err:
        problems.append(f"{path}: cannot read the event log ({err.strerror})")
    rows += [{"structure": k[0], "kind": k[1], "queue": k[2], "start": start, "end": None,
              "seconds": None} for k, start in begun.items()]
    if since is not None:
        rows = [r for r in rows if (r["end"] or r["start"]).timestamp() >= since]
    rows.sort(key=lambda r: r["start"])
    return pa.Table.from_pylist(rows, schema=schema)

