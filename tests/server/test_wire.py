"""Replies carrying large payloads are encoded with one copy of each, to the same bytes."""

import msgpack
import pytest

from cqsd.server import wire
from cqsproto import LARGE, MESSAGE_TOO_LARGE, ProtocolError, encode_frame
from cqsproto.codec import pack_parts


def reply(*sizes: int) -> dict:
    items = [{"entry_id": i, "data": bytes([i]) * size} for i, size in enumerate(sizes)]
    return {"id": 7, "ok": True, "result": wire.messages(items, cursor=None)}


def test_a_result_with_a_large_payload_is_large_and_small_ones_are_not() -> None:
    """One payload of LARGE bytes makes the result Large; below it, a plain dict."""
    assert type(reply(LARGE - 1, 3)["result"]) is dict
    assert type(reply(3, LARGE)["result"]) is wire.Large


def test_a_large_reply_encodes_to_the_bytes_of_a_plain_one() -> None:
    """Packed around its payloads, a reply is exactly the frame packb makes."""
    frame = reply(5, LARGE, 3 * LARGE)
    assert encode_frame(frame, 1 << 20, large=True) == encode_frame(frame, 1 << 20)
    body = msgpack.packb(frame, use_bin_type=True)
    assert encode_frame(frame, 1 << 20, large=True) == len(body).to_bytes(4, "big") + body


def test_a_large_reply_over_the_frame_limit_is_too_large() -> None:
    """Past max_frame, a large frame is refused as a plain one is."""
    for large in (False, True):
        with pytest.raises(ProtocolError) as raised:
            encode_frame(reply(LARGE), LARGE, large=large)
        assert raised.value.reason == MESSAGE_TOO_LARGE


def test_a_large_reply_leaves_its_payloads_where_they_are() -> None:
    """The packed parts view each large payload rather than copy it: the walk goes
    inside the result, a dict subclass, as msgpack would."""
    frame = reply(5, LARGE, 2 * LARGE)
    payloads = [m["data"] for m in frame["result"]["messages"]]
    views = [part.obj for part in pack_parts(frame, 1 << 30) if isinstance(part, memoryview)]
    assert len(views) == 2 and views[0] is payloads[1] and views[1] is payloads[2]
