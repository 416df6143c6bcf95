"""The one exception that carries a reason code (docs/protocol.md, a contract).

Every failure a user can see has exactly one reason code; the message names the
structure, queue or entry involved so the operator can act on it. The codes
themselves are the protocol's (``cqsproto.reasons``): they are what travels.
"""

from cqsproto.reasons import Reason

__all__ = ["CQSError", "Reason"]


class CQSError(Exception):
    """A request failed for a reason the caller can act on."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = Reason(reason)
        self.message = message
        self.details: dict[str, object] = {}  # more fields of the error reply (NOT_OWNER's)
