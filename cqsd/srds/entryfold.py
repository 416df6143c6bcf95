"""The fold of each entry's effect rows, sorted in log order, into its slot row.

Design note. Entry ids are never reused within a structure, so each entry's
history is independent of every other's: once Spark has sent all rows of an
entry to one task and sorted them by (structure, id, log order), the task
walks each entry's run of rows once, as the reference fold walks the log
(cqsd/recovery/fold.py), and knows at its end whether the entry is present
and which row gave each field:

- present iff its last add (``base``, ``P``, ``I``) comes after its last
  removal (``D``, ``O``);
- qtype, name, home and a base delivery count from its last *reset*
  (``base``, ``P`` with count 0, ``I``, ``R``); the count is that base plus
  the ``L`` rows after it;
- where and owner from the last of ``base P I R L C``; put time from the last
  add; data and map from the last add or ``M``, whose payload the entry's
  ``B`` rows make (``cqsd.blocks.Blocks``, as in the reference fold);
- lease and deadline from the last of ``base P I R L C T`` (only ``base`` and
  ``T`` carry one: a lock, a return or a cold lock clears it), not_before
  from the last of ``base P I N``;
- ``L D R C O M T N`` whose previous add/removal is missing or a removal is
  the reference fold's FoldError, naming the record.

The walk touches only the small columns in Python; the fields of the output
rows are taken from the input columns by row index (``take``), so a payload
is never a Python object unless blocks make it. It runs in Spark's Python
workers (``mapInArrow``) and uses pyarrow and nothing of pyspark.
"""

from collections.abc import Iterator

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

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
from . import effects, slotfiles
from .segments import Payloads

ADDED = frozenset((effects.BASE, *ADDS))
# The folded rows: the structure, then the slot schema (every column optional, as
# Spark declares what it reads back).
SCHEMA = pa.schema([pa.field("structure", pa.string()),
                    *(pa.field(f.name, f.type) for f in slotfiles.SCHEMA)])
# Ids per bucket (``id >> BUCKET_BITS``) the fold's shuffle partitions by: enough
# buckets that hashing them spreads rows evenly over a few tasks, few enough that
# the driver's index of them stays short (2,000 for 10^6 ids).
BUCKET_BITS = 9
_RESET_FIELDS = ("qtype", "name", "home_qtype", "home_name")
_LEASE_FIELDS = ("lease", "deadline")


def fold_sorted(batches: Iterator[pa.RecordBatch],
                payloads: Payloads | None = None) -> Iterator[pa.RecordBatch]:
    """Effect rows (effects.SCHEMA) sorted by (structure, id, log order) -> the rows
    of the entries present at the end (SCHEMA), in (structure, id) order, their
    data read back by ``payloads`` where a row says where its record is.

    An entry's rows may span batches: the run of the last entry of a batch is
    kept for the next. Raises FoldError naming the record for an effect on an
    entry the image does not hold, or blocks that do not make its payload.
    """
    carry: pa.RecordBatch | None = None
    for batch in batches:
        if carry is not None and carry.num_rows:
            batch = pa.Table.from_batches([carry, batch]).combine_chunks().to_batches()[0]
        if not batch.num_rows:
            continue
        cut = _last_run(batch)
        if cut:
            yield _fold(batch, cut, payloads)
        carry = batch.slice(cut)
    if carry is not None and carry.num_rows:
        yield _fold(carry, carry.num_rows, payloads)


def _last_run(batch: pa.RecordBatch) -> int:
    """Where the rows of the batch's last entry begin."""
    ids, structures = batch.column("id"), batch.column("structure")
    last_id, last_s = ids[-1], structures[-1]
    same = pc.and_(pc.equal(ids, last_id), pc.equal(structures, last_s))
    # rows are sorted, so the last entry's rows are one run at the end
    return batch.num_rows - pc.sum(same.cast(pa.int64())).as_py()


def _fold(batch: pa.RecordBatch, n: int, payloads: Payloads | None) -> pa.RecordBatch:
    """Fold the entries whose rows are the first ``n`` rows of ``batch``."""
    structures = batch.column("structure").to_pylist()
    ids = batch.column("id").to_pylist()
    kinds = batch.column("kind").to_pylist()
    keep_at: list[int] = []  # per output row: the row index its structure and id come from
    reset_at: list[int] = []
    place_at: list[int] = []
    put_at: list[int] = []
    payload_at: list[int] = []
    lease_at: list[int] = []
    later_at: list[int] = []
    locks_after: list[int] = []
    made: dict[int, bytes] = {}  # output position -> a payload the entry's blocks made
    i = 0
    while i < n:
        s, eid = structures[i], ids[i]
        present = None  # None: no add or removal yet; else whether the last was an add
        reset = place = put = payload = lease = later = -1
        locks = 0
        blocks: Blocks | None = None
        bytes_made: bytes | None = None
        j = i
        while j < n and ids[j] == eid and structures[j] == s:
            kind = kinds[j]
            if kind in ADDED:
                present, reset, place, put, payload, locks, bytes_made = True, j, j, j, j, 0, None
                lease = later = j
            elif kind == BLOCK:
                blocks = blocks or Blocks(s)
                _blocks_step(batch, j, blocks, kind)
            else:
                if kind == MAPPED:
                    blocks = blocks or Blocks(s)
                    bytes_made, payload = _blocks_step(batch, j, blocks, kind), j
                if not present:
                    raise FoldError(_orphan(batch, j))
                if kind in REMOVES:
                    present = False
                elif kind == LOCK:
                    place, lease, locks = j, j, locks + 1
                elif kind == READY_AT:
                    reset, place, lease, locks = j, j, j, 0
                elif kind == COLD_BY:
                    place = lease = j
                elif kind == LEASED:
                    lease = j
                elif kind == NOT_BEFORE_AT:
                    later = j
            j += 1
        if present:
            if bytes_made is not None:
                made[len(keep_at)] = bytes_made
            keep_at.append(i)
            reset_at.append(reset)
            place_at.append(place)
            put_at.append(put)
            payload_at.append(payload)
            lease_at.append(lease)
            later_at.append(later)
            locks_after.append(locks)
        i = j
    return _rows(batch, keep_at, reset_at, place_at, put_at, payload_at, lease_at, later_at,
                 locks_after, made, payloads)


def _rows(batch: pa.RecordBatch, keep_at: list[int], reset_at: list[int], place_at: list[int],
          put_at: list[int], payload_at: list[int], lease_at: list[int], later_at: list[int],
          locks_after: list[int], made: dict[int, bytes],
          payloads: Payloads | None) -> pa.RecordBatch:
    """The output rows, each field taken from the row the walk chose for it."""
    col = batch.column
    reset = pa.array(reset_at, pa.int64())
    data = col("data").take(pa.array(payload_at, pa.int64()))
    located = [k for k, at in enumerate(col("at").take(pa.array(payload_at, pa.int64()))
                                       .to_pylist()) if at is not None]
    if made or located:
        values = data.to_pylist()
        for position, payload in made.items():
            values[position] = payload
        if located:
            if payloads is None:
                raise ValueError("rows say where their data is, but no log to read it from")
            rows = [payload_at[k] for k in located]
            fields = [col(name).take(pa.array(rows, pa.int64())).to_pylist()
                      for name in ("at", "lsn", "part", "idx", "structure")]
            for k, payload in zip(located, payloads.read(list(zip(*fields, strict=True))),
                                  strict=True):
                values[k] = payload
        data = pa.array(values, pa.binary())
    keep = pa.array(keep_at, pa.int64())
    place = pa.array(place_at, pa.int64())
    lease = pa.array(lease_at, pa.int64())
    count = pc.add(col("count").take(reset), pa.array(locks_after, pa.int32()))
    columns = {
        "structure": col("structure").take(keep), "id": col("id").take(keep),
        **{name: col(name).take(reset) for name in _RESET_FIELDS},
        "data": data, "map": col("map").take(pa.array(payload_at, pa.int64())),
        "put_time": col("put_time").take(pa.array(put_at, pa.int64())),
        "count": count.cast(pa.int32()),
        "where": col("where").take(place), "owner": col("owner").take(place),
        **{name: col(name).take(lease) for name in _LEASE_FIELDS},
        "not_before": col("not_before").take(pa.array(later_at, pa.int64())),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def _blocks_step(batch: pa.RecordBatch, j: int, blocks: Blocks, kind: str) -> bytes | None:
    """Hand row ``j``, a B or an M, to the entry's blocks; an M's payload. A FoldError
    names the record."""
    eid = batch.column("id")[j].as_py()
    try:
        if kind == BLOCK:
            blocks.add(eid, batch.column("page")[j].as_py(), batch.column("data")[j].as_py())
            return None
        packed = batch.column("map")[j].as_py()
        return blocks.take(eid, decode(blocks.structure, eid, msgpack.unpackb(packed)))
    except FoldError as err:
        raise FoldError(f"{err} {_record(batch, j)}") from None


def _record(batch: pa.RecordBatch, j: int) -> str:
    return f"(writer {batch.column('writer')[j].as_py()} LSN {batch.column('lsn')[j].as_py()})"


def _orphan(batch: pa.RecordBatch, j: int) -> str:
    """The reference fold's FoldError text, naming the record too."""
    s, kind, eid = (batch.column(c)[j].as_py() for c in ("structure", "kind", "id"))
    return (f"structure {s}: effect {kind} on entry {eid} {_record(batch, j)}, "
            "which the image does not hold")
