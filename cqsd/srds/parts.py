"""The files a job's fold tasks write: slot Parquet for a checkpoint, packed image
rows for a recovery.

Design note. Each fold task (one shuffle partition, fold.by_entry) writes its
folded rows to a file of its own in the job's staging directory, in the
Python worker that folded them, so the rows never go back through the JVM.
A checkpoint's tasks write ``part-NNNNN.parquet`` files in the slot schema,
each sorted by id, which become the slot (slots.install). A recovery's tasks
write ``part-NNNNN.rows``: the image rows packed with msgpack, as the image
holds them, in id order, with an index of where each id bucket's rows are.
A bucket is wholly in one task's file (the shuffle partitions by bucket), so
the driver writes the image by copying the buckets' bytes in bucket order:
every row in id order, with no row unpacked or compared on the driver.

A task writes under a temporary name and renames at the end, so a retried
task replaces, never mixes with, what a failed attempt wrote.
"""

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq

from . import entryfold, slotfiles
from .segments import Payloads, Task

SLOT, IMAGE = "slot", "image"
# One row per structure and bucket of a task's image file (a recovery may fold
# several structures together); one row per task for a slot file.
INDEX = pa.schema([("file", pa.string()), ("bucket", pa.int64()), ("offset", pa.int64()),
                   ("length", pa.int64()), ("rows", pa.int64()), ("structure", pa.string())])


@dataclass(frozen=True)
class Chunk:
    """Where one bucket's packed image rows of one structure are (or, for a slot
    file, the whole file)."""

    file: str
    bucket: int
    offset: int
    length: int
    rows: int
    structure: str = ""


def writer(tasks: list[Task], staged: str, kind: str):
    """The function each fold task runs (``mapInArrow``): sorted effect rows in, its
    file written, its INDEX rows out."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext  # in the worker, where the task is known

        context = TaskContext.get()
        assert context is not None, "a task's function runs in the task"
        name = f"part-{context.partitionId():05d}"
        payloads = Payloads(tasks)
        try:
            folded = entryfold.fold_sorted(batches, payloads)
            if kind == SLOT:
                chunks = _write_slot(folded, Path(staged) / f"{name}.parquet")
            else:
                chunks = _write_image(folded, Path(staged) / f"{name}.rows")
            yield pa.RecordBatch.from_pylist([vars(c) for c in chunks], schema=INDEX)
        finally:
            payloads.close()

    return write


def _write_slot(folded: Iterator[pa.RecordBatch], path: Path) -> list[Chunk]:
    temp, out, rows = path.with_name(path.name + ".tmp"), None, 0
    try:
        for batch in folded:
            if not batch.num_rows:
                continue
            if out is None:
                out = pq.ParquetWriter(temp, slotfiles.SCHEMA)
            out.write_batch(pa.RecordBatch.from_arrays(
                [batch.column(f.name) for f in slotfiles.SCHEMA], schema=slotfiles.SCHEMA))
            rows += batch.num_rows
    finally:
        if out is not None:
            out.close()
    if out is None:
        return []
    os.replace(temp, path)
    return [Chunk(path.name, -1, 0, path.stat().st_size, rows)]


def _write_image(folded: Iterator[pa.RecordBatch], path: Path) -> list[Chunk]:
    temp, packer = path.with_name(path.name + ".tmp"), msgpack.Packer(use_bin_type=True)
    chunks: list[Chunk] = []
    at: tuple[str, int] | None = None  # the (structure, bucket) being written
    start = offset = rows = 0
    with open(temp, "wb") as f:
        for batch in folded:
            packed = []
            names = batch.column("structure").to_pylist()
            for structure, (eid, row) in zip(names, slotfiles.image_rows(batch), strict=True):
                if (structure, eid >> entryfold.BUCKET_BITS) != at:
                    if at is not None:
                        chunks.append(Chunk(path.name, at[1], start, offset - start, rows, at[0]))
                    at, start, rows = (structure, eid >> entryfold.BUCKET_BITS), offset, 0
                row_bytes = packer.pack(row)
                packed.append(row_bytes)
                offset, rows = offset + len(row_bytes), rows + 1
            f.write(b"".join(packed))
    if at is not None:
        chunks.append(Chunk(path.name, at[1], start, offset - start, rows, at[0]))
    if not chunks:
        temp.unlink()
        return []
    os.replace(temp, path)
    return chunks


def image_chunks(staged: Path, chunks: list[Chunk]) -> Iterator[tuple[int, bytes]]:
    """(rows, packed bytes) of each bucket in bucket order, for image.write_packed;
    ``chunks`` are one structure's. Raises ValueError if two tasks wrote the same
    bucket (a retried task's file replaces its failed attempt's, so only a bug can)."""
    ordered = sorted(chunks, key=lambda c: c.bucket)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if before.bucket == after.bucket:
            raise ValueError(f"{staged}: bucket {after.bucket} is in {before.file} and "
                             f"{after.file}")
    fds: dict[str, int] = {}
    try:
        for c in ordered:
            if c.file not in fds:
                fds[c.file] = os.open(staged / c.file, os.O_RDONLY | os.O_CLOEXEC)
            yield c.rows, os.pread(fds[c.file], c.length, c.offset)
    finally:
        for fd in fds.values():
            os.close(fd)
