"""The space map's rules one at a time: allocation, freeing, release, growth, the saved
map and the rebuild (docs/smds.md, "Space management")."""

import struct

import pytest
from crc32c import crc32c

from cqsd.smds import (
    BadSpaceMap,
    DoubleFree,
    NoSpace,
    OutsideDataSet,
    OverlappingRanges,
    Range,
    SpaceMap,
    UnallocatedFree,
    expanded_size,
    whole_blocks,
)
from cqsd.smds.pages import PAGE, room

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 ** 3
BLOCK = 16 * KiB  # four pages a block keeps the arithmetic visible
PPB = BLOCK // PAGE


def space(blocks=8):
    return SpaceMap(BLOCK, blocks * BLOCK)


def test_a_queue_fills_its_current_block_before_taking_another():
    """Small messages to one queue follow each other in one block, from its first page."""
    s = space()
    assert s.allocate("Q", 10) == [Range(PPB, 1)]
    assert s.allocate("Q", PAGE) == [Range(PPB + 1, 2)]  # 4096 + 64 bytes need two pages
    assert s.current("Q") == Range(PPB + 3, 1)


def test_each_queue_has_its_own_current_block():
    """Another queue's put takes a new block rather than the first queue's tail."""
    s = space()
    s.allocate("Q", 10)
    assert s.allocate("R", 10) == [Range(2 * PPB, 1)]


def test_a_message_that_does_not_fit_is_split_at_the_end_of_the_block():
    """The tail of the current block is filled, the rest goes on at the start of a new block
    (seed 001), and that block becomes the queue's current one."""
    s = space()
    s.allocate("Q", 2 * PAGE)  # pages 0-2 of block 1
    ranges = s.allocate("Q", room(1) + room(PPB) + 1)
    assert ranges == [Range(PPB + 3, 1), Range(2 * PPB, PPB), Range(3 * PPB, 1)]
    assert s.current("Q") == Range(3 * PPB + 1, PPB - 1)


def test_a_message_that_ends_at_the_end_of_a_block_leaves_no_current_block():
    """A full block is no queue's current block."""
    s = space()
    assert s.allocate("Q", room(PPB)) == [Range(PPB, PPB)]
    assert s.current("Q") is None
    assert s.allocate("Q", 0) == [Range(2 * PPB, 1)]


def test_new_blocks_are_the_lowest_free_ones():
    """A block given back is taken again before any higher one."""
    s = space()
    first = s.allocate("Q", room(PPB))
    s.allocate("R", room(PPB))
    s.free(first, None)
    assert s.allocate("S", 0) == [Range(PPB, 1)]


def test_an_allocation_that_does_not_fit_is_refused_whole():
    """NoSpace names pages wanted and available, and nothing is allocated."""
    s = space(blocks=3)  # two data blocks
    s.allocate("Q", 0)
    before = s.usage()
    with pytest.raises(NoSpace) as caught:
        s.allocate("Q", room(PPB - 1) + room(PPB) + 1)
    assert (caught.value.wanted, caught.value.available) == (PPB - 1 + PPB + 1, 2 * PPB - 1)
    assert s.usage() == before


def test_a_freed_page_is_pending_until_its_delete_is_durable():
    """free(txid) holds the pages; release(txid) gives them back, with every earlier txid."""
    s = space()
    a, b = s.allocate("Q", 0), s.allocate("R", 0)
    s.free(a, txid=7)
    s.free(b, txid=9)
    assert s.page_state(a[0].page) == "pending"
    assert s.usage().pending_pages == 2
    assert s.release(6) == 0
    assert s.release(9) == 2
    assert s.page_state(a[0].page) == s.page_state(b[0].page) == "free"


def test_a_page_freed_twice_is_a_loud_bug():
    """A second free while the first is pending raises DoubleFree and changes nothing."""
    s = space()
    r = s.allocate("Q", 0)
    s.free(r, txid=1)
    with pytest.raises(DoubleFree):
        s.free(r, txid=2)
    with pytest.raises(DoubleFree, match="twice in one free"):
        s.free(s.allocate("R", 0) * 2, None)
    assert s.usage().pending_pages == 1


def test_freeing_pages_nobody_holds_is_a_loud_bug():
    """Pages never allocated, or already released, raise UnallocatedFree."""
    s = space()
    r = s.allocate("Q", 0)
    with pytest.raises(UnallocatedFree):
        s.free([Range(PPB + 1, 1)], None)
    s.free(r, None)
    with pytest.raises(UnallocatedFree):
        s.free(r, None)


def test_a_range_outside_the_data_blocks_is_named():
    """The control block and pages past the extent are outside; a range across a block
    boundary is a bad argument."""
    s = space(blocks=3)
    for bad in (Range(0, 1), Range(3 * PPB, 1)):
        with pytest.raises(OutsideDataSet):
            s.free([bad], None)
    with pytest.raises(ValueError, match="crosses a block boundary"):
        s.free([Range(PPB + 3, 2)], None)


def test_a_block_returns_only_when_its_last_page_is_released():
    """Freed pages in a block still holding data are not handed out again (seed 001)."""
    s = space(blocks=3)
    a, b = s.allocate("Q", 0), s.allocate("Q", 0)
    s.free(a, txid=1)
    s.release(1)
    assert s.usage().blocks_in_use == 1 and s.current("Q") == Range(PPB + 2, PPB - 2)
    s.free(b, txid=2)
    s.release(2)
    assert s.usage().blocks_in_use == 0 and s.current("Q") is None
    assert s.allocate("R", room(PPB)) == [Range(PPB, PPB)]  # the whole block again


def test_usage_counts_each_page_once():
    """used + free + pending = total; available counts free blocks and current tails."""
    s = space(blocks=5)  # 16 data pages
    s.allocate("Q", 0)
    s.free(s.allocate("R", room(2)), txid=1)
    u = s.usage()
    assert (u.total_pages, u.used_pages, u.pending_pages, u.free_pages) == (16, 1, 2, 13)
    assert (u.blocks_in_use, u.free_blocks, u.available_pages) == (2, 2, 8 + 3 + 2)
    assert u.used_percent == 100 * 3 / 16


def test_expansion_is_wanted_at_ninety_percent():
    """wants_growth turns on once no more than a tenth of the data pages can be allocated."""
    s = space(blocks=11)  # ten data blocks
    for _ in range(8):
        s.allocate("Q", room(PPB))
    assert not s.wants_growth
    s.allocate("Q", room(PPB))
    assert s.wants_growth


def test_growing_adds_free_blocks():
    """Blocks of an expansion are free at once; shrinking or a partial block is refused."""
    s = space(blocks=2)
    s.allocate("Q", room(PPB))
    assert s.grow(4 * BLOCK) == 2
    assert s.allocate("R", room(PPB) + 1) == [Range(2 * PPB, PPB), Range(3 * PPB, 1)]
    for bad in (3 * BLOCK, 5 * BLOCK - PAGE):
        with pytest.raises(ValueError):
            s.grow(bad)


def test_an_expansion_adds_a_fifth_in_whole_blocks_up_to_dsmax():
    """20% of the size, rounded up to blocks and at least one; capped; None at dsmax."""
    block = 256 * KiB
    assert expanded_size(64 * MiB, block, 16 * GiB) == 64 * MiB + 52 * block
    assert expanded_size(2 * block, block, 16 * GiB) == 3 * block
    assert expanded_size(64 * MiB, block, 70 * MiB) == 70 * MiB
    assert expanded_size(64 * MiB, block, 64 * MiB + block - 1) is None


def test_a_new_data_set_is_whole_blocks_and_at_least_two():
    """dssize is rounded up to blocks; the control block needs a data block beside it."""
    assert whole_blocks(64 * MiB, 256 * KiB) == 64 * MiB
    assert whole_blocks(64 * MiB + 1, 256 * KiB) == 64 * MiB + 256 * KiB
    assert whole_blocks(1, 256 * KiB) == 512 * KiB


def test_a_bad_geometry_is_refused():
    """A block that is not whole pages, or a size of fewer than two blocks."""
    for dsblock, size in ((PAGE + 1, 8 * PAGE), (0, 8 * PAGE), (BLOCK, BLOCK), (BLOCK, 3 * PAGE)):
        with pytest.raises(ValueError):
            SpaceMap(dsblock, size)
    with pytest.raises(ValueError):
        space().allocate("Q", -1)


# -- the saved map ----------------------------------------------------------------------


def saved():
    s = space()
    s.allocate("Q", room(PPB) + 10)
    s.free(s.allocate("R", 10), txid=3)
    return s, s.to_bytes(1234)


def test_the_saved_map_round_trips_with_its_timestamp():
    """Pending pages are saved as in use; current blocks are not kept."""
    s, data = saved()
    back, stamp = SpaceMap.from_bytes(data + bytes(PAGE), BLOCK, 8 * BLOCK)
    assert stamp == 1234
    assert back.to_bytes(1234) == data
    assert (back.usage().used_pages, back.usage().pending_pages) == (PPB + 2, 0)
    assert back.current("Q") is None


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda d: d[:40], "short"),
    (lambda d: b"X" + d[1:], "magic"),
    (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "header-crc"),
    (lambda d: d[:-1], "short"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 0x80]), "body-crc"),
])
def test_a_damaged_saved_map_is_named(damage, reason):
    """Every way the checkpoint can be cut or flipped has its reason."""
    _, data = saved()
    with pytest.raises(BadSpaceMap) as caught:
        SpaceMap.from_bytes(damage(data), BLOCK, 8 * BLOCK)
    assert caught.value.reason == reason


def test_a_saved_map_of_another_geometry_is_not_used():
    """A map saved before an expansion the header does not know, or for other blocks."""
    _, data = saved()
    for dsblock, size in ((BLOCK, 9 * BLOCK), (2 * BLOCK, 8 * BLOCK)):
        with pytest.raises(BadSpaceMap, match="geometry"):
            SpaceMap.from_bytes(data, dsblock, size)


def checkpoint(body, version=1, ppb=PPB, blocks=8):
    """A checkpoint laid out by hand from docs/smds.md, CRCs and all."""
    head = struct.pack("<8sHHIQQQI16s", b"SMDSMAP\n", version, 0, ppb, blocks, 0,
                       len(body) // (4 + (ppb + 7) // 8), crc32c(body), bytes(16))
    return head + struct.pack("<I", crc32c(head)) + body


def test_the_saved_map_is_laid_out_as_documented():
    """A hand-made checkpoint of block 2, pages 0 and 2, reads back as those two pages."""
    s, stamp = SpaceMap.from_bytes(checkpoint(b"\x02\0\0\0\x05"), BLOCK, 8 * BLOCK)
    assert [s.page_state(2 * PPB + i) for i in range(PPB)] == ["used", "free", "used", "free"]
    assert SpaceMap.from_bytes(s.to_bytes(0), BLOCK, 8 * BLOCK)[0].to_bytes(0) == s.to_bytes(0)


@pytest.mark.parametrize("body", [
    b"\x02\0\0\0\x01\x01\0\0\0\x01",  # blocks out of order
    b"\0\0\0\0\x01",  # the control block
    b"\x08\0\0\0\x01",  # past the last block
    b"\x01\0\0\0\0",  # a block with no page in use
    b"\x01\0\0\0\x10",  # a page beyond the block
])
def test_a_saved_map_with_impossible_blocks_is_refused(body):
    """Good CRCs do not make a map possible: each is refused with reason "order"."""
    with pytest.raises(BadSpaceMap, match="order"):
        SpaceMap.from_bytes(checkpoint(body), BLOCK, 8 * BLOCK)


def test_an_unknown_version_is_refused():
    """A checkpoint format this code does not know is not guessed at."""
    with pytest.raises(BadSpaceMap, match="version"):
        SpaceMap.from_bytes(checkpoint(b"", version=2), BLOCK, 8 * BLOCK)


# -- the rebuild --------------------------------------------------------------------------


def test_the_rebuild_marks_exactly_the_ranges_of_the_maps():
    """Restart processing: the maps' pages are in use, all else free, no block current."""
    s = SpaceMap.rebuild(BLOCK, 8 * BLOCK, [Range(PPB + 1, 2), Range(3 * PPB, PPB)])
    u = s.usage()
    assert (u.used_pages, u.blocks_in_use, u.free_blocks) == (PPB + 2, 2, 5)
    assert s.allocate("Q", 0) == [Range(2 * PPB, 1)]  # the lowest free block, between them


def test_two_maps_claiming_one_page_are_damage():
    """OverlappingRanges: the data set (or the structure) cannot be trusted."""
    with pytest.raises(OverlappingRanges):
        SpaceMap.rebuild(BLOCK, 8 * BLOCK, [Range(PPB, 3), Range(PPB + 2, 1)])


def test_a_map_pointing_past_the_extent_is_damage():
    """OutsideDataSet, as seed 000 says of references outside the new extents."""
    with pytest.raises(OutsideDataSet):
        SpaceMap.rebuild(BLOCK, 4 * BLOCK, [Range(4 * PPB, 1)])
