"""Tests for cqsproto.codec: framing, limits, damage and import isolation."""

from __future__ import annotations

import copy
import marshal
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqsproto import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    INVALID_REQUEST,
    LARGE,
    MESSAGE_TOO_LARGE,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    codec,
    encode_frame,
    encode_reply,
)
from cqsproto.codec import SPARE_MAX

REPO_ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
# The read size the daemon and the SDK use, so the big-frame test is realistic.
CHUNK = 64 * 1024

# Hypothesis examples are small frames, but byte-by-byte feeding makes each one
# cost milliseconds, so the deadline is off rather than flaky; the round trips
# run fewer examples than the fuzzers, whose examples are cheaper.
fast = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
fuzz = settings(fast, max_examples=300)


# --- strategies -------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
frames = st.dictionaries(st.text(max_size=8), values, max_size=6)


# --- helpers ----------------------------------------------------------------


def raw_frame(body: bytes) -> bytes:
    """Frame *body* by hand, without the encoder's checks."""
    return struct.pack(">I", len(body)) + body


def drain(decoder: FrameDecoder) -> tuple[list[dict[str, Any]], object]:
    """Return the frames the decoder can produce now, and what stopped it."""
    got = []
    while True:
        item = decoder.next_frame()
        if item is NEED_DATA or item is CLOSED:
            return got, item
        got.append(item)


def feed(decoder: FrameDecoder, stream: bytes, cuts: list[int]) -> list[dict[str, Any]]:
    """Feed *stream* split at *cuts*, draining after each piece, then EOF."""
    got = []
    bounds = [0, *sorted(set(cuts)), len(stream)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi > lo:
            decoder.receive_data(stream[lo:hi])
            got += more_frames(decoder)
    return got + last_frames(decoder)


def more_frames(decoder: FrameDecoder) -> list[dict[str, Any]]:
    """The frames the bytes so far complete; the decoder then needs more."""
    got, stop = drain(decoder)
    assert stop is NEED_DATA
    return got


def last_frames(decoder: FrameDecoder) -> list[dict[str, Any]]:
    """The frames left at EOF, which must end cleanly."""
    decoder.receive_data(b"")
    got, stop = drain(decoder)
    assert stop is CLOSED
    return got


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Compare by repr, which unlike == tells True from 1 and b"a" from "a"."""
    assert repr(got) == repr(want)


def expect_error(stream: bytes, reason: str, *, max_frame: int = DEFAULT_MAX_FRAME) -> str:
    """Feed *stream* then EOF; return the message of the ProtocolError raised."""
    decoder = FrameDecoder(max_frame)
    decoder.receive_data(stream)
    decoder.receive_data(b"")
    with pytest.raises(ProtocolError) as info:
        drain(decoder)
    assert info.value.reason == reason
    return str(info.value)


# --- constants and sentinels ------------------------------------------------


def test_constants_have_their_documented_values() -> None:
    """The protocol is version 1 and a frame may hold 100 MiB plus 1 MiB."""
    assert PROTOCOL_VERSION == 1
    assert DEFAULT_MAX_FRAME == 101 * MiB == 105906176


def test_sentinels_are_distinct_singletons_with_their_names_as_repr() -> None:
    """NEED_DATA and CLOSED are two different objects that survive copying."""
    assert NEED_DATA is not CLOSED
    assert NEED_DATA != CLOSED
    assert repr(NEED_DATA) == str(NEED_DATA) == "NEED_DATA"
    assert repr(CLOSED) == "CLOSED"
    assert copy.deepcopy(NEED_DATA) is NEED_DATA


# --- encoding ---------------------------------------------------------------


def test_encode_frame_writes_a_big_endian_length_then_the_body() -> None:
    """The smallest frame is the length 1 in four bytes and the empty map."""
    assert encode_frame({}) == b"\x00\x00\x00\x01\x80"


def test_bytes_travel_as_msgpack_bin_and_str_as_msgpack_str() -> None:
    """A bytes value is packed as bin 8 (0xc4) and comes back as bytes."""
    frame = encode_frame({"p": b"\x00\x01", "s": "é"})
    assert frame[4:] == b"\x82\xa1p\xc4\x02\x00\x01\xa1s\xa2\xc3\xa9"
    decoder = FrameDecoder()
    decoder.receive_data(frame)
    assert_same([decoder.next_frame()], [{"p": b"\x00\x01", "s": "é"}])


def test_encode_frame_refuses_a_body_over_max_frame() -> None:
    """Encoding more than max_frame bytes raises MESSAGE_TOO_LARGE, with the size."""
    body_size = len(msgpack.packb({"p": b"x" * 100}, use_bin_type=True))
    with pytest.raises(ProtocolError) as info:
        encode_frame({"p": b"x" * 100}, max_frame=body_size - 1)
    assert info.value.reason == MESSAGE_TOO_LARGE
    assert str(info.value) == f"frame of {body_size} bytes exceeds the maximum of {body_size - 1}"
    assert len(encode_frame({"p": b"x" * 100}, max_frame=body_size)) == 4 + body_size


@given(st.integers(min_value=-(2**63), max_value=2**64 - 1), frames)
def test_encode_reply_is_the_frame_of_the_reply_map(request_id: int, result: dict) -> None:
    """A reply packed around its constant prefix is byte for byte the frame of
    {"id", "ok": true, "result"}, and decodes to it."""
    frame = encode_reply(request_id, result)
    reply = {"id": request_id, "ok": True, "result": result}
    assert frame == encode_frame(reply)
    decoder = FrameDecoder()
    decoder.receive_data(frame)
    assert_same([decoder.next_frame()], [reply])


def test_encode_reply_refuses_a_body_over_max_frame() -> None:
    """As encode_frame: MESSAGE_TOO_LARGE past max_frame."""
    size = len(encode_frame({"id": 1, "ok": True, "result": {"p": b"x" * 100}})) - 4
    with pytest.raises(ProtocolError) as info:
        encode_reply(1, {"p": b"x" * 100}, max_frame=size - 1)
    assert info.value.reason == MESSAGE_TOO_LARGE
    assert len(encode_reply(1, {"p": b"x" * 100}, max_frame=size)) == 4 + size


def test_a_frame_that_cannot_be_packed_leaves_the_next_one_whole() -> None:
    """The packer kept between calls starts afresh after one that raised halfway."""
    for bad in ({"a": 1, "b": object()}, {"a": 1, "b": 2**70}):
        with pytest.raises((TypeError, OverflowError)):
            encode_frame(bad)
        assert encode_frame({"c": 3}) == raw_frame(msgpack.packb({"c": 3}))


def test_encode_frame_refuses_what_the_peer_would_refuse() -> None:
    """A non-dict or a non-str key is the caller's bug, so it is a TypeError."""
    with pytest.raises(TypeError):
        encode_frame([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="frame map key 3 is not a string"):
        encode_frame({3: "x"})  # type: ignore[dict-item]


@pytest.mark.parametrize("max_frame", [0, -1, 2**32])
def test_max_frame_must_fit_the_length_prefix(max_frame: int) -> None:
    """A limit of zero or beyond four bytes of length is a ValueError."""
    with pytest.raises(ValueError):
        FrameDecoder(max_frame)
    with pytest.raises(ValueError):
        encode_frame({}, max_frame=max_frame)


# --- round trips ------------------------------------------------------------


@fast
@given(st.lists(frames, min_size=1, max_size=4))
def test_frames_fed_whole_come_back_unchanged(objs: list[dict[str, Any]]) -> None:
    """Frames fed in one piece decode to equal maps of the same types."""
    stream = b"".join(encode_frame(obj) for obj in objs)
    assert_same(feed(FrameDecoder(), stream, []), objs)


@fast
@given(st.lists(frames, min_size=1, max_size=3))
def test_frames_fed_byte_by_byte_come_back_unchanged(objs: list[dict[str, Any]]) -> None:
    """Frames fed one byte at a time decode exactly as when fed whole."""
    stream = b"".join(encode_frame(obj) for obj in objs)
    assert_same(feed(FrameDecoder(), stream, list(range(len(stream)))), objs)


@fast
@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_frames_fed_in_random_chunks_come_back_unchanged(
    objs: list[dict[str, Any]], data: st.DataObject
) -> None:
    """However the stream is cut into reads, the same frames come out."""
    stream = b"".join(encode_frame(obj) for obj in objs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    assert_same(feed(FrameDecoder(), stream, cuts), objs)


def feed_into_room(decoder: FrameDecoder, stream: bytes, reads: list[int],
                   direct: list[bool]) -> list[dict[str, Any]]:
    """Feed *stream* as a socket would give it: reads of at most each of *reads*
    bytes (then the rest), straight into the decoder's room when it offers one and
    the matching *direct* says to take it, else through receive_data; then EOF."""
    got, at, turn = [], 0, 0
    while at < len(stream):
        want = reads[turn % len(reads)] if reads else len(stream)
        room = decoder.room()
        if room is not None and not (direct[turn % len(direct)] if direct else True):
            room.release()
            room = None
        if room is not None:
            with room:
                n = min(want, len(room), len(stream) - at)
                room[:n] = stream[at:at + n]
            decoder.received(n)
        else:
            n = min(want, len(stream) - at)
            decoder.receive_data(stream[at:at + n])
        at, turn = at + n, turn + 1
        got += more_frames(decoder)
    return got + last_frames(decoder)


large_frames = st.builds(
    lambda rid, size: {"id": rid, "data": bytes([rid % 256]) * size},
    st.integers(0, 1000), st.integers(LARGE - 10, 3 * LARGE))


@fast
@given(st.lists(frames | large_frames, min_size=1, max_size=4),
       st.lists(st.integers(1, 2 * LARGE), max_size=8), st.lists(st.booleans(), max_size=8))
def test_large_frames_received_into_the_room_come_back_unchanged(
    objs: list[dict[str, Any]], reads: list[int], direct: list[bool]
) -> None:
    """However reads go into the room a large frame's rest is given (or not), the same
    frames come out, and the decoder holds nothing after them."""
    stream = b"".join(encode_frame(obj) for obj in objs)
    decoder = FrameDecoder()
    assert_same(feed_into_room(decoder, stream, reads, direct), objs)
    assert decoder.buffered == 0


def test_the_room_is_the_rest_of_a_large_frame_only() -> None:
    """No room before a header, for a small frame, past max_frame, after an error or
    EOF; for a large one, exactly its missing bytes, and received() refuses more."""
    big = encode_frame({"id": 1, "data": b"z" * (2 * LARGE)})
    decoder = FrameDecoder()
    assert decoder.room() is None
    decoder.receive_data(encode_frame({"id": 0, "data": b"s" * 100}) + big[:10])
    assert decoder.next_frame() == {"id": 0, "data": b"s" * 100}
    room = decoder.room()
    assert room is not None and len(room) == len(big) - 10
    room.release()
    with pytest.raises(ValueError):
        decoder.received(len(big))
    decoder.received(5)  # within the room
    small = FrameDecoder()
    small.receive_data(encode_frame({"data": b"x" * (LARGE - 100)})[:10])
    assert small.room() is None
    tight = FrameDecoder(LARGE)
    tight.receive_data(big[:10])
    assert tight.room() is None
    with pytest.raises(ProtocolError):
        tight.next_frame()


def receive_whole(decoder: FrameDecoder, frame: bytes) -> tuple[dict[str, Any], object]:
    """*frame* through the decoder's room after its first 10 bytes: the frame decoded,
    and the buffer the room was a view of."""
    decoder.receive_data(frame[:10])
    room = decoder.room()
    assert room is not None
    with room:
        buffer = room.obj
        room[:] = frame[10:]
    decoder.received(len(frame) - 10)
    return decoder.next_frame(), buffer  # type: ignore[return-value]


def test_a_large_frames_buffer_serves_the_next_one_up_to_spare_max() -> None:
    """The buffer a 1 MiB frame was received into receives the next large frame (no
    fresh, zeroed MiB a put), whole and right even when the next one is shorter;
    a frame over SPARE_MAX takes its buffer with it."""
    decoder = FrameDecoder()
    first, buffer = receive_whole(decoder, encode_frame({"id": 1, "data": b"a" * MiB}))
    second, again = receive_whole(decoder, encode_frame({"id": 2, "data": b"b" * (MiB // 2)}))
    assert (first, second) == ({"id": 1, "data": b"a" * MiB}, {"id": 2, "data": b"b" * (MiB // 2)})
    assert again is buffer and decoder.buffered == 0
    huge, big = receive_whole(decoder, encode_frame({"id": 3, "data": b"c" * SPARE_MAX}))
    assert huge == {"id": 3, "data": b"c" * SPARE_MAX} and big is not buffer
    _, after = receive_whole(decoder, encode_frame({"id": 4, "data": b"d" * MiB}))
    assert after is not big


def test_receive_data_accepts_bytearray_and_memoryview() -> None:
    """Reads may arrive as bytearray or as a slice of a memoryview."""
    frame = encode_frame({"id": 1})
    decoder = FrameDecoder()
    decoder.receive_data(bytearray(frame[:3]))
    decoder.receive_data(memoryview(b"??" + frame)[5:])
    assert decoder.next_frame() == {"id": 1}


def test_nested_maps_may_have_keys_of_any_hashable_type() -> None:
    """Only the top-level map must have str keys; the codec does not judge payloads."""
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame({"result": {1: "one", b"k": None}}))
    assert decoder.next_frame() == {"result": {1: "one", b"k": None}}


def test_many_small_frames_in_one_read_are_all_delivered() -> None:
    """Five thousand pipelined 100-byte frames in a single read all decode in order."""
    objs = [{"id": i, "op": "put", "queue": "Q1", "data": b"x" * 60} for i in range(5000)]
    stream = b"".join(encode_frame(obj) for obj in objs)
    decoder = FrameDecoder()
    decoder.receive_data(stream + stream[:10])
    got, stop = drain(decoder)
    assert stop is NEED_DATA
    assert got == objs
    assert decoder.buffered == 10


def test_a_100_mib_frame_in_64_kib_reads_decodes_once_complete() -> None:
    """A maximal message read 64 KiB at a time is NEED_DATA until its last byte."""
    payload = bytes(range(256)) * (100 * MiB // 256)
    frame = encode_frame({"id": 1, "op": "put", "data": payload})
    decoder = FrameDecoder()
    view = memoryview(frame)
    results = []
    for offset in range(0, len(frame), CHUNK):
        decoder.receive_data(view[offset : offset + CHUNK])
        results.append(decoder.next_frame())
    assert all(result is NEED_DATA for result in results[:-1])
    assert results[-1]["data"] == payload  # type: ignore[index]
    assert decoder.buffered == 0


def test_buffered_counts_the_bytes_not_yet_returned() -> None:
    """buffered grows with each read and shrinks as frames are returned."""
    first, second = encode_frame({"id": 1}), encode_frame({"id": 2})
    decoder = FrameDecoder()
    assert decoder.buffered == 0
    decoder.receive_data(first + second[:3])
    assert decoder.buffered == len(first) + 3
    assert decoder.next_frame() == {"id": 1}
    assert decoder.buffered == 3
    decoder.receive_data(second[3:])
    assert decoder.next_frame() == {"id": 2}
    assert decoder.buffered == 0


# --- end of stream ----------------------------------------------------------


def test_eof_at_a_frame_boundary_is_closed_for_good() -> None:
    """Frames read before a clean EOF are delivered, then CLOSED every time."""
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame({"id": 1}))
    decoder.receive_data(b"")
    decoder.receive_data(b"")
    assert decoder.next_frame() == {"id": 1}
    assert decoder.next_frame() is CLOSED
    assert decoder.next_frame() is CLOSED


def test_data_after_eof_is_a_caller_bug() -> None:
    """Handing the decoder bytes after it was told of EOF raises RuntimeError."""
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    with pytest.raises(RuntimeError):
        decoder.receive_data(b"\x00")


def test_truncation_at_every_offset_is_reported_as_truncated() -> None:
    """EOF anywhere inside a frame, header or body, is INVALID_REQUEST "truncated"."""
    first = encode_frame({"id": 1})
    frame = encode_frame({"id": 7, "op": "put", "data": b"\x00" * 40, "tags": ["a", 1.5]})
    for cut in range(1, len(frame)):
        decoder = FrameDecoder()
        decoder.receive_data(first + frame[:cut])
        decoder.receive_data(b"")
        assert decoder.next_frame() == {"id": 1}
        with pytest.raises(ProtocolError, match="^truncated frame") as info:
            decoder.next_frame()
        assert info.value.reason == INVALID_REQUEST


def test_truncation_messages_say_how_far_the_frame_got() -> None:
    """The message counts the header or body bytes that arrived."""
    assert expect_error(b"\x00\x00", INVALID_REQUEST) == (
        "truncated frame: connection closed after 2 of 4 header bytes"
    )
    assert expect_error(struct.pack(">I", 400) + b"\x80" * 10, INVALID_REQUEST) == (
        "truncated frame: connection closed after 10 of 400 body bytes"
    )


# --- limits -----------------------------------------------------------------


def test_an_oversized_header_is_refused_before_its_body_arrives() -> None:
    """Four bytes announcing 200 MB are enough to raise MESSAGE_TOO_LARGE."""
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">I", 200_000_000))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason == MESSAGE_TOO_LARGE
    assert str(info.value) == "frame of 200000000 bytes exceeds the maximum of 105906176"


def test_a_frame_of_exactly_max_frame_bytes_is_accepted() -> None:
    """The limit is inclusive: max_frame bytes pass and one more does not."""
    frame = encode_frame({"p": b"x" * 100})
    size = len(frame) - 4
    decoder = FrameDecoder(max_frame=size)
    decoder.receive_data(frame)
    assert decoder.next_frame() == {"p": b"x" * 100}
    assert expect_error(frame, MESSAGE_TOO_LARGE, max_frame=size - 1) == (
        f"frame of {size} bytes exceeds the maximum of {size - 1}"
    )


def test_a_zero_length_frame_is_invalid() -> None:
    """A frame must hold at least the one byte of an empty map."""
    message = expect_error(b"\x00\x00\x00\x00" + encode_frame({}), INVALID_REQUEST)
    assert "0 bytes" in message


# --- malformed bodies -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [([1, 2], "list"), (3, "int"), ("s", "str"), (b"b", "bytes"), (None, "NoneType"),
     (1.5, "float"), (True, "bool")],
)
def test_a_body_that_is_not_a_map_is_invalid(value: object, name: str) -> None:
    """Arrays, scalars and nil are refused, naming what arrived instead."""
    body = msgpack.packb(value, use_bin_type=True)
    message = expect_error(raw_frame(body), INVALID_REQUEST)
    assert message == f"frame body is not a msgpack map (got {name})"


@pytest.mark.parametrize(
    ("key", "shown"),
    [(3, "3"), (b"k", "b'k'"), (None, "None"), (True, "True"), (1.5, "1.5")],
)
def test_a_top_level_key_that_is_not_a_string_is_invalid(key: object, shown: str) -> None:
    """Int, bin, nil, bool and float keys are refused, quoting the key."""
    body = msgpack.packb({"id": 1, key: "x"}, use_bin_type=True)
    message = expect_error(raw_frame(body), INVALID_REQUEST)
    assert message == f"frame map key {shown} is not a string"


def test_a_huge_bad_key_is_quoted_briefly() -> None:
    """A megabyte bin key does not become a megabyte error message."""
    body = msgpack.packb({b"k" * MiB: 1}, use_bin_type=True)
    assert len(expect_error(raw_frame(body), INVALID_REQUEST)) < 100


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({"a": msgpack.ExtType(5, b"xy")}),
        b"\x81\xa1a\x91\xc7\x00\xf9",  # ext 8 of reserved type -7, no data, in an array
        msgpack.packb({"a": msgpack.Timestamp(1, 2)}),
        msgpack.packb(msgpack.ExtType(1, b"\x80")),
        b"\x81\xa1a\xc7\x00\x05",  # ext 8 of type 5 with no data
        b"\x81\xa1a\xc7\x00\xff",  # a timestamp with no data
    ],
    ids=["ext", "empty-ext-in-list", "timestamp", "top-level-ext", "ext8-empty", "timestamp-empty"],
)
def test_msgpack_ext_types_are_invalid(body: bytes) -> None:
    """No ext type, the timestamp included, gets past the decoder."""
    message = expect_error(raw_frame(body), INVALID_REQUEST)
    assert "ext" in message or "timestamp" in message


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # the one byte msgpack never uses
        b"\x80\x80",  # two maps in one frame
        b"\x82\xa1a",  # a map that ends early
        b"\x81\xa1a\xa2\xff\xfe",  # a str that is not UTF-8
        b"\x81\x91\x01\x01",  # an array as a map key
        b"\x81\xa1a" + b"\x91" * 5000 + b"\xc0",  # arrays nested 5000 deep
    ],
    ids=["reserved-byte", "extra-data", "short-map", "bad-utf8", "array-key", "deep-nesting"],
)
def test_a_body_that_is_not_valid_msgpack_is_invalid(body: bytes) -> None:
    """Whatever msgpack objects to becomes INVALID_REQUEST with msgpack's detail."""
    message = expect_error(raw_frame(body), INVALID_REQUEST)
    assert message.startswith("frame body is not valid msgpack: ")


# --- poisoning --------------------------------------------------------------


@pytest.mark.parametrize(
    "stream",
    [
        struct.pack(">I", DEFAULT_MAX_FRAME + 1),
        raw_frame(b"\xc1"),
        raw_frame(b"\x90"),
        b"\x00\x00\x00\x00",
    ],
    ids=["too-large", "invalid", "not-a-map", "empty"],
)
def test_after_an_error_the_decoder_keeps_raising_it(stream: bytes) -> None:
    """A failed decoder drops its bytes, ignores new ones and repeats its error."""
    decoder = FrameDecoder()
    decoder.receive_data(stream)
    with pytest.raises(ProtocolError) as first:
        decoder.next_frame()
    decoder.receive_data(encode_frame({"id": 1}))
    assert decoder.buffered == 0
    for _ in range(2):
        with pytest.raises(ProtocolError) as again:
            decoder.next_frame()
        assert (again.value.reason, str(again.value)) == (first.value.reason, str(first.value))


# --- fuzzing ----------------------------------------------------------------


def survive(stream: bytes, cuts: list[int], max_frame: int = DEFAULT_MAX_FRAME) -> None:
    """Feed *stream* in pieces then EOF; only ProtocolError may escape, and no call hangs."""
    decoder = FrameDecoder(max_frame)
    # Every frame returned consumes at least five bytes, which bounds the calls.
    budget = len(stream) // 5 + 2 * (len(cuts) + 2)
    bounds = [0, *sorted(set(cuts)), len(stream)]
    pieces = [stream[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo] + [b""]
    try:
        for piece in pieces:
            decoder.receive_data(piece)
            while budget:
                budget -= 1
                item = decoder.next_frame()
                if item is NEED_DATA or item is CLOSED:
                    break
                assert isinstance(item, dict)
                assert all(isinstance(key, str) for key in item)
            assert budget, "next_frame kept returning frames out of too few bytes"
        assert item is CLOSED
    except ProtocolError as error:
        assert error.reason in (INVALID_REQUEST, MESSAGE_TOO_LARGE)


cut_lists = st.lists(st.integers(0, 300), max_size=8)


@fuzz
@given(st.binary(max_size=300), cut_lists)
def test_arbitrary_bytes_raise_nothing_but_protocol_error(garbage: bytes, cuts: list[int]) -> None:
    """Random bytes, in random reads, end in frames, CLOSED or a ProtocolError."""
    survive(garbage, cuts, max_frame=64)


# Half the bodies open with a one-entry map header, to reach the key checks.
garbage_bodies = st.binary(max_size=40) | st.binary(max_size=40).map(lambda tail: b"\x81" + tail)


@fuzz
@given(st.lists(garbage_bodies, max_size=6), cut_lists)
def test_well_framed_garbage_bodies_raise_nothing_but_protocol_error(
    bodies: list[bytes], cuts: list[int]
) -> None:
    """Correct lengths around random bodies reach msgpack, and only ProtocolError escapes."""
    survive(b"".join(raw_frame(body) for body in bodies), cuts)


damage = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)


@fuzz
@given(frames, damage)
def test_damaged_valid_frames_raise_nothing_but_protocol_error(
    obj: dict[str, Any], overwrites: list[tuple[int, int]]
) -> None:
    """A real frame with a few bytes overwritten fails, if at all, with ProtocolError."""
    stream = bytearray(encode_frame(obj) + encode_frame({"id": 2}))
    for position, value in overwrites:
        stream[position % len(stream)] = value
    survive(bytes(stream), [], max_frame=4096)


# --- the fast decoder and its reference -------------------------------------
#
# msgspec decodes the bodies (the fast path) and msgpack is the reference: whatever
# msgspec makes of a body, the codec must answer what msgpack makes of it, value or
# refusal. The bodies below reach where the two differ: ext types and timestamps in
# every encoding, arrays as map keys at any depth, nesting near either's limit.


def outcome(decode: Any, body: bytes) -> object:
    """What *decode* makes of *body*: its map marshalled (types and key order included,
    deeper than == and repr reach; version 0 writes no str as interned), or its
    error's reason and message."""
    try:
        return marshal.dumps(decode(body), 0)
    except ProtocolError as error:
        return (error.reason, error.message)


def assert_as_msgpack(body: bytes) -> None:
    assert outcome(codec._decode_body, body) == outcome(codec._decode_reference, body)


exts = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=20)) | st.builds(
    msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999)
)
any_keys = (st.text(max_size=4) | st.integers(-5, 5) | st.binary(max_size=4)
            | st.tuples(st.integers(0, 3)) | exts)
odd_values = st.recursive(
    scalars | exts,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(any_keys, children, max_size=4),
    max_leaves=16,
)
odd_bodies = st.one_of(
    st.dictionaries(any_keys, odd_values, max_size=5),
    odd_values,
).map(lambda obj: msgpack.packb(obj, use_bin_type=True))


@fuzz
@given(odd_bodies)
def test_a_body_decodes_as_msgpack_decodes_it(body: bytes) -> None:
    """Maps, ext types (the timestamp too), tuples packed as array keys, at any depth."""
    assert_as_msgpack(body)


@fuzz
@given(frames, damage)
def test_a_damaged_body_decodes_as_msgpack_decodes_it(
    obj: dict[str, Any], overwrites: list[tuple[int, int]]
) -> None:
    """A real body with a few bytes overwritten: a timestamp's or an ext's header
    made of a payload's bytes, a length cut short, a str made invalid."""
    body = bytearray(msgpack.packb(obj, use_bin_type=True))
    for position, value in overwrites:
        body[position % len(body)] = value
    assert_as_msgpack(bytes(body))


@pytest.mark.parametrize(
    "ext",
    ["d4ff00", "d5ff0000", "d6ff00000001", "d7ff" + "00" * 7 + "01", "d8ff" + "00" * 16,
     "c704ff00000001", "c708ff" + "00" * 7 + "01", "c70cff" + "00" * 11 + "01",
     "c8000cff" + "00" * 11 + "01", "c90000000cff" + "00" * 11 + "01", "c700ff"],
)
def test_every_encoding_of_a_timestamp_is_refused_as_msgpack_refuses_it(ext: str) -> None:
    """msgspec would make a datetime of most of these; none gets past the codec, as a
    value or as a nested map's key."""
    for body in (b"\x81\xa1a" + bytes.fromhex(ext), b"\x81\xa1a\x91\x81\xa1b" + bytes.fromhex(ext),
                 b"\x81\xa1a\x81" + bytes.fromhex(ext) + b"\x01"):
        assert_as_msgpack(body)
        assert isinstance(outcome(codec._decode_body, body), tuple)


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_an_array_as_a_map_key_at_any_depth_is_refused_as_msgpack_refuses_it(depth: int) -> None:
    """msgspec makes a tuple of it, msgpack cannot hash it."""
    body = b"\x81\xa1a" * depth + b"\x81\x91\x01\x01"
    if depth == 0:
        body = b"\x81\xa1a" + body  # a map at the top, as a frame must be
    assert_as_msgpack(body)
    assert isinstance(outcome(codec._decode_body, body), tuple)


@pytest.mark.parametrize("depth", [500, 990, 1000, 1010, 1023, 1024, 1025, 5000])
def test_nesting_near_either_limit_decodes_as_msgpack_decodes_it(depth: int) -> None:
    """msgspec stops at the interpreter's recursion limit, msgpack at its own stack."""
    assert_as_msgpack(b"\x81\xa1a" + b"\x91" * depth + b"\xc0")
    assert_as_msgpack(b"\x81\xa1a" + b"\x81\xa1a" * depth + b"\xc0")


# --- isolation --------------------------------------------------------------


def test_importing_the_protocol_pulls_in_no_event_loop_or_package_of_ours() -> None:
    """Importing every cqsproto module afresh loads no trio, anyio, asyncio, socket, cqsd,
    cqsclient or logstream."""
    forbidden = ["trio", "anyio", "asyncio", "socket", "cqsd", "cqsclient", "logstream"]
    script = (
        "import sys, pkgutil, importlib, cqsproto\n"
        "for m in pkgutil.iter_modules(cqsproto.__path__):\n"
        "    importlib.import_module('cqsproto.' + m.name)\n"
        f"print(','.join(m for m in {forbidden!r} if m in sys.modules))\n"
    )
    path = os.pathsep.join([str(REPO_ROOT / "clients"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT / "clients",
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"cqsproto imported: {result.stdout.strip()}"
