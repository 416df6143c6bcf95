"""The structure engine against a deliberately simple model, over long random histories.

The model keeps every message in one flat dict with its place spelled out
(queue key, or lock owner, or cold), and derives everything else by scanning,
so it is slow and obviously right; the engine must agree with it after every step.
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
from cqsd.recovery.fold import RECOVERABLE, fold, rows_of

ENTRY_MAX = 700
SIZE = 40 * 512  # 40 data elements: small enough to fill often
MAX_ENTRIES = 30
MAX_DELIVERIES = 3
CLIENTS = ["IMS1", "IMS2", "IMS3"]
TYPES = [QueueType.TRAN, QueueType.TRAN_SERIAL, QueueType.LTERM, QueueType.TRAN_SUSPEND]
NAMES = ["A", "B", "TRANX"]
SUSPEND = QueueType.TRAN_SUSPEND

clients = st.sampled_from(CLIENTS)
keys = st.tuples(st.sampled_from(TYPES), st.sampled_from(NAMES))
sizes = st.one_of(st.integers(0, 600), st.integers(ENTRY_MAX + 1, 3 * ENTRY_MAX + 50))


def cost(n):
    """Elements and entries of a message, counted the slow way: segment by segment."""
    pieces = [n] if n <= ENTRY_MAX else [min(ENTRY_MAX, n - o) for o in range(0, n, ENTRY_MAX)]
    return sum(math.ceil((p + 64) / 512) for p in pieces), len(pieces)


class Msg:
    def __init__(self, eid, key, data):
        self.eid, self.key, self.data = eid, key, data
        self.place = "ready"  # or "locked", "cold"
        self.owner = None
        self.count = 0
        self.home = None


class EngineVersusModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        ticks = itertools.count(1)
        self.s = Structure(
            "SQ", SIZE, entry_max=ENTRY_MAX, max_entries=MAX_ENTRIES,
            max_deliveries=MAX_DELIVERIES, clock=lambda: next(ticks),
        )
        self.msgs: dict[int, Msg] = {}
        self.serial = 0
        self.replayed: dict[int, list] = {}  # the fold of every effect logged so far

    # -- model helpers --

    def ready(self, key):
        return sorted((m for m in self.msgs.values() if m.place == "ready" and m.key == key),
                      key=lambda m: m.eid)

    def used(self):
        totals = [cost(len(m.data)) for m in self.msgs.values()]
        return sum(t[0] for t in totals), sum(t[1] for t in totals)

    def fits(self, sizes_):
        e, n = self.used()
        for size in sizes_:
            c = cost(size)
            e, n = e + c[0], n + c[1]
        return e <= SIZE // 512 and n <= MAX_ENTRIES

    def payload(self, size):
        self.serial += 1
        return self.serial.to_bytes(4, "big") * (size // 4) + b"!" * (size % 4)

    def any_eid(self, data):
        pool = sorted(self.msgs) + [10**9]
        return data.draw(st.sampled_from(pool))

    def readable(self, key):
        if key[0] == QueueType.TRAN_SERIAL and any(
            m.place == "locked" and m.key == key for m in self.msgs.values()
        ):
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

    def expect(self, reason, call):
        try:
            result = call()
        except CQSError as err:
            assert err.reason == reason, (err, reason)
            return None
        assert reason is None, f"expected {reason}"
        return result

    # -- rules --

    @rule(key=keys, size=sizes, recoverable=st.booleans())
    def put(self, key, size, recoverable):
        data = self.payload(size)
        fits = self.fits([size])
        e = self.expect(
            None if fits else "STRUCTURE_FULL", lambda: self.s.put(*key, data, recoverable)
        )
        if e is not None:
            self.msgs[e.entry_id] = Msg(e.entry_id, key, data)

    @rule(client=clients, key=keys)
    def read(self, client, key):
        want = self.readable(key)
        e = self.expect(None if want else "NO_MESSAGE", lambda: self.s.read(client, *key))
        if e is not None:
            assert e.entry_id == want.eid and bytes(e.data) == want.data
            want.place, want.owner = "locked", client
            want.count += 1
            assert e.delivery_count == want.count

    @rule(client=st.one_of(st.none(), clients), data=st.data())
    def delete(self, client, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.delete_reason(client, m)
        self.expect(reason, lambda: self.s.delete(client, eid))
        if reason is None:
            del self.msgs[eid]

    def delete_reason(self, client, m):
        if m is None:
            return "ENTRY_NOT_FOUND"
        if client is None:
            return "LOCK_NOT_HELD" if m.place == "locked" else None
        return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"

    def move_reason(self, client, m):
        if m is None:
            return "ENTRY_NOT_FOUND"
        return "LOCK_NOT_HELD" if m.place == "locked" and m.owner != client else None

    def unlock_reason(self, client, m):
        if m is None:
            return "ENTRY_NOT_FOUND"
        return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"

    @rule(client=st.one_of(st.none(), clients), key=keys, data=st.data())
    def move(self, client, key, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.move_reason(client, m)
        self.expect(reason, lambda: self.s.move(client, eid, *key))
        if reason is None:
            m.place, m.owner, m.key, m.home = "ready", None, key, None

    @rule(client=clients, failed=st.booleans(), dest=st.one_of(st.none(), keys), data=st.data())
    def unlock(self, client, failed, dest, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.unlock_reason(client, m)
        kw = {"qtype": dest[0], "name": dest[1]} if dest else {}
        self.expect(reason, lambda: self.s.unlock(client, eid, failed=failed, **kw))
        if reason is None:
            self.give_back(m, dest, failed)

    @rule(client=clients, data=st.data())
    def commit(self, client, data):
        """A random batch; the model decides the one reason it must fail, or applies it all."""
        n = data.draw(st.integers(1, 4))
        ops, reason, seen = [], None, set()
        for _ in range(n):
            kind = data.draw(st.sampled_from(["put", "delete", "move", "unlock"]))
            if kind == "put":
                key, size = data.draw(keys), data.draw(sizes)
                ops.append(Put(*key, self.payload(size)))
                continue
            eid = self.any_eid(data)
            m = self.msgs.get(eid)
            if eid in seen:
                reason = reason or "INVALID_REQUEST"
            seen.add(eid)
            if kind == "delete":
                ops.append(Delete(eid))
                reason = reason or self.delete_reason(client, m)
            elif kind == "move":
                key = data.draw(keys)
                ops.append(Move(eid, *key))
                reason = reason or self.move_reason(client, m)
            else:
                ops.append(Unlock(eid, data.draw(st.booleans())))
                reason = reason or self.unlock_reason(client, m)
        if reason is None:
            freed = [self.msgs[o.entry_id] for o in ops if type(o) is Delete]
            saved = {m.eid: self.msgs.pop(m.eid) for m in freed}
            fits = self.fits([len(o.data) for o in ops if type(o) is Put])
            self.msgs.update(saved)
            reason = None if fits else "STRUCTURE_FULL"
        before = self.snapshot()
        results = self.expect(reason, lambda: self.s.commit(client, ops))
        if results is None:
            assert self.snapshot() == before, "a refused commit changed something"
            return
        for op, e in zip(ops, results, strict=True):
            if type(op) is Put:
                self.msgs[e.entry_id] = Msg(e.entry_id, (op.qtype, op.name), op.data)
            elif type(op) is Delete:
                del self.msgs[op.entry_id]
            elif type(op) is Move:
                m = self.msgs[op.entry_id]
                m.place, m.owner, m.key, m.home = "ready", None, (op.qtype, op.name), None
            else:
                self.give_back(self.msgs[op.entry_id], None, op.failed)

    @rule(client=clients)
    def release_client(self, client):
        self.s.release_client(client)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                self.give_back(m, None, failed=True)

    @rule(client=clients)
    def cold_client(self, client):
        self.s.cold_client(client)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                m.place = "cold"

    @precondition(lambda self: any(m.place == "cold" or m.home for m in self.msgs.values()))
    @rule(data=st.data())
    def requeue(self, data):
        eid = data.draw(st.sampled_from(
            sorted(e for e, m in self.msgs.items() if m.place == "cold" or (m.home and m.place == "ready"))
        ))
        self.s.requeue(eid)
        m = self.msgs[eid]
        if m.place == "ready":
            m.key, m.home = m.home, None
        m.place, m.owner, m.count = "ready", None, 0

    @rule(key=keys, limit=st.integers(1, 4))
    def browse_pages(self, key, limit):
        """Paging through a queue with a cursor shows exactly the model's queue, in order."""
        seen, cursor = [], None
        while True:
            page, cursor = self.s.browse(*key, after=cursor, limit=limit)
            seen += page
            if cursor is None:
                break
        assert [(e.entry_id, bytes(e.data)) for e in seen] == [(m.eid, m.data) for m in self.ready(key)]

    # -- invariants --

    steps = 0

    @invariant()
    def count_steps(self):
        type(self).steps += 1

    def snapshot(self):
        return [(e.entry_id, e.where, e.owner, e.qtype, e.name, e.delivery_count) for e in self.s]

    @invariant()
    def agrees_with_model(self):
        engine = {e.entry_id: e for e in self.s}
        assert set(engine) == set(self.msgs)
        for eid, m in self.msgs.items():
            e = engine[eid]
            assert (e.where, e.owner) == (m.place, m.owner)
            assert (e.qtype, e.name) == m.key
            assert e.delivery_count == m.count
            assert (e.home is None) == (m.home is None)

    @invariant()
    def fifo_and_no_entry_in_two_places(self):
        everything, cursor = [], None
        while True:
            page, cursor = self.s.browse(after=cursor, limit=7)
            everything += page
            if cursor is None:
                break
        found = [e.entry_id for e in everything]
        assert sorted(found) == sorted(self.msgs), "browse-all must show each message exactly once"
        assert all(e.qtype not in (2, 6) for e in everything), "a staging segment was visible"
        for key in {m.key for m in self.msgs.values()}:
            queue = [e.entry_id for e in self.s.browse(*key, limit=1000)[0]]
            assert queue == sorted(queue)

    @invariant()
    def log_effects_fold_to_the_recoverable_content(self):
        """Replaying the effects (through msgpack, as the log stores them) gives the
        recoverable messages exactly as the engine holds them."""
        record = msgpack.unpackb(msgpack.packb({"s": "SQ", "e": self.s.effects}), raw=False)
        self.s.effects.clear()
        fold(self.replayed, [record], "SQ")
        live = {i: row for i, row in rows_of(self.s).items() if row[RECOVERABLE]}
        assert self.replayed == live

    @invariant()
    def capacity_arithmetic(self):
        elements, entries = self.used()
        assert (self.s.elements_used, self.s.entries_used) == (elements, entries)
        assert elements <= SIZE // 512 and entries <= MAX_ENTRIES
        rows = self.s.header_stats()
        assert sum(r["elements"] for r in rows) == elements
        assert sum(r["entries"] for r in rows) == entries

    @invariant()
    def lock_ownership_and_serial_rule(self):
        for client in CLIENTS:
            want = sorted(e for e, m in self.msgs.items() if m.place == "locked" and m.owner == client)
            assert [e.entry_id for e in self.s.client_locks(client)] == want
        serial_locked = [m.key for m in self.msgs.values()
                         if m.place == "locked" and m.key[0] == QueueType.TRAN_SERIAL]
        assert len(serial_locked) == len(set(serial_locked))


def test_engine_agrees_with_model_over_random_histories():
    """At least 2,000 random steps across clients, types, long messages and a full structure."""
    EngineVersusModel.steps = 0
    run_state_machine_as_test(
        EngineVersusModel,
        settings=settings(
            max_examples=80,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            print_blob=True,
        ),
    )
    assert EngineVersusModel.steps >= 2000, f"only {EngineVersusModel.steps} steps ran"
