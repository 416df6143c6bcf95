"""logstream: a durable, shared, append-only record log (cqsd's System Logger).

A logstream is a directory; each writer appends to its own series of segment
files, and readers merge all series by (timestamp, writer, lsn). The format
and the guarantees are specified in docs/logstream.md.

This package must never import cqsd or trio: the daemon, batch jobs and
checkers all use it, and it is tested on its own.
"""

from .errors import (
    CorruptLog,
    Damage,
    LogstreamError,
    LogWriteFailed,
    TornTail,
    Trimmed,
    WriterBusy,
)
from .reader import read, tail_positions
from .record import Record
from .repair import Repair
from .trim import trim
from .writer import DEFAULT_SEGMENT_SIZE, Writer, WriterStats

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "CorruptLog",
    "Damage",
    "LogWriteFailed",
    "LogstreamError",
    "Record",
    "Repair",
    "TornTail",
    "Trimmed",
    "Writer",
    "WriterBusy",
    "WriterStats",
    "read",
    "tail_positions",
    "trim",
]
