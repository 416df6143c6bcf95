"""The record codec: pure bytes in and out."""

from __future__ import annotations

import copy
import pickle
import threading

import crc32c
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstream import Damage, record
from logstream.record import HEADER_SIZE, MAX_BODY, Frame, NeedData
from tests.msgpack_values import keys, scalars

bodies = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=20,
)
lsns = st.integers(min_value=1, max_value=2**64 - 1)
stamps = st.integers(min_value=0, max_value=2**64 - 1)


@given(lsns, stamps, bodies)
def test_any_msgpack_body_round_trips(lsn: int, ts: int, body: object) -> None:
    """Encoding then decoding gives back the LSN, the timestamp and an equal body."""
    frame = record.encode(lsn, ts, body)
    decoded = record.decode(frame)
    assert isinstance(decoded, Frame)
    assert (decoded.lsn, decoded.timestamp, decoded.end) == (lsn, ts, len(frame))
    assert record.unpack_body(decoded.body) == body


@given(lsns, stamps, bodies)
def test_every_prefix_asks_for_more_data(lsn: int, ts: int, body: object) -> None:
    """Fed byte by byte, the decoder needs more data until the whole record is there."""
    frame = record.encode(lsn, ts, body)
    for cut in range(len(frame)):
        assert isinstance(record.decode(frame[:cut]), NeedData)


@given(lsns, stamps, bodies, st.lists(st.integers(min_value=0, max_value=2000), max_size=4))
def test_a_body_packed_as_parts_frames_to_the_bytes_of_encode(
    lsn: int, ts: int, body: object, cuts: list[int]
) -> None:
    """A packed body cut into buffers (views among them), framed by `encode_parts`,
    is exactly what `encode` makes of the body: the CRC chains over the parts."""
    packed = msgpack.packb(body, use_bin_type=True)
    at = sorted({min(cut, len(packed)) for cut in cuts})
    spans = zip([0, *at], [*at, len(packed)], strict=True)
    parts: record.Parts = [memoryview(packed)[a:b] if i % 2 else packed[a:b]
                           for i, (a, b) in enumerate(spans)]
    assert b"".join(record.encode_parts(lsn, ts, parts)) == record.encode(lsn, ts, body)


def test_the_header_is_28_bytes_in_the_documented_order() -> None:
    """The layout matches docs/logstream.md: magic, CRC, length, LSN, timestamp, body."""
    frame = record.encode(0x0102030405060708, 0x1112131415161718, b"hi")
    assert HEADER_SIZE == 28
    assert frame[:4] == b"\xc1LOG"
    assert frame[8:12] == (4).to_bytes(4, "little")  # msgpack bin8: c4 02 h i
    assert frame[12:20] == bytes.fromhex("0807060504030201")
    assert frame[20:28] == bytes.fromhex("1817161514131211")
    assert frame[28:] == msgpack.packb(b"hi", use_bin_type=True)
    assert int.from_bytes(frame[4:8], "little") == crc32c.crc32c(frame[8:])


def test_records_decode_back_to_back_from_offsets() -> None:
    """Each decoded frame says where the next one starts."""
    buf = b"".join(record.encode(n, n * 10, ["body", n]) for n in range(1, 6))
    offset, seen = 0, []
    while offset < len(buf):
        frame = record.decode(buf, offset)
        assert isinstance(frame, Frame)
        seen.append(frame.lsn)
        offset = frame.end
    assert seen == [1, 2, 3, 4, 5]


def test_any_buffer_decodes_as_its_bytes_do() -> None:
    """A bytearray or a memoryview of records decodes and is searched as bytes are."""
    buf = record.encode(1, 10, "a") + record.encode(2, 20, "b")
    first = record.decode(buf)
    assert isinstance(first, Frame)
    for other in (bytearray(buf), memoryview(buf)):
        assert record.decode(other, first.end) == record.decode(buf, first.end)
        assert record.unpack_body(memoryview(other)[HEADER_SIZE:first.end]) == "a"
    assert record.find_frame(bytearray(buf), 1, 2) == first.end


def test_a_record_survives_pickle_and_copy() -> None:
    """Readers' records may be pickled (to a worker) or copied like any value."""
    rec = record.Record("alpha", 3, 30, {"put": [b"x", 1]})
    for again in (pickle.loads(pickle.dumps(rec)), copy.copy(rec), copy.deepcopy(rec)):
        assert again == rec and type(again) is record.Record


def test_no_single_bit_flip_decodes_as_a_record() -> None:
    """Flipping any one bit of a record makes it damage (or a longer, unfinished one)."""
    frame = record.encode(7, 123456789, {"k": "value", "n": [1, 2, 3]})
    for bit in range(len(frame) * 8):
        flipped = bytearray(frame)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert not isinstance(record.decode(bytes(flipped)), Frame), bit


@pytest.mark.parametrize(
    ("damaged", "reason"),
    [
        (b"\0" * 40, Damage.BAD_MAGIC),
        (b"garbage!" * 5, Damage.BAD_MAGIC),
        (b"\x00", Damage.BAD_MAGIC),
        (b"\xc1LOG\0\0\0\0" + (MAX_BODY + 1).to_bytes(4, "little") + b"\0" * 16, Damage.BAD_LENGTH),
    ],
)
def test_damage_is_named(damaged: bytes, reason: Damage) -> None:
    """Zeros and garbage are a bad magic, an absurd length is a bad length."""
    assert record.decode(damaged) is reason


def test_a_bad_crc_is_named() -> None:
    """A flipped body byte is reported as a CRC failure."""
    frame = bytearray(record.encode(1, 1, "hello"))
    frame[-1] ^= 0xFF
    assert record.decode(bytes(frame)) is Damage.BAD_CRC


@pytest.mark.parametrize(("lsn", "ts"), [(0, 0), (2**64, 0), (1, -1), (1, 2**64)])
def test_encode_refuses_numbers_out_of_range(lsn: int, ts: int) -> None:
    """LSNs are 1..2**64-1 and timestamps 0..2**64-1."""
    with pytest.raises(ValueError):
        record.encode(lsn, ts, None)


def test_encode_refuses_an_oversized_body() -> None:
    """A body above MAX_BODY is refused before it is framed."""
    with pytest.raises(ValueError):
        record.encode(1, 1, b"x" * MAX_BODY)


def test_encode_refuses_what_msgpack_cannot_pack() -> None:
    """An object msgpack cannot pack raises TypeError."""
    with pytest.raises(TypeError):
        record.encode(1, 1, object())


def test_find_frame_skips_damage_and_lower_lsns() -> None:
    """The resync search finds the next good record at or above an LSN, ignoring older ones."""
    older = record.encode(3, 1, "old")
    newer = record.encode(9, 1, "new")
    buf = b"junk\xc1LOGjunk" + older + b"\0" * 10 + newer
    assert record.find_frame(buf, 0, 5) == len(buf) - len(newer)
    assert record.find_frame(buf, 0, 3) == buf.index(older)
    assert record.find_frame(buf, 0, 10) is None


def test_a_body_that_cannot_be_packed_leaves_the_next_one_whole() -> None:
    """The packer kept between calls starts afresh after one that raised halfway."""
    for bad in ({"a": 1, "b": object()}, {"a": 1, "b": 2**70}):
        with pytest.raises((TypeError, ValueError)):
            record.pack_body(bad)
        assert record.pack_body({"c": 3}) == msgpack.packb({"c": 3}, use_bin_type=True)


@given(bodies)
def test_a_body_packs_to_the_bytes_msgpack_packs(body: object) -> None:
    """Bodies are packed by msgspec, for speed, to msgpack's bytes exactly: a log
    reads the same whichever wrote it."""
    assert record.pack_body(body) == msgpack.packb(body, use_bin_type=True)


INT_EDGES = [-(2**63), -(2**31) - 1, -(2**31), -32769, -32768, -129, -128, -33, -32, -1,
             0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1]


@pytest.mark.parametrize("size", [15, 16, 31, 32, 255, 256, 65535, 65536])
def test_every_length_format_packs_as_msgpack_packs_it(size: int) -> None:
    """str, bin, array and map at each edge between their msgpack formats, ints at
    theirs, and a dict subclass (a reply's result is one)."""

    class Result(dict):  # type: ignore[type-arg]
        pass

    for body in ("x" * size, b"x" * size, [0] * size, {str(i): i for i in range(size)},
                 INT_EDGES, Result(a=1, b=[1.5, None, True])):
        assert record.pack_body(body) == msgpack.packb(body, use_bin_type=True)


def test_bodies_packed_on_many_threads_at_once_stay_whole() -> None:
    """One encoder serves every thread (the daemon packs on its loop and in its
    fsync thread)."""
    bodies = [{"n": i, "d": bytes([i % 256]) * (i % 700)} for i in range(2000)]

    def pack_all(out: list) -> None:
        out.extend(record.pack_body(b) for b in bodies)

    outs: list[list] = [[] for _ in range(4)]
    threads = [threading.Thread(target=pack_all, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = [msgpack.packb(b, use_bin_type=True) for b in bodies]
    assert all(o == want for o in outs)
