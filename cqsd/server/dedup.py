"""The daemon's side of exactly-once puts: each owned pair's memory of keys
(cqsd/dedup.py), the key of the request being settled, and the answer to a resend.

A put or commit that carries a key is looked up first: a key the pair
remembers is answered with the entry ids it produced, once the record that
produced them is durable, and nothing is applied. Otherwise the handler applies
it and ``note``s the key with its ids; the dispatcher, settling the request,
writes them into the pair's record (``stamp``) and remembers them with its LSN
(``remember``). The memory is filled at start, and at each takeover, from the
log (``install``, cqsd/recovery/keys.py) and dropped with the pair.
"""

from __future__ import annotations

import time
from typing import Any

from cqsproto import requests

from ..config import Config
from ..dedup import Key, Remembered, key_field, key_of
from ..records import KEY
from .session import Session

# A keyed request: its key, and its record's KEY field (``key_field``), both built
# once; the field's entry ids are filled in when it is applied (``note``).
Noted = tuple[Key, list[Any]]


def window_of(config: Config) -> float:
    """Seconds keys are remembered: the group's ``dedup_window`` in a group, else the
    daemon's (a lone daemon restarted under a client is in doubt the same way)."""
    return config.group.dedup_window if config.group is not None else config.daemon.dedup_window


class Dedup:
    """Every keyed put passes through ``key``, ``recall``, ``note``, ``stamp`` and
    ``remember`` once: the key is built once, as the memory's string and as the
    record's field (benchmarks/exactlyonce.py prices the path)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.memories: dict[str, Remembered] = {}  # pair -> its keys
        self._noted: dict[str, Noted] = {}  # pair -> the key of the request being settled

    def key(self, session: Session, where: str, value: list[Any] | None) -> Noted | None:
        """The full key of a request's ``key`` field (INVALID_REQUEST if malformed);
        None if it has none or the window is 0 (nothing is remembered then)."""
        found = requests.idempotency_key(where, value)
        if found is None or self.window <= 0:
            return None
        client = session.client
        assert client is not None  # only registered sessions put
        return key_of(client, found[0], found[1]), key_field(client, found, [])

    def recall(self, pair: str, key: Noted | None) -> tuple[list[int], int] | None:
        """(entry ids, LSN to wait for) of a key ``pair`` remembers, or None."""
        if key is None:
            return None
        memory = self.memories.get(pair)
        return None if memory is None else memory.recall(key[0], time.time_ns())

    def note(self, pair: str, key: Noted | None, ids: list[int]) -> None:
        """The request with ``key`` was applied to ``pair`` and produced ``ids``."""
        if key is not None:
            key[1][3] = ids
            self._noted[pair] = key

    def stamp(self, pair: str, record: dict[str, Any] | None) -> Noted | None:
        """The key noted for ``pair``, written into its record (if it made one)."""
        noted = self._noted.pop(pair, None) if self._noted else None
        if noted is not None and record is not None:
            record[KEY] = noted[1]
        return noted

    def remember(self, pair: str, noted: Noted, lsn: int) -> None:
        """``noted`` is in the record at ``lsn`` (0: none; a non-recoverable put)."""
        memory = self.memories.get(pair)
        if memory is None:
            memory = self.memories[pair] = Remembered(self.window)
        memory.remember(noted[0], noted[1][3], time.time_ns(), lsn)

    def rolled(self) -> None:
        """The log rolled to a new series: every key remembered so far is durable."""
        for memory in self.memories.values():
            memory.all_durable()

    def install(self, memories: dict[str, Remembered], newest: int) -> None:
        """The memories a start or a takeover read back from the log, or a standby kept,
        whose newest record is stamped ``newest`` (0: none): put on this node's clock."""
        now = time.time_ns()
        for memory in memories.values():
            memory.catch_up(newest, now)
        self.memories.update(memories)

    def drop(self, pair: str) -> None:
        """The pair is not this daemon's any more."""
        self.memories.pop(pair, None)
        self._noted.pop(pair, None)
