"""Names for the ways a logstream can be damaged or fail.

A torn tail (what a crash leaves) is not corruption (what a disk or a bug
leaves), and neither is a failed write (what is happening now). Callers react to
each differently, so each has its own type and every damage its own reason.
"""

from __future__ import annotations

import enum
import os


class Damage(str, enum.Enum):
    """Why bytes in a segment are not a good record or a good header."""

    SHORT_RECORD = "short-record"  # the file ends inside a record
    BAD_MAGIC = "bad-magic"  # the bytes where a record should start are not one
    BAD_LENGTH = "bad-length"  # a body length above record.MAX_BODY
    BAD_CRC = "bad-crc"
    BAD_BODY = "bad-body"  # the CRC is good but the body is not one msgpack object
    LSN_MISMATCH = "lsn-mismatch"  # the CRC is good but the LSN is not the next one
    LSN_GAP = "lsn-gap"  # a segment does not start where the previous one ended
    BAD_HEADER = "bad-segment-header"
    FOREIGN = "foreign-segment"  # the header names another writer or first LSN
    VERSION = "unsupported-version"

    def __str__(self) -> str:
        return self.value


class LogstreamError(Exception):
    """Base of every error the logstream raises on purpose."""


class CorruptLog(LogstreamError):
    """Bytes that were once written whole are now wrong; never repaired or skipped."""

    def __init__(self, path: os.PathLike[str] | str, offset: int, reason: Damage, detail: str = ""):
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        self.detail = detail
        text = f"{self.path}: corrupt at offset {offset}: {reason}"
        super().__init__(f"{text} ({detail})" if detail else text)


class TornTail(LogstreamError):
    """The last segment ends in an unfinished write; safe to cut at `offset`."""

    def __init__(self, path: os.PathLike[str] | str, offset: int, length: int, reason: Damage):
        self.path = os.fspath(path)
        self.offset = offset
        self.length = length
        self.reason = reason
        super().__init__(f"{self.path}: torn tail of {length} bytes at offset {offset}: {reason}")


class LogWriteFailed(LogstreamError):
    """A write or fsync failed; the writer is dead and will not retry (fsyncgate)."""

    def __init__(self, path: os.PathLike[str] | str, error: OSError):
        self.path = os.fspath(path)
        self.error = error
        super().__init__(f"{self.path}: log write failed: {error}")


class WriterBusy(LogstreamError):
    """Another open writer holds the lock of this series."""


class Trimmed(LogstreamError):
    """A reader asked for records that trim has already deleted."""
