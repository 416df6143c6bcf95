"""The data set's header page and the block prefix (docs/smds.md, byte by byte).

The header says which data set a file is (structure, owner, when it was
formatted), how big it is, and whether a saved space map can be trusted. It is
kept in two copies, pages 0 and 1, written alternately as bbolt writes its two
meta pages, so a crash during a header update leaves the previous header in
force instead of a FAILED data set. The block prefix is what lets a read prove
that the bytes it found belong to the entry asking for them (seed 000, "Data
set contents are incorrect").

Pure: bytes in, values or named errors out (``errors.py``).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any, Final

from crc32c import crc32c

from .errors import (
    BadPrefix,
    ForeignHeader,
    IncompleteRecovery,
    Recreated,
    ShortDataSet,
    TornHeader,
    Unformatted,
    UnsupportedVersion,
)
from .pages import PAGE, PREFIX

MAGIC: Final = b"CQSSMDS\n"
VERSION: Final = 1
NAME_BYTES: Final = 16  # structure and client names are at most 16 characters

# Flags (docs/smds.md "The header"); every other bit must be zero.
OPEN: Final = 1 << 0  # opened for update and not closed cleanly since
PARTIAL_RECOVERY: Final = 1 << 1  # recovery started writing blocks, not finished
KNOWN_FLAGS: Final = OPEN | PARTIAL_RECOVERY

# magic, version, reserved, page size, dsblock, flags, sequence, structure, owner,
# created, size, updated, map page, map pages, reserved, map time; zeros; CRC at 4092.
_HEADER: Final = struct.Struct("<8sHHIIIQ16s16sQQQQIIQ")
_CRC: Final = struct.Struct("<I")
_HEADER_CRC_AT: Final = PAGE - _CRC.size


@dataclass(frozen=True)
class Header:
    """One copy of the header: who the data set is and what state it was left in."""

    structure: str
    owner: str
    dsblock: int
    size: int  # the formatted extent in bytes, control block included
    created: int  # ns; the data set's identity
    sequence: int = 1
    flags: int = OPEN
    updated: int = 0  # ns, when this copy was written
    map_page: int = 0  # first page of the saved space map, 0 = none
    map_pages: int = 0
    map_time: int = 0  # ns; equals the repository's copy when the map is current

    @property
    def is_open(self) -> bool:
        return bool(self.flags & OPEN)

    @property
    def partial_recovery(self) -> bool:
        return bool(self.flags & PARTIAL_RECOVERY)

    @property
    def copy(self) -> int:
        """Which header page this copy lives on: sequence 1 on page 0, then alternately."""
        return (self.sequence - 1) % 2

    def next(self, **changes: Any) -> Header:
        """The header to write next: ``changes`` applied, in the other copy."""
        return dataclasses.replace(self, sequence=self.sequence + 1, **changes)


def _name(text: str, what: str) -> bytes:
    raw = text.encode("ascii")
    if not 1 <= len(raw) <= NAME_BYTES or b"\0" in raw:
        raise ValueError(f"{what} {text!r} must be 1 to {NAME_BYTES} ASCII characters")
    return raw


def pack_header(h: Header) -> bytes:
    """The header as one page. Raises ValueError for a value that does not fit."""
    if h.flags & ~KNOWN_FLAGS:
        raise ValueError(f"unknown header flags {h.flags:#x}")
    if h.sequence < 1 or h.dsblock % PAGE or h.dsblock < PAGE or h.size % h.dsblock:
        raise ValueError(f"impossible geometry or sequence in {h}")
    fields = _HEADER.pack(
        MAGIC, VERSION, 0, PAGE, h.dsblock, h.flags, h.sequence,
        _name(h.structure, "structure"), _name(h.owner, "owner"), h.created, h.size,
        h.updated, h.map_page, h.map_pages, 0, h.map_time,
    )
    page = fields + bytes(_HEADER_CRC_AT - len(fields))
    return page + _CRC.pack(crc32c(page))


def unpack_header(page: bytes | memoryview) -> Header:
    """One header copy (exactly one page) back into a Header.

    Raises Unformatted (all zeros), ForeignHeader (not our magic), TornHeader
    (CRC, fixed fields or padding wrong), UnsupportedVersion (a version or flag
    this code does not know).
    """
    page = bytes(page)
    if len(page) != PAGE:
        raise ShortDataSet("short", f"a header copy is {PAGE} bytes, got {len(page)}")
    if page.count(0) == PAGE:
        raise Unformatted("unformatted", "the header page is all zeros")
    if page[:len(MAGIC)] != MAGIC:
        raise ForeignHeader("magic", f"not a cqsd SMDS header (starts {page[:8]!r})")
    (crc,) = _CRC.unpack_from(page, _HEADER_CRC_AT)
    if crc32c(page[:_HEADER_CRC_AT]) != crc:
        raise TornHeader("torn", "the header CRC does not match")
    (_, version, reserved, page_size, dsblock, flags, sequence, structure, owner, created,
     size, updated, map_page, map_pages, reserved2, map_time) = _HEADER.unpack_from(page)
    if version != VERSION:
        raise UnsupportedVersion("version", f"header format version {version}, this cqsd "
                                            f"reads {VERSION}")
    if flags & ~KNOWN_FLAGS:
        raise UnsupportedVersion("flags", f"unknown header flags {flags:#x}")
    padding_is_zero = page[_HEADER.size:_HEADER_CRC_AT].count(0) == _HEADER_CRC_AT - _HEADER.size
    if (reserved or reserved2 or page_size != PAGE or not padding_is_zero or sequence < 1
            or dsblock < PAGE or dsblock % PAGE or size % dsblock):
        raise TornHeader("fields", "a fixed header field is wrong though its CRC matches")
    return Header(structure.rstrip(b"\0").decode("ascii", "replace"),
                  owner.rstrip(b"\0").decode("ascii", "replace"), dsblock, size, created,
                  sequence, flags, updated, map_page, map_pages, map_time)


def read_header(control: bytes | memoryview) -> Header:
    """The header in force, from the first two pages of a data set file (more bytes
    are ignored): the valid copy with the higher sequence. A torn or zero copy is
    what a crash during a header write leaves, and is passed over; a copy that is
    foreign or of a newer format is not, since no crash of ours makes one.

    Raises Unformatted when both copies are zeros (or the file is empty),
    ShortDataSet for fewer than two pages that are not all zeros,
    UnsupportedVersion or ForeignHeader for such a copy (also when the copies
    name different data sets), TornHeader when no copy is valid.
    """
    control = bytes(control[:2 * PAGE])
    if control.count(0) == len(control):
        raise Unformatted("unformatted", f"the first {len(control)} bytes are zeros")
    if len(control) < 2 * PAGE:
        raise ShortDataSet("short", f"{len(control)} bytes, fewer than the two header pages")
    copies: list[Header] = []
    errors: list[Exception] = []
    for i in (0, 1):
        try:
            copies.append(unpack_header(control[i * PAGE:(i + 1) * PAGE]))
        except (Unformatted, TornHeader, ForeignHeader, UnsupportedVersion) as damage:
            errors.append(damage)
    if len(copies) == 2 and _identity(copies[0]) != _identity(copies[1]):
        raise ForeignHeader("copies-disagree", f"the two header copies name different data sets: "
                                               f"{_identity(copies[0])}, {_identity(copies[1])}")
    for kind in (UnsupportedVersion, ForeignHeader):
        for error in errors:
            if isinstance(error, kind):
                raise error
    if copies:
        return max(copies, key=lambda h: h.sequence)
    raise next(e for e in errors if isinstance(e, TornHeader))  # both zero was caught above


def _identity(h: Header) -> tuple[str, str, int, int]:
    return (h.structure, h.owner, h.created, h.dsblock)


def validate(h: Header, *, structure: str, owner: str, created: int | None = None,
             file_size: int | None = None, recovering: bool = False) -> None:
    """Check a header read back against what the daemon expects of this data set.

    Raises ForeignHeader (another structure or owner), Recreated (``created``
    differs from the repository's), ShortDataSet (``file_size`` below the
    extent), IncompleteRecovery (the flag is set and this is not recovery).
    """
    if h.structure != structure:
        raise ForeignHeader("wrong-structure", f"the header names structure {h.structure!r}, "
                                               f"not {structure!r}")
    if h.owner != owner:
        raise ForeignHeader("wrong-owner", f"the header names owner {h.owner!r}, not {owner!r}")
    if created is not None and h.created != created:
        raise Recreated("recreated", f"formatted at {h.created}, the repository knows the one "
                                     f"formatted at {created}")
    if file_size is not None and file_size < h.size:
        raise ShortDataSet("short", f"the file has {file_size} bytes, the header says {h.size}")
    if h.partial_recovery and not recovering:
        raise IncompleteRecovery("partial-recovery", "recovery was attempted and did not finish")


# -- the block prefix -----------------------------------------------------------------

PREFIX_MAGIC: Final = b"\xc1SMB"
PREFIX_VERSION: Final = 1
# magic, version, reserved, entry id, message length, offset, bytes, data CRC, owner,
# reserved; then the CRC of those 60 bytes.
_PREFIX: Final = struct.Struct("<4sHHQQQII16sI")
assert _PREFIX.size + _CRC.size == PREFIX


@dataclass(frozen=True)
class Prefix:
    """The 64 bytes before each message block's payload: whose data follows."""

    entry_id: int
    owner: str
    length: int  # the whole message
    offset: int  # of this block's data within the message
    nbytes: int  # payload bytes in this block
    crc: int  # CRC-32C of those bytes


def pack_prefix(p: Prefix) -> bytes:
    fields = _PREFIX.pack(PREFIX_MAGIC, PREFIX_VERSION, 0, p.entry_id, p.length, p.offset,
                          p.nbytes, p.crc, _name(p.owner, "owner"), 0)
    return fields + _CRC.pack(crc32c(fields))


def unpack_prefix(raw: bytes | memoryview) -> Prefix:
    """The prefix at the start of ``raw``.

    Raises BadPrefix: ``short`` (fewer than 64 bytes), ``unwritten`` (zeros:
    nothing was ever written there), ``torn`` (magic, CRC or reserved fields
    wrong); UnsupportedVersion for a version this code does not know.
    """
    head = bytes(raw[:PREFIX])
    if len(head) < PREFIX:
        raise BadPrefix("short", f"{len(head)} bytes where a {PREFIX}-byte block prefix belongs")
    if head.count(0) == PREFIX:
        raise BadPrefix("unwritten", "zeros where a block prefix belongs")
    (crc,) = _CRC.unpack_from(head, _PREFIX.size)
    if head[:4] != PREFIX_MAGIC or crc32c(head[:_PREFIX.size]) != crc:
        raise BadPrefix("torn", "the block prefix's magic or CRC is wrong")
    _, version, reserved, entry_id, length, offset, nbytes, data_crc, owner, reserved2 = (
        _PREFIX.unpack_from(head))
    if version != PREFIX_VERSION:
        raise UnsupportedVersion("version", f"block prefix version {version}")
    if reserved or reserved2:
        raise BadPrefix("torn", "reserved block prefix fields are not zero")
    return Prefix(entry_id, owner.rstrip(b"\0").decode("ascii", "replace"), length, offset,
                  nbytes, data_crc)


def check_block(raw: bytes | memoryview, *, entry_id: int, owner: str, length: int,
                offset: int, nbytes: int) -> tuple[memoryview, int]:
    """The payload of the message block read into ``raw`` (prefix first) and its
    CRC-32C, once its prefix names this entry, owner, message length, offset and
    block length, and its data matches the prefix's CRC. (The data map holds only
    the whole payload's CRC; the caller checks that once every block is in, from
    the blocks' CRCs: crcs.py.)

    Raises BadPrefix with the first field that differs: ``wrong-entry``,
    ``wrong-owner``, ``wrong-length``, ``wrong-offset``, then ``short`` (fewer
    bytes read than the block holds) or ``bad-crc``; or what unpack_prefix raises.
    """
    found = check_prefix(raw, entry_id=entry_id, owner=owner, length=length, offset=offset,
                         nbytes=nbytes)
    data = memoryview(raw)[PREFIX:PREFIX + nbytes]
    if len(data) < nbytes:
        raise BadPrefix("short", f"{len(data)} of the block's {nbytes} bytes were read")
    if crc32c(data) != found.crc:
        raise BadPrefix("bad-crc", f"the data of entry {entry_id} at offset {offset} fails "
                                   f"its CRC")
    return data, found.crc


def check_prefix(raw: bytes | memoryview, *, entry_id: int, owner: str, length: int,
                 offset: int, nbytes: int) -> Prefix:
    """The prefix at the start of ``raw``, once it names this entry, owner, message
    length, offset and block length (the data is not looked at: restart after
    recovery reads only the prefixes). Raises BadPrefix as check_block does."""
    found = unpack_prefix(raw)
    for reason, field, have, want in (("wrong-entry", "entry id", found.entry_id, entry_id),
                                      ("wrong-owner", "owner", found.owner, owner),
                                      ("wrong-length", "message length", found.length, length),
                                      ("wrong-offset", "offset", found.offset, offset),
                                      ("wrong-length", "block length", found.nbytes, nbytes)):
        if have != want:
            raise BadPrefix(reason, f"the block prefix has {field} {have!r}, entry {entry_id} "
                                    f"expects {want!r}")
    return found
