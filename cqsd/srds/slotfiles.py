"""The Parquet files of an SRDS slot (slots.py): their schema, and their rows
read as image rows (docs/recovery.md) or written from them.

Design note. Kept apart from slots.py so that pyarrow is imported only where a
slot's files are read or written: by the Spark jobs, and by the daemon when it
restarts from a slot or installs an empty one, not at every daemon start.
"""

import heapq
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq

from ..records import ROW_FIELDS
from .slots import SlotError

# One row per recoverable message. ``map`` is the msgpack of an offloaded
# payload's data map (docs/smds.md), whose bytes ``data`` then holds too: a
# checkpoint includes the offloaded data of recoverable messages. ``lease`` (ns)
# and ``deadline`` (wall-clock ns) are a leased lock's, ``not_before`` a delayed
# put's (docs/recovery.md).
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("qtype", pa.int32(), nullable=False),
    pa.field("name", pa.string(), nullable=False),
    pa.field("data", pa.binary()),
    pa.field("map", pa.binary()),
    pa.field("put_time", pa.int64(), nullable=False),
    pa.field("count", pa.int32(), nullable=False),
    pa.field("where", pa.string(), nullable=False),
    pa.field("owner", pa.string()),
    pa.field("home_qtype", pa.int32()),
    pa.field("home_name", pa.string()),
    pa.field("lease", pa.int64()),
    pa.field("deadline", pa.int64()),
    pa.field("not_before", pa.int64()),
])
# Spark writes every column as optional, so files are checked by names and types.
_COLUMNS = [(f.name, f.type) for f in SCHEMA]
# Slots written before leases and delayed puts lack their three columns; those
# written before SMDS also have a string column ``ref`` (always null) instead of
# ``map``. They are read as rows with none.
_BEFORE_LEASES = _COLUMNS[:-3]
_BEFORE_MAPS = [("ref", pa.string()) if name == "map" else (name, t)
                for name, t in _BEFORE_LEASES]
BATCH_BYTES = 64 << 20  # payload bytes per batch read, when messages are large


def iter_rows(paths: Iterable[Path], *, offloaded_data: bool = True) -> Iterator[list]:
    """Image rows from slot-format Parquet files each sorted by id, merged by id.

    ``offloaded_data=False`` leaves the data of offloaded rows (those with a map)
    empty, as a restart holds them: the bytes are in the data sets.
    """
    # (id, row) pairs compare by id alone (ids are unique), without a key call per row
    return (row for _, row in heapq.merge(*(_file_rows(Path(p), offloaded_data)
                                            for p in paths)))


def _file_rows(path: Path, offloaded_data: bool) -> Iterator[tuple[int, list]]:
    try:
        parquet = pq.ParquetFile(path)
        columns = [(f.name, f.type) for f in parquet.schema_arrow]
        if columns not in (_COLUMNS, _BEFORE_LEASES, _BEFORE_MAPS):
            raise SlotError(f"{path}: not an SRDS slot file (columns {parquet.schema_arrow.names})")
        last = None
        for batch in parquet.iter_batches(batch_size=_batch_rows(parquet)):
            for eid, row in image_rows(batch, offloaded_data=offloaded_data):
                if last is not None and eid <= last:
                    raise SlotError(f"{path}: rows are not in entry-id order at entry {eid}")
                last = eid
                yield eid, row
    except (OSError, pa.ArrowException, ValueError, msgpack.UnpackException) as err:
        raise SlotError(f"{path}: cannot read slot file ({err})") from err


def image_rows(batch: pa.RecordBatch, *, offloaded_data: bool = True
               ) -> Iterator[tuple[int, list]]:
    """(id, image row) for each row of a batch in the slot schema (other columns are
    ignored, and an older slot's missing map and lease columns read as none;
    ``offloaded_data`` as for ``iter_rows``). Raises msgpack errors for a map that
    is not msgpack."""
    c = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    nils = [None] * batch.num_rows
    for (eid, qtype, name, data, put_time, count, where, owner, hq, hn, packed, lease,
         deadline, not_before) in zip(
        c["id"], c["qtype"], c["name"], c["data"], c["put_time"], c["count"],
        c["where"], c["owner"], c["home_qtype"], c["home_name"], c.get("map") or nils,
        c.get("lease") or nils, c.get("deadline") or nils, c.get("not_before") or nils,
        strict=True,
    ):
        home = [hq, hn] if hq is not None else None
        datamap = None if packed is None else msgpack.unpackb(packed)
        if datamap is not None and not offloaded_data:
            data = b""
        yield eid, [eid, qtype, name, data, True, put_time, count, where, owner, home, datamap,
                    None if lease is None else [lease, deadline], not_before]


def _batch_rows(parquet: pq.ParquetFile) -> int:
    """Rows per batch read: 4096, or fewer for rows of large (offloaded) messages."""
    meta = parquet.metadata
    nbytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return max(1, min(4096, BATCH_BYTES * max(1, meta.num_rows) // max(1, nbytes)))


def table_of(rows: Iterable[list]) -> pa.Table:
    """Image rows (recoverable ones) as a table in the slot schema, sorted by id."""
    ordered = sorted(rows, key=lambda row: row[0])
    columns: list[Sequence[Any]] = (list(zip(*ordered, strict=True)) if ordered
                                     else [[]] * ROW_FIELDS)
    eid, qtype, name, data, _, put_time, count, where, owner, home, maps, leases, later = columns
    return pa.table({
        "id": eid, "qtype": qtype, "name": name, "data": data,
        "map": [None if m is None else msgpack.packb(m) for m in maps],
        "put_time": put_time, "count": count, "where": where, "owner": owner,
        "home_qtype": [h[0] if h else None for h in home],
        "home_name": [h[1] if h else None for h in home],
        "lease": [lease[0] if lease else None for lease in leases],
        "deadline": [lease[1] if lease else None for lease in leases],
        "not_before": later,
    }, schema=SCHEMA)


def rows_in(path: Path) -> int:
    """The rows a slot file holds, from its footer."""
    return int(pq.read_metadata(path).num_rows)


def write_empty(path: Path) -> None:
    """A slot file with no row."""
    pq.write_table(table_of([]), path)
