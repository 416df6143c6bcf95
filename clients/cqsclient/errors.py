"""The exceptions of the cqsclient SDK: one class per reason code of DESIGN §4.

Every failed request raises a :class:`CQSError` subclass whose ``reason`` is
the server's reason code and whose ``message`` is the server's text, so code
can catch the class (``except StructureFull``) or test the code
(``error.reason == "STRUCTURE_FULL"``). The one code the server never sends
is ``CONNECTION_LOST``: the SDK raises :class:`ConnectionLost` itself when the
connection drops, to the request that noticed and to every other request in
flight, because nobody can know whether the server acted on them. Nothing is
retried silently; that decision belongs to the caller, who knows whether the
request was idempotent.

The codes are the protocol's (``cqsproto.Reason``, a str enum), the same the
daemon sends, so the two sides cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from cqsproto import Reason

__all__ = [
    "REASONS",
    "CQSError",
    "CannotConnect",
    "ClientActive",
    "ClientLimit",
    "ConnectionLost",
    "EntryNotFound",
    "InvalidRequest",
    "LockNotHeld",
    "MessageTooLarge",
    "NoMessage",
    "NotAuthorized",
    "NotRegistered",
    "OverflowRejected",
    "ProtocolViolation",
    "ShuttingDown",
    "SmdsFull",
    "SmdsUnavailable",
    "StructureFailed",
    "StructureFull",
    "UnknownStructure",
    "error_from_reply",
]


class CQSError(Exception):
    """A cqsd request failed; ``reason`` is its reason code, ``message`` says why."""

    reason: str = "UNKNOWN"

    def __init__(self, message: str, reason: str | None = None) -> None:
        if reason is not None:
            self.reason = reason
        self.message = message
        super().__init__(f"{self.reason}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.reason))


class NoMessage(CQSError):
    """No message was available (after waiting, if the read waited)."""

    reason = Reason.NO_MESSAGE


class StructureFull(CQSError):
    """The structure has no room: puts are refused, reads still work."""

    reason = Reason.STRUCTURE_FULL


class OverflowRejected(CQSError):
    """A put to a queue in overflow whose overflow structure is full or absent."""

    reason = Reason.OVERFLOW_REJECTED


class StructureFailed(CQSError):
    """The structure is failed and awaits recovery or rebuild."""

    reason = Reason.STRUCTURE_FAILED


class SmdsUnavailable(CQSError):
    """The shared message data set holding (or to hold) the payload is unavailable."""

    reason = Reason.SMDS_UNAVAILABLE


class SmdsFull(CQSError):
    """The client's shared message data set has no room for this payload and cannot
    expand (at dsmax, or dsexpand off); deleting messages makes room."""

    reason = Reason.SMDS_FULL


class MessageTooLarge(CQSError):
    """The message (or the request carrying it) exceeds the server's limit."""

    reason = Reason.MESSAGE_TOO_LARGE


class EntryNotFound(CQSError):
    """No entry with that id exists in the structure."""

    reason = Reason.ENTRY_NOT_FOUND


class LockNotHeld(CQSError):
    """The entry is not locked by this client (or is locked by another one)."""

    reason = Reason.LOCK_NOT_HELD


class NotAuthorized(CQSError):
    """The client name or secret was refused."""

    reason = Reason.NOT_AUTHORIZED


class NotRegistered(CQSError):
    """The connection has not registered (or has deregistered)."""

    reason = Reason.NOT_REGISTERED


class ClientActive(CQSError):
    """A client of that name is already registered."""

    reason = Reason.CLIENT_ACTIVE


class ClientLimit(CQSError):
    """The daemon already has its maximum number of clients."""

    reason = Reason.CLIENT_LIMIT


class UnknownStructure(CQSError):
    """No structure of that name is defined."""

    reason = Reason.UNKNOWN_STRUCTURE


class InvalidRequest(CQSError):
    """The request was malformed: an unknown field, a wrong type, a bad name."""

    reason = Reason.INVALID_REQUEST


class ShuttingDown(CQSError):
    """The daemon is shutting down and accepts no new work."""

    reason = Reason.SHUTTING_DOWN


class ConnectionLost(CQSError):
    """The connection to the daemon dropped (or was closed) before the reply came.

    Whether the server acted on a request in flight is unknown. ``address``
    names the daemon's address.
    """

    reason = "CONNECTION_LOST"

    def __init__(self, message: str, reason: str | None = None, *, address: str = "") -> None:
        self.address = address
        super().__init__(message, reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_connection_error, (type(self), self.message, self.address))


class CannotConnect(ConnectionLost):
    """The connection could not be opened at all, so no request reached the daemon."""


class ProtocolViolation(CQSError):
    """The server sent a reply this SDK cannot understand (a bug, or a version mismatch)."""

    reason = "PROTOCOL_VIOLATION"


def _rebuild_connection_error(cls: type[ConnectionLost], message: str, address: str) -> Any:
    return cls(message, address=address)


# The reason codes of DESIGN §4 (a contract), in its order, and their classes.
REASONS: dict[str, type[CQSError]] = {
    cls.reason: cls
    for cls in (
        NoMessage,
        StructureFull,
        OverflowRejected,
        StructureFailed,
        SmdsUnavailable,
        MessageTooLarge,
        EntryNotFound,
        LockNotHeld,
        NotAuthorized,
        NotRegistered,
        ClientActive,
        ClientLimit,
        UnknownStructure,
        InvalidRequest,
        ShuttingDown,
        SmdsFull,
    )
}


def error_from_reply(reply: dict[str, Any]) -> CQSError:
    """The exception for an ``ok: false`` reply.

    A reason this SDK does not know (a newer server) becomes a plain CQSError
    carrying that reason, rather than being lost.
    """
    reason = reply.get("reason")
    message = reply.get("message")
    if not isinstance(message, str):
        message = "the server gave no message"
    if not isinstance(reason, str):
        return ProtocolViolation(f"error reply without a reason code: {message}")
    cls = REASONS.get(reason)
    if cls is None:
        return CQSError(message, reason)
    return cls(message)
