"""Leases and delays on the wire: which values ``read``'s ``lease``, ``renew``'s
``lease`` and ``put``'s ``delay`` / ``not_before`` may take (docs/protocol.md).

The request table (``requests``) checks only that they are numbers; here is what
numbers mean something. A lease and a delay are seconds from now, a not_before
is a wall-clock time in epoch seconds (a user-facing absolute time); on the
daemon's side they become nanoseconds, as a message's put time is, so NaN,
infinities and times past what 64 bits of nanoseconds hold must be refused
before anything is changed.
"""

import math
from typing import Final

from .codec import INVALID_REQUEST, ProtocolError

__all__ = ["MAX_DELAY", "MAX_LEASE", "lease_seconds", "not_before_ns"]

# SQS's longest visibility timeout: a lock held longer than half a day is a lost
# worker, not a long job, and the operator's tools are the better way to see it.
MAX_LEASE: Final = 12 * 3600.0
# A year ahead: a delayed put is a scheduled message, not long-term storage.
MAX_DELAY: Final = 366 * 24 * 3600.0
NS: Final = 1_000_000_000


def lease_seconds(where: str, value: float) -> float:
    """``value`` as a lease; raises ProtocolError(INVALID_REQUEST) unless it is a
    finite number of seconds above 0 and at most MAX_LEASE."""
    seconds = _seconds(value)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_LEASE):
        raise ProtocolError(INVALID_REQUEST,
                            f"{where}: lease must be more than 0 and at most {MAX_LEASE:g} "
                            f"seconds, got {value!r}")
    return seconds


def not_before_ns(where: str, delay: float | None, not_before: float | None,
                  now_ns: int) -> int | None:
    """The wall-clock ns before which a put is not readable, from a ``delay`` in
    seconds or a ``not_before`` in epoch seconds (at most one of the two), or None
    for no delay (neither, a delay of 0, or a not_before already past). Raises
    ProtocolError(INVALID_REQUEST) for both at once, a value that is not a finite
    number, a negative delay or not_before, or one more than MAX_DELAY ahead."""
    if delay is None and not_before is None:
        return None
    if delay is not None and not_before is not None:
        raise ProtocolError(INVALID_REQUEST, f"{where}: give delay or not_before, not both")
    name, value = ("delay", delay) if delay is not None else ("not_before", not_before)
    seconds = _seconds(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ProtocolError(INVALID_REQUEST,
                            f"{where}: {name} must be a finite number of seconds, 0 or more, "
                            f"got {value!r}")
    ahead = seconds if name == "delay" else seconds - now_ns / NS
    if ahead > MAX_DELAY:  # in seconds first: a huge one would not fit in ns
        raise ProtocolError(INVALID_REQUEST,
                            f"{where}: {name} {value!r} is more than {MAX_DELAY:g} seconds "
                            "ahead")
    at = now_ns + int(seconds * NS) if name == "delay" else int(seconds * NS)
    return at if at > now_ns else None


def _seconds(value: object) -> float:
    """A number as a float; an int too large for one is infinite (refused as such)."""
    try:
        return float(value)  # type: ignore[arg-type]  # the request table made it a number
    except OverflowError:
        return math.inf
