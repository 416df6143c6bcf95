"""A primary and its overflow structure against a simple model, over random histories.

The model keeps every message with its place spelled out, as in test_stateful,
and does not care which structure holds it: FIFO, locks, delivery counts and the
SERIAL rule must come out the same whatever overflow processing did meanwhile.
Where a put goes and whether it fits is decided from what the pair reports (its
names in overflow status, each structure's free space), and checked exactly. The
log records taken from the pair, folded per structure, must equal each
structure's recoverable rows after every step.
"""

import itertools
import math

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cqsd.engine import CQSError, Delete, Move, Put, QueueType, Structure, Unlock
from cqsd.engine.pair import StructurePair
from cqsd.engine.structure import position
from cqsd.recovery.fold import RECOVERABLE, fold, rows_of

from .test_stateful import EngineVersusModel

EL = 512
ENTRY_MAX = 700
MAX_DELIVERIES = 3
CLIENTS = ["IMS1", "IMS2"]
TYPES = [QueueType.TRAN, QueueType.TRAN_SERIAL, QueueType.LTERM, QueueType.TRAN_SUSPEND]
NAMES = ["A", "B", "C"]
SUSPEND, SERIAL = QueueType.TRAN_SUSPEND, QueueType.TRAN_SERIAL

clients = st.sampled_from(CLIENTS)
keys = st.tuples(st.sampled_from(TYPES), st.sampled_from(NAMES))
sizes = st.one_of(st.integers(0, 440), st.integers(0, 1000), st.integers(ENTRY_MAX + 1, 1600))


def cost(n):
    pieces = [n] if n <= ENTRY_MAX else [min(ENTRY_MAX, n - o) for o in range(0, n, ENTRY_MAX)]
    return sum(math.ceil((p + 64) / 512) for p in pieces), len(pieces)


def no_c_lterm(structure, candidates):
    """An overflow exit that keeps LTERM:C out of overflow status."""
    return [c for c in candidates if (c["qtype"], c["queue"]) != ("LTERM", "C")]


class Msg:
    def __init__(self, eid, key, data, recoverable):
        self.eid, self.key, self.data, self.recoverable = eid, key, data, recoverable
        self.place = "ready"
        self.owner = None
        self.count = 0
        self.home = None


class PairVersusModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        ticks = itertools.count(1)
        clock = lambda: next(ticks)  # noqa: E731
        primary = Structure("P", 24 * EL, initsize=16 * EL, entry_max=ENTRY_MAX, max_entries=22,
                            max_deliveries=MAX_DELIVERIES, clock=clock)
        overflow = Structure("OV", 10 * EL, entry_max=ENTRY_MAX, max_entries=8,
                             max_deliveries=MAX_DELIVERIES, clock=clock)
        self.pair = StructurePair(primary, overflow, threshold=50, overflow_exit=no_c_lterm)
        self.msgs: dict[int, Msg] = {}
        self.serial = 0
        self.images = {"P": {}, "OV": {}}

    # -- model helpers --

    def status(self):
        return {(QueueType[n["qtype"]], n["queue"]) for n in self.pair.overflow_names()}

    def holder(self, eid):
        return self.pair.overflow if self.pair.overflow.holds(eid) else self.pair.primary

    def fits(self, s, sizes_, freed=()):
        elements = s.elements_used + sum(cost(n)[0] for n in sizes_)
        entries = s.entries_used + sum(cost(n)[1] for n in sizes_)
        elements -= sum(cost(len(m.data))[0] for m in freed)
        entries -= sum(cost(len(m.data))[1] for m in freed)
        return elements <= s.elements_total and entries <= s.entries_total

    def payload(self, size):
        self.serial += 1
        return self.serial.to_bytes(4, "big") * (size // 4) + b"!" * (size % 4)

    def any_eid(self, data):
        return data.draw(st.sampled_from(sorted(self.msgs) + [10**9]))

    def ready(self, key):
        return sorted((m for m in self.msgs.values() if m.place == "ready" and m.key == key),
                      key=lambda m: m.eid)

    def readable(self, key):
        if key[0] == SERIAL and any(m.place == "locked" and m.key == key
                                    for m in self.msgs.values()):
            return None
        queue = self.ready(key)
        return queue[0] if queue else None

    def give_back(self, m, target, failed):
        m.place, m.owner = "ready", None
        if failed and m.count >= MAX_DELIVERIES:
            m.home = m.home or m.key
            m.key = (SUSPEND, m.key[1])
        elif target is not None:
            m.key, m.home = target, None

    def outcome(self, call):
        try:
            return call(), None
        except CQSError as err:
            return None, str(err.reason)

    def entry_reason(self, kind, client, m):
        if m is None:
            return "ENTRY_NOT_FOUND"
        if kind == "delete":
            if client is None:
                return "LOCK_NOT_HELD" if m.place == "locked" else None
            return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"
        if kind == "move":
            return "LOCK_NOT_HELD" if m.place == "locked" and m.owner != client else None
        return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"

    def snapshot(self):
        return [(e.entry_id, e.where, e.owner, e.qtype, e.name, e.delivery_count)
                for e in self.pair]

    # -- rules --

    @rule(key=keys, n=st.integers(1, 8), recoverable=st.booleans())
    def flood(self, key, n, recoverable):
        """Several one-element messages to one queue: what fills a structure."""
        for _ in range(n):
            self.put(key, 100, recoverable)

    @rule(key=keys, size=sizes, recoverable=st.booleans())
    def put(self, key, size, recoverable):
        data = self.payload(size)
        over = key in self.status()
        target = self.pair.overflow if over else self.pair.primary
        want = None if self.fits(target, [size]) else (
            "OVERFLOW_REJECTED" if over else "STRUCTURE_FULL")
        e, reason = self.outcome(lambda: self.pair.put(*key, data, recoverable))
        assert reason == want
        if e is not None:
            assert self.pair.overflow.holds(e.entry_id) == over
            self.msgs[e.entry_id] = Msg(e.entry_id, key, data, recoverable)
        if self.pair.pressure:  # as the daemon does after the request
            self.relieve()

    @rule(client=clients, key=keys)
    def read(self, client, key):
        want = self.readable(key)
        e, reason = self.outcome(lambda: self.pair.read(client, *key))
        assert reason == (None if want else "NO_MESSAGE")
        if e is not None:
            assert e.entry_id == want.eid and bytes(e.data) == want.data
            want.place, want.owner = "locked", client
            want.count += 1

    @rule(client=st.one_of(st.none(), clients), data=st.data())
    def delete(self, client, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        want = self.entry_reason("delete", client, m)
        assert self.outcome(lambda: self.pair.delete(client, eid))[1] == want
        if want is None:
            del self.msgs[eid]

    @rule(client=st.one_of(st.none(), clients), key=keys, data=st.data())
    def move(self, client, key, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        want = self.entry_reason("move", client, m)
        assert self.outcome(lambda: self.pair.move(client, eid, *key))[1] == want
        if want is None:
            m.place, m.owner, m.key, m.home = "ready", None, key, None

    @rule(client=clients, failed=st.booleans(), dest=st.one_of(st.none(), keys), data=st.data())
    def unlock(self, client, failed, dest, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        want = self.entry_reason("unlock", client, m)
        kw = {"qtype": dest[0], "name": dest[1]} if dest else {}
        assert self.outcome(lambda: self.pair.unlock(client, eid, failed=failed, **kw))[1] == want
        if want is None:
            self.give_back(m, dest, failed)

    @rule(client=clients, data=st.data())
    def commit(self, client, data):
        """A random batch: refused for exactly the reason that applies, or applied whole."""
        status = self.status()
        ops = []
        for _ in range(data.draw(st.integers(1, 4))):
            kind = data.draw(st.sampled_from(["put", "delete", "move", "unlock"]))
            if kind == "put":
                ops.append(Put(*data.draw(keys), self.payload(data.draw(sizes))))
            elif kind == "delete":
                ops.append(Delete(self.any_eid(data)))
            elif kind == "move":
                ops.append(Move(self.any_eid(data), *data.draw(keys)))
            else:
                ops.append(Unlock(self.any_eid(data), data.draw(st.booleans())))
        want = self.commit_reason(client, ops, status)
        before = self.snapshot()
        results, reason = self.outcome(lambda: self.pair.commit(client, ops))
        assert reason == want
        if reason is not None:
            assert self.snapshot() == before, "a refused commit changed something"
            return
        for op, e in zip(ops, results, strict=True):
            if type(op) is Put:
                key = (QueueType(op.qtype), op.name)
                assert self.pair.overflow.holds(e.entry_id) == (key in status)
                self.msgs[e.entry_id] = Msg(e.entry_id, key, op.data, True)
            elif type(op) is Delete:
                del self.msgs[op.entry_id]
            elif type(op) is Move:
                m = self.msgs[op.entry_id]
                m.place, m.owner, m.key, m.home = "ready", None, (op.qtype, op.name), None
            else:
                self.give_back(self.msgs[op.entry_id], None, op.failed)

    def commit_reason(self, client, ops, status):
        """Each structure checks its share of the batch in order, the primary first:
        the first entry that fails, else its puts not fitting."""
        kinds = {Delete: "delete", Move: "move", Unlock: "unlock"}
        for s, space in [(self.pair.primary, "STRUCTURE_FULL"),
                         (self.pair.overflow, "OVERFLOW_REJECTED")]:
            mine = [op for op in ops if (
                ((QueueType(op.qtype), op.name) in status) == (s is self.pair.overflow)
                if type(op) is Put else self.holder(op.entry_id) is s)]
            seen, freed, reason = set(), [], None
            for op in mine:
                if type(op) is Put:
                    continue
                m = self.msgs.get(op.entry_id)
                reason = "INVALID_REQUEST" if op.entry_id in seen else self.entry_reason(
                    kinds[type(op)], client, m)
                if reason:
                    return reason
                seen.add(op.entry_id)
                if type(op) is Delete:
                    freed.append(m)
            puts = [len(op.data) for op in mine if type(op) is Put]
            if puts and not self.fits(s, puts, freed):
                return space
        return None

    @rule(client=clients)
    def release_client(self, client):
        self.pair.release_client(client)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                self.give_back(m, None, failed=True)

    @rule(client=clients)
    def cold_client(self, client):
        self.pair.cold_client(client)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                m.place = "cold"

    @precondition(lambda self: any(m.place == "cold" or m.home for m in self.msgs.values()))
    @rule(data=st.data())
    def requeue(self, data):
        eid = data.draw(st.sampled_from(sorted(
            e for e, m in self.msgs.items()
            if m.place == "cold" or (m.home and m.place == "ready"))))
        self.pair.requeue(eid)
        m = self.msgs[eid]
        if m.place == "ready":
            m.key, m.home = m.home, None
        m.place, m.owner, m.count = "ready", None, 0

    @rule(key=keys)
    def dequeue(self, key):
        gone = [e.entry_id for e in self.pair.dequeue(*key)]
        assert gone == [m.eid for m in self.ready(key)]
        for eid in gone:
            del self.msgs[eid]

    @rule()
    def relieve(self):
        relief = self.pair.relieve()
        if relief is not None:
            chosen = {(QueueType[c["qtype"]], c["queue"]) for c in relief.selected}
            assert chosen <= self.status()
            assert (QueueType.LTERM, "C") not in chosen

    @rule(limit=st.integers(1, 3))
    def move_some(self, limit):
        assert self.pair.move_some(limit) <= limit

    @rule(key=keys, limit=st.integers(1, 3))
    def browse_pages(self, key, limit):
        seen, cursor = [], None
        while True:
            page, cursor = self.pair.browse(*key, after=cursor, limit=limit)
            seen += page
            if cursor is None:
                break
        assert [e.entry_id for e in seen] == [m.eid for m in self.ready(key)]

    # -- invariants --

    steps = 0

    @invariant()
    def count_steps(self):
        type(self).steps += 1

    @invariant()
    def agrees_with_model(self):
        engine = {e.entry_id: e for e in self.pair}
        assert set(engine) == set(self.msgs)
        for eid, m in self.msgs.items():
            e = engine[eid]
            assert (e.where, e.owner, (e.qtype, e.name)) == (m.place, m.owner, m.key)
            assert e.delivery_count == m.count and (e.home is None) == (m.home is None)
            assert self.pair.primary.holds(eid) != self.pair.overflow.holds(eid)

    @invariant()
    def overflow_status_follows_placement(self):
        """Ready in the overflow structure implies overflow status; overflow status
        implies ready messages somewhere."""
        status = self.status()
        assert set(self.pair.overflow.ready_keys()) <= status
        for key in status:
            assert self.pair.primary.has_ready(key) or self.pair.overflow.has_ready(key)
        assert self.pair.overflow_mode == bool(status)

    @invariant()
    def capacity_per_structure(self):
        for s in (self.pair.primary, self.pair.overflow):
            held = [cost(len(m.data)) for m in self.msgs.values() if s.holds(m.eid)]
            assert (s.elements_used, s.entries_used) == (sum(c[0] for c in held),
                                                         sum(c[1] for c in held))
            assert s.elements_used <= s.elements_total and s.entries_used <= s.entries_total

    @invariant()
    def browse_all_is_each_message_once_in_order(self):
        everything, cursor = [], None
        while True:
            page, cursor = self.pair.browse(after=cursor, limit=5)
            everything += page
            if cursor is None:
                break
        assert sorted(e.entry_id for e in everything) == sorted(self.msgs)
        assert [position(e) for e in everything] == sorted(position(e) for e in everything)

    @invariant()
    def log_records_fold_to_each_structure(self):
        record = self.pair.take_record()
        if record is not None:
            record = msgpack.unpackb(msgpack.packb(record), raw=False)
        for s in (self.pair.primary, self.pair.overflow):
            if record is not None:
                fold(self.images[s.name], [record], s.name)
            assert self.images[s.name] == {i: r for i, r in rows_of(s).items() if r[RECOVERABLE]}

    @invariant()
    def serial_rule_across_both(self):
        locked = [m.key for m in self.msgs.values() if m.place == "locked" and m.key[0] == SERIAL]
        assert len(locked) == len(set(locked))


class PassThroughVersusModel(EngineVersusModel):
    """The single-structure model, run through a pair with overflow processing off:
    what the daemon's fast path must be."""

    def __init__(self):
        super().__init__()
        self.s = StructurePair(self.s, threshold=100)

    @invariant()
    def log_effects_fold_to_the_recoverable_content(self):
        record = self.s.take_record()
        if record is not None:
            fold(self.replayed, [msgpack.unpackb(msgpack.packb(record), raw=False)], "SQ")
        live = {i: row for i, row in rows_of(self.s).items() if row[RECOVERABLE]}
        assert self.replayed == live

    @invariant()
    def capacity_arithmetic(self):
        elements, entries = self.used()
        assert (self.s.primary.elements_used, self.s.primary.entries_used) == (elements, entries)
        assert sum(r["elements"] for r in self.s.header_stats()) == elements


def run(machine, examples):
    machine.steps = 0
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow], print_blob=True,
    ))
    return machine.steps


def test_pair_agrees_with_model_over_random_histories():
    """At least 3,000 random steps of puts, reads, commits, reliefs and moves."""
    assert run(PairVersusModel, 100) >= 3000


def test_a_pair_without_overflow_is_the_structure():
    """The single-structure model holds through a pair with overflow processing off."""
    assert run(PassThroughVersusModel, 30) >= 600
