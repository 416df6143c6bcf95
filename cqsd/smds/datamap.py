"""The data map: what an offloaded entry keeps in the structure instead of its payload.

Owner, length, CRC and the ranges holding the message blocks (docs/smds.md,
"The data map"). It travels as a small msgpack array — in the entry, in the
log's ``M`` effect, in images and SRDS slots — so a structure of tens of MiB
can hold GiBs of messages at one data element each. Every DataMap obeys the
allocation rule (``pages.pieces``); one that does not cannot be constructed.

The map also knows how its payload is laid out, so the two halves of the data
path live here: ``blocks`` (what to write where) and ``assemble`` (the checks a
read makes before any byte reaches a client).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from crc32c import crc32c

from cqsproto.names import CLIENT_NAME

from .bufferpool import Held
from .crcs import joined, payload_crcs
from .errors import BadDataMap, BadPrefix, DownLevel, OutsideDataSet
from .header import Prefix, check_block, check_prefix, pack_prefix
from .pages import PAGE, PREFIX, Piece, Range, pieces

U32, U63 = 1 << 32, 1 << 63
# a group node's log series, ``NODE-N`` (docs/group.md): in a group each incarnation of
# a node allocates only in data sets of its own, named after its series
WRITER = re.compile(r"[A-Z0-9]{1,8}-[1-9][0-9]{0,9}")


class Block(NamedTuple):
    """One message block to write: ``prefix`` then ``data`` at byte ``position``."""

    position: int
    prefix: bytes
    data: memoryview


def _is_int(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value < limit


@dataclass(frozen=True, slots=True)
class DataMap:
    """Where an offloaded payload is: ``ranges`` of the data set of ``owner`` (in a
    group, of ``owner`` as node incarnation ``writer`` put it: docs/smds.md)."""

    owner: str
    length: int
    crc: int
    ranges: tuple[Range, ...]
    writer: str | None = None
    # the ranges' pieces, cut once when the map is checked: a put, its read and its
    # delete each asked for them again (~15 us a time for a 1 MiB payload)
    _pieces: tuple[Piece, ...] = field(init=False, repr=False, compare=False)
    # the CRC of each piece of the payload ``of`` made the map of, taken in the pass
    # that took the whole payload's (crcs.py), for ``blocks``' prefixes; then None
    _block_crcs: list[int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not CLIENT_NAME.fullmatch(self.owner):
            raise BadDataMap(f"owner {self.owner!r} is not a client name")
        if self.writer is not None and (not isinstance(self.writer, str)
                                        or not WRITER.fullmatch(self.writer)):
            raise BadDataMap(f"writer {self.writer!r} is not a node's log series (NODE-N)")
        if not _is_int(self.length, U63) or not _is_int(self.crc, U32):
            raise BadDataMap(f"length {self.length!r} or CRC {self.crc!r} out of range")
        try:
            object.__setattr__(self, "_pieces", tuple(pieces(self.length, self.ranges)))
        except ValueError as error:
            raise BadDataMap(f"ranges {self.ranges} do not hold {self.length} bytes by the "
                             f"allocation rule: {error}") from None

    @classmethod
    def of(cls, owner: str, payload: bytes | memoryview, ranges: Sequence[Range],
           writer: str | None = None) -> DataMap:
        """The map of ``payload`` stored in ``ranges`` (as SpaceMap.allocate gave them)."""
        view = memoryview(payload).cast("B")
        dmap = cls(owner, len(view), 0, tuple(ranges), writer)  # checked, and cut
        crcs, whole = payload_crcs(view, dmap._pieces)
        object.__setattr__(dmap, "crc", whole)
        object.__setattr__(dmap, "_block_crcs", crcs)
        return dmap

    @property
    def dataset(self) -> str:
        """The name of the data set holding the payload, in its structure's folder:
        the owner, or in a group ``OWNER.NODE-N``."""
        return dataset_name(self.owner, self.writer)

    # -- the encoded form --------------------------------------------------------------

    def encode(self) -> list[Any]:
        """``[owner, length, crc, [page, count, …]]``, with ``writer`` after it in a
        group; ready for msgpack."""
        flat = [self.owner, self.length, self.crc, [n for r in self.ranges for n in r]]
        return flat if self.writer is None else [*flat, self.writer]

    @classmethod
    def decode(cls, obj: object) -> DataMap:
        """A map back from its encoded form (lists or tuples). Raises BadDataMap."""
        if not isinstance(obj, list | tuple) or len(obj) not in (4, 5):
            raise BadDataMap(f"a data map is a 4- or 5-element array, not {obj!r:.80}")
        owner, length, crc, flat = obj[:4]
        writer = obj[4] if len(obj) == 5 else None
        if (not isinstance(flat, list | tuple) or not flat or len(flat) % 2
                or not all(_is_int(n, U63) for n in flat)):
            raise BadDataMap(f"ranges must be pairs of page and count, not {flat!r:.80}")
        ranges = tuple(Range(flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
        return cls(owner, length, crc, ranges, writer)

    # -- the layout --------------------------------------------------------------------

    def pieces(self) -> tuple[Piece, ...]:
        """Each range with the part of the payload its message block carries."""
        return self._pieces

    def check_within(self, pages_per_block: int, blocks: int) -> None:
        """Check the ranges against a data set of ``blocks`` blocks of ``pages_per_block``.

        Raises OutsideDataSet for a range in the control block or past the
        extent, BadDataMap for one that crosses a block boundary, or does not
        start (after the first) or end (before the last) at one.
        """
        last = len(self.ranges) - 1
        for i, (page, count) in enumerate(self.ranges):
            end = page + count  # one past the range
            if page < pages_per_block or end > blocks * pages_per_block:
                raise OutsideDataSet("outside", f"range {(page, count)} is outside the data "
                                                f"blocks 1..{blocks - 1}")
            if (end - 1) // pages_per_block != page // pages_per_block:
                raise BadDataMap(f"range {(page, count)} crosses a block boundary")
            if i > 0 and page % pages_per_block:
                raise BadDataMap(f"range {(page, count)} continues a message mid-block")
            if i < last and end % pages_per_block:
                raise BadDataMap(f"range {(page, count)} is not the last, yet ends mid-block")

    def blocks(self, entry_id: int, payload: bytes | memoryview) -> list[Block]:
        """The message blocks to write for entry ``entry_id``: prefixes and zero-copy
        slices of ``payload`` (which must be the payload this map was made of)."""
        view = memoryview(payload)
        if len(view) != self.length:
            raise ValueError(f"a payload of {len(view)} bytes for a map of {self.length}")
        crcs = self._block_crcs
        if crcs is None:
            crcs = [crc32c(view[offset:offset + nbytes]) for _, offset, nbytes in self._pieces]
        object.__setattr__(self, "_block_crcs", None)  # one payload's: not kept with the entry
        out = []
        for ((page, _), offset, nbytes), crc in zip(self._pieces, crcs, strict=True):
            prefix = pack_prefix(Prefix(entry_id, self.owner, self.length, offset, nbytes, crc))
            out.append(Block(page * PAGE, prefix, view[offset:offset + nbytes]))
        return out

    def read_sizes(self) -> list[tuple[int, int]]:
        """(byte position, bytes) to read for each message block, prefix included."""
        return [(r.page * PAGE, PREFIX + nbytes) for r, _, nbytes in self.pieces()]

    def assemble(self, entry_id: int, reads: Sequence[bytes | memoryview | Held]) -> bytes:
        """The payload from the bytes read at each of ``read_sizes``, once every prefix
        names this entry and every block and the whole payload pass their CRCs.
        A read may instead be the piece as written (``Held``, never from the disk,
        so unchecked); when every piece is, and they are the one payload they
        were cut from, that payload is returned as it is, without a copy.

        Raises BadPrefix (header.check_block's reasons, or ``bad-crc`` for the
        whole payload) and ValueError for a wrong number of reads.
        """
        parts = self.pieces()
        if len(reads) != len(parts):
            raise ValueError(f"{len(reads)} blocks read for a map of {len(parts)}")
        held = [read for read in reads if isinstance(read, Held)]
        if len(held) == len(reads):
            whole = held[0].data.obj
            if type(whole) is bytes and len(whole) == self.length and all(
                    piece.data.obj is whole for piece in held):
                return whole
            return b"".join(piece.data for piece in held)
        blocks = [
            (read.data, crc32c(read.data)) if isinstance(read, Held) else
            check_block(read, entry_id=entry_id, owner=self.owner, length=self.length,
                        offset=offset, nbytes=nbytes)
            for read, (_, offset, nbytes) in zip(reads, parts, strict=True)]
        if joined(blocks) != self.crc:  # the payload's CRC, from its blocks' (crcs.py)
            raise BadPrefix("bad-crc", f"the payload of entry {entry_id} fails the map's CRC")
        return b"".join(data for data, _ in blocks)

    def check_newest(self, entry_id: int, first: bytes | memoryview) -> None:
        """Restart's down-level check: the first message block of the newest entry
        (``first``, read at ``read_sizes()[0]``) must be that entry's.

        Raises DownLevel, carrying the BadPrefix as its cause.
        """
        _, offset, nbytes = self.pieces()[0]
        try:
            check_block(first, entry_id=entry_id, owner=self.owner, length=self.length,
                        offset=offset, nbytes=nbytes)
        except BadPrefix as error:
            raise DownLevel("down-level", f"the newest entry {entry_id}'s first block is not "
                                          f"in the data set ({error}): an older copy?") from error

    def check_prefixes(self, entry_id: int, heads: Sequence[bytes | memoryview]) -> None:
        """Restart after recovery: the prefix of every message block (``heads``, the
        first PREFIX bytes read at each of ``read_sizes``) must be this entry's,
        or its data was lost (seed 000, "Shared message data set restart after
        recovery"). Raises BadPrefix naming the first that is not."""
        parts = self.pieces()
        if len(heads) != len(parts):
            raise ValueError(f"{len(heads)} prefixes read for a map of {len(parts)}")
        for raw, (_, offset, nbytes) in zip(heads, parts, strict=True):
            check_prefix(raw, entry_id=entry_id, owner=self.owner, length=self.length,
                         offset=offset, nbytes=nbytes)


def dataset_name(owner: str, writer: str | None) -> str:
    """The data set of ``owner`` put by incarnation ``writer`` (None: a daemon on its
    own): ``OWNER`` or ``OWNER.NODE-N``, its file's name without ``.smds``."""
    return owner if writer is None else f"{owner}.{writer}"
