"""Random request histories driven through the real engine, logged as the daemon logs them.

A history works a primary structure and its overflow structure with every kind
of request (puts of long messages included, which the engine stages in
segments), on several queue types including SERIAL, and moves messages from
the primary to the overflow as overflow processing does (``Structure.transfer``):
one record holding an ``O`` for the primary and, in its ``x`` map, an ``I`` for
the overflow. Each
request's effects become one record, stamped for one of several writers so
that the merged order (timestamp, writer, LSN) is the order of the requests.

Offloaded puts (docs/smds.md) are logged as the daemon logs them: the engine
puts an entry with no data and the history gives it a data map, then logs its
blocks (``B``), the engine's ``P`` and the ``M`` — the blocks in the same record
or in records of their own just before it, of the same writer. Some puts are
abandoned after their blocks (a crash before the entry was logged): their
``B`` effects have no ``M`` and every fold drops them. A cut between a put's
block records and its entry record is one the daemon never makes (``safe``).

Leases and delays: some reads take a lease, some locks are renewed, some puts
are delayed (a ``not_before`` a few ticks of the id clock ahead), and a tick
of the monotonic clock expires leases and ripens what is due, as the daemon's
timer does; expiries are logged as the unlocks they are.
"""

import itertools
import random

import msgpack
from hypothesis import strategies as st

from cqsd.engine import CQSError, Delete, Move, Put, QueueType, Structure, Unlock
from cqsd.records import BLOCK, DATA, MAP, MAPPED, RECOVERABLE, rows_of
from cqsd.smds import DataMap, Range
from cqsd.smds.pages import pages_for, room

WRITERS = ["IMSA", "cqsd", "w.3"]  # in sort order; ties in time are broken by writer
CLIENTS = ["IMS1", "IMS2"]
TYPES = [QueueType.TRAN, QueueType.TRAN_SERIAL, QueueType.LTERM, QueueType.TRAN_SUSPEND,
         QueueType.APPC]
NAMES = ["A", "B"]
ENTRY_MAX = 300  # so a message of a few hundred bytes is staged in segments
NOISE = "NOISE"  # a structure no test folds: its effects must be ignored
OWNER = "IMS1"  # whose data set holds the offloaded payloads


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
        self.now = 0.0  # the monotonic clock leases run on

        def monotonic() -> float:
            return self.now

        self.primary = Structure(name, 1 << 22, entry_max=ENTRY_MAX, max_deliveries=2,
                                 clock=lambda: next(ticks), ticks=monotonic)
        self.overflow = Structure(name + "X", 1 << 22, entry_max=ENTRY_MAX, max_deliveries=2,
                                  ticks=monotonic)
        self.primary.pair_with(self.overflow)  # one id clock, as for any overflow pair
        self.choices = choices
        self.records: list[tuple[str, int, int, dict]] = []  # (writer, lsn, timestamp, body)
        self._lsn = dict.fromkeys(WRITERS, 0)
        self._at = (0, "")
        self._serial = 0
        self.payloads: dict[int, bytes] = {}  # of the offloaded messages
        self.unsafe: set[int] = set()  # cuts between a put's blocks and its entry
        self._writer: str | None = None  # the writer of the next record, if already chosen
        self._page = 1 << 30  # ranges are handed out downwards, so pages fall in map order

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

    def expected(self, materialised: bool = True) -> dict[str, dict[int, list]]:
        """The recoverable rows of both live structures: what every fold must give.
        An offloaded row holds its payload if ``materialised``, else no data."""
        rows = {s.name: {i: r for i, r in rows_of(s).items() if r[RECOVERABLE]}
                for s in (self.primary, self.overflow)}
        for r in (r for by_id in rows.values() for r in by_id.values()):
            if r[MAP] is not None and materialised:
                r[DATA] = self.payloads[r[0]]
        return rows

    def safe(self, cut: int) -> int:
        """The nearest cut at or before ``cut`` (records before it) that the daemon
        could make: one that does not fall between a put's blocks and its entry."""
        while cut in self.unsafe:
            cut -= 1
        return cut

    # -- requests ------------------------------------------------------------------

    def put(self, s: Structure) -> None:
        key, size = self._key(), self._size()
        s.put(*key, self._payload(size), self.choices.pick([True, True, False]))

    def put_later(self, s: Structure) -> None:
        """A delayed put: not readable until the id clock has moved on a little."""
        s.put(*self._key(), self._payload(self._size()), self.choices.pick([True, False]),
              not_before=s.ids.clock() + self.choices.number(0, 30))

    def read_leased(self, s: Structure) -> None:
        ready = sorted({(int(e.qtype), e.name) for e in s if e.where == "ready"})
        s.read(self.choices.pick(CLIENTS), *self.choices.pick([*ready, self._key()]),
               lease=self.choices.number(1, 6) / 2)

    def renew(self, s: Structure) -> None:
        locked = [e.entry_id for e in s if e.where == "locked"]
        s.renew(self.choices.pick(CLIENTS), self.choices.pick([*locked, *locked, 10**9]),
                self.choices.number(1, 6) / 2)

    def tick(self, s: Structure) -> None:
        """Time passes: leases expire (a client spared now and then, as after a
        restart), delayed messages ripen."""
        self.now += self.choices.number(0, 3)
        spared = self.choices.pick([(), (), CLIENTS[:1]])
        for structure in (self.primary, self.overflow):
            structure.expire(spared=spared)
            structure.ripen()

    def put_offloaded(self, s: Structure) -> None:
        """A put whose payload is offloaded to a data set; logged, if recoverable, as
        its blocks, then P with no data, then M with its map."""
        payload = self._payload(self.choices.number(1, 3 * room(2)))
        entry = s.put(*self._key(), b"", self.choices.pick([True, True, False]))
        entry.map = self._map(payload)
        self.payloads[entry.entry_id] = payload
        if entry.recoverable:
            (put,) = s.effects
            s.effects = [*self._blocks(s, entry.entry_id, entry.map, payload), put,
                         (MAPPED, entry.entry_id, entry.map.encode())]

    def abandon(self, s: Structure) -> None:
        """The blocks of an offloaded put that never completed: no P, no M follows."""
        s.ids.last += 1  # the id the put had taken
        payload = self._payload(self.choices.number(1, 2 * room(1)))
        s.effects = self._blocks(s, s.ids.last, self._map(payload), payload)

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
        ready = [e.entry_id for e in self.primary if e.where == "ready" and e.map is None]
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
        self.primary.effects, self.overflow.effects = [], []
        self._append(body)

    def _append(self, body: dict) -> None:
        body = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)
        self.records.append(self._stamp(body))

    def _stamp(self, body: dict) -> tuple[str, int, int, dict]:
        """A writer, LSN and timestamp that keep the merged order the request order."""
        writer, self._writer = self._writer or self.choices.pick(WRITERS), None
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

    def _map(self, payload: bytes) -> DataMap:
        """A data map for ``payload`` by the allocation rule: ranges of one or two
        pages, the last just big enough."""
        ranges, rest = [], len(payload)
        while True:
            pages = self.choices.number(1, 2)
            last = rest <= room(pages)
            pages = pages_for(rest) if last else pages
            self._page -= pages
            ranges.append(Range(self._page, pages))
            if last:
                return DataMap.of(OWNER, payload, ranges)
            rest -= room(pages)

    def _blocks(self, s: Structure, eid: int, datamap: DataMap, payload: bytes) -> list:
        """The B effects of a payload, in map order or reversed. Sometimes they are
        logged at once in one or two records of their own (returning none), and the
        writer of the next record, which holds the entry, is fixed to theirs."""
        blocks = [(BLOCK, eid, r.page, payload[offset:offset + n])
                  for r, offset, n in datamap.pieces()]
        if self.choices.pick([False, True]):
            blocks.reverse()
        if self.choices.pick([True, True, False]):
            return blocks
        writer = self.choices.pick(WRITERS)
        cut = self.choices.number(0, len(blocks))
        for part in (blocks[:cut], blocks[cut:]):
            if part:
                self._writer = writer
                self._append({"s": s.name, "e": part})
                self.unsafe.add(len(self.records))
        self._writer = writer
        return []

    def _any_id(self, s: Structure) -> int:
        return self.choices.pick([e.entry_id for e in s] + [10**9])


STEPS = [History.put, History.put, History.put, History.read, History.read, History.delete,
         History.move, History.unlock, History.unlock, History.commit, History.requeue,
         History.dequeue, History.release, History.cold, History.cold, History.move_to_overflow,
         History.put_offloaded, History.put_offloaded, History.abandon, History.put_later,
         History.put_later, History.read_leased, History.read_leased, History.renew, History.tick,
         History.tick]
