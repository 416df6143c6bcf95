"""The cqsd wire codec: length-prefixed msgpack maps, sans I/O.

Design note
-----------
A connection carries a stream of frames in each direction::

    +----------------------+---------------------------------------+
    | N: uint32 big-endian | N bytes: one msgpack map, str keys    |
    +----------------------+---------------------------------------+

``N`` counts the body only, never the header, and is at least 1 (the
smallest map, ``{}``, is the single byte ``0x80``). Bodies are packed with
``use_bin_type=True`` so that ``bytes`` travel as msgpack *bin* and ``str`` as
msgpack *str*; they are unpacked with ``raw=False`` so each comes back as the
type it was sent as. Requests carry an ``id``, replies echo it, and
notifications are maps without one; this module neither knows nor cares which
is which. It frames, and it checks that every frame is a map with str keys.
msgpack *ext* types, the timestamp included, are not part of the protocol and
are refused. msgpack's ``unpackb`` is the reference decoder: a body is first
decoded by msgspec, twice as fast, whose result is taken only where it is
what msgpack makes of the body (`_decode_body`); successful replies and the
log's records are packed by msgspec's encoder to msgpack's bytes exactly.

Nothing here does I/O, in the manner of h11: the caller reads bytes from
wherever it likes and hands them to :meth:`FrameDecoder.receive_data`, then
calls :meth:`FrameDecoder.next_frame` until it answers :data:`NEED_DATA`.
That is why the same code serves the Trio daemon, the AnyIO SDK and the
blocking socket client, and why it must never import any of them (a test
checks).

Two shapes of traffic have to be cheap. A 100 MiB message arrives in many
reads: once its header is in, the decoder offers the rest of the frame as
room to receive into (:meth:`FrameDecoder.room`, for ``recv_into``), so the
bytes are copied once, by the kernel; reads fed with ``receive_data`` are
appended to one ``bytearray`` (amortised O(1) a byte). The frame is decoded
once, through a ``memoryview``, when its last byte is in (a body of at
most 4 KiB from a copy, which costs less than the views). On the way out, a
frame carrying large binaries is packed around them (``pack_parts``), for one
copy or a vectored send of none. A pipelining client sends thousands of 100-byte frames in one
read: they are decoded in place by advancing a read offset, and the consumed
prefix is only dropped once it is at least as large as what remains, so every
byte is moved at most a constant number of times.

A frame whose header announces more than ``max_frame`` bytes is refused as
soon as the header is in, before its body is buffered. Any error poisons the
decoder: it drops what it holds, ignores what it is given, and raises the same
error from every later call, because after a framing error the byte stream
has no trustworthy boundaries left to resynchronise on.
"""

from __future__ import annotations

import enum
import struct
import threading
from typing import Any, Final

import msgpack
import msgspec

from .quote import quote
from .reasons import Reason

__all__ = [
    "CLOSED",
    "DEFAULT_MAX_FRAME",
    "FRAME_HEADROOM",
    "HEADER_SIZE",
    "INVALID_REQUEST",
    "LARGE",
    "MAX_FRAME_LIMIT",
    "MESSAGE_TOO_LARGE",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "ProtocolError",
    "encode_frame",
    "encode_frame_parts",
    "encode_reply",
    "max_frame_for",
    "pack_parts",
]

# Bumped whenever a peer of the previous version could misread a frame or a
# request; the two sides compare it in the `register` handshake (docs/protocol.md).
PROTOCOL_VERSION: Final = 1

_MiB: Final = 1024 * 1024

# A frame carries a message plus the other fields of its request (id, op,
# queue name, options): 1 MiB of headroom lets a maximal message still fit.
FRAME_HEADROOM: Final = 1 * _MiB

# The largest message cqsd accepts by default is 100 MiB, MQ's MAXMSGL.
DEFAULT_MAX_FRAME: Final = 100 * _MiB + FRAME_HEADROOM

# The length prefix is a 4-byte big-endian unsigned integer, so no frame can
# be longer than this however a limit is configured.
_HEADER: Final = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size
MAX_FRAME_LIMIT: Final = 2**32 - 1

# Reason codes carried by ProtocolError; the daemon puts them in its error
# reply (where it can still send one) before closing the connection.
INVALID_REQUEST: Final = Reason.INVALID_REQUEST.value
MESSAGE_TOO_LARGE: Final = Reason.MESSAGE_TOO_LARGE.value


class ProtocolError(Exception):
    """A frame broke the wire format.

    ``reason`` is the reason code for the error reply (``INVALID_REQUEST`` or
    ``MESSAGE_TOO_LARGE``); ``str(error)`` names the problem.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __repr__(self) -> str:
        return f"ProtocolError({self.reason!r}, {self.message!r})"


class _Signal(enum.Enum):
    # An Enum rather than bare object()s: members stay singletons through copy
    # and pickle, and type checkers narrow `result is NEED_DATA` checks.
    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"

    def __repr__(self) -> str:
        return self.value

    def __str__(self) -> str:
        return self.value


NEED_DATA: Final = _Signal.NEED_DATA
"""Returned by :meth:`FrameDecoder.next_frame` when it needs more bytes."""

CLOSED: Final = _Signal.CLOSED
"""Returned by :meth:`FrameDecoder.next_frame` once the peer closed cleanly."""


def max_frame_for(max_message: int) -> int:
    """The largest request frame a daemon whose max_message is *max_message* accepts."""
    return min(max_message + FRAME_HEADROOM, MAX_FRAME_LIMIT)


def _check_max_frame(max_frame: int) -> None:
    if not 1 <= max_frame <= MAX_FRAME_LIMIT:
        raise ValueError(
            f"max_frame must be between 1 and {MAX_FRAME_LIMIT} (the 4-byte length "
            f"prefix), not {max_frame}"
        )


def _too_large(size: int, max_frame: int) -> ProtocolError:
    return ProtocolError(
        MESSAGE_TOO_LARGE, f"frame of {size} bytes exceeds the maximum of {max_frame}"
    )


def encode_frame(obj: dict[str, Any], max_frame: int = DEFAULT_MAX_FRAME, *,
                 large: bool = False) -> bytes:
    """Return the frame for *obj*: its 4-byte length, then its msgpack body.
    *large*: *obj* carries binaries of LARGE bytes or more (a put's payload, a
    read's reply), packed around (`pack_parts`) so that each is copied once.

    Raises ProtocolError(MESSAGE_TOO_LARGE) if the body would exceed
    *max_frame* bytes (the peer would refuse it), ValueError if *max_frame* is
    out of range, and TypeError if *obj* is not a dict with str keys. Values
    msgpack cannot pack raise msgpack's own error (TypeError, OverflowError or
    ValueError): those are bugs in the caller, not in the peer.
    """
    if large:
        return b"".join(encode_frame_parts(obj, max_frame))
    _check_frame(obj, max_frame)
    body: bytes = _packer().pack(obj)
    if len(body) > max_frame:
        raise _too_large(len(body), max_frame)
    return _HEADER.pack(len(body)) + body


# What every successful reply begins and goes on with: ``{"id": ``, then
# ``"ok": true, "result": `` (msgpack packs a dict's keys in insertion order).
_REPLY_HEAD: Final = b"\x83\xa2id"
_REPLY_OK: Final = b"\xa2ok\xc3\xa6result"
# Packs a result to msgpack's bytes in about half the time (tests hold it to them),
# and serves every thread (logstream/record.py says why).
_ENCODER: Final = msgspec.msgpack.Encoder()


def encode_reply(request_id: int, result: dict[str, Any],
                 max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """``encode_frame({"id": request_id, "ok": True, "result": result}, max_frame)``,
    the frame of every successful reply, byte for byte: packed around a constant
    prefix, with no map to build or keys to check (the daemon's hot path: a reply a
    request). Raises as ``encode_frame`` does."""
    pack = _ENCODER.encode
    body = b"".join((_REPLY_HEAD, pack(request_id), _REPLY_OK, pack(result)))
    if len(body) > max_frame:
        raise _too_large(len(body), max_frame)
    return _HEADER.pack(len(body)) + body


_local: Final = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's ``msgpack.Packer(use_bin_type=True)``: ``packb`` makes (and
    allocates a buffer for) a Packer a call, ~0.7 µs of a small frame's ~1 µs; one
    Packer resets after each ``pack``, even one that raised, but is not safe to share
    between threads."""
    try:
        packer: msgpack.Packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer


def encode_frame_parts(obj: dict[str, Any], max_frame: int = DEFAULT_MAX_FRAME) -> Parts:
    """The frame ``encode_frame(obj, large=True)`` makes, as buffers for one vectored
    send (``sendmsg``): its large binaries are then not copied at all."""
    _check_frame(obj, max_frame)
    parts = pack_parts(obj, 2**32)
    size = sum(len(part) for part in parts)
    if size > max_frame:
        raise _too_large(size, max_frame)
    return [_HEADER.pack(size) + parts[0], *parts[1:]]


def _check_frame(obj: object, max_frame: int) -> None:
    # *obj* is an object, not the dict[str, Any] it should be: compiled, the keys of
    # a dict[str, Any] are checked as they are taken, with mypyc's message, not ours.
    _check_max_frame(max_frame)
    if not isinstance(obj, dict):
        raise TypeError(f"a frame must be a dict, not {type(obj).__name__}")
    for key in obj:
        if not isinstance(key, str):
            raise TypeError(f"frame map key {quote(key)} is not a string")


# Binaries from this size on are sent (and logged) from where they lie
# (`pack_parts`): a copy costs more than an iovec from about here, and msgpack
# packs every one of them as bin 32 (type 0xc6, a 4-byte big-endian length),
# the one header to make.
LARGE: Final = 64 * 1024
# The largest buffer a decoder keeps between large frames (`FrameDecoder.room`):
# room for a 1 MiB message and its request, 2 MiB a connection at most; larger
# frames' buffers go with their frames, as the 100 MiB of a MAXMSGL one must.
SPARE_MAX: Final = 2 * _MiB
_BIN32: Final = struct.Struct(">BI")
_BINARY: Final = (bytes, bytearray, memoryview)
Parts = list[bytes | memoryview]


def pack_parts(obj: Any, limit: int) -> Parts:
    """``msgpack.packb(obj, use_bin_type=True)`` as buffers: the packed bytes around
    every binary of LARGE bytes or more, and views of those binaries, in order.
    Joined, the parts are exactly what packb returns; a 1 MiB payload is then
    copied once, or not at all by a vectored write, rather than three times
    (msgpack's growing buffer, the bytes it returns, the frame): an 8 MiB commit
    of eight puts packs in 0.2 ms rather than 7.6.

    Walks dicts, lists and tuples in Python, so it is for bodies of a few large
    binaries, not of many small objects. Raises ValueError above ``limit`` bytes,
    for an int beyond 64 bits or for containers nested deeper than msgpack nests,
    TypeError for what msgpack cannot pack.
    """
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    parts: Parts = []
    try:
        _walk(obj, packer, parts)
    except OverflowError as error:  # an int beyond 64 bits
        raise ValueError(str(error)) from error
    parts.append(packer.bytes())
    size = sum(len(part) for part in parts)
    if size > limit:
        raise ValueError(f"body of {size} bytes exceeds {limit}")
    return parts


# How deep msgpack nests (its DEFAULT_RECURSE_LIMIT): packb refuses deeper containers.
_NEST_LIMIT: Final = 1024


def _walk(obj: Any, packer: msgpack.Packer, parts: Parts) -> None:
    """`pack_parts`' walk, on a stack of its own: recursion would stop at the interpreter's
    limit, before packb's, or, compiled (mypyc), overflow the C stack and crash; this
    refuses what packb refuses, as packb does, in both builds. (Nor is it a closure: a
    recursive closure is a reference cycle, which would keep the parts, and the payloads
    they view, alive until the garbage collector's next pass.)"""
    todo: list[tuple[Any, int]] = [(obj, _NEST_LIMIT)]
    while todo:
        obj, limit = todo.pop()
        if limit < 0:
            raise ValueError("recursion limit exceeded")
        if isinstance(obj, dict):  # subclasses too (a reply's result), as msgpack packs them
            packer.pack_map_header(len(obj))
            for key, value in reversed(obj.items()):
                todo += ((value, limit - 1), (key, limit - 1))
        elif isinstance(obj, (list, tuple)):
            packer.pack_array_header(len(obj))
            todo += [(item, limit - 1) for item in reversed(obj)]
        elif type(obj) in _BINARY and len(obj) >= LARGE and memoryview(obj).c_contiguous:
            view = memoryview(obj).cast("B")
            if view.nbytes >= 2**32:
                raise ValueError(f"a binary of {view.nbytes} bytes cannot be packed")
            parts.append(packer.bytes() + _BIN32.pack(0xC6, view.nbytes))
            packer.reset()
            parts.append(view)
        else:
            packer.pack(obj)


# A body up to this size is decoded from a copy, which costs less than the two views
# below up to about 4 KiB (callgrind: 10,200 instructions rather than 15,400 for a
# body of 1 KiB; 18,600 rather than 15,900 for one of 8 KiB).
_COPIED: Final = 4 * 1024


class FrameDecoder:
    """Turns the bytes of one connection back into frames.

    Feed it with :meth:`receive_data` and drain it with :meth:`next_frame`.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        _check_max_frame(max_frame)
        self.max_frame = max_frame
        self._buf = bytearray()
        # Bytes before _start belong to frames already returned; bytes from _end on
        # are room reserved for the rest of a large frame (`room`).
        self._start = 0
        self._end = 0
        self._eof = False
        self._error: ProtocolError | None = None
        # The buffer the last large frame was received into (`room`), kept for the
        # next one up to SPARE_MAX: zeroing and faulting in a fresh 1 MiB a frame was
        # ~0.1 ms of the daemon's CPU per 1 MiB put. Frames are decoded into new
        # objects, so nothing refers to it once its frame is returned.
        self._spare = bytearray()

    @property
    def buffered(self) -> int:
        """How many received bytes the decoder holds (for back-pressure)."""
        return self._end - self._start

    def room(self) -> memoryview | None:
        """Where the rest of a large frame may be received directly (``recv_into``),
        sparing the copy ``receive_data`` makes: a view of the frame's missing bytes,
        at least LARGE of them, or None (receive bytes and feed them as usual).
        Report what was written there with :meth:`received`, and release the view
        first. A 1 MiB frame then costs one copy, the kernel's, rather than three."""
        available = self._end - self._start
        if self._error is not None or self._eof or available < HEADER_SIZE:
            return None
        (size,) = _HEADER.unpack_from(self._buf, self._start)
        whole = HEADER_SIZE + size
        if size > self.max_frame or whole - available < LARGE:
            return None
        if len(self._buf) - self._start < whole:  # a buffer for the frame, once
            buf = self._spare
            if buf is self._buf or not whole <= len(buf) <= SPARE_MAX:  # in use, or unfit
                buf = bytearray(whole)
                self._spare = buf if whole <= SPARE_MAX else bytearray()
            # A spare longer than the frame leaves room past it, which receive_data
            # fills before it appends, as it does the frame's own.
            buf[:available] = memoryview(self._buf)[self._start:self._end]
            self._buf, self._start, self._end = buf, 0, available
        return memoryview(self._buf)[self._end:self._start + whole]

    def received(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last :meth:`room`."""
        if not 0 < nbytes <= len(self._buf) - self._end:
            raise ValueError(f"{nbytes} bytes received into {len(self._buf) - self._end} of room")
        self._end += nbytes

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes read from the peer; empty *data* means the peer closed.

        Raises RuntimeError if called with more bytes after the end of the
        stream, which is a bug in the caller. A poisoned decoder discards
        whatever it is given.
        """
        if self._eof:
            if len(data):
                raise RuntimeError("received more data after the end of the stream")
            return
        if not len(data):
            self._eof = True
            return
        if self._error is not None:
            return
        if self._end < len(self._buf):  # into the room reserved for a large frame first
            into = min(len(data), len(self._buf) - self._end)
            self._buf[self._end:self._end + into] = memoryview(data)[:into]
            self._end += into
            if into == len(data):
                return
            data = memoryview(data)[into:]
        if self._start and self._start >= len(self._buf) - self._start:
            # Drop the consumed prefix only when it is at least as big as what
            # survives, so the copy is paid for by bytes already decoded.
            self._buf = self._buf[self._start :]
            self._start = 0
        self._buf += data
        self._end = len(self._buf)

    def next_frame(self) -> dict[str, Any] | _Signal:
        """Return the next frame, NEED_DATA, or CLOSED after a clean EOF.

        Raises ProtocolError(MESSAGE_TOO_LARGE) as soon as a header announces
        more than max_frame bytes, and ProtocolError(INVALID_REQUEST) for an
        empty, malformed or truncated frame or one that is not a map with str
        keys. Once it has raised, every later call raises the same error.
        """
        if self._error is not None:
            # A fresh instance with the same reason and message, so the
            # tracebacks of the first and later raises do not pile up.
            raise ProtocolError(self._error.reason, self._error.message) from self._error
        start = self._start
        available = self._end - start
        try:
            if available < HEADER_SIZE:
                if not self._eof:
                    return NEED_DATA  # where each read's frames end: no call
                return self._starved(available, HEADER_SIZE, "header")
            (size,) = _HEADER.unpack_from(self._buf, start)
            if size > self.max_frame:
                raise _too_large(size, self.max_frame)
            if size == 0:
                raise ProtocolError(
                    INVALID_REQUEST, "frame of 0 bytes: a frame body must be a msgpack map"
                )
            if available - HEADER_SIZE < size:
                return self._starved(available - HEADER_SIZE, size, "body")
            body_start = start + HEADER_SIZE
            body_end = body_start + size
            if size <= _COPIED:
                frame = _decode_body(self._buf[body_start:body_end])
            else:
                # The views are released on the way out: a bytearray with a live
                # export refuses to grow, and the next receive_data must append.
                with memoryview(self._buf) as view, view[body_start:body_end] as body:
                    frame = _decode_body(body)
        except ProtocolError as error:
            self._error = error
            self._buf = bytearray()
            self._start = self._end = 0
            raise
        if body_end == self._end:
            # Fully drained: let go of the storage now, so the memory of a
            # 100 MiB frame does not outlive the frame.
            self._buf = bytearray()
            self._start = self._end = 0
        else:
            self._start = body_end
        return frame

    def _starved(self, have: int, want: int, part: str) -> _Signal:
        if not self._eof:
            return NEED_DATA
        if have == 0 and part == "header":
            return CLOSED
        raise ProtocolError(
            INVALID_REQUEST,
            f"truncated frame: connection closed after {have} of {want} {part} bytes",
        )


class _ExtTypeRefused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _refuse_ext(code: int, data: bytes | memoryview) -> Any:
    raise _ExtTypeRefused(code)


# msgspec decodes a body into the same dicts, lists, strs and bytes as msgpack's
# unpackb, in half the time (a put's 0.49 against 1.01 µs, a read's 0.38 against
# 0.79), except where the two differ: msgspec makes a datetime of the timestamp ext,
# as a value or as a key, which the protocol refuses, and a tuple of an array used
# as a map key, which msgpack cannot hash. A body it decodes with neither
# (`_as_msgpack`) is taken as it is; any other, and any it refuses, is decoded again
# by msgpack, the reference, whose answer, or refusal, is the codec's.
_FAST: Final = msgspec.msgpack.Decoder(ext_hook=_refuse_ext)


def _decode_body(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Unpack one frame body and check it is a map with str keys."""
    try:
        fast: Any = _FAST.decode(body)
    except Exception:  # noqa: BLE001 - msgpack's answer below is the codec's
        fast = None
    if type(fast) is dict and _as_msgpack(fast):
        return fast
    return _decode_reference(body)


def _scalar(value: object) -> bool:
    """Whether *value* is of a scalar type msgpack decodes to, as msgspec does (it
    also makes a datetime of a timestamp, and a tuple of an array used as a map key,
    which msgpack does not). Compared one by one: a tuple's `in` costs 1 % of the
    daemon's instructions."""
    kind = type(value)
    return (kind is str or kind is int or kind is bytes or kind is bool or kind is float
            or value is None)


def _as_msgpack(obj: dict[Any, Any]) -> bool:
    """Whether *obj*, from msgspec, is what msgpack makes of its body: a map with str
    keys holding only lists, maps and `_scalar`s, with `_scalar`s for keys. The top
    level, all a request usually is, in a typed loop (a generic one costs 1 % of the
    daemon's instructions); what it holds on a stack (the nesting is the body's)."""
    todo: list[Any] = []
    for key, value in obj.items():
        if type(key) is not str:
            return False
        kind = type(value)
        if kind is list or kind is dict:
            todo.append(value)
        elif not _scalar(value):
            return False
    while todo:
        container = todo.pop()
        if type(container) is dict:
            for key in container:
                if not _scalar(key):
                    return False
            container = container.values()
        for value in container:
            kind = type(value)
            if kind is list or kind is dict:
                todo.append(value)
            elif not _scalar(value):
                return False
    return True


def _decode_reference(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """`_decode_body` by msgpack's unpackb."""
    try:
        # strict_map_key=False lets any hashable key through so that the key
        # check below, not msgpack, words the error. max_ext_len=0 refuses ext
        # data before msgpack decodes it: the timestamp ext (-1) is decoded
        # natively and never reaches ext_hook, and ext_hook still catches
        # the ext types with no data at all.
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            max_ext_len=0,
            ext_hook=_refuse_ext,
        )
    except _ExtTypeRefused as refused:
        # A name of its own: compiled (mypyc), one name bound in two clauses is one
        # variable of the first clause's type, which the second's error fails.
        raise _ext_refused(refused.code) from None
    except (ValueError, TypeError) as error:
        # msgpack's UnpackException, ExtraData, FormatError and StackError are
        # ValueErrors, as is UnicodeDecodeError from a bad str; an array or map
        # used as a map key fails hashing with TypeError.
        detail = str(error) or type(error).__name__
        if "max_ext_len" in detail:
            # Matching msgpack's wording only improves the message: the
            # reason code is INVALID_REQUEST whether or not it matches.
            raise _ext_refused(None) from error
        message = f"frame body is not valid msgpack: {detail}"
        raise ProtocolError(INVALID_REQUEST, message) from error
    if type(obj) is not dict:
        raise ProtocolError(
            INVALID_REQUEST, f"frame body is not a msgpack map (got {type(obj).__name__})"
        )
    for key in obj:
        if type(key) is not str:  # msgpack makes no subclass of str
            raise ProtocolError(INVALID_REQUEST, f"frame map key {quote(key)} is not a string")
    return obj


def _ext_refused(code: int | None) -> ProtocolError:
    what = "an ext type" if code is None else f"ext type {code}"
    return ProtocolError(
        INVALID_REQUEST, f"frame body contains msgpack {what}, which the protocol does not use"
    )
