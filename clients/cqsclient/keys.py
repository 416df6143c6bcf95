"""Idempotency keys: how a put or commit sent again after a lost reply is applied once.

Design note
-----------
A reply lost with its connection leaves a put in doubt: the daemon may have
applied it. Each put and commit a client sends carries a key, ``[incarnation,
sequence]``: the incarnation is drawn at random at each ``connect()`` (so a
restarted process never reuses its predecessor's keys), the sequence counts the
requests of that connection's lifetime; the daemon adds the client's name. A
daemon remembers the keys of the last ``dedup_window`` seconds (it says how
long at registration) with the entry ids they produced, through restarts and
takeovers, and answers a key it has seen with those ids, applying nothing.

So with ``reconnect`` the client sends an in-doubt put or commit again on the
new connection, with the same key, instead of raising ConnectionLost; only
while the daemon can still remember it (the first send less than the window
ago). A daemon that does not take keys (``dedup_window`` 0, or an older one)
gets none, and an in-doubt request raises as it always did. No I/O here.
"""

from __future__ import annotations

import itertools
import secrets
import time

from .ops import Call

__all__ = ["Keys"]


class Keys:
    """The keys of one client (one ``connect()``); thread-safe."""

    def __init__(self) -> None:
        self.incarnation = secrets.token_hex(8)
        self._sequence = itertools.count(1)  # next() is atomic: threads share it
        self.window = 0.0  # seconds the daemon remembers a key; 0: it takes none

    def stamp(self, call: Call) -> float | None:
        """Give a put or commit its key (once: a resend keeps it); the monotonic time it
        was stamped, or None if it carries none."""
        if not call.keyed or self.window <= 0:
            return None
        if "key" not in call.request:
            call.request["key"] = [self.incarnation, next(self._sequence)]
        return time.monotonic()

    def may_resend(self, call: Call, stamped: float | None) -> bool:
        """Whether the in-doubt *call* may be sent again: it has a key the daemon still
        remembers."""
        return stamped is not None and time.monotonic() - stamped < self.window
