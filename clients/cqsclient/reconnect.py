"""Reconnecting after a lost connection: the policy, the lock book and the resync.

Design note
-----------
A client connected with ``reconnect=True`` (or a :class:`Reconnect` policy)
that loses its connection opens a new one, with back-off, and registers warm:
the daemon hands back the locks this client still holds (``resync_locks``),
as a CQS warm restart does, for ``resync_grace`` seconds after the old
connection died (or the daemon restarted). The new registration carries the
old one's takeover token, so a name the daemon still thinks is held by the
dying connection is taken over instead of refused with CLIENT_ACTIVE.

What the application held, it learns from the :class:`Resync` report. To
write it the client keeps a :class:`LockBook`: the locks the application
was handed (messages read, ``resync_locks`` at connect) less those it gave
up (deleted, unlocked, moved, committed). Folding the daemon's list into the
book sorts every lock into three:

- *kept*: held before, handed back now; the application goes on with them.
- *lost*: held before, not handed back: the message went back to its queue
  (the grace ran out, or the lock was not yet durable when the daemon died),
  or a delete in flight was applied. Either way this client no longer holds
  it, and the message may be delivered again (at least once, never lost).
- *orphans*: handed back, but the application never saw them: a read in
  flight when the connection dropped locked them and its reply was lost.
  The client gives them back (a plain unlock) so they are read again.

Requests in flight when the connection dropped raise ConnectionLost; those
that certainly did not reach the daemon, and those safe to repeat
(``Call.retry``: reads, browses, queries, interests), are sent again on the
new connection instead. This module does no I/O (but logging): the clients do.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ConnectionLost
from .model import HeldLock, Message
from .ops import Call

__all__ = ["LockBook", "Reconnect", "Resync", "policy"]

log = logging.getLogger("cqsclient")


@dataclass(frozen=True, slots=True)
class Resync:
    """What a reconnect found; given to ``Reconnect.on_resync`` and kept as
    ``Client.last_resync``.

    ``cause`` is why the old connection ended; ``attempts`` how many connections
    were tried and ``seconds`` how long from noticing the loss to registered
    again. ``kept``: locks the application held that came back to it. ``lost``:
    locks it held that did not (the message may be delivered again, to anyone).
    ``given_back``: locks taken by reads lost in flight, unlocked again.
    ``interests``: the interests registered again.
    """

    cause: str
    attempts: int
    seconds: float
    kept: list[HeldLock] = field(default_factory=list)
    lost: list[HeldLock] = field(default_factory=list)
    given_back: list[HeldLock] = field(default_factory=list)
    interests: list[tuple[str, str, str | int]] = field(default_factory=list)


@dataclass(frozen=True)
class Reconnect:
    """How a client reconnects: ``connect(..., reconnect=Reconnect(...))``.

    The first attempt is at once; then each waits ``first_delay`` seconds,
    multiplied by ``multiplier`` after every failure up to ``max_delay``, each
    delay shortened by a random part of up to ``jitter`` (so that many clients
    of a restarted daemon do not come back in step). After ``give_up_after``
    seconds of failed attempts (None: never) the request that noticed the loss
    raises its ConnectionLost. ``on_resync`` is called with the :class:`Resync`
    report after each reconnect, in the thread (or task) that reconnected.
    """

    first_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2
    give_up_after: float | None = None
    on_resync: Callable[[Resync], Any] | None = None

    def delays(self, rand: Callable[[], float] = random.random) -> Iterator[float]:
        """The seconds to wait before each attempt: 0 first, then backing off."""
        yield 0.0
        delay = self.first_delay
        while True:
            yield delay * (1 - self.jitter * rand())
            delay = min(delay * self.multiplier, self.max_delay)

    def failed(
        self, attempt: int, started: float, error: BaseException, lost: ConnectionLost
    ) -> None:
        """Attempt *attempt* failed with *error*: say so (at attempts 1, 2, 4, 8, ...,
        so that a long outage does not flood the log); raise *lost* (the error the
        request that noticed the loss raises) once ``give_up_after`` has passed."""
        level = logging.WARNING if attempt & (attempt - 1) == 0 else logging.DEBUG
        log.log(level, "cqsd reconnect attempt %d failed: %s", attempt, error)
        if self.give_up_after is not None and time.monotonic() - started >= self.give_up_after:
            raise lost from error

    def done(self, resync: Resync) -> None:
        """Say what the reconnect found, and tell the application (``on_resync``)."""
        log.info(
            "cqsd reconnected after %.3f s (%d attempts): %d locks kept, %d lost, %d given back",
            resync.seconds, resync.attempts, len(resync.kept), len(resync.lost),
            len(resync.given_back),
        )
        if self.on_resync is not None:
            try:
                self.on_resync(resync)
            except Exception:
                log.exception("Reconnect.on_resync raised")


def policy(reconnect: bool | Reconnect | None) -> Reconnect | None:
    """The policy ``connect(reconnect=...)`` asks for: None for False, defaults for True."""
    if reconnect is None or reconnect is False:
        return None
    if reconnect is True:
        return Reconnect()
    if not isinstance(reconnect, Reconnect):
        raise TypeError(f"reconnect must be a bool or a Reconnect, not {type(reconnect).__name__}")
    return reconnect


LockKey = tuple[str, int]  # (structure, entry id)


class LockBook:
    """The locks the application knows it holds (see the module's design note)."""

    def __init__(self) -> None:
        self._held: dict[LockKey, HeldLock] = {}

    def __contains__(self, key: LockKey) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def adopt(self, locks: Iterable[HeldLock]) -> None:
        """The application was told it holds *locks* (``resync_locks``)."""
        for lock in locks:
            self._held[(lock.structure, lock.entry_id)] = lock

    def note(self, call: Call, result: Any) -> None:
        """*call* succeeded with *result*: record the locks it took and gave up."""
        structure = call.structure
        for entry_id in call.releases:
            self._held.pop((structure, entry_id), None)
        if call.locks:
            messages: list[Message] = (
                result if isinstance(result, list) else [] if result is None else [result]
            )
            for m in messages:
                self._held[(structure, m.entry_id)] = HeldLock(
                    structure, m.entry_id, m.queue, m.qtype
                )

    def structures(self) -> set[str]:
        """The structures the application holds locks in."""
        return {structure for structure, _ in self._held}

    def forget(self, key: LockKey) -> None:
        """The lock is not the application's any more (given back by the SDK)."""
        self._held.pop(key, None)

    def clear(self) -> None:
        """Everything was released (deregistered)."""
        self._held.clear()

    def resync(
        self, locks: Iterable[HeldLock], within: set[str] | None = None
    ) -> tuple[list[HeldLock], list[HeldLock], list[HeldLock]]:
        """Compare the daemon's resync list with the book: (kept, lost, orphans); the
        book's locks only in the structures *within* (those the node serves), if
        given. The book is left as it is until the reconnect succeeds (``lose``)."""
        handed = {(lock.structure, lock.entry_id): lock for lock in locks}
        held = {key: lock for key, lock in self._held.items()
                if within is None or lock.structure in within}
        kept = [lock for key, lock in held.items() if key in handed]
        lost = [lock for key, lock in held.items() if key not in handed]
        orphans = [lock for key, lock in handed.items() if key not in self._held]
        return kept, lost, orphans

    def lose(self, locks: Iterable[HeldLock]) -> None:
        """The application no longer holds *locks* (the lost ones of a resync)."""
        for lock in locks:
            self._held.pop((lock.structure, lock.entry_id), None)
