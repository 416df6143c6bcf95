"""Noticing a silent daemon: the client-side keepalive.

Design note
-----------
A daemon that is stopped (SIGSTOP), hung, or cut off behind a dead network
path keeps its socket open: the kernel accepts what the client sends and
nothing comes back, so a request could wait forever, and in a group the
structure's new owner would serve everyone but this client (docs/group.md).
With ``keepalive=SECONDS`` a connection that is waiting for a reply (or a
notification) and hears nothing from the daemon for that long is declared
lost: requests in flight raise ConnectionLost (``applied`` unknown), and a
client with ``reconnect`` reconnects to another node of its list.

A read may wait on the daemon for much longer than the keepalive, and the
daemon answers it only at the end; so while something waits and the line has
been quiet for a third of the keepalive, the client sends a ``ping`` (the
cheapest request, answered at once, whatever the client's state) and drops
its reply: any frame at all proves the daemon alive. A stopped daemon answers
no ping, and is noticed within the keepalive of the moment the wait began or
the daemon last spoke. An idle connection sends nothing: the next request
finds out. :class:`Keepalive` is the pure clock logic; the connections do the
I/O.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["PING", "SILENT", "Keepalive"]

PING: Final = "ping"
SILENT: Final = "silent"
Action = Literal["ping", "silent"] | None


class Keepalive:
    """The keepalive's clock, for one connection; times are ``time.monotonic()``."""

    __slots__ = ("interval", "last", "pinged", "seconds")

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"keepalive must be a positive number of seconds, not {seconds!r}")
        self.seconds = seconds
        self.interval = seconds / 3
        self.last = float("-inf")  # when the daemon last sent anything
        self.pinged = float("-inf")

    def heard(self, now: float) -> None:
        """The daemon sent something (a frame, or part of one)."""
        self.last = now

    def step(self, now: float, since: float) -> tuple[Action, float]:
        """What to do for a caller waiting since *since*: (PING, SILENT or None, the
        seconds to wait at most before calling again)."""
        quiet_from = max(self.last, since)
        silent_at = quiet_from + self.seconds
        if now >= silent_at:
            return SILENT, 0.0
        action: Action = None
        if now - max(quiet_from, self.pinged) >= self.interval:
            self.pinged = now
            action = PING
        ping_at = max(quiet_from, self.pinged) + self.interval
        return action, max(0.0, min(ping_at, silent_at) - now)

    def silence(self) -> str:
        """Why the connection was declared lost."""
        return f"no word from the daemon for {self.seconds:g} s (keepalive)"
