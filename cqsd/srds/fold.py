"""The fold of docs/recovery.md as Spark DataFrame operations.

Design note. The reference fold (cqsd/recovery/fold.py) walks the log once and
updates a dict. Here every effect is a row (effects.py) and the walk becomes a
window over each entry's rows in log order, partitioned by (structure, id).
Because entry ids are never reused within a structure, each entry's history is
independent of every other's, so the window is the whole fold:

- an entry is present at the end if its last add (``base`` slot row, ``P``,
  ``I``) comes after its last removal (``D``, ``O``);
- qtype, name, home and the base delivery count come from its last *reset*
  (``base``, ``P`` with count 0, ``I``, ``R``); the count is that base plus the
  ``L`` rows after it;
- where and owner come from the last of ``base P I R L C``; put time from
  the last add, data and map from the last add or ``M``; the lease from the
  last of ``base P I R L C T`` (only ``T`` and ``base`` carry one), not_before
  from the last of ``base P I N``;
- an ``L D R C O M`` whose previous add/remove row is missing or a removal is
  the reference fold's FoldError; Spark raises it from inside the plan with
  ``raise_error``, and ``raised`` turns it back into a FoldError.

Offloaded payloads are materialised first (``_materialise``): each entry's
``B`` and ``M`` rows are grouped and handed, in log order, to
``cqsd.blocks.Blocks`` as in the reference fold, which gives each ``M`` row its
payload (or names the problem, raised like an orphan). The ``B`` rows go, and
the window above takes ``M`` rows as they come.

The output keeps the window's partitioning, so each partition (each written
file) is sorted by (structure, id) at no extra cost.
"""

import contextlib
from collections.abc import Iterator

import msgpack
import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ..blocks import Blocks, decode
from ..records import (
    ADDS,
    BLOCK,
    COLD_BY,
    LEASED,
    LOCK,
    MAPPED,
    NOT_BEFORE_AT,
    READY_AT,
    REMOVES,
    FoldError,
)
from . import effects, segments, slots

EVENTS = from_arrow_schema(effects.SCHEMA)
SLOT = from_arrow_schema(slots.SCHEMA)
ORDER = ["ts", "writer", "lsn", "part", "idx"]
_RAISED = "USER_RAISED_EXCEPTION"
PROBLEM = "_problem"  # why an entry's B and M rows do not make its payload
_TAKEN = effects.SCHEMA.append(pa.field(PROBLEM, pa.string()))


class _Summaries(AccumulatorParam):
    """Collects the tasks' summaries (segments.scan) on the driver."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:
        value1.extend(value2)
        return value1


class LogEvents:
    """The effect rows of a plan's segments, read by one Spark task per segment;
    after an action on them, ``check`` says whether the tasks read everything."""

    def __init__(self, spark: SparkSession, tasks: list[segments.Task], structures: set[str]):
        self.tasks = tasks
        self._summaries = spark.sparkContext.accumulator([], _Summaries())
        if not tasks:
            self.frame = spark.createDataFrame([], EVENTS)
            return
        # One partition per task, made in the JVM: each task's number picks its segment.
        numbers = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
        self.frame = numbers.mapInArrow(
            _decoder(tasks, frozenset(structures), self._summaries), EVENTS)

    def summaries(self) -> list[dict]:
        """What the tasks that ended reported (segments.scan)."""
        return self._summaries.value

    def check(self) -> segments.Coverage:
        """Raises what segments.check raises."""
        return segments.check(self.tasks, self.summaries())


def _decoder(tasks: list[segments.Task], structures: frozenset[str], summaries):
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for numbers in batches:
            for number in numbers.column(0).to_pylist():
                summary: dict = {}
                yield from segments.scan(tasks[number], structures, summary)
                summaries.add([summary])
    return decode


def slot_events(rows: DataFrame, structure: str) -> DataFrame:
    """Slot rows (slot schema) as base rows of ``structure``, before every record."""
    return rows.select(
        F.lit(structure).alias("structure"), "id", F.lit(-1).cast("long").alias("ts"),
        F.lit("").alias("writer"), F.lit(0).cast("long").alias("lsn"),
        F.lit(0).alias("part"), F.lit(0).alias("idx"), F.lit(effects.BASE).alias("kind"),
        "qtype", "name", "data", "put_time", "count", "where", "owner", "home_qtype", "home_name",
        F.lit(None).cast("long").alias("page"), "map", "lease", "deadline", "not_before",
    )


def read_slot(spark: SparkSession, slot: slots.Slot) -> DataFrame:
    """A slot's files as slot rows."""
    return spark.read.schema(SLOT).parquet(*(str(p) for p in slot.paths))


def fold(events: DataFrame) -> DataFrame:
    """The rows (``structure`` plus the slot schema) the events fold to.

    Each partition is sorted by (structure, id). An action on the result
    raises a Spark error that ``raised`` turns into FoldError if an effect
    names an entry that is not there.
    """
    events = _materialise(events)
    kind = F.col("kind")
    added, removed = kind.isin(effects.BASE, *ADDS), kind.isin(*REMOVES)
    reset, placed = added | (kind == READY_AT), added | kind.isin(READY_AT, LOCK, COLD_BY)
    entry = Window.partitionBy("structure", "id").orderBy(*ORDER)
    upto = entry.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = entry.rowsBetween(Window.unboundedPreceding, -1)
    presence = F.when(added | removed, kind)
    counted = events.select(
        "*",
        F.last(presence, ignorenulls=True).over(before).alias("_before"),
        F.last(presence, ignorenulls=True).over(upto).alias("_now"),
        F.sum((kind == "L").cast("int")).over(upto).alias("_locks"),
        F.lead("kind").over(entry).isNull().alias("_last"),
    )
    folded = counted.select(
        "*",
        F.last(F.when(reset, F.struct("qtype", "name", "home_qtype", "home_name", "count",
                                      "_locks")), True).over(upto).alias("_reset"),
        F.last(F.when(placed, F.struct("where", "owner")), True).over(upto).alias("_place"),
        F.last(F.when(added, F.col("put_time")), True).over(upto).alias("_put_time"),
        F.last(F.when(added | (kind == MAPPED), F.struct("data", "map")), True).over(upto)
        .alias("_payload"),
        F.last(F.when(placed | (kind == LEASED), F.struct("lease", "deadline")), True)
        .over(upto).alias("_lease"),
        F.last(F.when(added | (kind == NOT_BEFORE_AT), F.struct("not_before")), True)
        .over(upto).alias("_later"),
    )
    orphan = ~added & (F.col("_before").isNull() | F.col("_before").isin(*REMOVES))
    # One expression, so no optimiser can test the last-row condition first and
    # skip the checks on the rows it would drop.
    keep = (F.when(F.col(PROBLEM).isNotNull(), F.raise_error(F.col(PROBLEM)))
            .when(orphan, F.raise_error(_orphan_message()))
            .otherwise(F.col("_last") & F.col("_now").isin(effects.BASE, *ADDS)))
    return folded.filter(keep).select(
        "structure", "id",
        F.col("_reset.qtype").alias("qtype"), F.col("_reset.name").alias("name"),
        F.col("_payload.data").alias("data"), F.col("_payload.map").alias("map"),
        F.col("_put_time").alias("put_time"),
        (F.col("_reset.count") + F.col("_locks") - F.col("_reset._locks")).cast("int")
        .alias("count"),
        F.col("_place.where").alias("where"), F.col("_place.owner").alias("owner"),
        F.col("_reset.home_qtype").alias("home_qtype"),
        F.col("_reset.home_name").alias("home_name"),
        F.col("_lease.lease").alias("lease"), F.col("_lease.deadline").alias("deadline"),
        F.col("_later.not_before").alias("not_before"),
    ).sortWithinPartitions("structure", "id")


def _materialise(events: DataFrame) -> DataFrame:
    """The events without B rows, each M row carrying its entry's payload, plus a
    PROBLEM column: null, or (on a B or M row) why the blocks do not fit."""
    kind = F.col("kind")
    taken = (events.filter(kind.isin(BLOCK, MAPPED)).groupBy("structure", "id")
             .applyInArrow(_take_blocks, from_arrow_schema(_TAKEN)))
    return (events.filter(~kind.isin(BLOCK, MAPPED))
            .withColumn(PROBLEM, F.lit(None).cast("string")).unionByName(taken))


def _take_blocks(rows: pa.Table) -> pa.Table:
    """One entry's B and M rows -> its M rows with their payloads, or the first row
    in log order that is a FoldError of the reference fold, naming its record."""
    ordered = sorted(rows.to_pylist(), key=lambda r: tuple(r[c] for c in ORDER))
    blocks, out = Blocks(ordered[0]["structure"]), []
    for r in ordered:
        try:
            if r["kind"] == BLOCK:
                blocks.add(r["id"], r["page"], r["data"])
                continue
            datamap = decode(blocks.structure, r["id"], msgpack.unpackb(r["map"]))
            out.append({**r, "data": blocks.take(r["id"], datamap), PROBLEM: None})
        except FoldError as err:
            problem = f"{err} (writer {r['writer']} LSN {r['lsn']})"
            return pa.Table.from_pylist([{**r, "data": None, PROBLEM: problem}], schema=_TAKEN)
    return pa.Table.from_pylist(out, schema=_TAKEN)


def _orphan_message() -> Column:
    """The reference fold's FoldError text, naming the record too."""
    return F.concat(
        F.lit("structure "), F.col("structure"), F.lit(": effect "), F.col("kind"),
        F.lit(" on entry "), F.col("id").cast("string"), F.lit(" (writer "), F.col("writer"),
        F.lit(" LSN "), F.col("lsn").cast("string"), F.lit("), which the image does not hold"),
    )


@contextlib.contextmanager
def raised() -> Iterator[None]:
    """Turn the fold's in-plan error back into FoldError around a Spark action."""
    try:
        yield
    except CapturedException as err:
        if err.getCondition() == _RAISED:
            raise FoldError(err.getMessageParameters()["errorMessage"]) from None
        raise


def slot_columns(rows: DataFrame) -> DataFrame:
    """Fold output as slot rows (the structure column dropped)."""
    return rows.select(*SLOT.fieldNames())
