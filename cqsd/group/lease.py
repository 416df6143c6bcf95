"""How long this node may still act as an owner: its etcd lease, seen locally.

Design note. etcd expires a lease ``ttl`` seconds after the last keep-alive it
*received*; we cannot know when that was, but we know when we *sent* it, which
was earlier. So a keep-alive sent at local time ``t`` and answered proves the
lease alive until at least ``t + ttl`` on etcd's clock. On ours we count less:
``t + ttl * (1 - DRIFT) - MARGIN``. DRIFT covers the two clocks running at
different rates (crystal drift is tens of parts per million; 2% is far above
it); MARGIN covers the time between our validity check and the moment a reply
leaves. The clock is CLOCK_BOOTTIME: it never jumps (an NTP step or an
operator's ``date -s`` do not move it) and, unlike CLOCK_MONOTONIC, it keeps
counting while the machine is suspended, when etcd's clock also runs on.

Every acknowledgement of a recoverable request checks ``valid`` *after* its
fsync (docs/group.md): the record was durable before the deadline, the new
owner seals only after etcd expired the lease, which is after the deadline, so
the seal includes every acknowledged record. A node whose deadline passes
stops acknowledging (it is *fenced*) until a renewal succeeds again, and then
it owns nothing: its owner keys went with the lease.

Pure: times are arguments; ``now()`` is the one place the clock is read.
"""

from __future__ import annotations

import time

__all__ = ["DRIFT", "MARGIN", "LeaseClock", "now"]

DRIFT = 0.02  # fraction of the TTL not counted on: clock rate differences, with room
MARGIN = 0.25  # seconds: between the check after an fsync and the reply leaving


def now() -> float:
    """Seconds on CLOCK_BOOTTIME: never steps, counts through a suspend."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class LeaseClock:
    """The local deadline of this node's lease, moved on by each answered keep-alive."""

    __slots__ = ("lease", "ttl", "valid_until")

    def __init__(self) -> None:
        self.lease = 0  # etcd's lease id; 0 = none
        self.ttl = 0
        self.valid_until = float("-inf")

    def granted(self, lease: int, ttl: int, sent_at: float) -> None:
        """A new lease, asked for at ``sent_at``."""
        self.lease, self.ttl = lease, ttl
        self.renewed(ttl, sent_at)

    def renewed(self, ttl: int, sent_at: float) -> None:
        """A keep-alive sent at ``sent_at`` came back with ``ttl`` (0: the lease is gone)."""
        if ttl <= 0:
            self.lost()
            return
        self.valid_until = max(self.valid_until, sent_at + ttl * (1 - DRIFT) - MARGIN)

    def lost(self) -> None:
        """The lease is gone: nothing bound to it is ours any more."""
        self.lease, self.valid_until = 0, float("-inf")

    def valid(self, at: float) -> bool:
        return at < self.valid_until

    def left(self, at: float) -> float:
        """Seconds of validity left at ``at`` (0 when fenced)."""
        return max(0.0, self.valid_until - at)

    def renew_at(self) -> float:
        """When to send the next keep-alive: a third of the TTL before it, so two can fail."""
        return self.valid_until - self.ttl * (2 / 3)
