"""Structure images: every message of a structure, as written at a clean shutdown.

A CF structure outlives its connectors; our structures live in daemon memory,
so a clean stop writes each one out whole — recoverable and non-recoverable
messages, locks and the cold queue included — and the next start loads it.

Format: ``u32`` big-endian length of the header, the header (a msgpack map
``{"format": "cqsd-image", "version": 4, "structure", "last_id", "count",
"created", "lsn"}``, ``lsn`` being the log position the image covers,
``{writer: last LSN}``), then the rows as ONE msgpack array of arrays
``[entry_id, qtype, name, data, recoverable, put_time, delivery_count, where,
owner, home, map, lease, not_before]`` (``records.py``) in entry-id order, then a
24-byte footer: ``u64`` length of the rows array, ``u64`` row count, ``u32``
CRC32C of the rows array, ``b"CQIE"``. Version 3 is the same without ``lease``
and ``not_before`` (before leases and delayed puts), version 2 without ``map``
too (before SMDS); both are still read, their rows given nil for what they lack.
One array lets a restart decode a million rows in a single C call over a
memory map, with no copy of the file. The file is written to a temporary name,
fsynced, renamed and the directory fsynced, so an image is either whole or
absent; a damaged one is refused by name, never half-loaded.
"""

import itertools
import mmap
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

import msgpack
from crc32c import crc32c

from logstream.durable import fsync_dir

from ..engine import Structure
from ..errors import DaemonError
from ..records import ROW_FIELDS, row_of

FORMAT = "cqsd-image"
VERSION = 4
# earlier versions still read, and the row fields each lacks (filled with nil)
MISSING = {3: 2, 2: 3}  # 3: before leases and delays; 2: before SMDS too


class ImageError(DaemonError):
    """An image file that cannot be trusted; the message names the file and the problem."""


def path_for(directory: Path, structure: str) -> Path:
    return directory / f"{structure}.img"


FOOTER = struct.Struct(">QQI4s")
WRITE_BYTES = 1 << 20  # packed rows gathered per write
MAGIC = b"CQIE"


def save(path: Path, structure: Structure, lsn: dict[str, int]) -> int:
    """Write ``structure`` to ``path`` durably; returns the number of messages."""
    entries = list(structure)
    rows = (row_of(e) for e in entries)
    return write_rows(path, structure.name, rows, len(entries), lsn, structure.last_id)


def snapshot(structure: Structure) -> list[list]:
    """Every message of ``structure`` as image rows, taken now: for ``write_rows`` to
    write later (from a thread, say) while the structure changes."""
    return [row_of(e) for e in structure]


def write_rows(path: Path, structure: str, rows: Iterable[list], count: int,
               lsn: dict[str, int], last_id: int) -> int:
    """Write an image of ``count`` message rows (docs/recovery.md) streamed from
    ``rows`` in entry-id order, e.g. a recovery job's output, durably to ``path``.

    The count comes first because the header and the array header hold it.
    Raises ImageError (and leaves no file) if ``rows`` yields another number.
    """
    packer = msgpack.Packer(use_bin_type=True)
    packed = ((1, packer.pack(row)) for row in rows)
    return write_packed(path, structure, packed, count, lsn, last_id)


def write_packed(path: Path, structure: str, chunks: Iterable[tuple[int, bytes]], count: int,
                 lsn: dict[str, int], last_id: int) -> int:
    """``write_rows`` for rows already packed with msgpack: ``chunks`` are (rows,
    their packed bytes) in entry-id order, as a recovery job's tasks write them.
    Raises ImageError (and leaves no file) if they hold other than ``count`` rows."""
    tmp = path.with_name(path.name + ".tmp")
    packer = msgpack.Packer(use_bin_type=True)
    header = packer.pack({
        "format": FORMAT, "version": VERSION, "structure": structure, "last_id": last_id,
        "count": count, "created": time.time_ns(), "lsn": lsn,
    })
    crc = length = written = pending = 0
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack(">I", len(header)) + header)
            chunks_out = [packer.pack_array_header(count)]
            for rows, chunk in chunks:
                chunks_out.append(chunk)
                written, pending = written + rows, pending + len(chunk)
                if len(chunks_out) >= 1024 or pending >= WRITE_BYTES:
                    crc, length = _write(f, chunks_out, crc, length)
                    pending = 0
            crc, length = _write(f, chunks_out, crc, length)
            if written != count:
                raise ImageError(f"{path}: {written} rows were streamed for an image of {count}")
            f.write(FOOTER.pack(length, count, crc, MAGIC))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return count


def _write(f, chunks: list[bytes], crc: int, length: int) -> tuple[int, int]:
    block = b"".join(chunks)
    chunks.clear()
    f.write(block)
    return crc32c(block, crc), length + len(block)


def read_rows(path: Path, structure: str) -> tuple[dict, dict[int, list]]:
    """The header and the message rows (docs/recovery.md) of the image at ``path``.

    Raises ImageError naming the file if it is damaged or belongs to another structure.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 4 + FOOTER.size:
                raise ImageError(f"{path}: image is truncated ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(path, structure, mm, size)
    except OSError as err:
        raise ImageError(f"{path}: cannot read image: {err.strerror}") from err


def read_header(path: Path, structure: str) -> dict:
    """The header of an image (its log position and last id) without reading its rows;
    raises ImageError naming the file if it is not an image of ``structure``."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack(">I", f.read(4).rjust(4, b"\0"))
            header = msgpack.unpackb(f.read(length), raw=False)
    except OSError as err:
        raise ImageError(f"{path}: cannot read image: {err.strerror}") from err
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise ImageError(f"{path}: damaged image header ({err})") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ImageError(f"{path}: not a cqsd structure image")
    if header.get("structure") != structure:
        raise ImageError(f"{path}: image of structure {header.get('structure')}, not {structure}")
    return header


def _parse(path: Path, structure: str, mm: mmap.mmap, size: int) -> tuple[dict, dict[int, list]]:
    rows_length, count, crc, magic = FOOTER.unpack(mm[size - FOOTER.size:])
    (header_length,) = struct.unpack(">I", mm[:4])
    if magic != MAGIC or 4 + header_length + rows_length + FOOTER.size != size:
        raise ImageError(f"{path}: not a whole cqsd structure image (footer does not match)")
    view = memoryview(mm)
    try:
        try:
            header = msgpack.unpackb(view[4:4 + header_length], raw=False)
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ImageError(f"{path}: not a cqsd structure image")
            version = header.get("version")
            if version != VERSION and version not in MISSING:
                raise ImageError(f"{path}: image version {version} is not {VERSION}")
            if header.get("structure") != structure:
                raise ImageError(
                    f"{path}: image of structure {header.get('structure')}, not {structure}"
                )
            # released on the way out, even by an error, so the map can close
            with view[4 + header_length: 4 + header_length + rows_length] as body:
                if crc32c(body) != crc:
                    raise ImageError(f"{path}: rows fail their CRC32C check")
                rows = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as err:
            raise ImageError(f"{path}: damaged image ({type(err).__name__}: {err})") from err
        if not isinstance(rows, list) or len(rows) != count:
            raise ImageError(f"{path}: holds {len(rows)} rows, its footer says {count}")
        missing = MISSING.get(version, 0)
        fields = ROW_FIELDS - missing
        if any(not isinstance(r, list) or len(r) != fields for r in rows):
            raise ImageError(f"{path}: a message row is malformed")
        if missing:
            nils = [None] * missing
            for r in rows:
                r += nils
        return header, {r[0]: r for r in rows}
    finally:
        view.release()


def restore(structure: Structure, rows: dict[int, list]) -> None:
    """Put image rows into an empty structure, in entry-id order."""
    # images are written in id order and the fold only adds ids above them, so a
    # sort (a third of a second at a million rows) is rarely needed
    in_order = all(a < b for a, b in itertools.pairwise(rows))
    structure.load(rows.values() if in_order else (rows[i] for i in sorted(rows)))
    structure.take_events()
