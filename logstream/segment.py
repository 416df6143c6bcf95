"""Segment names and the segment header codec: pure, no I/O.

A segment's name and its header both say whose series it belongs to and where
in it it starts; they must agree, so a file copied from another logstream or
renamed by hand is refused by name rather than read as ours.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import crc32c

from .errors import Damage

MAGIC = b"LOGSTRM\n"
VERSION = 1
# magic, version, header size, writer id length, reserved, first lsn,
# writer id, reserved; the CRC follows.
_BODY = struct.Struct("<8sHHB3sQ32s4s")
HEADER_SIZE = _BODY.size + 4  # 64
MAX_WRITER_ID = 32

SUFFIX = ".seg"
_WRITER_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")
# Parsed from the right: a writer id may itself contain dots and digits.
_SEGMENT_NAME = re.compile(r"([A-Za-z0-9_.-]{1,32})\.(\d{20})\.seg")


def check_writer_id(writer: str) -> str:
    """Return `writer` if it is a valid writer id; raise ValueError if not."""
    if not isinstance(writer, str) or not _WRITER_ID.fullmatch(writer):
        raise ValueError(f"writer id {writer!r} is not 1..32 characters of [A-Za-z0-9_.-]")
    return writer


def segment_name(writer: str, first_lsn: int) -> str:
    """The file name of `writer`'s segment whose first record is `first_lsn`."""
    return f"{writer}.{first_lsn:020d}{SUFFIX}"


def lock_name(writer: str) -> str:
    """The name of the file an open writer keeps locked."""
    return f"{writer}.lock"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """(writer, first LSN) for a segment file name, None for any other file."""
    match = _SEGMENT_NAME.fullmatch(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


class SegmentHeader(NamedTuple):
    writer: str
    first_lsn: int


def encode_header(writer: str, first_lsn: int) -> bytes:
    """The 64-byte header of a new segment."""
    raw = check_writer_id(writer).encode("ascii")
    body = _BODY.pack(MAGIC, VERSION, HEADER_SIZE, len(raw), b"", first_lsn, raw, b"")
    return body + crc32c.crc32c(body).to_bytes(4, "little")


def decode_header(data: bytes) -> SegmentHeader | Damage:
    """Decode a segment header, or name what is wrong with it."""
    if len(data) < HEADER_SIZE:
        return Damage.BAD_HEADER
    body = data[: _BODY.size]
    magic, version, size, length, reserved1, first_lsn, raw, reserved2 = _BODY.unpack(body)
    if magic != MAGIC:
        return Damage.BAD_HEADER
    # The version before the CRC: another version may put its CRC elsewhere.
    if version != VERSION:
        return Damage.VERSION
    if crc32c.crc32c(body) != int.from_bytes(data[_BODY.size : HEADER_SIZE], "little"):
        return Damage.BAD_HEADER
    if size != HEADER_SIZE or reserved1 != b"\0" * 3 or reserved2 != b"\0" * 4:
        return Damage.BAD_HEADER
    if not 1 <= length <= MAX_WRITER_ID or raw[length:] != b"\0" * (MAX_WRITER_ID - length):
        return Damage.BAD_HEADER
    try:
        writer = check_writer_id(raw[:length].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return Damage.BAD_HEADER
    if first_lsn < 1:
        return Damage.BAD_HEADER
    return SegmentHeader(writer, first_lsn)
