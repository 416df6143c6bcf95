"""Structure images: every message of a structure, as written at a clean shutdown.

A CF structure outlives its connectors; our structures live in daemon memory,
so a clean stop writes each one out whole — recoverable and non-recoverable
messages, locks and the cold queue included — and the next start loads it.

Format (msgpack stream): a header map ``{"format": "cqsd-image", "version": 1,
"structure", "last_id", "count", "created", "lsn"}`` (``lsn``: the log position
the image covers, ``{writer: last LSN}``), then one array per message
``[entry_id, qtype, name, data, recoverable, put_time, delivery_count, where,
owner, home]`` in entry-id order, then a trailer map ``{"end": true, "count",
"crc32c"}`` whose CRC covers the packed messages. The file is written to a
temporary name, fsynced, renamed and the directory fsynced, so an image is
either whole or absent; a damaged one is refused by name, never half-loaded.
"""

import os
import time
from pathlib import Path

import msgpack
from crc32c import crc32c

from logstream.durable import fsync_dir

from ..engine import Structure

FORMAT = "cqsd-image"
VERSION = 1


class ImageError(Exception):
    """An image file that cannot be trusted; the message names the file and the problem."""


def path_for(directory: Path, structure: str) -> Path:
    return directory / f"{structure}.img"


def save(path: Path, structure: Structure, lsn: dict[str, int]) -> int:
    """Write ``structure`` to ``path`` durably; returns the number of messages."""
    entries = list(structure)
    tmp = path.with_name(path.name + ".tmp")
    pack = msgpack.Packer(use_bin_type=True).pack
    crc = 0
    with open(tmp, "wb") as f:
        f.write(pack({
            "format": FORMAT, "version": VERSION, "structure": structure.name,
            "last_id": structure.last_id, "count": len(entries), "created": time.time_ns(),
            "lsn": lsn,
        }))
        for e in entries:
            row = pack([
                e.entry_id, int(e.qtype), e.name, e.data, e.recoverable, e.put_time,
                e.delivery_count, e.where, e.owner,
                [int(e.home[0]), e.home[1]] if e.home else None,
            ])
            crc = crc32c(row, crc)
            f.write(row)
        f.write(pack({"end": True, "count": len(entries), "crc32c": crc}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return len(entries)


def read_rows(path: Path, structure: str) -> tuple[dict, dict[int, list]]:
    """The header and the message rows (docs/recovery.md) of the image at ``path``.

    Raises ImageError naming the file if it is damaged or belongs to another structure.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise ImageError(f"{path}: cannot read image: {err.strerror}") from err
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1))
    unpacker.feed(raw)
    rows: dict[int, list] = {}
    try:
        header = next(unpacker)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ImageError(f"{path}: not a cqsd structure image")
        if header.get("version") != VERSION:
            raise ImageError(f"{path}: image version {header.get('version')} is not {VERSION}")
        if header.get("structure") != structure:
            raise ImageError(f"{path}: image of structure {header.get('structure')}, not {structure}")
        crc, view, start = 0, memoryview(raw), unpacker.tell()
        for item in unpacker:
            end = unpacker.tell()
            if isinstance(item, dict):
                if item.get("count") != len(rows) or item.get("crc32c") != crc:
                    raise ImageError(f"{path}: trailer does not match the {len(rows)} messages read")
                return header, rows
            crc = crc32c(view[start:end], crc)
            start = end
            if not isinstance(item, list) or len(item) != 10:
                raise ImageError(f"{path}: message row {len(rows)} is malformed")
            rows[item[0]] = item
    except ImageError:
        raise
    except (StopIteration, ValueError, TypeError, msgpack.UnpackException) as err:
        raise ImageError(f"{path}: damaged image ({type(err).__name__}: {err})") from err
    raise ImageError(f"{path}: image is truncated (no trailer after {len(rows)} messages)")


def restore(structure: Structure, rows: dict[int, list]) -> None:
    """Put image rows into an empty structure, in entry-id order."""
    for eid in sorted(rows):
        structure.restore(*rows[eid])
    structure.take_events()
