"""Reason codes (DESIGN §4, a contract) and the one exception that carries them.

Every failure a user can see has exactly one reason code; the message names the
structure, queue or entry involved so the operator can act on it.
"""

from enum import StrEnum


class Reason(StrEnum):
    NO_MESSAGE = "NO_MESSAGE"
    STRUCTURE_FULL = "STRUCTURE_FULL"
    OVERFLOW_REJECTED = "OVERFLOW_REJECTED"
    STRUCTURE_FAILED = "STRUCTURE_FAILED"
    SMDS_UNAVAILABLE = "SMDS_UNAVAILABLE"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    ENTRY_NOT_FOUND = "ENTRY_NOT_FOUND"
    LOCK_NOT_HELD = "LOCK_NOT_HELD"
    NOT_AUTHORIZED = "NOT_AUTHORIZED"
    NOT_REGISTERED = "NOT_REGISTERED"
    CLIENT_ACTIVE = "CLIENT_ACTIVE"
    CLIENT_LIMIT = "CLIENT_LIMIT"
    UNKNOWN_STRUCTURE = "UNKNOWN_STRUCTURE"
    INVALID_REQUEST = "INVALID_REQUEST"
    SHUTTING_DOWN = "SHUTTING_DOWN"


class CQSError(Exception):
    """A request failed for a reason the caller can act on."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = Reason(reason)
        self.message = message
