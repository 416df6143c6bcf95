"""The record codec: bytes in, frames out, no I/O (layout in docs/logstream.md).

`decode` is sans-I/O in the h11 manner: given a buffer and an offset it returns
a `Frame`, `NeedData` (the buffer ends inside a record; read more, or at end of
file call it a short record) or a `Damage` reason. It never raises on bad
input, because deciding whether bad bytes are a torn tail or corruption needs
context (where in the file, what follows) that only the caller has.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import crc32c
import msgpack
import msgspec

from .errors import Damage

MAGIC: Final = b"\xc1LOG"
# magic, crc, body length, lsn, timestamp
HEADER: Final = struct.Struct("<4sIIQQ")
HEADER_SIZE: Final = HEADER.size  # 28
# Lengths above this are damage, not data: it bounds what a damaged length
# field can make us allocate, and is far above any record cqsd writes.
MAX_BODY: Final = 16 * 1024 * 1024
MAX_U64: Final = 2**64 - 1

_CRC_FROM: Final = 8  # the CRC covers everything after itself
Parts = list[bytes | memoryview]  # a record, or its body, as buffers for one vectored write
_TAIL: Final = struct.Struct("<IQQ")  # the CRC-covered part of the header
_HEAD: Final = struct.Struct("<4sI")  # the part before it: magic and CRC


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One record as readers see it: whose, which, when, and what."""

    writer: str
    lsn: int
    timestamp: int
    body: Any

    def __reduce__(self) -> tuple[type[Record], tuple[str, int, int, Any]]:
        # Pickled (and copied) through __init__: compiled (mypyc), a frozen
        # dataclass's own way sets its fields one by one, which frozen refuses.
        return (Record, (self.writer, self.lsn, self.timestamp, self.body))


class Frame(NamedTuple):
    """A decoded record with its body still packed, and where the next one starts."""

    lsn: int
    timestamp: int
    body: bytes
    end: int


class NeedData(NamedTuple):
    """The buffer ends inside a record that needs `size` bytes from its start."""

    size: int


def pack_body(body: Any) -> bytes:
    """Pack a body as msgpack; raises TypeError or ValueError if it cannot be."""
    return pack_bodies((body,))[0]


def pack_bodies(bodies: Iterable[Any]) -> list[bytes]:
    """`pack_body` of each body (a writer's batch, with one look-up of the packer)."""
    pack = _ENCODER.encode
    try:
        packed: list[bytes] = [pack(body) for body in bodies]
    except OverflowError as error:  # an int beyond 64 bits
        raise ValueError(str(error)) from error
    for one in packed:
        if len(one) > MAX_BODY:
            raise ValueError(f"record body of {len(one)} bytes exceeds {MAX_BODY}")
    return packed


# msgspec packs a record's body to the same bytes as msgpack's Packer in about half
# the time (tests hold it to them). One Encoder serves every thread: msgspec 0.23,
# the oldest release allowed (pyproject.toml), keeps an encode's state on
# the C stack (older ones kept a buffer in the Encoder, as a msgpack Packer does).
_ENCODER: Final = msgspec.msgpack.Encoder()


def unpack_body(packed: bytes | bytearray | memoryview) -> Any:
    """Unpack a body; raises ValueError (or a msgpack error) if it is not one object."""
    return msgpack.unpackb(packed, raw=False, strict_map_key=False)


def encode_packed(lsn: int, timestamp: int, packed: bytes | memoryview) -> bytes:
    """Frame an already packed body; the writer's hot path."""
    tail = _TAIL.pack(len(packed), lsn, timestamp)
    return b"".join((_HEAD.pack(MAGIC, crc32c.crc32c(packed, crc32c.crc32c(tail))), tail, packed))


def encode_parts(lsn: int, timestamp: int, parts: Parts) -> Parts:
    """Frame a body packed as buffers: the same bytes as `encode_packed` of the parts
    joined, as buffers for one vectored write (the CRC chained over them)."""
    tail = _TAIL.pack(sum(len(part) for part in parts), lsn, timestamp)
    crc = crc32c.crc32c(tail)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return [MAGIC + crc.to_bytes(4, "little") + tail + parts[0], *parts[1:]]


def encode_batch(first_lsn: int, timestamp: int, packed: list[bytes]) -> bytes:
    """The records of bodies already packed, with LSNs from ``first_lsn`` on and one
    timestamp, as one buffer: `encode_packed` of each, joined, with one join."""
    parts: list[bytes] = []
    lsn = first_lsn  # counted, not enumerate(packed, first_lsn), which mypyc compiles generically
    for body in packed:
        tail = _TAIL.pack(len(body), lsn, timestamp)
        parts += (_HEAD.pack(MAGIC, crc32c.crc32c(body, crc32c.crc32c(tail))), tail, body)
        lsn += 1
    return b"".join(parts)


def encode(lsn: int, timestamp: int, body: Any) -> bytes:
    """Frame a record; raises ValueError for out-of-range numbers or bodies."""
    if not 1 <= lsn <= MAX_U64:
        raise ValueError(f"LSN {lsn} is not in 1..2**64-1")
    if not 0 <= timestamp <= MAX_U64:
        raise ValueError(f"timestamp {timestamp} is not in 0..2**64-1")
    return encode_packed(lsn, timestamp, pack_body(body))


def decode(buf: bytes | bytearray | memoryview, offset: int = 0) -> Frame | NeedData | Damage:
    """Decode the record starting at `offset` of `buf` (see module docstring). Any
    buffer, by its type too: compiled (mypyc), a `bytes` refuses a bytearray."""
    available = len(buf) - offset
    if available < HEADER_SIZE:
        # Judge what is there: a wrong first byte is damage however short the rest.
        if available > 0 and not MAGIC.startswith(bytes(buf[offset : offset + len(MAGIC)])):
            return Damage.BAD_MAGIC
        return NeedData(HEADER_SIZE)
    magic, crc, length, lsn, timestamp = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        return Damage.BAD_MAGIC
    if length > MAX_BODY:
        return Damage.BAD_LENGTH
    end = offset + HEADER_SIZE + length
    if end > len(buf):
        return NeedData(HEADER_SIZE + length)
    covered = memoryview(buf)[offset + _CRC_FROM : end]
    try:
        if crc32c.crc32c(covered) != crc:
            return Damage.BAD_CRC
    finally:
        covered.release()
    return Frame(lsn, timestamp, bytes(buf[offset + HEADER_SIZE : end]), end)


def find_frame(buf: bytes | bytearray, start: int, min_lsn: int) -> int | None:
    """Offset of the first good frame at or after `start` with LSN >= `min_lsn`.

    This is how damage is told from a torn tail: a crash can only leave bad
    bytes at the end, so a good later record means the bad bytes are
    corruption. Searching for the magic keeps this at memory speed; the LSN
    bound keeps a record image stored inside a body from counting.
    """
    pos = buf.find(MAGIC, start)
    while pos != -1:
        found = decode(buf, pos)
        if isinstance(found, Frame) and found.lsn >= min_lsn:
            return pos
        pos = buf.find(MAGIC, pos + 1)
    return None
