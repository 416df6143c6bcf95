"""Coverage-guided fuzzing of the wire codec and the request table, with atheris.

Run it standalone for a long budget (the first directory named is the corpus; the
seeds below are written into it, and a temporary one is made when none is named)::

    python tests/protocol/fuzz_codec.py -atheris_runs=1000000 -rss_limit_mb=512 CORPUS

tests/protocol/test_fuzz_codec.py runs it briefly in the normal suite.

What a peer sends is untrusted, so for any bytes at all the decoder and the request
table may only answer frames, NEED_DATA, CLOSED or a ProtocolError of a named reason
with a short message; anything else they raise, and any check below that fails, is a
crash. Each input is a small header, then the byte stream (see :func:`unpack_input`):

- the stream is decoded fed whole and fed cut into reads at the points the header
  picks (or one byte at a time), with a small ``max_frame``; both must give the
  same frames and end the same way;
- the decoder never holds more than ``max_frame`` plus the read just handed to it;
- after an error the decoder stays poisoned, after a clean EOF it stays closed;
- every whole body decodes as msgpack's unpackb decodes it (the codec's fast
  decoder, msgspec, against its reference);
- every frame goes through ``requests.parse`` (and ``commit_ops`` for a commit), and
  round-trips through ``encode_frame`` to the same values and the same bytes.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import atheris
import msgpack

# atheris learns coverage from Python bytecode, so it cannot instrument a compiled
# module (mypyc, docs/native.md), and the fuzzer would be blind to the codec: it
# drives cqsproto's Python source, the reference the compiled build is held to
# (the codec's Hypothesis tests in test_codec.py run on whichever build is in use).
# cqsproto/native.py loads the source ahead of the extensions and behind atheris's
# finder, which instruments what it loads.
os.environ["CQSD_BUILD"] = "source"
with atheris.instrument_imports(include=["cqsproto"]):
    from cqsproto import (
        CLOSED,
        HEADER_SIZE,
        INVALID_REQUEST,
        MAX_FRAME_LIMIT,
        MESSAGE_TOO_LARGE,
        NEED_DATA,
        FrameDecoder,
        ProtocolError,
        codec,
        encode_frame,
        requests,
    )

# The decoder limits an input may pick: small, so that a few kilobytes of input
# reach the limit, and down to 1, the smallest a decoder allows.
LIMITS = (4096, 1024, 128, 16, 5, 1)
BYTE_BY_BYTE = 0xFF
MAX_CUTS = 8
# An error message quotes at most a few short values, so the error reply to a
# request of any size stays small (and fits in any sensible max_frame).
MESSAGE_BOUND = 300
SCALARS = (str, bytes, int, float, bool, type(None))


def unpack_input(data: bytes) -> tuple[int, list[int] | None, bytes]:
    """(max_frame, cut points or None for byte by byte, stream) of one fuzz input.

    Byte 0 picks the limit from LIMITS; byte 1 is BYTE_BY_BYTE or, modulo
    MAX_CUTS + 1, the number of cut points, each a big-endian uint16 taken modulo
    the stream's length + 1; the rest is the stream.
    """
    limit = LIMITS[data[0] % len(LIMITS)] if data else LIMITS[0]
    mode = data[1] if len(data) > 1 else 0
    if mode == BYTE_BY_BYTE:
        return limit, None, data[2:]
    count = mode % (MAX_CUTS + 1)
    stream = data[2 + 2 * count :]
    raw = data[2 : 2 + 2 * count]
    cuts = [int.from_bytes(raw[i : i + 2], "big") % (len(stream) + 1)
            for i in range(0, len(raw), 2)]
    return limit, cuts, stream


def pack_input(stream: bytes, *, limit: int = LIMITS[0], cuts: Sequence[int] | None = ()) -> bytes:
    """The fuzz input that unpack_input reads back as (limit, cuts, stream)."""
    if cuts is None:
        return bytes((LIMITS.index(limit), BYTE_BY_BYTE)) + stream
    head = bytes((LIMITS.index(limit), len(cuts)))
    return head + b"".join(struct.pack(">H", cut) for cut in cuts) + stream


def pieces(stream: bytes, cuts: list[int] | None) -> list[bytes]:
    """The reads *stream* arrives in: one byte each, or cut at *cuts*."""
    if cuts is None:
        return [stream[i : i + 1] for i in range(len(stream))]
    bounds = [0, *sorted(set(cuts)), len(stream)]
    return [stream[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]


# --- the checks ---------------------------------------------------------------


def check_error(error: ProtocolError) -> None:
    """A protocol error has a named reason and a short message."""
    assert error.reason in (INVALID_REQUEST, MESSAGE_TOO_LARGE), error.reason
    assert str(error) == error.message
    assert len(error.message) <= MESSAGE_BOUND, f"{len(error.message)}-char message"


def check_bounded(decoder: FrameDecoder, latest: int) -> None:
    """The decoder holds at most an unfinished frame plus the latest read (of *latest* bytes).

    Every earlier read was drained down to NEED_DATA, which leaves less than one
    header and max_frame bytes. The storage behind it may also keep the consumed
    prefix until the next read, which drops it once it outgrows the rest, so the
    storage is at most twice that plus the latest read.
    """
    unfinished = HEADER_SIZE + decoder.max_frame - 1
    assert decoder.buffered <= unfinished + latest
    assert len(decoder._buf) <= 2 * unfinished + latest


def drain(decoder: FrameDecoder, frames: list[dict[str, Any]]) -> object:
    """Append the frames the decoder has ready; return NEED_DATA, CLOSED or the error."""
    while True:
        try:
            item = decoder.next_frame()
        except ProtocolError as error:
            check_error(error)
            return error
        if item is NEED_DATA or item is CLOSED:
            return item
        assert type(item) is dict and all(type(key) is str for key in item)
        frames.append(item)


def check_poisoned(decoder: FrameDecoder, error: ProtocolError, rest: list[bytes]) -> None:
    """A decoder that raised drops what it holds and what follows, and raises again."""
    for read in [*rest, b""]:
        decoder.receive_data(read)
        assert decoder.buffered == 0
        again = drain(decoder, [])
        assert isinstance(again, ProtocolError)
        assert (again.reason, again.message) == (error.reason, error.message)


def decode(reads: list[bytes], limit: int) -> tuple[list[dict[str, Any]], object]:
    """The frames *reads* hold, then an EOF, and how the stream ended."""
    decoder = FrameDecoder(limit)
    frames: list[dict[str, Any]] = []
    latest = 0
    for i, read in enumerate([*reads, b""]):
        decoder.receive_data(read)
        latest = len(read) or latest
        check_bounded(decoder, latest)
        end = drain(decoder, frames)
        if isinstance(end, ProtocolError):
            check_poisoned(decoder, end, reads[i + 1 :])
            return frames, end
        assert end is (NEED_DATA if read else CLOSED)
        assert decoder.buffered < HEADER_SIZE + limit  # NEED_DATA leaves less than a frame
    assert decoder.next_frame() is CLOSED
    return frames, CLOSED


def shape(obj: object) -> list[tuple[str, object]]:
    """*obj* flattened in prefix order with each value's type, so True is not 1.

    Iterative: a frame may nest a thousand levels deep, past what a recursive
    walk (or repr, or ==) survives.
    """
    out: list[tuple[str, object]] = []
    todo = [obj]
    while todo:
        item = todo.pop()
        if type(item) is dict:
            out.append(("map", len(item)))
            for key, value in reversed(item.items()):
                todo += [value, key]
        elif type(item) is list:
            out.append(("array", len(item)))
            todo.extend(reversed(item))
        else:
            assert type(item) in SCALARS, f"decoded a {type(item).__name__}"
            out.append((type(item).__name__, repr(item)))
    return out


def same_end(a: object, b: object) -> bool:
    """Both streams closed cleanly, or failed with the same reason and message."""
    if isinstance(a, ProtocolError) and isinstance(b, ProtocolError):
        return (a.reason, a.message) == (b.reason, b.message)
    return a is b


def check_request(frame: dict[str, Any]) -> None:
    """The request table answers any frame with its fields or INVALID_REQUEST."""
    try:
        _, op, args = requests.parse(frame)
        if op == "commit":
            requests.commit_ops(args["ops"])
    except ProtocolError as error:
        check_error(error)
        assert error.reason == INVALID_REQUEST


def check_round_trip(frame: dict[str, Any], limit: int) -> None:
    """Encoding a decoded frame gives back the same values, and is a fixed point."""
    encoded = encode_frame(frame, MAX_FRAME_LIMIT)
    decoder = FrameDecoder(MAX_FRAME_LIMIT)
    decoder.receive_data(encoded)
    again = decoder.next_frame()
    assert decoder.buffered == 0
    assert shape(again) == shape(frame)
    assert encode_frame(again, MAX_FRAME_LIMIT) == encoded  # type: ignore[arg-type]
    try:
        assert encode_frame(frame, limit) == encoded
    except ProtocolError as error:
        # a float32 comes back as a float64, so a frame can outgrow its limit
        assert error.reason == MESSAGE_TOO_LARGE and len(encoded) - HEADER_SIZE > limit


def outcome(decode: Any, body: bytes) -> object:
    """What *decode* makes of *body*: its shape, or its error's reason and message."""
    try:
        return shape(decode(body))
    except ProtocolError as error:
        return (error.reason, error.message)


def check_reference(stream: bytes) -> None:
    """Every whole body in *stream* decodes (or is refused) as msgpack, the codec's
    reference, decodes it: msgspec, its fast path, may differ in nothing."""
    at = 0
    while at + HEADER_SIZE <= len(stream):
        (size,) = struct.unpack_from(">I", stream, at)
        body = stream[at + HEADER_SIZE : at + HEADER_SIZE + size]
        if len(body) < size:
            return
        assert outcome(codec._decode_body, body) == outcome(codec._decode_reference, body)
        at += HEADER_SIZE + size


def test_one_input(data: bytes) -> None:
    """Decode one stream whole and in reads, compare, then check every frame."""
    limit, cuts, stream = unpack_input(data)
    check_reference(stream)
    frames, end = decode([stream] if stream else [], limit)
    frames_in_reads, end_in_reads = decode(pieces(stream, cuts), limit)
    assert [shape(f) for f in frames] == [shape(f) for f in frames_in_reads]
    assert same_end(end, end_in_reads), (end, end_in_reads)
    for frame in frames:
        check_request(frame)
        check_round_trip(frame, limit)


# --- the mutator ---------------------------------------------------------------
#
# The coverage atheris sees is that of cqsproto; msgpack's C unpacker is
# opaque to it, and a random byte flip seldom keeps a frame's length prefix and
# the lengths inside its body consistent. So half the mutations are libFuzzer's
# own, and half rebuild the stream frame by frame: each body is unpacked and one
# value in it replaced (by a long string, a deep nest, an ext type, a field of
# another op...), or, when it does not unpack, mutated as bytes; then every body
# is framed again with its true length.

KEYS = sorted({"id", "op", *requests.OPS, *(f for spec in requests.OPS.values() for f in spec)})
INTS = (0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1)


def random_value(rng: random.Random, depth: int = 0) -> object:
    """A msgpack value, sized to reach the limits the checks care about."""
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return rng.choice((None, True, False, 0.5, float("nan"), float("inf")))
    if kind == 1:
        return rng.choice(INTS) + rng.choice((0, 0, 1, -1))
    if kind == 2:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(40)))
    if kind == 3:
        return rng.choice(KEYS) * rng.choice((1, 1, 2, 100))
    if kind == 4:
        return rng.randbytes(rng.choice((0, 1, 8, 400, 2000)))
    if kind == 5:
        return msgpack.ExtType(rng.randrange(128), rng.randbytes(rng.randrange(3)))
    if kind == 6:
        return msgpack.Timestamp(rng.randrange(2**32))
    if kind == 7:
        nest: object = random_value(rng, 3)
        for _ in range(rng.choice((2, 100, 500, 1000, 1020, 1030))):
            nest = [nest] if rng.random() < 0.9 else {"op": nest}
        return nest
    if kind in (8, 9):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_key(rng): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_key(rng: random.Random) -> object:
    return rng.choice(KEYS) if rng.random() < 0.8 else rng.choice((1, b"k", None, 2.5, "k" * 500))


def mutate_body(body: bytes, rng: random.Random) -> bytes:
    """*body* with one value replaced, a key added or dropped, or its bytes mutated."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, TypeError):
        return atheris.Mutate(body, len(body) + 16)
    if type(obj) is not dict or rng.random() < 0.1:
        obj = {"id": rng.randrange(100), "op": rng.choice(KEYS)}
    target = obj
    while target and rng.random() < 0.5:  # dig into a nested map or list
        inner = [v for v in (target.values() if type(target) is dict else target)
                 if type(v) in (dict, list) and v]
        if not inner:
            break
        target = rng.choice(inner)
    if type(target) is dict and target and rng.random() < 0.2:
        del target[rng.choice(list(target))]
    elif type(target) is dict:
        target[random_key(rng)] = random_value(rng)
    elif target:
        target[rng.randrange(len(target))] = random_value(rng)
    try:
        return msgpack.packb(obj, use_bin_type=rng.random() < 0.9,
                             use_single_float=rng.random() < 0.2)
    except (ValueError, TypeError, OverflowError):  # nested past msgpack's limit
        return body


def bodies(stream: bytes) -> list[bytes]:
    """The bodies of *stream*'s frames, the last one as far as it goes."""
    out, at = [], 0
    while at + HEADER_SIZE <= len(stream):
        (size,) = struct.unpack_from(">I", stream, at)
        out.append(stream[at + HEADER_SIZE : at + HEADER_SIZE + size])
        at += HEADER_SIZE + size
    return out


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """libFuzzer's mutation or, as often, one frame's body rebuilt and every frame re-framed."""
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    limit, cuts, stream = unpack_input(data)
    frames = bodies(stream) or [b"\x80"]
    i = rng.randrange(len(frames))
    frames[i] = mutate_body(frames[i], rng)
    if rng.random() < 0.1:
        frames.insert(rng.randrange(len(frames) + 1), frames[i])
    stream = b"".join(struct.pack(">I", len(body)) + body for body in frames)
    if rng.random() < 0.3:
        limit = rng.choice(LIMITS)
    return pack_input(stream, limit=limit, cuts=cuts)[:max_size]


# --- the seed corpus ----------------------------------------------------------

SAMPLES: dict[type, object] = {
    str: "MSGQ01", int: 7, bool: True, bytes: b"payload", float: 0.25,
    type(None): None, list: [],
}


def sample_fields(spec: dict[str, Any], full: bool) -> dict[str, Any]:
    """Values of the right wire type for a spec's required fields, or for all of them."""
    out = {}
    for name, (types, default) in spec.items():
        if full or default is requests.REQUIRED:
            out[name] = SAMPLES[types[-1] if full else types[0]]
    return out


def sample_requests() -> Iterator[dict[str, Any]]:
    """A minimal and a full request of every op, and a commit of every commit op."""
    commit_ops = [
        {"op": kind, **sample_fields(spec, full)}
        for kind, spec in requests.COMMIT_OPS.items()
        for full in (False, True)
    ]
    for rid, op in enumerate(requests.OPS):
        for full in (False, True):
            frame = {"id": rid, "op": op, **sample_fields(requests.OPS[op], full)}
            if op == "commit":
                frame["ops"] = commit_ops
            yield frame


def seeds() -> Iterator[bytes]:
    """Valid requests one by one, pipelined and byte by byte, and some damage."""
    frames = [encode_frame(frame) for frame in sample_requests()]
    for frame in frames:
        yield pack_input(frame)
    stream = b"".join(frames[:8])
    yield pack_input(stream, cuts=[3, 40, 41, 100])
    yield pack_input(stream[:200], cuts=None)
    yield pack_input(frames[0], limit=16)
    yield pack_input(frames[0][:-1])  # truncated
    for body in (
        b"",  # an empty body
        b"\x81\xa1a\xd4\x05\x00",  # an ext type
        b"\x81\x01\xc0",  # an int key
        b"\x81\xa0\xca",  # a float32 cut short
        b"\x81\xa1a\xca\x3f\x80\x00\x00",  # a float32, which comes back a float64
    ):
        yield pack_input(struct.pack(">I", len(body)) + body)


def write_seeds(corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i:03d}").write_bytes(seed)


def main(argv: list[str]) -> None:
    """Fuzz (libFuzzer's flags and corpus directories in *argv*), or replay the files named."""
    compiled = [str(module.__file__) for name, module in sys.modules.items()
                if name.partition(".")[0] == "cqsproto"]
    compiled = [path for path in compiled if not path.endswith(".py")]
    assert not compiled, f"fuzzing compiled modules, which atheris cannot see into: {compiled}"
    paths = [arg for arg in argv[1:] if not arg.startswith("-")]
    if not paths:
        paths = [tempfile.mkdtemp(prefix="cqsd-fuzz-codec-")]
        argv = [*argv, paths[0]]
        print(f"corpus: {paths[0]}", file=sys.stderr)
    if not Path(paths[0]).is_file():
        write_seeds(Path(paths[0]))
    atheris.Setup(argv, test_one_input, custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
