"""Tests for cqsproto.requests: a bad request is refused by name, never with a crash."""

from __future__ import annotations

import pytest

from cqsproto import INVALID_REQUEST, ProtocolError
from cqsproto.requests import commit_ops, next_read, parse

from .test_quote import nested

MiB = 1024 * 1024
# Long enough to name the op and field at fault, short enough for any error reply.
SHORT = 200


def refusal(call, *args: object) -> str:
    """The message of the INVALID_REQUEST that call(*args) raises."""
    with pytest.raises(ProtocolError) as info:
        call(*args)
    assert info.value.reason == INVALID_REQUEST
    return info.value.message


def test_a_valid_request_is_parsed_with_its_defaults() -> None:
    """A put names its id, op and fields, with qtype and recoverable filled in."""
    frame = {"id": 7, "op": "put", "structure": "MSGQ01", "queue": "Q", "data": b"x"}
    assert parse(frame) == (
        7, "put", {"structure": "MSGQ01", "queue": "Q", "qtype": "TRAN", "data": b"x",
                   "recoverable": True, "delay": None, "not_before": None, "key": None},
    )


@pytest.mark.parametrize("field", ["id", "op"])
def test_an_id_or_op_nested_a_thousand_deep_is_refused_by_name(field: str) -> None:
    """A 1 KB frame of nested arrays once raised RecursionError from repr, stopping the daemon."""
    frame = {"id": 1, "op": "put", field: nested(1000)}
    message = refusal(parse, frame)
    assert "[[[[...]]]]" in message and len(message) < SHORT


@pytest.mark.parametrize("field", ["id", "op"])
def test_an_id_or_op_of_megabytes_is_quoted_briefly(field: str) -> None:
    """A 30 MiB bin id once became a 120 MB message, too large for its own error reply."""
    frame = {"id": 1, "op": "put", field: b"\x00" * 30 * MiB}
    assert len(refusal(parse, frame)) < SHORT


def test_an_unknown_field_of_megabytes_is_quoted_briefly() -> None:
    """A request's unknown field is named in a few characters, however long its name."""
    frame = {"id": 1, "op": "connect", "structure": "MSGQ01", "x" * MiB: 1}
    message = refusal(parse, frame)
    assert message.startswith("connect: unknown field 'xxx") and len(message) < SHORT


def test_an_unknown_key_of_a_commit_op_is_quoted_briefly() -> None:
    """A commit op's keys may be any msgpack scalar; a huge bin key is still quoted briefly."""
    ops = [{"op": "delete", "entry_id": 1, b"k" * MiB: 1}]
    message = refusal(commit_ops, ops)
    assert message.startswith("commit ops[0] (delete): unknown field b'kkk")
    assert len(message) < SHORT


@pytest.mark.parametrize("key", [b"queue", 7, 2.5, None, True])
def test_a_non_string_key_of_a_deletes_next_is_refused_by_name(key: object) -> None:
    """A delete's next read is a map of the peer's, whose keys may be any msgpack type."""
    message = refusal(next_read, {"queue": "Q", key: 1})
    assert message.startswith("delete next: unknown field ")
