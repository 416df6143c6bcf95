"""The buffer pool of one structure: ``dsbufs`` buffers of ``dsblock`` bytes, LRU.

Seed 000 ("Optimising buffer pool sizes"): buffers holding message data after
a write or a read are kept, LRU, so that a message read back soon after it was
written or read costs no I/O. A read fills a buffer's own memory. A write
leaves its block *held*: the buffer refers to the slice of the (immutable)
payload the block was written from, rather than a copy of it, and a read that
finds it skips the checks a block from disk needs, as its bytes never left
memory.
This module is the bookkeeping only (no I/O, no trio): which buffer holds which
block, which are in use by a read, which to reuse next, and the figures
``display usage --type smds`` shows. ``dataset.DataSet.read`` does the reads.

A buffer is *pinned* while a read uses it (between ``lookup``/``take`` and
``release``) and is never reused then; an unpinned buffer is *free*, either
empty or holding a block it can give up (the least recently used first). A
request that finds every buffer pinned is a *wait* (MQ's "buffer waits"): the
caller reads into memory of its own rather than block, and the figure says
``dsbufs`` is too small. Blocks are keyed by ``(data set, first page)``; a write
or a free of pages invalidates every cached block overlapping them, so a
buffer never serves bytes the data set no longer holds.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .pages import PAGE, Range

BlockKey = tuple[str, int]  # (data set name, page where the message block starts)


class Held(NamedTuple):
    """A block as written: ``data``, the slice of entry ``entry_id``'s payload from
    byte ``offset`` (a view of the payload's bytes, not a copy)."""

    entry_id: int
    offset: int
    data: memoryview


class Buffer:
    """``dsblock`` bytes of memory and what they hold: ``nbytes`` of block ``key``,
    read into ``memory``, or ``held`` as written (prefix counted in ``nbytes``)."""

    __slots__ = ("memory", "key", "nbytes", "pins", "held")

    def __init__(self, size: int) -> None:
        self.memory = bytearray(size)
        self.key: BlockKey | None = None
        self.nbytes = 0
        self.pins = 0
        self.held: Held | None = None

    def view(self) -> memoryview:
        return memoryview(self.memory)[:self.nbytes]


@dataclass(frozen=True)
class PoolStatistics:
    """The pool's figures for the usage row (docs/smds.md): ``buffers``, ``hits``,
    ``misses``, ``lru_hit_percent`` (hits of all lookups, 0 before any),
    ``waits`` (requests that found no free buffer), ``lowest_free`` (the fewest
    free buffers seen since the pool was made), and the buffers ``in_use`` and
    ``cached`` now."""

    buffers: int
    hits: int
    misses: int
    lru_hit_percent: float
    waits: int
    lowest_free: int
    in_use: int
    cached: int


class BufferPool:
    """``buffers`` buffers of ``size`` bytes (the structure's dsbufs and dsblock).

    Safe to share between the worker threads doing a structure's reads: each
    method holds a lock for its bookkeeping, and no method does I/O."""

    def __init__(self, buffers: int, size: int) -> None:
        if buffers < 1 or size < PAGE or size % PAGE:
            raise ValueError(f"{buffers} buffers of {size} bytes")
        self.size = size
        self._ppb = size // PAGE
        self._buffers = buffers  # what the pool is to hold (resize changes it)
        self._held = buffers  # what it holds: more than _buffers while pinned ones go
        self._empty = [Buffer(size) for _ in range(buffers)]  # free, holding nothing
        self._lru: OrderedDict[BlockKey, Buffer] = OrderedDict()  # free, holding a block, LRU first
        self._cached: dict[BlockKey, Buffer] = {}  # every buffer holding a block, pinned or not
        self._by_block: dict[tuple[str, int], set[BlockKey]] = {}  # (owner, block) -> cached keys
        self.hits = self.misses = self.waits = 0
        self.lowest_free = buffers
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        return len(self._empty) + len(self._lru)

    def statistics(self) -> PoolStatistics:
        with self._lock:
            lookups = self.hits + self.misses
            return PoolStatistics(self._buffers, self.hits, self.misses,
                                  100 * self.hits / lookups if lookups else 0.0, self.waits,
                                  self.lowest_free, self._held - self.free, len(self._cached))

    def resize(self, buffers: int) -> None:
        """Hold ``buffers`` from now on (alter-smds --dsbufs): new ones are added empty;
        when there are fewer, free buffers go, empty ones first and then the least
        recently used, and a buffer pinned by a read goes when it is released."""
        if buffers < 1:
            raise ValueError(f"{buffers} buffers")
        with self._lock:
            self._buffers = buffers
            while self._held < buffers:
                self._empty.append(Buffer(self.size))
                self._held += 1
            while self._held > buffers and self._empty:
                self._empty.pop()
                self._held -= 1
            while self._held > buffers and self._lru:
                key, _ = self._lru.popitem(last=False)
                self._forget(key)
                self._held -= 1

    def lookup(self, key: BlockKey, nbytes: int) -> Buffer | None:
        """The buffer holding at least ``nbytes`` of block ``key``, pinned (a hit), or
        None (a miss: the caller ``take``s a buffer and reads)."""
        with self._lock:
            buffer = self._cached.get(key)
            if buffer is None or buffer.nbytes < nbytes:
                self.misses += 1
                return None
            self.hits += 1
            if not buffer.pins:
                del self._lru[key]
            buffer.pins += 1
            self._note_free()
            return buffer

    def take(self) -> Buffer | None:
        """A free buffer, pinned, to read a block into: an empty one, else the least
        recently used (whose block is forgotten). None when every buffer is pinned:
        counted as a wait."""
        with self._lock:
            buffer = self._free()
            if buffer is None:
                self.waits += 1
                return None
            buffer.pins = 1
            self._note_free()
            return buffer

    def hold(self, key: BlockKey, nbytes: int, held: Held) -> bool:
        """Keep block ``key`` (``nbytes`` with its prefix) as just written, ``held``,
        in a free buffer, most recently used; False when every buffer is in use (a
        write never waits for a buffer: its bytes are already in memory)."""
        with self._lock:
            if key in self._cached:  # an older copy: its buffer is the one to reuse
                self._drop(self._cached[key])
            buffer = self._free()
            if buffer is None:
                return False
            self._keep(buffer, key, nbytes)
            buffer.held = held
            self._lru[key] = buffer
            return True

    def fill(self, buffer: Buffer, key: BlockKey, nbytes: int) -> None:
        """Record that ``buffer`` (taken, pinned) now holds ``nbytes`` of block ``key``."""
        with self._lock:
            if buffer.key is not None or not buffer.pins or nbytes > self.size:
                raise ValueError("fill a buffer that was taken and is empty, with at most its size")
            self._keep(buffer, key, nbytes)

    def release(self, buffer: Buffer, *, keep: bool = True) -> None:
        """A read is done with ``buffer``; it stays cached (most recently used) unless
        ``keep`` is false (its bytes failed their checks) or it was invalidated."""
        with self._lock:
            if buffer.pins < 1:
                raise ValueError("release of a buffer that is not in use")
            if not keep and buffer.key is not None:
                self._drop(buffer)
            buffer.pins -= 1
            if buffer.pins:
                return
            if self._held > self._buffers:  # the pool was made smaller meanwhile
                if buffer.key is not None:
                    self._forget(buffer.key)
                self._held -= 1
                return
            if buffer.key is None:
                self._empty.append(buffer)
            else:
                self._lru[buffer.key] = buffer

    def invalidate(self, owner: str, ranges: Iterable[Range]) -> int:
        """Forget every cached block of ``owner``'s data set overlapping ``ranges``
        (pages written or freed); returns how many were forgotten."""
        with self._lock:
            dropped = 0
            for page, count in ranges:
                keys = self._by_block.get((owner, page // self._ppb), set())
                for key in [k for k in keys
                            if k[1] < page + count and page < k[1] + self._pages(self._cached[k])]:
                    self._drop(self._cached[key])
                    dropped += 1
            return dropped

    # -- inside --------------------------------------------------------------------

    def _pages(self, buffer: Buffer) -> int:
        return max(1, -(-buffer.nbytes // PAGE))

    def _block_of(self, key: BlockKey) -> tuple[str, int]:
        return key[0], key[1] // self._ppb

    def _free(self) -> Buffer | None:
        """An unpinned buffer to reuse, holding nothing: an empty one, else the least
        recently used, its block forgotten; None when every buffer is pinned."""
        if self._empty:
            return self._empty.pop()
        if not self._lru:
            return None
        key, buffer = self._lru.popitem(last=False)
        self._forget(key)
        buffer.key, buffer.nbytes, buffer.held = None, 0, None
        return buffer

    def _keep(self, buffer: Buffer, key: BlockKey, nbytes: int) -> None:
        """``buffer`` now holds ``nbytes`` of block ``key``: indexed, replacing any
        other buffer's copy (two reads of one block that missed together)."""
        old = self._cached.get(key)
        if old is not None:
            self._drop(old)
        buffer.key, buffer.nbytes = key, nbytes
        self._cached[key] = buffer
        self._by_block.setdefault(self._block_of(key), set()).add(key)

    def _forget(self, key: BlockKey) -> None:
        """Remove ``key`` from the indexes (its buffer is handled by the caller)."""
        del self._cached[key]
        block = self._block_of(key)
        self._by_block[block].discard(key)
        if not self._by_block[block]:
            del self._by_block[block]

    def _drop(self, buffer: Buffer) -> None:
        """``buffer``'s block is no longer valid: an unpinned buffer becomes empty, a
        pinned one becomes empty when released."""
        assert buffer.key is not None
        self._forget(buffer.key)
        if not buffer.pins:
            del self._lru[buffer.key]
            self._empty.append(buffer)
        buffer.key, buffer.nbytes, buffer.held = None, 0, None

    def _note_free(self) -> None:
        self.lowest_free = min(self.lowest_free, self.free)
