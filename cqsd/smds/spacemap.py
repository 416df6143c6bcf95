"""The space map of one data set: which pages hold message blocks, and where the next go.

Design note. The rules are IBM MQ's (seed 001, "Shared message data set space
management"); the shape is bbolt's freelist (STYLE): a small pure object, no I/O.

- Space goes to a queue a logical block at a time, then to its messages as page
  ranges within that block, from the block's cursor on: each queue has at most
  one *current* block, and a message that does not fit in it is split at the
  block's end and goes on in a new block. New blocks are the lowest-numbered
  free ones.
- Freed pages are not handed out one by one: a block goes back to the free pool
  when its last page in use is released, and not before.
- A free is *pending* until the delete that caused it is durable
  (``free(ranges, txid)`` … ``release(txid)``), so a crash that brings the entry
  back finds its data intact. A double free, or a free of pages nobody holds,
  is a bug and is refused loudly, before anything changes.

Each block in use is one int, a bitmap of its pages (bit *i* = page *i* of the
block), which makes overlap and double-free checks one ``&`` per block. Free
blocks are the never-used ones above ``_fresh`` plus a heap of returned ones
below it, so growing by a thousand blocks costs nothing.

The saved form (``to_bytes``/``from_bytes``) and the rebuild from data maps are
the restart paths of docs/smds.md.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Final

from crc32c import crc32c

from .errors import (
    BadSpaceMap,
    DoubleFree,
    NoSpace,
    OutsideDataSet,
    OverlappingRanges,
    SmdsError,
    UnallocatedFree,
)
from .pages import PAGE, Range, pages_for, room

RESERVED_BLOCKS: Final = 1  # block 0 holds the two header copies and is never handed out
EXPAND_AT: Final = 90  # percent full at which expansion starts (seed 001, "reaches 90% full")
EXPAND_BY: Final = 20  # percent of the current size added (seeds: "20% of the current size")

MAP_MAGIC: Final = b"SMDSMAP\n"
MAP_VERSION: Final = 1
# magic, version, reserved, pages per block, blocks, timestamp, entries, body CRC,
# reserved; then the CRC of those 60 bytes; then the body.
_MAP_HEAD: Final = struct.Struct("<8sHHIQQQI16s")
_CRC: Final = struct.Struct("<I")
_BLOCK_NO: Final = struct.Struct("<I")
MAP_HEADER: Final = _MAP_HEAD.size + _CRC.size  # 64


@dataclass(frozen=True)
class Usage:
    """The figures ``display smds`` and ``display usage`` show (docs/smds.md, "Usage")."""

    size: int  # bytes, the formatted extent
    total_pages: int  # pages of the data blocks
    used_pages: int
    pending_pages: int
    free_pages: int  # total - used - pending
    blocks_in_use: int
    free_blocks: int
    available_pages: int  # allocatable now: free blocks and current blocks' tails
    used_percent: float  # 100 * (total - available) / total


def whole_blocks(nbytes: int, dsblock: int) -> int:
    """``nbytes`` rounded up to whole blocks, and never below the two a data set needs."""
    return max(2 * dsblock, -(-nbytes // dsblock) * dsblock)


def expanded_size(size: int, dsblock: int, dsmax: int) -> int | None:
    """The size an expansion of a ``size``-byte data set asks for: 20% more, in whole
    blocks and at least one, capped at ``dsmax`` (rounded down to whole blocks);
    None when the data set is already there (the expansion fails, seed 000)."""
    more = max(1, -(-size * EXPAND_BY // (100 * dsblock)))
    new = min(size + more * dsblock, dsmax // dsblock * dsblock)
    return new if new > size else None


class SpaceMap:
    """Free and used space of one data set of ``size`` bytes in blocks of ``dsblock``."""

    def __init__(self, dsblock: int, size: int) -> None:
        if dsblock < PAGE or dsblock % PAGE:
            raise ValueError(f"dsblock {dsblock} is not a positive multiple of {PAGE}")
        if size % dsblock or size < 2 * dsblock:
            raise ValueError(f"size {size} is not at least two whole blocks of {dsblock}")
        self.dsblock = dsblock
        self.ppb = dsblock // PAGE  # pages per block
        self.blocks = size // dsblock
        self._taken: dict[int, int] = {}  # block in use -> pages allocated (live or pending)
        self._pending: dict[int, int] = {}  # block -> pages freed, not yet released
        self._by_txid: dict[int, list[tuple[int, int]]] = {}  # txid -> [(block, pages)]
        self._current: dict[Hashable, int] = {}  # queue -> its current block
        self._queue_of: dict[int, Hashable] = {}  # current block -> its queue
        self._cursor: dict[int, int] = {}  # current block -> its next free page (index)
        self._returned: list[int] = []  # heap of free blocks below _fresh
        self._fresh = RESERVED_BLOCKS  # this block and all above it have never been taken
        self._used = 0
        self._pending_pages = 0
        self._tails = 0  # unused pages of all current blocks

    def __repr__(self) -> str:
        return (f"SpaceMap(dsblock={self.dsblock}, blocks={self.blocks}, used={self._used}, "
                f"pending={self._pending_pages}, current={len(self._current)})")

    # -- figures ---------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.blocks * self.dsblock

    @property
    def pending_pages(self) -> int:
        """Pages freed and waiting for their delete to be durable."""
        return self._pending_pages

    @property
    def free_blocks(self) -> int:
        return len(self._returned) + self.blocks - self._fresh

    @property
    def _total(self) -> int:
        return (self.blocks - RESERVED_BLOCKS) * self.ppb

    @property
    def _available(self) -> int:
        return self.free_blocks * self.ppb + self._tails

    def usage(self) -> Usage:
        total, available = self._total, self._available
        return Usage(self.size, total, self._used, self._pending_pages,
                     total - self._used - self._pending_pages, len(self._taken),
                     self.free_blocks, available, 100 * (total - available) / total)

    @property
    def wants_growth(self) -> bool:
        """At least EXPAND_AT percent full: time to expand (if the data set may)."""
        return 100 * (self._total - self._available) >= EXPAND_AT * self._total

    def page_state(self, page: int) -> str:
        """``"used"``, ``"pending"`` or ``"free"`` (for diagnosis and tests)."""
        block, bit = divmod(page, self.ppb)
        if self._pending.get(block, 0) >> bit & 1:
            return "pending"
        return "used" if self._taken.get(block, 0) >> bit & 1 else "free"

    def current(self, queue: Hashable) -> Range | None:
        """The unused tail of ``queue``'s current block, where its next message starts."""
        block = self._current.get(queue)
        if block is None:
            return None
        cursor = self._cursor[block]
        return Range(block * self.ppb + cursor, self.ppb - cursor)

    # -- allocation ------------------------------------------------------------------

    def allocate(self, queue: Hashable, nbytes: int) -> list[Range]:
        """Ranges for a payload of ``nbytes`` put to ``queue``, prefixes included.

        Raises NoSpace (nothing allocated) when more blocks are needed than are free.
        """
        if nbytes < 0:
            raise ValueError(f"a payload of {nbytes} bytes")
        block = self._current.get(queue)
        tail = 0
        if block is not None:
            tail = self.ppb - self._cursor[block]
            if nbytes <= room(tail):  # the common case: it fits in the current block
                return [self._give(block, self._cursor[block], pages_for(nbytes), queue)]
        rest = nbytes - room(tail) if block is not None else nbytes
        full = room(self.ppb)
        new = max(1, -(-rest // full))
        if new > self.free_blocks:
            wanted = tail + (new - 1) * self.ppb + pages_for(rest - (new - 1) * full)
            raise NoSpace(wanted, self._available)
        ranges = []
        if block is not None:  # fill the current block to its end, then go on
            ranges.append(self._give(block, self._cursor[block], tail, queue))
        for _ in range(new):
            nb = min(rest, full)
            ranges.append(self._give(self._take_block(), 0, pages_for(nb), queue))
            rest -= nb
        return ranges

    def blocks_needed(self, queue: Hashable, nbytes: int) -> int:
        """New blocks ``allocate(queue, nbytes)`` takes: 0 when the payload fits in the
        queue's current block (so a caller can tell a put that can never fit)."""
        block = self._current.get(queue)
        tail = 0 if block is None else self.ppb - self._cursor[block]
        if block is not None and nbytes <= room(tail):
            return 0
        rest = nbytes - room(tail) if block is not None else nbytes
        return max(1, -(-rest // room(self.ppb)))

    def _take_block(self) -> int:
        if self._returned:
            return heapq.heappop(self._returned)
        self._fresh += 1
        return self._fresh - 1

    def _give(self, block: int, start: int, count: int, queue: Hashable) -> Range:
        """Mark ``count`` pages of ``block`` from ``start`` allocated; the block is
        then ``queue``'s current block if pages remain after them."""
        self._taken[block] = self._taken.get(block, 0) | ((1 << count) - 1) << start
        self._used += count
        self._drop_current(block)
        end = start + count
        if end < self.ppb:  # (the queue's old current block was this one, or is full)
            self._current[queue] = block
            self._queue_of[block] = queue
            self._cursor[block] = end
            self._tails += self.ppb - end
        return Range(block * self.ppb + start, count)

    def _drop_current(self, block: int) -> None:
        queue = self._queue_of.pop(block, None)
        if queue is not None:
            del self._current[queue]
            self._tails -= self.ppb - self._cursor.pop(block)

    # -- freeing -----------------------------------------------------------------------

    def _mask(self, r: Range) -> tuple[int, int]:
        """(block, page bitmap) of a range; raises OutsideDataSet or ValueError."""
        page, count = r
        block = page // self.ppb
        if count < 1 or (page + count - 1) // self.ppb != block:
            raise ValueError(f"range {tuple(r)} is empty or crosses a block boundary")
        if not RESERVED_BLOCKS <= block < self.blocks:
            raise OutsideDataSet("outside", f"range {tuple(r)} is outside the data blocks "
                                            f"{RESERVED_BLOCKS}..{self.blocks - 1}")
        return block, ((1 << count) - 1) << (page - block * self.ppb)

    def _masks(self, ranges: Iterable[Range],
               overlap: Callable[[Range], SmdsError]) -> dict[int, int]:
        """The page bitmaps of ``ranges`` by block; ``overlap(r)`` is raised for a
        range sharing a page with an earlier one."""
        masks: dict[int, int] = {}
        for r in ranges:
            block, mask = self._mask(r)
            if masks.get(block, 0) & mask:
                raise overlap(r)
            masks[block] = masks.get(block, 0) | mask
        return masks

    def free(self, ranges: Iterable[Range], txid: int | None) -> None:
        """Free ``ranges``: pending under ``txid`` until ``release`` reaches it, or at
        once when ``txid`` is None (a change that is never logged).

        Raises DoubleFree (a page already pending, or named twice), UnallocatedFree
        (a page not allocated), OutsideDataSet; nothing is freed then.
        """
        masks = self._masks(ranges, lambda r: DoubleFree(f"range {tuple(r)} names a page "
                                                         f"twice in one free"))
        for block, mask in masks.items():
            if pending := mask & self._pending.get(block, 0):
                raise DoubleFree(f"pages {self._pages(block, pending)} are already pending")
            if unallocated := mask & ~self._taken.get(block, 0):
                raise UnallocatedFree(f"pages {self._pages(block, unallocated)} are not allocated")
        freed = sum(mask.bit_count() for mask in masks.values())
        self._used -= freed
        if txid is None:
            for block, mask in masks.items():
                self._taken[block] &= ~mask
                self._maybe_return(block)
            return
        for block, mask in masks.items():
            self._pending[block] = self._pending.get(block, 0) | mask
        self._by_txid.setdefault(txid, []).extend(masks.items())
        self._pending_pages += freed

    def release(self, txid: int) -> int:
        """Make every page pending under a txid up to ``txid`` free (its delete is now
        durable); returns how many pages that was."""
        released = 0
        for t in sorted(t for t in self._by_txid if t <= txid):
            for block, mask in self._by_txid.pop(t):
                left = self._pending[block] & ~mask
                if left:
                    self._pending[block] = left
                else:
                    del self._pending[block]
                self._taken[block] &= ~mask
                released += mask.bit_count()
                self._maybe_return(block)
        self._pending_pages -= released
        return released

    def _maybe_return(self, block: int) -> None:
        """A block whose last page in use is gone goes back to the pool, cursor and all."""
        if not self._taken[block]:
            del self._taken[block]
            self._drop_current(block)
            heapq.heappush(self._returned, block)

    def _pages(self, block: int, mask: int) -> list[int]:
        return [block * self.ppb + i for i in range(self.ppb) if mask >> i & 1]

    # -- growth ----------------------------------------------------------------------

    def grow(self, new_size: int) -> int:
        """Take in the blocks of an expansion to ``new_size`` bytes (already formatted
        and recorded in the header); returns how many blocks were added."""
        if new_size % self.dsblock or new_size < self.size:
            raise ValueError(f"cannot grow from {self.size} to {new_size} bytes in blocks of "
                             f"{self.dsblock}")
        added = new_size // self.dsblock - self.blocks
        self.blocks += added
        return added

    # -- the saved map and the rebuild ------------------------------------------------------

    def to_bytes(self, timestamp: int) -> bytes:
        """The space-map checkpoint (docs/smds.md): every page allocated or pending, by
        block; current blocks are not kept, so their unused tails come back with them."""
        width = (self.ppb + 7) // 8
        blocks = sorted(b for b, mask in self._taken.items() if mask)
        body = b"".join(_BLOCK_NO.pack(b) + self._taken[b].to_bytes(width, "little")
                        for b in blocks)
        head = _MAP_HEAD.pack(MAP_MAGIC, MAP_VERSION, 0, self.ppb, self.blocks, timestamp,
                              len(blocks), crc32c(body), bytes(16))
        return head + _CRC.pack(crc32c(head)) + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, dsblock: int, size: int) -> tuple[SpaceMap, int]:
        """(map, timestamp) from a checkpoint written by ``to_bytes`` for a data set of
        this geometry; bytes after the checkpoint (page padding) are ignored.

        Raises BadSpaceMap: ``short``, ``magic``, ``header-crc``, ``version``,
        ``geometry`` (another block size or count), ``body-crc``, ``order``.
        """
        data = bytes(data)
        if len(data) < MAP_HEADER:
            raise BadSpaceMap("short", f"{len(data)} bytes, under its {MAP_HEADER}-byte header")
        magic, version, reserved, ppb, blocks, timestamp, entries, body_crc, spare = (
            _MAP_HEAD.unpack_from(data))
        if magic != MAP_MAGIC:
            raise BadSpaceMap("magic", f"no space-map checkpoint here (starts {data[:8]!r})")
        if crc32c(data[:_MAP_HEAD.size]) != _CRC.unpack_from(data, _MAP_HEAD.size)[0]:
            raise BadSpaceMap("header-crc", "the checkpoint header fails its CRC")
        if version != MAP_VERSION or reserved or any(spare):
            raise BadSpaceMap("version", f"checkpoint version {version} or reserved bytes unknown")
        if ppb != dsblock // PAGE or blocks != size // dsblock:
            raise BadSpaceMap("geometry", f"saved for {blocks} blocks of {ppb} pages, the data "
                                          f"set has {size // dsblock} of {dsblock // PAGE}")
        width = (ppb + 7) // 8
        body = data[MAP_HEADER:MAP_HEADER + entries * (_BLOCK_NO.size + width)]
        if len(body) < entries * (_BLOCK_NO.size + width):
            raise BadSpaceMap("short", f"the body of {entries} blocks is cut short")
        if crc32c(body) != body_crc:
            raise BadSpaceMap("body-crc", "the checkpoint body fails its CRC")
        masks: dict[int, int] = {}
        previous = RESERVED_BLOCKS - 1
        for at in range(0, len(body), _BLOCK_NO.size + width):
            (block,) = _BLOCK_NO.unpack_from(body, at)
            mask = int.from_bytes(body[at + _BLOCK_NO.size:at + _BLOCK_NO.size + width], "little")
            if not previous < block < blocks or not mask or mask >> ppb:
                raise BadSpaceMap("order", f"block {block} (after {previous}) with pages "
                                           f"{mask:#x} cannot be in this map")
            masks[block] = mask
            previous = block
        return cls._from_masks(dsblock, size, masks), timestamp

    @classmethod
    def rebuild(cls, dsblock: int, size: int, ranges: Iterable[Range]) -> SpaceMap:
        """Restart processing: the map of a data set whose allocated pages are exactly
        ``ranges`` (the ranges of every data map naming it). No block is current.

        Raises OverlappingRanges (two ranges share a page), OutsideDataSet.
        """
        masks = cls(dsblock, size)._masks(ranges, lambda r: OverlappingRanges(
            "overlap", f"range {tuple(r)} shares a page with another data map's"))
        return cls._from_masks(dsblock, size, masks)

    @classmethod
    def _from_masks(cls, dsblock: int, size: int, masks: dict[int, int]) -> SpaceMap:
        space = cls(dsblock, size)
        space._taken = masks
        space._used = sum(mask.bit_count() for mask in masks.values())
        space._fresh = max(masks, default=RESERVED_BLOCKS - 1) + 1
        space._returned = [b for b in range(RESERVED_BLOCKS, space._fresh) if b not in masks]
        return space
