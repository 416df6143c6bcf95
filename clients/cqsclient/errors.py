"""The exceptions of the cqsclient SDK: one class per reason code of docs/protocol.md.

Every failed request raises a :class:`CQSError` subclass whose ``reason`` is
the server's reason code and whose ``message`` is the server's text, so code
can catch the class (``except StructureFull``) or test the code
(``error.reason == "STRUCTURE_FULL"``). The one code the server never sends
is ``CONNECTION_LOST``: the SDK raises :class:`ConnectionLost` itself when the
connection drops, to the request that noticed and to every other request in
flight, because nobody can know whether the server acted on them, and
:class:`RequestTimeout` when a reply does not come in time. Both say what the
SDK knows of the request in ``applied``: ``False`` when it never reached the
daemon whole (so it was not applied), ``None`` when the SDK cannot know. A
client connected with ``reconnect`` sends again what certainly was not
applied, and what is safe to repeat; nothing else is retried silently: that
decision belongs to the caller, who knows whether the request was idempotent.

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
    "RequestTimeout",
    "ShuttingDown",
    "SmdsFull",
    "NotOwner",
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


class NotOwner(CQSError):
    """In a group (docs/group.md), the node asked does not own the structure: ``owner``
    is the address of the node that does (None while none does) and ``epoch`` its
    epoch. The SDK follows it on its own; it reaches callers only of a single node."""

    reason = Reason.NOT_OWNER

    def __init__(self, message: str, owner: str | None = None, epoch: int | None = None
                 ) -> None:
        super().__init__(message)
        self.owner = owner
        self.epoch = epoch


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

    ``applied`` is False if the request never reached the daemon whole (it was
    sent after the loss, or its send failed), so it was not applied; None if it
    was sent and whether the daemon acted on it is unknown. ``address`` names
    the daemon's address.
    """

    reason = "CONNECTION_LOST"

    def __init__(
        self,
        message: str,
        reason: str | None = None,
        *,
        address: str = "",
        applied: bool | None = None,
    ) -> None:
        self.address = address
        self.applied = applied
        super().__init__(message, reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_connection_error,
            (type(self), self.message, self.address, self.applied),
        )


class CannotConnect(ConnectionLost):
    """The connection could not be opened at all, so no request reached the daemon."""


class ProtocolViolation(CQSError):
    """The server sent a reply this SDK cannot understand (a bug, or a version mismatch)."""

    reason = "PROTOCOL_VIOLATION"


class RequestTimeout(CQSError, TimeoutError):
    """No reply came within the request's timeout (after its ``wait``, for a read).

    ``applied`` is False if the request never went to the daemon whole (it waited
    for other threads' sends, or its own send stalled), so it was not applied;
    None if it went and the SDK cannot know whether the daemon acted on it. The
    reply, if it comes later, is dropped; the messages a late read reply locked
    are given back (a plain unlock, sent before the client's next request). The
    connection stays open, unless the send stalled part-way through the frame:
    then it is closed, and every request in flight gets ConnectionLost.
    Also a builtin TimeoutError.
    """

    reason = "TIMEOUT"

    def __init__(self, message: str, reason: str | None = None, *,
                 applied: bool | None = None) -> None:
        self.applied = applied
        super().__init__(message, reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_timeout, (self.message, self.applied))


def _rebuild_connection_error(
    cls: type[ConnectionLost], message: str, address: str, applied: bool | None = None
) -> Any:
    return cls(message, address=address, applied=applied)


def _rebuild_timeout(message: str, applied: bool | None) -> RequestTimeout:
    return RequestTimeout(message, applied=applied)


# The reason codes of docs/protocol.md (a contract), in its order, and their classes.
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
        NotOwner,
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
    if cls is NotOwner:
        owner, epoch = reply.get("owner"), reply.get("epoch")
        return NotOwner(message, owner if isinstance(owner, str) else None,
                        epoch if type(epoch) is int else None)
    return cls(message)
