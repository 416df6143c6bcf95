"""The data map: its encoded form, the allocation rule it holds ranges to, and the write
and read paths it lays out (docs/smds.md, "The data map")."""

import contextlib

import msgpack
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from cqsd.smds import (
    BadDataMap,
    BadPrefix,
    DataMap,
    DownLevel,
    OutsideDataSet,
    Range,
    SpaceMap,
    crcs,
    datamap,
    header,
)
from cqsd.smds.header import unpack_prefix
from cqsd.smds.pages import PAGE, PREFIX, room

KiB = 1024
BLOCK = 256 * KiB
PPB = BLOCK // PAGE


def stored(payload, queue="Q", blocks=64, before=0):
    """The map of ``payload`` as a space map places it, after ``before`` bytes to the same queue."""
    space = SpaceMap(BLOCK, blocks * BLOCK)
    if before:
        space.allocate(queue, before)
    return DataMap.of("IMS1", payload, space.allocate(queue, len(payload)))


def disk(dmap, entry_id, payload):
    """A data set's bytes with ``payload``'s blocks written where the map says."""
    image = bytearray(max(r.page + r.pages for r in dmap.ranges) * PAGE)
    for position, prefix, data in dmap.blocks(entry_id, payload):
        image[position:position + PREFIX + len(data)] = prefix + data
    return image


def read(image, dmap):
    return [bytes(image[at:at + n]) for at, n in dmap.read_sizes()]


def test_the_map_of_a_mebibyte_is_five_ranges_in_a_few_dozen_bytes():
    """A 1 MiB payload in 256 KiB blocks: four full blocks and one page, as a small array."""
    dmap = stored(bytes(1024 * KiB))
    assert dmap.ranges == (Range(PPB, PPB), Range(2 * PPB, PPB), Range(3 * PPB, PPB),
                           Range(4 * PPB, PPB), Range(5 * PPB, 1))
    assert dmap.encode() == ["IMS1", 1024 * KiB, crc32c(bytes(1024 * KiB)),
                             [PPB, PPB, 2 * PPB, PPB, 3 * PPB, PPB, 4 * PPB, PPB, 5 * PPB, 1]]
    assert len(msgpack.packb(dmap.encode())) < 40


@given(st.integers(0, 3 * BLOCK), st.integers(0, BLOCK))
def test_every_map_the_space_map_makes_round_trips(length, before):
    """Encoded, packed, unpacked and decoded, the map is the same and fits its data set."""
    dmap = stored(bytes(length), before=before)
    dmap.check_within(PPB, 64)
    back = DataMap.decode(msgpack.unpackb(msgpack.packb(dmap.encode())))
    assert back == dmap
    assert sum(p.nbytes for p in back.pieces()) == length


@pytest.mark.parametrize("obj", [
    None, [], ["IMS1", 1, 0], ["IMS1", 1, 0, [16, 1], 9],
    ["", 1, 0, [16, 1]], ["bad name!", 1, 0, [16, 1]], [7, 1, 0, [16, 1]],
    ["IMS1", -1, 0, [16, 1]], ["IMS1", True, 0, [16, 1]], ["IMS1", 1, 2**32, [16, 1]],
    ["IMS1", 1, 0, []], ["IMS1", 1, 0, [16]], ["IMS1", 1, 0, [16, "1"]], ["IMS1", 1, 0, "xy"],
    ["IMS1", 1, 0, [16, 0]],  # an empty range
    ["IMS1", 1, 0, [16, 2]],  # a last range bigger than its bytes need
    ["IMS1", PAGE, 0, [16, 1]],  # a last range too small for its bytes
    ["IMS1", 10, 0, [16, 1, 32, 1]],  # a first range not filled
    ["IMS1", room(1), 0, [16, 1, 32, 1]],  # an empty last range
    ["IMS1", 1, 0, [16, 1], "NODE1"], ["IMS1", 1, 0, [16, 1], "node1-1"],  # not a series
    ["IMS1", 1, 0, [16, 1], "NODE1-1", 0],  # six elements
])
def test_a_map_that_breaks_the_rules_is_refused(obj):
    """Wrong shape or types, a bad owner, lengths out of range, ranges that do not follow
    the allocation rule: BadDataMap, which is also a ValueError."""
    with pytest.raises(BadDataMap):
        DataMap.decode(obj)


@pytest.mark.parametrize(("ranges", "length", "error"), [
    ([Range(0, 1)], 10, OutsideDataSet),  # in the control block
    ([Range(PPB - 1, 2)], room(2), OutsideDataSet),  # starts in the control block
    ([Range(64 * PPB - 1, 2)], room(2), OutsideDataSet),  # past the extent
    ([Range(2 * PPB - 1, 2)], room(2), BadDataMap),  # crosses a block boundary
    ([Range(PPB, 1), Range(2 * PPB, 1)], room(1) + 10, BadDataMap),  # the first ends mid-block
    # the second goes on mid-block
    ([Range(PPB + 1, PPB - 1), Range(2 * PPB + 1, 1)], room(PPB - 1) + 10, BadDataMap),
])
def test_a_map_is_checked_against_the_data_sets_geometry(ranges, length, error):
    """Ranges outside the data blocks are damage; ranges that could not have been
    allocated so are a bad map, though they follow the allocation rule."""
    dmap = DataMap("IMS1", length, 0, tuple(ranges))
    with pytest.raises(error):
        dmap.check_within(PPB, 64)


@given(st.binary(max_size=3 * PAGE) | st.integers(0, 2 * BLOCK).map(lambda n: b"\x5a" * n),
       st.integers(0, BLOCK))
def test_what_is_written_reads_back_byte_for_byte(payload, before):
    """blocks() then assemble() over the same bytes returns the payload exactly."""
    dmap = stored(payload, before=before)
    image = disk(dmap, 42, payload)
    assert dmap.assemble(42, read(image, dmap)) == payload


def test_each_block_is_a_prefix_then_a_slice_of_the_payload():
    """Positions are page * 4096; the data is a view, not a copy."""
    payload = bytes(range(256)) * 1100
    dmap = stored(payload, before=3 * PAGE)
    blocks = dmap.blocks(7, payload)
    assert [b.position for b in blocks] == [r.page * PAGE for r in dmap.ranges]
    assert b"".join(bytes(b.data) for b in blocks) == payload
    assert all(isinstance(b.data, memoryview) and len(b.prefix) == PREFIX for b in blocks)
    with pytest.raises(ValueError):
        dmap.blocks(7, payload[:-1])


def test_a_damaged_block_is_named_not_returned():
    """A flipped data byte, another entry's block, or a block never written: BadPrefix."""
    payload = b"x" * (PAGE * 70)
    dmap = stored(payload)
    image = disk(dmap, 42, payload)
    flipped = bytearray(image)
    flipped[dmap.ranges[1].page * PAGE + PREFIX + 5] ^= 1
    cases = [(flipped, 42, "bad-crc"), (image, 43, "wrong-entry"),
             (bytearray(len(image)), 42, "unwritten")]
    for data, entry, reason in cases:
        with pytest.raises(BadPrefix) as caught:
            dmap.assemble(entry, read(data, dmap))
        assert caught.value.reason == reason


def test_blocks_that_each_pass_must_still_make_the_payload_of_the_map():
    """The whole payload's CRC is checked against the map once every block is in."""
    payload = b"abc" * 3000
    dmap = stored(payload)
    other = DataMap("IMS1", dmap.length, dmap.crc ^ 1, dmap.ranges)
    with pytest.raises(BadPrefix, match="map's CRC"):
        other.assemble(42, read(disk(dmap, 42, payload), dmap))
    with pytest.raises(ValueError):
        dmap.assemble(42, [])


def test_the_newest_block_not_being_there_means_the_data_set_is_down_level():
    """Restart's check of the newest entry: a mismatch is DownLevel, carrying why."""
    payload = b"n" * 5000
    dmap = stored(payload)
    image = disk(dmap, 42, payload)
    first = read(image, dmap)[0]
    dmap.check_newest(42, first)
    for stale in (bytes(len(first)), read(disk(dmap, 41, payload), dmap)[0]):
        with pytest.raises(DownLevel) as caught:
            dmap.check_newest(42, stale)
        assert isinstance(caught.value.__cause__, BadPrefix)


def test_restart_after_recovery_checks_every_blocks_prefix_not_its_data():
    """check_prefixes passes the prefixes of the entry's own blocks, whatever the data
    after them, and names the first block that is another entry's or unwritten."""
    payload = b"p" * (BLOCK + 5000)
    dmap = stored(payload)
    image = disk(dmap, 42, payload)
    heads = [bytes(image[at:at + PREFIX]) for at, _ in dmap.read_sizes()]
    dmap.check_prefixes(42, heads)
    with pytest.raises(BadPrefix) as caught:
        dmap.check_prefixes(43, heads)
    assert caught.value.reason == "wrong-entry"
    with pytest.raises(BadPrefix) as caught:
        dmap.check_prefixes(42, [heads[0], bytes(PREFIX)])
    assert caught.value.reason == "unwritten"
    with pytest.raises(ValueError):
        dmap.check_prefixes(42, heads[:1])


def test_a_group_nodes_map_names_its_incarnations_data_set_and_round_trips():
    """In a group the map carries the node incarnation that put it, as a fifth element,
    and so names that incarnation's data set; a map without one keeps four."""
    alone = DataMap.of("IMS1", b"x" * 10, [Range(16, 1)])
    grouped = DataMap.of("IMS1", b"x" * 10, [Range(16, 1)], "NODE1-3")
    assert (alone.dataset, len(alone.encode())) == ("IMS1", 4)
    assert (grouped.dataset, grouped.encode()[4]) == ("IMS1.NODE1-3", "NODE1-3")
    assert DataMap.decode(msgpack.unpackb(msgpack.packb(grouped.encode()))) == grouped


@settings(max_examples=40, deadline=None)
@given(length=st.integers(0, 5 * BLOCK), before=st.integers(0, 2 * BLOCK))
def test_the_payload_and_block_crcs_are_taken_in_one_pass_over_the_payload(length, before):
    """The map's CRC is the payload's and each prefix's is its block's, as if taken
    apart, yet the payload is read once, and its last block a second time; a read
    from the disk checks both in as many bytes."""
    payload = bytes(range(256)) * (length // 256) + b"\x5a" * (length % 256)
    stored(b"\x00" * (3 * BLOCK))  # the matrix of a full block's zeros, built once
    with counted_crcs(datamap) as hashed:
        dmap = stored(payload, before=before)
    assert dmap.crc == crc32c(payload)
    image = disk(dmap, 7, payload)
    for _, prefix, data in dmap.blocks(7, payload):
        assert unpack_prefix(prefix).crc == crc32c(data)
    once = length + (dmap.pieces()[-1].nbytes if len(dmap.ranges) > 1 else 0)
    assert sum(hashed) == once
    with counted_crcs(header, datamap) as checked:
        assert dmap.assemble(7, read(image, dmap)) == payload
    assert sum(checked) == once + 60 * len(dmap.ranges)  # and each prefix's own 60 bytes


@contextlib.contextmanager
def counted_crcs(*more):
    """The bytes each CRC-32C taken meanwhile by crcs.py (and modules *more*) covered."""
    hashed = []
    with pytest.MonkeyPatch.context() as patch:
        for module in (crcs, *more):
            patch.setattr(module, "crc32c", lambda data, *crc: hashed.append(len(data))
                          or crc32c(data, *crc))
        yield hashed
