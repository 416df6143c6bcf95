"""Reason codes (docs/protocol.md, a contract): the one word every failure carries.

They live in the protocol because they are what travels: the engine raises
them, the daemon puts them in error replies, and the SDK turns each back into
its exception class. Names and values are fixed; add, never rename.
"""

from enum import StrEnum

__all__ = ["Reason"]


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
    SMDS_FULL = "SMDS_FULL"
    NOT_OWNER = "NOT_OWNER"
