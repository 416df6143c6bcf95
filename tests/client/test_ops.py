"""Tests for cqsclient.ops: the requests both clients send and how replies are read."""

from __future__ import annotations

import pytest

from cqsclient import errors, ops, replies
from cqsclient.model import BrowsePage, HeldLock, Location, Message
from cqsproto import PROTOCOL_VERSION

WIRE = {
    "entry_id": 7, "queue": "TRANX", "qtype": "TRAN", "data": b"abc", "recoverable": True,
    "put_time": 123, "delivery_count": 1,
}


def ok(result):
    return {"id": 1, "ok": True, "result": result}


def test_register_carries_the_protocol_version_and_parses_the_session():
    """register sends client, secret, cold and version; its result lists the held locks."""
    call = ops.register("IMS1", None, False)
    assert call.request == {
        "op": "register", "client": "IMS1", "secret": None, "cold": False,
        "version": PROTOCOL_VERSION,
    }
    session = call.finish(ok({
        "version": 1, "server": "cqsd 0.1", "max_message": 99, "structures": ["MSGQ01"],
        "locks": [{"structure": "MSGQ01", "entry_id": 5, "queue": "Q", "qtype": "TRAN"}],
    }))
    assert session.max_message == 99
    assert session.locks == [HeldLock("MSGQ01", 5, "Q", "TRAN")]


def test_read_turns_no_message_into_none_and_batch_into_empty_list():
    """NO_MESSAGE is an ordinary outcome of a read, but an error for everything else."""
    empty = {"id": 1, "ok": False, "reason": "NO_MESSAGE", "message": "empty"}
    assert ops.read("S", "Q", "TRAN", None).finish(empty) is None
    assert ops.read_batch("S", "Q", 5, "TRAN", 1.0).finish(empty) == []
    with pytest.raises(errors.NoMessage):
        ops.delete("S", 1).finish(empty)


def test_read_parses_messages_with_their_structure():
    """A read's messages become Message values naming the structure they came from."""
    call = ops.read("MSGQ01", "TRANX", "TRAN", 2.5)
    assert call.request == {
        "op": "read", "structure": "MSGQ01", "queue": "TRANX", "qtype": "TRAN", "n": 1,
        "wait": 2.5,
    }
    assert call.locks
    message = call.finish(ok({"messages": [WIRE]}))
    assert message == Message(7, "TRANX", "TRAN", b"abc", True, 123, 1, structure="MSGQ01")


def test_browse_defaults_qtype_to_tran_only_with_a_queue():
    """Browsing a queue means its TRAN queue unless told; browsing a structure means all types."""
    assert ops.browse("S", "Q", None, 100, None).request["qtype"] == "TRAN"
    assert ops.browse("S", None, None, 100, None).request["qtype"] is None
    assert ops.browse("S", None, "LTERM", 100, None).request["qtype"] == "LTERM"


def test_browse_page_keeps_the_cursor_and_the_browse_fields():
    """A browse page is a list of messages with where/owner/home, plus the next cursor."""
    wire = dict(WIRE, where="cold", owner="IMS1", home=["TRAN", "TRANX"])
    page = ops.browse("S", None, None, 10, None).finish(ok({"messages": [wire], "cursor": "c2"}))
    assert isinstance(page, BrowsePage)
    assert page.cursor == "c2"
    assert (page[0].where, page[0].owner, page[0].home) == ("cold", "IMS1", ("TRAN", "TRANX"))


def test_put_checks_the_payload_before_building_a_request():
    """Payloads over max_message and str payloads are refused before anything is sent."""
    assert ops.put("S", "Q", b"x" * 10, "TRAN", True, 10).request["data"] == b"x" * 10
    with pytest.raises(errors.MessageTooLarge, match="11 bytes"):
        ops.put("S", "Q", b"x" * 11, "TRAN", True, 10)
    with pytest.raises(errors.MessageTooLarge):
        ops.put_batch("S", "Q", [b"ok", b"x" * 11], "TRAN", True, 10)
    with pytest.raises(TypeError, match="encode"):
        ops.put("S", "Q", "text", "TRAN", True, 10)  # type: ignore[arg-type]
    with pytest.raises(errors.MessageTooLarge):
        ops.put("S", "Q", memoryview(bytearray(11)), "TRAN", True, 10)


def test_put_batch_is_one_commit_of_puts():
    """put_batch builds a single commit whose result is the list of new entry ids."""
    call = ops.put_batch("S", "Q", [b"a", b"b"], "LTERM", False, None)
    assert call.request["op"] == "commit"
    assert call.request["ops"] == [
        {"op": "put", "queue": "Q", "qtype": "LTERM", "data": b"a", "recoverable": False},
        {"op": "put", "queue": "Q", "qtype": "LTERM", "data": b"b", "recoverable": False},
    ]
    assert call.finish(ok({"entry_ids": [3, 4]})) == [3, 4]


def test_unlock_requeue_dequeue_and_query_results():
    """unlock and requeue say where the message went; dequeue counts; query gives rows."""
    assert ops.unlock("S", 1).finish(ok({"qtype": "TRAN", "queue": "Q"})) == Location("TRAN", "Q")
    assert ops.requeue("S", 1).finish(ok({"qtype": "TRAN", "queue": "Q"})) == Location("TRAN", "Q")
    assert ops.dequeue("S", "Q", "TRAN").finish(ok({"count": 3})) == 3
    assert ops.query("locks").finish(ok({"rows": [{"a": 1}]})) == [{"a": 1}]
    assert ops.delete("S", 1, operator=True).request["operator"] is True


def test_malformed_result_is_a_protocol_violation():
    """A result missing its fields raises ProtocolViolation naming the op, not a KeyError."""
    with pytest.raises(errors.ProtocolViolation, match="'put'"):
        ops.put("S", "Q", b"x", "TRAN", True, None).finish(ok({}))


def test_notification_frames():
    """Only well-formed work notifications become Notification values."""
    frame = {"notify": "work", "structure": "S", "qtype": "TRAN", "queue": "Q"}
    note = replies.notification_from_wire(frame)
    assert (note.structure, note.qtype, note.queue) == ("S", "TRAN", "Q")
    assert replies.notification_from_wire({"notify": "other"}) is None
    assert replies.notification_from_wire({"notify": "work"}) is None
