"""The buffer pool: LRU reuse, pins, waits, lowest free count and invalidation."""

import pytest

from cqsd.smds.bufferpool import BufferPool, Held
from cqsd.smds.pages import PAGE, Range

BLOCK = 4 * PAGE  # four pages a block


def cache(pool, key, nbytes=100):
    """Read block ``key`` through the pool as a miss does: take, fill, release."""
    assert pool.lookup(key, nbytes) is None
    buffer = pool.take()
    assert buffer is not None
    pool.fill(buffer, key, nbytes)
    pool.release(buffer)
    return buffer


def test_a_block_read_once_is_served_from_memory_the_second_time():
    """The second lookup of a block is a hit on the same buffer, with its bytes."""
    pool = BufferPool(2, BLOCK)
    buffer = cache(pool, ("C1", 4))
    buffer.memory[:3] = b"abc"
    hit = pool.lookup(("C1", 4), 100)
    assert hit is buffer and bytes(hit.view()[:3]) == b"abc" and len(hit.view()) == 100
    pool.release(hit)
    stats = pool.statistics()
    assert (stats.buffers, stats.hits, stats.misses, stats.lru_hit_percent) == (2, 1, 1, 50.0)
    assert (stats.in_use, stats.cached) == (0, 1)


def test_a_cached_block_shorter_than_the_read_is_a_miss():
    """A buffer holding 100 bytes of a block cannot serve a read of 200."""
    pool = BufferPool(2, BLOCK)
    cache(pool, ("C1", 4), 100)
    assert pool.lookup(("C1", 4), 200) is None


def test_the_least_recently_used_block_is_the_one_given_up():
    """With two buffers holding A and B, a hit on A makes B the one a new read takes."""
    pool = BufferPool(2, BLOCK)
    a = cache(pool, ("C1", 4))
    b = cache(pool, ("C1", 8))
    pool.release(pool.lookup(("C1", 4), 100))
    assert pool.take() is b
    assert pool.lookup(("C1", 8), 100) is None
    assert pool.lookup(("C1", 4), 100) is a


def test_a_request_finding_every_buffer_pinned_is_a_wait():
    """take() gives None when every buffer is in use, counts a wait and a lowest free of 0."""
    pool = BufferPool(2, BLOCK)
    assert pool.statistics().lowest_free == 2
    first, second = pool.take(), pool.take()
    assert first is not None and second is not None
    assert pool.take() is None
    stats = pool.statistics()
    assert (stats.waits, stats.lowest_free, stats.in_use) == (1, 0, 2)
    pool.release(first)
    assert pool.take() is first
    assert pool.statistics().waits == 1


def test_a_pinned_buffer_is_never_reused_while_a_read_holds_it():
    """A hit pins a buffer: the next take gets the empty one, then waits."""
    pool = BufferPool(2, BLOCK)
    a = cache(pool, ("C1", 4))
    assert pool.lookup(("C1", 4), 100) is a
    other = pool.take()
    assert other is not None and other is not a
    assert pool.take() is None


def test_writing_or_freeing_pages_forgets_every_cached_block_overlapping_them():
    """A range overlapping a cached block drops it; other pages and other owners stay."""
    pool = BufferPool(4, BLOCK)
    cache(pool, ("C1", 4), PAGE + 1)  # pages 4 and 5
    cache(pool, ("C1", 6))  # page 6
    cache(pool, ("C2", 5))  # another owner's data set
    assert pool.invalidate("C1", [Range(5, 1)]) == 1
    assert pool.lookup(("C1", 4), 1) is None
    assert pool.lookup(("C1", 6), 1) is not None
    assert pool.lookup(("C2", 5), 1) is not None
    assert pool.statistics().cached == 2


def test_a_block_invalidated_while_pinned_is_empty_once_released():
    """A read that holds a buffer keeps its bytes; the buffer is emptied afterwards."""
    pool = BufferPool(1, BLOCK)
    a = cache(pool, ("C1", 4))
    assert pool.lookup(("C1", 4), 100) is a
    pool.invalidate("C1", [Range(4, 4)])
    pool.release(a)
    assert pool.lookup(("C1", 4), 100) is None
    assert pool.take() is a and a.key is None


def test_bytes_that_failed_their_checks_are_not_kept():
    """release(keep=False) forgets the block, so the next read goes to the disk."""
    pool = BufferPool(1, BLOCK)
    cache(pool, ("C1", 4))
    buffer = pool.lookup(("C1", 4), 100)
    pool.release(buffer, keep=False)
    assert pool.lookup(("C1", 4), 100) is None
    assert pool.statistics().cached == 0


def test_two_reads_missing_the_same_block_leave_one_copy_cached():
    """The later fill replaces the earlier; the earlier buffer goes back empty."""
    pool = BufferPool(2, BLOCK)
    first, second = pool.take(), pool.take()
    pool.fill(first, ("C1", 4), 100)
    pool.fill(second, ("C1", 4), 100)
    pool.release(first)
    pool.release(second)
    assert pool.statistics().cached == 1
    assert pool.lookup(("C1", 4), 100) is second


def test_misuse_is_refused():
    """A pool of no buffers, a fill of a buffer not taken, a release too many are errors."""
    with pytest.raises(ValueError):
        BufferPool(0, BLOCK)
    pool = BufferPool(1, BLOCK)
    buffer = pool.take()
    with pytest.raises(ValueError):
        pool.fill(buffer, ("C1", 4), BLOCK + 1)
    pool.release(buffer)
    with pytest.raises(ValueError):
        pool.release(buffer)
    with pytest.raises(ValueError):
        pool.fill(buffer, ("C1", 4), 1)


def test_a_resized_pool_adds_empty_buffers_or_gives_up_free_ones_then_pinned_ones():
    """resize grows with empty buffers; it shrinks by empty, then least recently used
    buffers, and a pinned one goes only when its read releases it."""
    pool = BufferPool(3, BLOCK)
    cache(pool, ("C1", 4))
    cache(pool, ("C1", 8))
    pinned = pool.lookup(("C1", 8), 100)
    pool.resize(1)
    stats = pool.statistics()
    assert (stats.buffers, stats.in_use, stats.cached) == (1, 1, 1)  # the empty and LRU went
    assert pool.take() is None  # the one left is pinned
    pool.release(pinned)
    assert pool.statistics().cached == 1 and pool.free == 1
    pool.resize(4)
    assert pool.free == 4 and pool.lookup(("C1", 8), 100) is not None
    with pytest.raises(ValueError):
        pool.resize(0)


def test_a_buffer_pinned_when_the_pool_shrank_is_dropped_at_release():
    """A pool smaller than the buffers its reads hold gives each up as it is released."""
    pool = BufferPool(2, BLOCK)
    held = [pool.take(), pool.take()]
    pool.resize(1)
    pool.release(held[0])
    assert (pool.free, pool.statistics().in_use) == (0, 1)
    pool.release(held[1])
    assert (pool.free, pool.statistics().in_use) == (1, 0)


def test_a_written_block_is_held_as_the_most_recently_used_and_never_waits():
    """hold() takes an empty buffer, else the least recently used, replaces an older
    copy of the same block, and gives up (False) rather than wait when every buffer
    is pinned."""
    pool = BufferPool(2, BLOCK)
    cache(pool, ("C1", 4))
    held = Held(7, 0, memoryview(b"abc"))
    assert pool.hold(("C1", 8), 3 + 64, held)
    hit = pool.lookup(("C1", 8), 3 + 64)
    assert hit is not None and hit.held is held
    pool.release(hit)
    assert pool.hold(("C1", 4), 3 + 64, Held(8, 0, memoryview(b"new")))  # replaces a's block
    hit = pool.lookup(("C1", 4), 3 + 64)
    assert hit is not None and hit.held is not None and hit.held.entry_id == 8
    pool.release(hit)
    assert pool.statistics().cached == 2
    assert pool.hold(("C1", 12), 67, held)  # the least recently used goes: block 8
    assert pool.lookup(("C1", 8), 67) is None
    first, second = pool.take(), pool.take()
    assert first is not None and second is not None and first.held is None
    assert not pool.hold(("C1", 16), 67, held)
    assert pool.statistics().waits == 0
