"""The model the engine's state machines check against, and the rules they share.

The model keeps every message in one flat dict with its place spelled out (queue
key, or lock owner, or cold), and derives everything else by scanning, so it is
slow and obviously right; the engine must agree with it after every step. A lone
structure and a primary/overflow pair answer the same requests with the same
outcomes, so one model and one set of rules serve both: a machine adds only what
its engine decides differently (where a put goes and whether it fits, how its log
and its capacity add up).

Time is the machine's: a wall clock (``wall``, the ids' and not_before's, in
ticks) and a monotonic one (``mono``, the leases'), which only ``tick`` moves;
``tick`` then expires leases and ripens delayed puts, as the daemon's timer does.
"""

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

from cqsd.engine import CQSError, Delete, Move, Put, QueueType, Unlock
from cqsd.records import RECOVERABLE, rows_of

ENTRY_MAX = 700
MAX_DELIVERIES = 3
TYPES = [QueueType.TRAN, QueueType.TRAN_SERIAL, QueueType.LTERM, QueueType.TRAN_SUSPEND]
SUSPEND, SERIAL = QueueType.TRAN_SUSPEND, QueueType.TRAN_SERIAL


def cost(n):
    """Elements and entries of a message, counted the slow way: segment by segment."""
    pieces = [n] if n <= ENTRY_MAX else [min(ENTRY_MAX, n - o) for o in range(0, n, ENTRY_MAX)]
    return sum(math.ceil((p + 64) / 512) for p in pieces), len(pieces)


def as_logged(record):
    """A log record after the trip through msgpack the log gives it, so a fold sees
    what recovery would."""
    return msgpack.unpackb(msgpack.packb(record), raw=False)


def recoverable_rows(s):
    """What a fold of the log must come to: the rows recovery would bring back."""
    return {i: row for i, row in rows_of(s).items() if row[RECOVERABLE]}


def run(machine, examples):
    """Run a machine over long histories; the step count lets a test insist on them."""
    machine.steps = 0
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow], print_blob=True,
    ))
    return machine.steps


def machines_own(name):
    """The machines exercise different clients and queues; a shared rule draws from
    the running machine's strategy of that name, not from one fixed list."""
    return st.runner().flatmap(lambda machine: getattr(machine, name))


clients, keys = machines_own("clients"), machines_own("keys")


DELAYS = st.sampled_from([0, 0, 0, 1, 3])  # wall ticks a put is delayed by (0: not)
LEASES = st.sampled_from([None, 0.5, 1.0, 2.5])  # a read's lease, monotonic seconds


class Msg:
    def __init__(self, eid, key, data, not_before=None):
        self.eid, self.key, self.data = eid, key, data
        self.place = "ready" if not_before is None else "delayed"  # or "locked", "cold"
        self.owner = None
        self.count = 0
        self.home = None  # where a suspended message goes back to on requeue
        self.deadline = None  # a leased lock's, monotonic
        self.not_before = not_before


class ModelMachine(RuleBasedStateMachine):
    """The requests and invariants that do not depend on how many structures hold
    the messages. A subclass sets the strategies `clients`, `keys` and `sizes`, hands
    its engine to __init__, and adds `put`, `commit_reason` and the invariants on
    its log and capacity; a pair also overrides `status` and `in_overflow`."""

    def __init__(self, s):
        super().__init__()
        self.s = s
        self.msgs: dict[int, Msg] = {}
        self.serial = 0

    # the clocks the subclasses give their structures (``wall`` is set first)
    wall = 1
    mono = 0.0

    def wall_clock(self):
        return self.wall

    def mono_clock(self):
        return self.mono

    def later(self, delay):
        """The put arguments of a delay (none: not delayed)."""
        return {"not_before": self.wall + delay} if delay else {}

    def admit(self, e, key, data, delay):
        self.msgs[e.entry_id] = Msg(e.entry_id, key, data, self.wall + delay if delay else None)

    # -- model helpers --

    def status(self):
        """The queues whose puts go to the overflow structure: none, without one."""
        return set()

    def in_overflow(self, eid):
        return False

    def ready(self, key):
        return sorted((m for m in self.msgs.values() if m.place == "ready" and m.key == key),
                      key=lambda m: m.eid)

    def readable(self, key):
        if key[0] == SERIAL and any(m.place == "locked" and m.key == key
                                    for m in self.msgs.values()):
            return None
        queue = self.ready(key)
        return queue[0] if queue else None

    def payload(self, size):
        """Data unique to each put, so a read of the wrong message shows."""
        self.serial += 1
        return self.serial.to_bytes(4, "big") * (size // 4) + b"!" * (size % 4)

    def any_eid(self, data):
        """An entry the model holds, or one that never existed."""
        return data.draw(st.sampled_from(sorted(self.msgs) + [10**9]))

    def give_back(self, m, target, failed):
        m.place, m.owner, m.deadline = "ready", None, None
        if failed and m.count >= MAX_DELIVERIES:
            m.home = m.home or m.key
            m.key = (SUSPEND, m.key[1])
        elif target is not None:
            m.key, m.home = target, None

    def expect(self, reason, call):
        """The call's result, having checked it failed for exactly `reason` (None: not at all)."""
        try:
            result = call()
        except CQSError as err:
            assert err.reason == reason, (err, reason)
            return None
        assert reason is None, f"expected {reason}"
        return result

    def entry_reason(self, kind, client, m):
        """Why a Delete, Move or Unlock of m by client must be refused, if it must."""
        if m is None:
            return "ENTRY_NOT_FOUND"
        if kind is Delete:
            if client is None:
                return "LOCK_NOT_HELD" if m.place == "locked" else None
            return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"
        if kind is Move:
            return "LOCK_NOT_HELD" if m.place == "locked" and m.owner != client else None
        return None if m.place == "locked" and m.owner == client else "LOCK_NOT_HELD"

    def batch_reason(self, client, ops):
        """Why a batch's entries refuse it: the first that fails, or one named twice."""
        seen = set()
        for op in ops:
            if type(op) is Put:
                continue
            reason = "INVALID_REQUEST" if op.entry_id in seen else self.entry_reason(
                type(op), client, self.msgs.get(op.entry_id))
            if reason:
                return reason
            seen.add(op.entry_id)
        return None

    def freed(self, ops):
        """The messages a batch deletes, whose room its puts may use."""
        return [self.msgs[op.entry_id] for op in ops if type(op) is Delete]

    def snapshot(self):
        return [(e.entry_id, e.where, e.owner, e.qtype, e.name, e.delivery_count) for e in self.s]

    def browse_through(self, *key, limit):
        """Every page of a browse, following the cursor to the end."""
        seen, cursor = [], None
        while True:
            page, cursor = self.s.browse(*key, after=cursor, limit=limit)
            seen += page
            if cursor is None:
                return seen

    # -- rules --

    @rule(client=clients, key=keys, lease=LEASES)
    def read(self, client, key, lease):
        want = self.readable(key)
        e = self.expect(None if want else "NO_MESSAGE", lambda: self.s.read(client, *key, lease))
        if e is not None:
            assert e.entry_id == want.eid and bytes(e.data) == want.data
            want.place, want.owner = "locked", client
            want.deadline = None if lease is None else self.mono + lease
            want.count += 1
            assert e.delivery_count == want.count

    @precondition(lambda self: any(m.place == "ready" for m in self.msgs.values()))
    @rule(client=clients, lease=LEASES, data=st.data())
    def read_some(self, client, lease, data):
        """A read of a queue that has a message, so that locks (and leases) are common."""
        key = data.draw(st.sampled_from(sorted({m.key for m in self.msgs.values()
                                                if m.place == "ready"})))
        self.read(client, key, lease)

    @rule(client=clients, lease=st.sampled_from([0.5, 3.0]), data=st.data())
    def renew(self, client, lease, data):
        """A renew by the lock's holder restarts its lease; anyone else's is refused."""
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.entry_reason(Unlock, client, m)
        self.expect(reason, lambda: self.s.renew(client, eid, lease))
        if reason is None:
            m.deadline = self.mono + lease

    expired = ripened = 0  # over a run, so a test can insist that both happen

    @rule(mono=st.sampled_from([0.0, 0.5, 1.0, 3.0]), wall=st.integers(0, 2),
          spared=st.sampled_from([(), (), ("IMS1",)]))
    def tick(self, mono, wall, spared):
        """Time passes: leases that ran out are failed deliveries (but for a spared
        owner's), delayed puts that are due are ready at their place by id."""
        self.mono += mono
        self.wall += wall
        expired = self.s.expire(self.mono, spared)
        ripe = self.s.ripen(self.wall)
        due = [m for m in self.msgs.values() if m.deadline is not None and m.deadline <= self.mono]
        assert sorted(e.entry_id for e in expired) == sorted(m.eid for m in due)
        for m in due:
            self.give_back(m, None, failed=m.owner not in spared)
        now = [m for m in self.msgs.values()
               if m.place == "delayed" and m.not_before <= self.wall]
        assert sorted(e.entry_id for e in ripe) == sorted(m.eid for m in now)
        for m in now:
            m.place = "ready"
        type(self).expired += len(expired)
        type(self).ripened += len(ripe)

    @rule(client=st.one_of(st.none(), clients), data=st.data())
    def delete(self, client, data):
        eid = self.any_eid(data)
        reason = self.entry_reason(Delete, client, self.msgs.get(eid))
        self.expect(reason, lambda: self.s.delete(client, eid))
        if reason is None:
            del self.msgs[eid]

    @rule(client=st.one_of(st.none(), clients), key=keys, data=st.data())
    def move(self, client, key, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.entry_reason(Move, client, m)
        self.expect(reason, lambda: self.s.move(client, eid, *key))
        if reason is None:  # a delayed message stays delayed
            m.owner, m.key, m.home, m.deadline = None, key, None, None
            m.place = "delayed" if m.place == "delayed" else "ready"

    @rule(client=clients, failed=st.booleans(), dest=st.one_of(st.none(), keys), data=st.data())
    def unlock(self, client, failed, dest, data):
        eid = self.any_eid(data)
        m = self.msgs.get(eid)
        reason = self.entry_reason(Unlock, client, m)
        kw = {"qtype": dest[0], "name": dest[1]} if dest else {}
        self.expect(reason, lambda: self.s.unlock(client, eid, failed=failed, **kw))
        if reason is None:
            self.give_back(m, dest, failed)

    @rule(client=clients, data=st.data())
    def commit(self, client, data):
        """A random batch: refused for exactly the reason that applies, or applied whole."""
        status = self.status()
        ops = []
        for _ in range(data.draw(st.integers(1, 4))):
            kind = data.draw(st.sampled_from(["put", "delete", "move", "unlock"]))
            if kind == "put":
                ops.append(Put(*data.draw(self.keys), self.payload(data.draw(self.sizes)),
                               **self.later(data.draw(DELAYS))))
            elif kind == "delete":
                ops.append(Delete(self.any_eid(data)))
            elif kind == "move":
                ops.append(Move(self.any_eid(data), *data.draw(self.keys)))
            else:
                ops.append(Unlock(self.any_eid(data), data.draw(st.booleans())))
        want = self.commit_reason(client, ops, status)
        before = self.snapshot()
        results = self.expect(want, lambda: self.s.commit(client, ops))
        if results is None:
            assert self.snapshot() == before, "a refused commit changed something"
            return
        for op, e in zip(ops, results, strict=True):
            if type(op) is Put:
                key = (op.qtype, op.name)
                assert self.in_overflow(e.entry_id) == (key in status)
                self.msgs[e.entry_id] = Msg(e.entry_id, key, op.data, op.not_before)
            elif type(op) is Delete:
                del self.msgs[op.entry_id]
            elif type(op) is Move:
                m = self.msgs[op.entry_id]
                m.owner, m.key, m.home, m.deadline = None, (op.qtype, op.name), None, None
                m.place = "delayed" if m.place == "delayed" else "ready"
            else:
                self.give_back(self.msgs[op.entry_id], None, op.failed)

    @rule(client=clients, failed=st.booleans())
    def release_client(self, client, failed):
        """Peer recovery of a client that failed, or of one whose locks a daemon restart
        found (not failed: nothing is suspended, the delivery counts stay)."""
        self.s.release_client(client, failed)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                self.give_back(m, None, failed=failed)

    @rule(client=clients)
    def cold_client(self, client):
        self.s.cold_client(client)
        for m in self.msgs.values():
            if m.place == "locked" and m.owner == client:
                m.place, m.deadline = "cold", None

    @precondition(lambda self: any(m.place == "cold" or (m.home and m.place == "ready")
                                   for m in self.msgs.values()))
    @rule(data=st.data())
    def requeue(self, data):
        eid = data.draw(st.sampled_from(sorted(
            e for e, m in self.msgs.items()
            if m.place == "cold" or (m.home and m.place == "ready"))))
        self.s.requeue(eid)
        m = self.msgs[eid]
        if m.place == "ready":
            m.key, m.home = m.home, None
        m.place, m.owner, m.count = "ready", None, 0

    @rule(key=keys, limit=st.integers(1, 4))
    def browse_pages(self, key, limit):
        """Paging through a queue with a cursor shows exactly the model's queue, in order."""
        seen = self.browse_through(*key, limit=limit)
        assert ([(e.entry_id, bytes(e.data)) for e in seen]
                == [(m.eid, m.data) for m in self.ready(key)])

    # -- invariants --

    steps = 0

    @invariant()
    def count_steps(self):
        type(self).steps += 1

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
            assert (e.lease[2] if e.lease else None) == m.deadline
            assert e.not_before == m.not_before

    @invariant()
    def serial_rule(self):
        locked = [m.key for m in self.msgs.values() if m.place == "locked" and m.key[0] == SERIAL]
        assert len(locked) == len(set(locked))
