"""Exactly-once puts: the idempotency keys of the last ``dedup_window`` seconds and
the entry ids each produced (docs/group.md, "Exactly-once puts").

Design note. A reply lost with its connection leaves the client in doubt: was
the put applied? The SDK sends every put and commit with a key (the client's
name, an incarnation drawn at each ``connect()``, a sequence) and, after a
reconnect, sends an in-doubt one again with the same key. The owner of the pair
answers a key it remembers with the entry ids it produced the first time and
applies nothing. The key travels in the request's log record (``records.KEY``),
so the memory is not state of its own: it is the keys of the records of the
last ``dedup_window`` seconds, which any start (a restart, a takeover) reads
back from the log (cqsd/recovery/keys.py), as the fold reads the messages. The
log is kept at least that long for it (checkpoints.py, ``trim``).

This module is pure: the caller passes the clock (wall-clock ns, the log
records' stamps) and feeds it what the log says. Memory is one entry per key,
in arrival order, so forgetting is a pop from the front: O(1) a key.

Clocks. Keys read back from the log carry the stamps of whoever wrote their
records, and a node that takes them over recalls with its own clock, which may
run ahead of theirs: a node minutes ahead would count every key as older than
the window and answer a resend by applying it again. So a memory keeps its own
clock, the one its keys were stamped on, offset from the node's by
``catch_up``: the newest record read back counts as stamped now. A key is then
remembered at least ``window`` after its stamp on its writer's clock, the time
between that newest record and now added (longer, never shorter).

A window holds a pair's puts of two minutes, hundreds of thousands of keys, for
as long as the daemon runs, so a key is kept in objects the garbage collector
does not track: the key as one string, its outcome as the bytes of its ints.
Tuples (or lists) of them would be walked again by every collection of the
daemon's older objects, and the puts that fill the window would set off young
collections more often; and each would cost memory of its own
(benchmarks/exactlyonce.py measures both).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from typing import Any

from .records import KEY, STRUCTURE

Key = str  # client, incarnation and sequence as one string (``key_of``)

__all__ = ["Key", "Remembered", "key_field", "key_of", "key_of_record"]

_ONE_ID = struct.Struct("3q")  # a put's outcome: at, lsn, its entry id
_AT = struct.Struct("q")  # the first int of any outcome


def key_of(client: str, incarnation: str, sequence: int) -> Key:
    """A key as the memory holds it: one string (one to one: a client name has no
    NUL, and the sequence, last, is digits)."""
    return f"{client}\0{incarnation}\0{sequence}"


def _outcome(at: int, lsn: int, ids: list[int]) -> bytes:
    """(at, lsn, entry id, ...) as the bytes of 64-bit ints (a put's, of one id, is
    packed inline by ``remember``)."""
    return struct.pack(f"{2 + len(ids)}q", at, lsn, *ids)


class Remembered:
    """The keys one structure pair saw in the last ``window`` seconds, each with the
    entry ids its request produced and the LSN of its record (0: not logged, or
    durable already). A window of 0 remembers nothing.

    ``recall`` and ``remember`` run once each for every keyed put: the expiry is
    looked at inline, and called only when the oldest key is due."""

    __slots__ = ("_ats", "_keys", "_outcomes", "_last", "_durable_to", "_behind", "window_ns")

    def __init__(self, window: float) -> None:
        self.window_ns = int(window * 1e9)
        self._outcomes: dict[Key, bytes] = {}  # key -> _outcome(at, lsn, ids)
        # arrival order, at never decreasing: two deques, not one of pairs, so that a
        # key costs no tuple the collector tracks (see the note above)
        self._ats: deque[int] = deque()
        self._keys: deque[Key] = deque()
        self._last = 0
        self._durable_to = -1  # keys remembered at or before this are durable, whatever LSN
        self._behind = 0  # ns this memory's clock is behind the caller's (``catch_up``)

    def __len__(self) -> int:
        return len(self._outcomes)

    def recall(self, key: Key, now: int) -> tuple[list[int], int] | None:
        """(entry ids, LSN) of ``key`` if it was seen within the window before ``now``."""
        horizon = now - self._behind - self.window_ns
        if self._ats and self._ats[0] < horizon:
            self._forget(horizon)
        got = self._outcomes.get(key)
        if got is None:
            return None
        ints = memoryview(got).cast("q")
        return ints[2:].tolist(), 0 if ints[0] <= self._durable_to else ints[1]

    def all_durable(self) -> None:
        """Every key so far is durable: its LSN is of a series the daemon rolled away
        from (a group node's, acknowledged to its end first), which a reply cannot wait
        for in the new one."""
        self._durable_to = self._last

    def catch_up(self, newest: int, now: int) -> None:
        """The newest record this memory was built from, stamped ``newest``, counts
        as stamped at ``now`` on the clock of the calls to come, if that is later (a
        memory read back from the log, or kept by a standby, on another node's clock:
        see the note above). A ``newest`` of 0 (no record read) changes nothing."""
        if newest:
            self._behind = max(self._behind, now - newest)

    def remember(self, key: Key, ids: list[int], at: int, lsn: int = 0) -> None:
        """``key``'s request produced ``ids`` at wall-clock ns ``at`` (a clock that
        stepped back counts as not moving: the order stays the expiry order)."""
        if self.window_ns <= 0:
            return
        at -= self._behind
        if at <= self._last:
            at = self._last
        if at <= self._durable_to:
            at = self._durable_to + 1
        self._last = at
        self._outcomes[key] = (_ONE_ID.pack(at, lsn, ids[0]) if len(ids) == 1
                               else _outcome(at, lsn, ids))
        ats = self._ats
        ats.append(at)
        self._keys.append(key)
        if ats[0] < at - self.window_ns:
            self._forget(at - self.window_ns)

    def expire(self, now: int) -> None:
        """Forget the keys seen more than the window before ``now``."""
        self._forget(now - self._behind - self.window_ns)

    def _forget(self, horizon: int) -> None:
        """Forget the keys stamped before ``horizon`` (on this memory's clock)."""
        ats, keys, outcomes = self._ats, self._keys, self._outcomes
        while ats and ats[0] < horizon:
            at = ats.popleft()
            key = keys.popleft()
            got = outcomes.get(key)
            if got is not None and _AT.unpack_from(got)[0] == at:  # not remembered again since
                del outcomes[key]


def key_field(client: str, key: tuple[str, int], ids: list[int]) -> list[Any]:
    """A record's ``KEY`` field: [client, incarnation, sequence, entry ids]."""
    return [client, key[0], key[1], ids]


def key_of_record(body: dict[str, Any]) -> tuple[Key, list[int]] | None:
    """The key a record carries and the ids it produced, or None."""
    field = body.get(KEY)
    if not field:
        return None
    client, incarnation, sequence, ids = field
    return key_of(client, incarnation, sequence), list(ids)


def rebuild(records: Iterable[tuple[int, dict[str, Any]]], pair_of: dict[str, str],
            window: float) -> dict[str, Remembered]:
    """The memories of the pairs named in ``pair_of`` (structure -> its pair), from
    ``(stamp, body)`` of log records in log order: what a start reads back (the
    caller expires them, at the newest stamp it knows of)."""
    memories = {pair: Remembered(window) for pair in set(pair_of.values())}
    for stamp, body in records:
        found = key_of_record(body)
        pair = pair_of.get(body.get(STRUCTURE, ""))
        if found is not None and pair is not None:
            memories[pair].remember(found[0], found[1], stamp)
    return memories
