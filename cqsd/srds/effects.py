"""Log records as effect rows: the decoding half of the Spark fold.

Each effect of docs/recovery.md on a structure being folded becomes one row
carrying its order key, (timestamp, writer, LSN, part, index): ``part`` is 0
for the record's ``e`` list and 1 for its ``x`` map, ``index`` the effect's
place in its list. Sorting by that key is the log order of the reference fold.
A slot's messages become rows of kind ``BASE`` that sort before any record.

This runs in Spark's Python workers (inside ``mapInArrow``) and on the driver
for in-memory records, so it uses pyarrow and nothing of pyspark.
"""

from collections.abc import Container, Iterator

import msgpack
import pyarrow as pa

from ..records import (
    ARITY,
    B_DATA,
    B_PAGE,
    BLOCK,
    COLD_BY,
    E_DATA,
    E_NAME,
    E_OWNER,
    E_PUT_TIME,
    E_QTYPE,
    EFFECTS,
    I_COUNT,
    I_HOME,
    LEASED,
    LOCK,
    M_MAP,
    MAPPED,
    MOVED_IN,
    N_AT,
    NOT_BEFORE_AT,
    OTHERS,
    PUT,
    R_COUNT,
    R_HOME,
    READY_AT,
    STRUCTURE,
    T_DEADLINE,
    T_LEASE,
    FoldError,
)

SCHEMA = pa.schema([
    ("structure", pa.string()),
    ("id", pa.int64()),
    ("ts", pa.int64()),
    ("writer", pa.string()),
    ("lsn", pa.int64()),
    ("part", pa.int32()),
    ("idx", pa.int32()),
    ("kind", pa.string()),
    ("qtype", pa.int32()),
    ("name", pa.string()),
    ("data", pa.binary()),
    ("put_time", pa.int64()),
    ("count", pa.int32()),
    ("where", pa.string()),
    ("owner", pa.string()),
    ("home_qtype", pa.int32()),
    ("home_name", pa.string()),
    ("page", pa.int64()),  # B: the data-set page its range starts at
    ("map", pa.binary()),  # M (and a slot's offloaded message): msgpack of the data map
    ("lease", pa.int64()),  # T: the lease, ns
    ("deadline", pa.int64()),  # T: its wall-clock deadline, ns
    ("not_before", pa.int64()),  # N
    # P, I read from a log segment: where their record is (AT_TASK_SHIFT), their data
    # left null; the fold reads it back for the messages that survive (segments.Payloads)
    ("at", pa.int64()),
])
AT_TASK_SHIFT = 40  # at = plan task number << 40 | the record's offset in its segment
BASE = "base"  # a slot's message, before every record (no effect kind is a word)
BATCH_ROWS = 4096  # rows per Arrow batch: a few MiB of 1 KiB messages
# ... or fewer, once their payloads reach this: an offloaded message's blocks are
# MiBs each, and an Arrow binary column holds at most 2 GiB
BATCH_BYTES = 64 << 20
KIND_COLUMN = SCHEMA.get_field_index("kind")
DATA_COLUMN = SCHEMA.get_field_index("data")


def rows_of(body, structures: Container[str], ts: int, writer: str, lsn: int,
            at: int | None = None) -> list[tuple]:
    """The effect rows of one record body for the structures in ``structures``;
    ``at`` given, P and I rows carry it instead of their data.

    Bodies that are not maps are no concern of a structure fold. Raises
    FoldError naming the record for an effect that is not one of docs/recovery.md.
    """
    if not isinstance(body, dict):
        return []
    rows: list[tuple] = []
    s = body.get(STRUCTURE)
    if isinstance(s, str) and s in structures:
        _add(rows, s, body.get(EFFECTS) or [], ts, writer, lsn, 0, at)
    other = body.get(OTHERS)
    if other:
        for t, effects in other.items():
            if t in structures:
                _add(rows, t, effects, ts, writer, lsn, 1, at)
    return rows


def _add(rows: list, s: str, effects: list, ts: int, writer: str, lsn: int, part: int,
         at: int | None) -> None:
    for idx, effect in enumerate(effects):
        try:
            kind = effect[0]
            if len(effect) != ARITY[kind]:
                raise ValueError
            rows.append(_row(s, kind, effect, ts, writer, lsn, part, idx, at))
        except (KeyError, IndexError, TypeError, ValueError):
            raise FoldError(f"structure {s}: effect {effect!r} (writer {writer} LSN {lsn}) "
                            "is not an effect of docs/recovery.md") from None


def _row(s, kind, e, ts, writer, lsn, part, idx, at) -> tuple:
    key = (s, e[1], ts, writer, lsn, part, idx, kind)
    if kind == PUT:
        return (*key, e[E_QTYPE], e[E_NAME], _data(e, at), e[E_PUT_TIME], 0, "ready", None,
                None, None, None, None, *_NO_TIMING, at)
    if kind == LOCK:
        return (*key, None, None, None, None, None, "locked", e[E_OWNER], None, None, None, None,
                *_NO_TIMING, None)
    if kind == READY_AT:
        return (*key, e[E_QTYPE], e[E_NAME], None, None, e[R_COUNT], "ready", None,
                *_home(e[R_HOME]), None, None, *_NO_TIMING, None)
    if kind == COLD_BY:
        return (*key, None, None, None, None, None, "cold", e[E_OWNER], None, None, None, None,
                *_NO_TIMING, None)
    if kind == MOVED_IN:
        return (*key, e[E_QTYPE], e[E_NAME], _data(e, at), e[E_PUT_TIME], e[I_COUNT], "ready",
                None, *_home(e[I_HOME]), None, None, *_NO_TIMING, at)
    if kind == BLOCK:
        return (*key, None, None, e[B_DATA], None, None, None, None, None, None, e[B_PAGE], None,
                *_NO_TIMING, None)
    if kind == MAPPED:
        return (*key, None, None, None, None, None, None, None, None, None, None,
                msgpack.packb(e[M_MAP], use_bin_type=True), *_NO_TIMING, None)
    if kind == LEASED:
        return (*key, *_NONE_BEFORE_TIMING, e[T_LEASE], e[T_DEADLINE], None, None)
    if kind == NOT_BEFORE_AT:
        return (*key, *_NONE_BEFORE_TIMING, None, None, e[N_AT], None)
    return (*key, *_NONE_BEFORE_TIMING, *_NO_TIMING, None)  # D, O


_NONE_BEFORE_TIMING = (None,) * 11  # qtype .. map
_NO_TIMING = (None, None, None)  # lease, deadline, not_before: only T and N carry them


def _data(e, at: int | None) -> bytes | None:
    """The data of a P or I row: none where the row says where to read it back."""
    if at is None:
        return e[E_DATA]
    if not isinstance(e[E_DATA], bytes):
        raise TypeError  # what the Arrow column would refuse
    return None


def _home(home) -> tuple:
    if home is None:
        return (None, None)
    qtype, name = home
    return (qtype, name)


def batch(rows: list[tuple]) -> pa.RecordBatch:
    """Effect rows as one Arrow batch in SCHEMA; raises FoldError if a value has the
    wrong type (a queue type that is not a number, say)."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(SCHEMA)
    try:
        arrays = [_array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)]
    except (pa.ArrowException, OverflowError) as err:
        first, last = rows[0], rows[-1]
        raise FoldError(f"structure {first[0]}: an effect in the records of writer {first[3]} "
                        f"from LSN {first[4]} to {last[4]} has a value of the wrong type "
                        f"({err})") from None
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def _array(values: tuple, type_: pa.DataType) -> pa.Array:
    """``pa.array``, without converting one by one a column that is all null (most
    columns of most kinds) or, for strings, all one value (structure, writer, kind)."""
    if values and values.count(values[0]) == len(values):
        if values[0] is None:
            return pa.nulls(len(values), type_)
        if type_ == pa.string() and type(values[0]) is str:
            return pa.repeat(pa.scalar(values[0], type_), len(values))
    return pa.array(values, type=type_)


def batches(records, structures: Container[str]) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the effect rows of ``(writer, lsn, timestamp, body)`` records."""
    gathered = Batches()
    for writer, lsn, ts, body in records:
        yield from gathered.add(rows_of(body, structures, ts, writer, lsn))
    yield from gathered.flush()


class Batches:
    """Effect rows gathered into Arrow batches of BATCH_ROWS rows, or fewer once their
    payloads reach BATCH_BYTES."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.nbytes = 0

    def add(self, rows: list[tuple], nbytes: int | None = None) -> list[pa.RecordBatch]:
        """The batch these rows complete, if they complete one. ``nbytes`` bounds their
        payload bytes (a record's length does) where counting them costs more."""
        self.rows += rows
        if nbytes is None:
            nbytes = sum(len(r[DATA_COLUMN]) for r in rows if r[DATA_COLUMN] is not None)
        self.nbytes += nbytes
        if len(self.rows) >= BATCH_ROWS or self.nbytes >= BATCH_BYTES:
            return self.flush()
        return []

    def flush(self) -> list[pa.RecordBatch]:
        """The rows gathered so far as a batch (none if there are none)."""
        done = [batch(self.rows)] if self.rows else []
        self.rows, self.nbytes = [], 0
        return done
