"""Random request histories driven through the real engine, logged as the daemon logs them.

A history works a primary structure and its overflow structure with every kind
of request (puts of long messages included, which the engine stages in
segments), on several queue types including SERIAL, and moves messages from
the primary to the overflow as overflow processing does (``Structure.transfer``):
one record holding an ``O`` for the primary and, in its ``x`` map, an ``I`` for
the overflow. Each
request's effects become one record, stamped for one of several writers so
that the merged order (timestamp, writer, LSN) is the order of the requests.
"""

import itertools
import random

import msgpack
from hypothesis import strategies as st

from cqsd.engine import CQSError, Delete, Move, Put, QueueType, Structure, Unlock
from cqsd.records import RECOVERABLE, rows_of

WRITERS = ["IMSA", "cqsd", "w.3"]  # in sort order; ties in time are broken by writer
CLIENTS = ["IMS1", "IMS2"]
TYPES = [QueueType.TRAN, QueueType.TRAN_SERIAL, QueueType.LTERM, QueueType.TRAN_SUSPEND,
         QueueType.APPC]
NAMES = ["A", "B"]
ENTRY_MAX = 300  # so a message of a few hundred bytes is staged in segments
NOISE = "NOISE"  # a structure no test folds: its effects must be ignored



class Drawn:
    """Choices drawn by Hypothesis (``st.data()``), so failures shrink."""

    def __init__(self, data) -> None:
        self.data = data

    def pick(self, options: list):
        return self.data.draw(st.sampled_from(options))

    def number(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))


class Seeded:
    """Choices from a seeded generator: one fixed history for the end-to-end tests."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def pick(self, options: list):
        return self.random.choice(options)

    def number(self, low: int, high: int) -> int:
        return self.random.randint(low, high)


class History:
    """Requests on ``name`` and ``name + "X"`` (its overflow) and their log records."""

    def __init__(self, name: str, choices: Drawn | Seeded) -> None:
        ticks = itertools.count(1)
        self.primary = Structure(name, 1 << 22, entry_max=ENTRY_MAX, max_deliveries=2,
                                 clock=lambda: next(ticks))
        self.overflow = Structure(name + "X", 1 << 22, entry_max=ENTRY_MAX, max_deliveries=2)
        self.primary.pair_with(self.overflow)  # one id clock, as for any overflow pair
        self.choices = choices
        self.records: list[tuple[str, int, int, dict]] = []  # (writer, lsn, timestamp, body)
        self._lsn = dict.fromkeys(WRITERS, 0)
        self._at = (0, "")
        self._serial = 0

    @property
    def names(self) -> list[str]:
        return [self.primary.name, self.overflow.name]

    def run(self, steps: int) -> "History":
        for _ in range(steps):
            step = self.choices.pick(STEPS)
            s = self.choices.pick([self.primary, self.primary, self.overflow])
            try:
                step(self, s)
            except CQSError:  # a refused request changes nothing, so logs nothing
                assert not (self.primary.effects or self.overflow.effects), step.__name__
            self._log()
        return self

    def expected(self) -> dict[str, dict[int, list]]:
        """The recoverable rows of both live structures: what every fold must give."""
        return {s.name: {i: r for i, r in rows_of(s).items() if r[RECOVERABLE]}
                for s in (self.primary, self.overflow)}

    # -- requests ------------------------------------------------------------------

    def put(self, s: Structure) -> None:
        key, size = self._key(), self._size()
        s.put(*key, self._payload(size), self.choices.pick([True, True, False]))

    def read(self, s: Structure) -> None:
        """Mostly a queue that has a message, so that locks (and cold starts) happen."""
        ready = sorted({(int(e.qtype), e.name) for e in s if e.where == "ready"})
        s.read(self.choices.pick(CLIENTS), *self.choices.pick([*ready, *ready, self._key()]))

    def delete(self, s: Structure) -> None:
        s.delete(self.choices.pick([None, *CLIENTS]), self._any_id(s))

    def move(self, s: Structure) -> None:
        s.move(self.choices.pick([None, *CLIENTS]), self._any_id(s),
               *self._key())

    def unlock(self, s: Structure) -> None:
        dest = (self._key() if self.choices.pick([True, False]) else None)
        kw = {"qtype": dest[0], "name": dest[1]} if dest else {}
        s.unlock(self.choices.pick(CLIENTS), self._any_id(s),
                 failed=self.choices.pick([False, True]), **kw)

    def commit(self, s: Structure) -> None:
        ops = []
        for _ in range(self.choices.number(1, 3)):
            kind = self.choices.pick(["put", "delete", "move", "unlock"])
            if kind == "put":
                ops.append(Put(*self._key(), self._payload(self._size())))
            elif kind == "delete":
                ops.append(Delete(self._any_id(s)))
            elif kind == "move":
                ops.append(Move(self._any_id(s), *self._key()))
            else:
                ops.append(Unlock(self._any_id(s), self.choices.pick([False, True])))
        s.commit(self.choices.pick(CLIENTS), ops)

    def requeue(self, s: Structure) -> None:
        s.requeue(self._any_id(s))

    def dequeue(self, s: Structure) -> None:
        s.dequeue(*self._key())

    def release(self, s: Structure) -> None:
        s.release_client(self.choices.pick(CLIENTS), failed=self.choices.pick([False, True]))

    def cold(self, s: Structure) -> None:
        s.cold_client(self.choices.pick(CLIENTS))

    def move_to_overflow(self, s: Structure) -> None:
        """Overflow processing moves a ready message to the overflow structure, keeping
        its id, put time, count and home (``O`` here, ``I`` there)."""
        ready = [e.entry_id for e in self.primary if e.where == "ready"]
        if ready:
            self.primary.transfer(self.choices.pick(ready), self.overflow)

    # -- logging -------------------------------------------------------------------

    def _log(self) -> None:
        """One record for what the request did, as the daemon writes it."""
        mine, theirs = self.primary.effects, self.overflow.effects
        if not mine and not theirs:
            return
        if mine and theirs:
            body = {"s": self.primary.name, "e": mine, "x": {self.overflow.name: theirs}}
        elif mine and self.choices.number(0, 4) == 0:
            # the same effects reached through another structure's record
            body = {"s": NOISE, "e": [["L", 1, "NOBODY"]], "x": {self.primary.name: mine}}
        else:
            body = {"s": (self.primary if mine else self.overflow).name, "e": mine or theirs}
        body = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)
        self.primary.effects, self.overflow.effects = [], []
        self.records.append(self._stamp(body))

    def _stamp(self, body: dict) -> tuple[str, int, int, dict]:
        """A writer, LSN and timestamp that keep the merged order the request order."""
        writer = self.choices.pick(WRITERS)
        ts = self._at[0] + self.choices.number(0, 2)
        if ts == self._at[0] and writer < self._at[1]:
            ts += 1
        self._at = (ts, writer)
        self._lsn[writer] += 1
        return (writer, self._lsn[writer], ts, body)

    def _key(self) -> tuple[QueueType, str]:
        return (self.choices.pick(TYPES), self.choices.pick(NAMES))

    def _size(self) -> int:
        if self.choices.pick([True, False]):
            return self.choices.number(0, 200)
        return self.choices.number(ENTRY_MAX + 1, 3 * ENTRY_MAX)

    def _payload(self, size: int) -> bytes:
        self._serial += 1
        return (self._serial.to_bytes(4, "big") * (size // 4 + 1))[:size]

    def _any_id(self, s: Structure) -> int:
        return self.choices.pick([e.entry_id for e in s] + [10**9])


STEPS = [History.put, History.put, History.put, History.read, History.read, History.delete,
         History.move, History.unlock, History.unlock, History.commit, History.requeue,
         History.dequeue, History.release, History.cold, History.cold, History.move_to_overflow]
