"""Tests for cqsclient.errors: one class per reason code, and error replies mapped to them."""

from __future__ import annotations

import pickle

import pytest

from cqsclient import errors

# docs/protocol.md, "Reason codes", a contract: every reason code, in its order.
DESIGN_REASONS = [
    "NO_MESSAGE", "STRUCTURE_FULL", "OVERFLOW_REJECTED", "STRUCTURE_FAILED", "SMDS_UNAVAILABLE",
    "MESSAGE_TOO_LARGE", "ENTRY_NOT_FOUND", "LOCK_NOT_HELD", "NOT_AUTHORIZED", "NOT_REGISTERED",
    "CLIENT_ACTIVE", "CLIENT_LIMIT", "UNKNOWN_STRUCTURE", "INVALID_REQUEST", "SHUTTING_DOWN",
    "SMDS_FULL", "NOT_OWNER",
]


def test_every_design_reason_has_its_own_class():
    """The mapping covers exactly the reason codes of docs/protocol.md, each with a
    distinct CQSError."""
    assert list(errors.REASONS) == DESIGN_REASONS
    classes = list(errors.REASONS.values())
    assert len(set(classes)) == len(classes)
    for reason, cls in errors.REASONS.items():
        assert issubclass(cls, errors.CQSError)
        assert cls.reason == reason


def test_the_protocols_reason_enum_agrees():
    """The SDK's reason codes are the protocol's, which the daemon sends, so none can drift."""
    from cqsproto import Reason

    assert [r.value for r in Reason] == DESIGN_REASONS


@pytest.mark.parametrize("reason", DESIGN_REASONS)
def test_error_reply_becomes_its_class(reason):
    """An error reply raises the class of its reason, carrying the reason and the message."""
    error = errors.error_from_reply({"id": 1, "ok": False, "reason": reason, "message": "why"})
    assert type(error) is errors.REASONS[reason]
    assert error.reason == reason
    assert error.message == "why"
    assert str(error) == f"{reason}: why"


def test_unknown_reason_is_kept_on_a_plain_cqserror():
    """A reason this SDK does not know (a newer daemon) still reaches the caller."""
    error = errors.error_from_reply({"id": 1, "ok": False, "reason": "NEW_CODE", "message": "m"})
    assert type(error) is errors.CQSError
    assert error.reason == "NEW_CODE"


def test_reply_without_reason_is_a_protocol_violation():
    """An error reply without a reason code is the server's bug, named as such."""
    error = errors.error_from_reply({"id": 1, "ok": False})
    assert isinstance(error, errors.ProtocolViolation)


def test_connection_lost_names_its_address_and_pickles():
    """ConnectionLost carries CONNECTION_LOST and the address, and survives pickling."""
    error = errors.CannotConnect("cannot connect to unix:///x: refused", address="unix:///x")
    assert isinstance(error, errors.ConnectionLost)
    assert error.reason == "CONNECTION_LOST"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.CannotConnect
    assert (copy.address, copy.message) == ("unix:///x", error.message)
    assert pickle.loads(pickle.dumps(errors.NoMessage("empty"))).message == "empty"


def test_not_owner_carries_the_owners_address_and_epoch():
    """A NOT_OWNER reply names the owner and its epoch, which the SDK follows."""
    error = errors.error_from_reply({"id": 1, "ok": False, "reason": "NOT_OWNER",
                                     "message": "MSGQ01 is owned by NODE2",
                                     "owner": "tcp://127.0.0.1:7411", "epoch": 42})
    assert isinstance(error, errors.NotOwner)
    assert (error.owner, error.epoch) == ("tcp://127.0.0.1:7411", 42)
    bare = errors.error_from_reply({"id": 1, "ok": False, "reason": "NOT_OWNER",
                                    "message": "no owner", "owner": 3, "epoch": "x"})
    assert (bare.owner, bare.epoch) == (None, None)
