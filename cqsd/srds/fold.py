"""The fold of docs/recovery.md as one Spark shuffle and a walk per entry.

Design note. The reference fold (cqsd/recovery/fold.py) walks the log once and
updates a dict. Here every effect is a row (effects.py), decoded once, in
parallel, one task per log segment. Entry ids are never reused within a
structure, so each entry's history is independent of every other's: one
shuffle sends all rows of an entry to one task, sorted by (structure, id, log
order), and that task walks each entry's run once in a Python worker
(entryfold.py), taking the output fields from the rows by index. Offloaded
payloads are made there too, from the entry's ``B`` rows by
``cqsd.blocks.Blocks`` as in the reference fold. No Python function runs per
row in the JVM's plan, and no row is decoded twice.

Rows are partitioned by (structure, ``id >> BUCKET_BITS``): each bucket of
ids is wholly in one task's output, and each task's output is sorted by id,
so the driver can lay the tasks' outputs end to end in bucket order and have
every row in id order without comparing rows (parts.py).
"""

import contextlib
import re
from collections.abc import Iterator

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.errors.exceptions.captured import PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ..records import FoldError
from . import effects, entryfold, segments, slotfiles, slots

EVENTS = from_arrow_schema(effects.SCHEMA)
SLOT = from_arrow_schema(slotfiles.SCHEMA)
FOLDED = from_arrow_schema(entryfold.SCHEMA)
ORDER = ["ts", "writer", "lsn", "part", "idx"]
# How a FoldError raised in a Python worker ends its traceback.
_FOLD_ERROR = re.compile(r"^(?:cqsd\.records\.)?FoldError: (.*)$", re.MULTILINE)


class Summaries(AccumulatorParam):
    """Collects the tasks' summaries (segments.scan) on the driver."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:
        value1.extend(value2)
        return value1


class LogEvents:
    """The effect rows of a plan's segments, read by one Spark task per segment;
    after an action on them, ``check`` says whether the tasks read everything."""

    def __init__(self, spark: SparkSession, tasks: list[segments.Task], structures: set[str],
                 first: int = 0):
        """``first``: the number of the first of ``tasks`` in the job's whole plan (a
        recovery of several structures reads each one's tasks, numbered end to end,
        as ``parts.writer`` reads payloads back)."""
        self.tasks = tasks
        self._summaries = spark.sparkContext.accumulator([], Summaries())
        if not tasks:
            # no partitions, so no tasks: a list, even an empty one, went through
            # Python workers of their own: a daemon and its workers, ~0.3 s of a job
            self.frame = spark.createDataFrame(spark.sparkContext.emptyRDD(), EVENTS)
            return
        # One partition per task, made in the JVM: each task's number picks its segment.
        numbers = spark.range(first, first + len(tasks), 1, numPartitions=len(tasks))
        self.frame = numbers.mapInArrow(
            _decoder(tasks, first, frozenset(structures), self._summaries), EVENTS)

    def summaries(self) -> list[dict]:
        """What the tasks that ended reported (segments.scan)."""
        return self._summaries.value

    def check(self) -> segments.Coverage:
        """Raises what segments.check raises."""
        return segments.check(self.tasks, self.summaries())


def _decoder(tasks: list[segments.Task], first: int, structures: frozenset[str], summaries):
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for numbers in batches:
            for number in numbers.column(0).to_pylist():
                summary: dict = {}
                yield from segments.scan(tasks[number - first], structures, summary, number)
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
        F.lit(None).cast("long").alias("at"),
    )


def read_slot(spark: SparkSession, slot: slots.Slot) -> DataFrame:
    """A slot's files as slot rows."""
    return spark.read.schema(SLOT).parquet(*(str(p) for p in slot.paths))


def fold(events: DataFrame, partitions: int | None = None) -> DataFrame:
    """The rows (entryfold.SCHEMA: ``structure`` plus the slot schema) events with
    their data inline (``effects.batches``; the jobs' log rows are folded by
    ``parts.writer``, which reads payloads back) fold to, each partition sorted by
    (structure, id). ``partitions`` defaults to the session's parallelism. An
    action on the result raises a Spark error that ``raised`` turns into
    FoldError if an effect names an entry that is not there.
    """
    return by_entry(events, partitions).mapInArrow(entryfold.fold_sorted, FOLDED)


def by_entry(events: DataFrame, partitions: int | None = None) -> DataFrame:
    """The events partitioned by id bucket and sorted by (structure, id, log order)."""
    n = partitions or events.sparkSession.sparkContext.defaultParallelism
    bucket = F.shiftright("id", entryfold.BUCKET_BITS)
    return (events.repartition(n, "structure", bucket)
            .sortWithinPartitions("structure", "id", *ORDER))


@contextlib.contextmanager
def raised() -> Iterator[None]:
    """Turn a FoldError raised in a Python worker back into FoldError around a Spark
    action."""
    try:
        yield
    except PythonException as err:
        found = _FOLD_ERROR.findall(str(err))
        if found:
            raise FoldError(found[-1]) from None
        raise
