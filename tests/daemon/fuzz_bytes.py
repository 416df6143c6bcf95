"""Bytes for the live-daemon fuzzer: payloads that differ from message to message,
the size a request's frame will have, requests that decode but are no request,
and frames that no decoder accepts."""

import random
import struct

import msgpack

from cqsproto import requests


def payload(n: int) -> bytes:
    """n bytes that differ from message to message (so a mix-up shows)."""
    stamp = b"%d:" % random.getrandbits(48)
    return (stamp * (n // len(stamp) + 1))[:n]


def frame_size(op: str, fields: dict, rid: int = 1) -> int:
    """The body length of a request frame (what the daemon's frame limit counts)."""
    return len(msgpack.packb({"id": rid, "op": op, **fields}, use_bin_type=True))


def terse(op: str, fields: dict) -> dict:
    """``fields`` less those equal to the protocol's defaults (they may be left out)."""
    spec = requests.OPS[op]
    return {k: v for k, v in fields.items() if k not in spec or spec[k][1] != v
            or type(spec[k][1]) is not type(v)}


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


MALFORMED = ["unknown_op", "no_op", "op_not_str", "unknown_field", "missing_field", "wrong_type",
             "bool_for_int", "id_str", "id_none", "id_float", "id_missing", "commit_op_not_map",
             "commit_unknown_op", "commit_wrong_type"]


def malformed(how: str, rid: int) -> tuple[bytes, int | None]:
    """A frame that decodes but is no request, and the id its refusal must carry."""
    request = {"id": rid, "op": "put", "structure": "SMALL", "queue": "A", "data": b"m"}
    if how == "unknown_op":
        request["op"] = "explode"
    elif how == "no_op":
        del request["op"]
    elif how == "op_not_str":
        request["op"] = 7
    elif how == "unknown_field":
        request["colour"] = "red"
    elif how == "missing_field":
        del request["data"]
    elif how == "wrong_type":
        request["data"] = "text, not bytes"
    elif how == "bool_for_int":
        request = {"id": rid, "op": "delete", "structure": "SMALL", "entry_id": True}
    elif how.startswith("id_"):
        request["id"] = {"id_str": "7", "id_none": None, "id_float": 7.0, "id_missing": None}[how]
        if how == "id_missing":
            del request["id"]
        return _framed(msgpack.packb(request)), None
    else:
        op = {"commit_op_not_map": 5, "commit_unknown_op": {"op": "explode"},
              "commit_wrong_type": {"op": "delete", "entry_id": "1"}}[how]
        request = {"id": rid, "op": "commit", "structure": "SMALL", "ops": [op]}
    return _framed(msgpack.packb(request)), rid


BROKEN = ["garbage", "zero_length", "huge_header", "just_past_limit", "truncated_header",
          "truncated_body", "not_a_map", "int_keys", "ext_type", "timestamp", "bad_utf8", "deep",
          "trailing_bytes", "map_claims_more"]


def broken(how: str, max_frame: int) -> tuple[bytes, str]:
    """(bytes that no decoder accepts, the reason code of their refusal)."""
    request = msgpack.packb({"id": 1, "op": "query", "kind": "clients"})
    too_large = {
        "garbage": b"\xff\xfe GET / HTTP/1.1\r\n\r\n" * 4,  # a length far past any limit
        "huge_header": struct.pack(">I", 2**32 - 1),
        "just_past_limit": struct.pack(">I", max_frame + 1),
    }
    if how in too_large:
        return too_large[how], "MESSAGE_TOO_LARGE"
    return {
        "zero_length": struct.pack(">I", 0),
        "truncated_header": b"\x00\x00",
        "truncated_body": _framed(request)[:-3],
        "not_a_map": _framed(msgpack.packb([1, "query"])),
        "int_keys": _framed(msgpack.packb({1: "id"})),
        "ext_type": _framed(msgpack.packb({"id": msgpack.ExtType(5, b"xx")})),
        "timestamp": _framed(msgpack.packb({"id": msgpack.Timestamp(1, 0)})),
        "bad_utf8": _framed(b"\x81\xa2id\xa2\xff\xfe"),
        "deep": _framed(b"\x81\xa1x" + b"\x91" * 5000 + b"\xc0"),
        "trailing_bytes": _framed(request + b"\xc0"),
        "map_claims_more": _framed(b"\x85\xa2id\x01"),
    }[how], "INVALID_REQUEST"
