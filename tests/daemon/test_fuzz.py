"""A live-daemon fuzzer (issue 11): a Hypothesis state machine drives a real
`cqsd run` with random sequences of every request of docs/protocol.md, from
several clients at once (the SMDS commands among them: fuzz_smds.py), through
the SDK and through raw frames (unknown, missing and wrong-typed fields,
unknown ops, bad ids, garbage, truncated and oversized frames), with sizes
from 0 bytes to past every limit, and clients that drop, re-register warm and
cold, and come back after a daemon restart.

After every step the daemon must still be running and answering on a fresh
connection, its log must hold no traceback, and what it stores must be what
the model (fuzz_model.py) says: every acknowledged message where the requests
left it, nothing a refused request touched changed, the space accounted for.
A refusal must carry a reason code of docs/protocol.md; a protocol error may close its
connection but never the daemon.

Budgets. In the suite the machine runs a fixed set of examples (derandomized:
the same sequences every run, so it cannot flake on a new seed). With
``CQSD_FUZZ_SECONDS=N`` it instead runs for N seconds from random seeds, in
chunks of CHUNK examples, printing each chunk's seed; ``CQSD_FUZZ_SEED=S``
starts from S (replay a chunk with ``CQSD_FUZZ_SEED=S CQSD_FUZZ_SECONDS=1``),
and ``CQSD_FUZZ_SPARK=1`` adds the Spark jobs (checkpoint, recover). Run it
with ``pytest -s`` to see the seeds as they go.
"""

import os
import random
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    precondition,
    rule,
)

from cqsproto import max_frame_for, requests
from cqsproto.requests import MAX_REGISTER_FRAME
from logstream.record import MAX_BODY

from .fuzz_bytes import frame_size, payload, terse
from .fuzz_checks import CHECKER, MAX_BATCH, Checks, check_page
from .fuzz_clients import ConnectionRules, locked_ids
from .fuzz_draws import (
    BAD_IDS,
    CAPACITY,
    CLIENTS,
    KINDS,
    LONG_LEASE,
    MAX_PEERS,
    MAX_WAIT,
    SHAPES,
    KiB,
    MiB,
    commit_ops,
    counts,
    delay_valid,
    delays,
    eids,
    good_keys,
    keys,
    lease_valid,
    leases,
    next_reads,
    operator_structures,
    picks,
    qtypes,
    queues,
    sizes,
    structures,
    waits,
    with_timing,
)
from .fuzz_model import Model, digest, qtype_name, valid_queue
from .fuzz_peers import ANSWER_TIMEOUT, RawPeer, sdk_request
from .fuzz_smds import SmdsRules
from .harness import Daemon

# Crashes found and not yet fixed: the fuzzer steers around these exact inputs so
# that it can look for others. Remove an entry once its fix is merged.
UNSYNCED_LOCK = "recover-waits-for-an-unsynced-lock-record"
LOST_WAKEUP = "a-waiting-read-misses-a-put-before-its-task-starts"
BIG_MOVE_BATCH = "overflow-moves-log-past-16MiB"
KNOWN_CRASHES: set[str] = set()  # every crash found so far is fixed (test_found.py)

SECONDS = float(os.environ.get("CQSD_FUZZ_SECONDS") or 0)
SPARK = os.environ.get("CQSD_FUZZ_SPARK", "") not in ("", "0")
# in `make test`: the same 50 derandomized sequences each run, ~1.7 s each (100 were
# the suite's longest test, 190-220 s of its 20 minutes); CQSD_FUZZ_SECONDS runs new ones
IN_SUITE_EXAMPLES = 50
CHUNK = 20  # examples per seed in the long run
STEPS = 50  # steps per example
# docs/robustness.md: a recoverable put, or a commit's recoverable puts together,
# fit one log record of 16 MiB less 64 KiB of headroom (less a few bytes an op).
RECORD = MAX_BODY - 64 * KiB
MAY_BE_TOO_LARGE = {"MESSAGE_TOO_LARGE"}
SPARK_TIMEOUT = 600.0


class DaemonFuzz(ConnectionRules, SmdsRules, Checks, RuleBasedStateMachine):
    """Clients, raw and SDK, against one daemon per example; the model says what
    must be stored after every step (fuzz_checks.py checks it)."""

    spark = False

    def __init__(self) -> None:
        super().__init__()
        self.d: Daemon | None = None
        self.peers: list = []
        self.checker: RawPeer | None = None

    # -- set-up and tear-down ---------------------------------------------------------

    @initialize(shape=st.sampled_from(["small"] * 4 + ["wide"] * 3 + ["smds"] * 3 + ["big"]),
                grace=st.sampled_from([0, 3600]), max_deliveries=st.sampled_from([1, 2]))
    def start(self, shape, grace, max_deliveries):
        self.shape, self.big = SHAPES[shape], shape == "big"
        keys_, structures_ = self.shape.toml(grace, max_deliveries)
        self.d = Daemon(keys_, structures_).start()
        self.max_frame = max_frame_for(self.shape.max_message)
        self.sizes = {"MSGQ01": self.shape.initsize, "MSGQ01OV": self.shape.ov, "SMALL": 8 * KiB}
        self.model = Model({"MSGQ01": self.shape.entry_max, "SMALL": KiB}, max_deliveries, grace,
                           frozenset({"MSGQ01"} if self.shape.offload else ()))
        self.log_seen = 0
        self.unsynced = False  # a lock record may be the log's last, not yet synced
        self.connect_checker()
        self.ready_before = set()
        self.quiet = set()  # queues whose only work this step went to waiting readers
        Checks.stats["examples"] += 1
        self.connect_with_the_sdk("A", False)
        self.connect_raw("B", False, "yes")

    def connect_checker(self):
        self.checker = RawPeer(self.d.socket)
        assert self.checker.register(CHECKER).ok

    def teardown(self):
        for peer in self.peers:
            peer.close()
        if self.d is not None:
            self.d.cleanup()

    # -- peers -----------------------------------------------------------------------

    def live(self, registered=None):
        self.peers = [p for p in self.peers if not p.closed]
        return [p for p in self.peers if registered is None or (p.client is not None) == registered]

    def pick(self, i, registered=None):
        live = self.live(registered)
        return live[i % len(live)]

    def lost_count(self, client):
        return sum(1 for e in self.d.events("connection_lost") if e.get("client") == client)

    def wait_lost(self, client, before):
        """Until the daemon has handled the end of ``client``'s connection (its
        connection_lost event); then the model applies peer recovery."""
        self.await_log(lambda: self.lost_count(client) > before,
                       f"the daemon did not notice that {client}'s connection ended")
        self.model.dropped(client)

    def await_log(self, logged, failure):
        """Until ``logged()`` holds of the daemon's log (each line read wakes us)."""
        deadline = time.monotonic() + 20
        with self.d._logged:
            while not logged():
                left = deadline - time.monotonic()
                assert left > 0 and self.d.proc.poll() is None, failure
                self.d._logged.wait(left)

    def ended(self, peer, before):
        """``peer``'s connection is gone without a deregister."""
        peer.closed = True
        if peer.client is not None:
            self.wait_lost(peer.client, before)

    def send(self, peer, op, fields, timeout=None):
        """One request on ``peer``; its Reply, or None if the connection ended."""
        Checks.stats[op] += 1
        if peer.kind == "sdk":
            return sdk_request(peer, op, fields, timeout)
        return peer.request(op, timeout=timeout or ANSWER_TIMEOUT, **fields)

    def too_big(self, peer, op, fields):
        """Whether the request's frame is past the daemon's frame limit: max_message
        plus headroom, and 64 KiB until the client has registered (the SDK's own
        limit is the same: it refuses such a request before sending)."""
        size = peer.body_size(op, **fields) if peer.kind == "raw" else frame_size(op, fields)
        return size > (self.max_frame if peer.client is not None else MAX_REGISTER_FRAME)

    def judge(self, reply, faults, may=(), on_ok=None):
        """A reply must refuse with one of ``faults`` if there are any; otherwise it
        succeeds (``on_ok`` applies it to the model), or is refused with one of
        ``may`` (for space, say). A refusal changed nothing: the next check sees to it."""
        assert reply is not None, "the daemon closed a connection over a well-formed request"
        allowed = set(faults) | set(may)
        if reply.ok:
            assert not faults, f"accepted a request it must refuse with one of {sorted(faults)}"
            if on_ok is not None:
                on_ok(reply.result)
        else:
            assert reply.reason in allowed, (
                f"refused with {reply.reason} ({reply.message}); expected "
                + (f"one of {sorted(allowed)}" if faults else
                   f"success{' or one of ' + str(sorted(allowed)) if allowed else ''}"))

    # -- what the model says about fields ------------------------------------------------

    def structure_faults(self, name, operator=False):
        known = {"MSGQ01", "SMALL"} | ({"MSGQ01OV"} if operator else set())
        return set() if name in known else {"UNKNOWN_STRUCTURE"}

    @staticmethod
    def key_faults(qtype, queue):
        valid = qtype_name(qtype) is not None and valid_queue(queue)
        return set() if valid else {"INVALID_REQUEST"}

    def entry(self, choice, structure):
        """An entry id for a rule: held (any structure's, so a wrong structure is
        tried too), deleted before, or never handed out."""
        kind, i = choice
        held = sorted(self.model.msgs)
        mine = [e for e in held if self.model.msgs[e].structure == structure]
        if kind == "held" and held:
            pool = mine if mine and i % 4 else held
            return pool[i % len(pool)]
        if kind == "gone" and self.model.gone:
            gone = sorted(self.model.gone)
            return gone[i % len(gone)]
        return BAD_IDS[i % len(BAD_IDS)]

    def size(self, spec, structure):
        if isinstance(spec, int):
            return spec
        mark, delta = spec
        base = {"entry_max": self.model.entry_max.get(structure, KiB),
                "entry_max2": 2 * self.model.entry_max.get(structure, KiB),
                "struct": self.sizes.get(structure, 8 * KiB) - 64 * 4,
                "max_message": self.shape.max_message,
                "frame": self.max_frame - 100, "half_log": MAX_BODY // 2, "log": MAX_BODY - 64,
                "20MiB": 20 * MiB}[mark]
        n = base + delta * (64 if mark in ("struct", "half_log", "log", "frame") else 1)
        return max(0, min(n, 32 * MiB if self.big else self.max_frame + 64))

    def moves_too_much(self, recoverable_bytes, structure):
        """Whether a put could leave enough recoverable data in a structure with an
        overflow structure for one batch of overflow moves to pass the log's
        record budget: a known crash while it is listed."""
        if BIG_MOVE_BATCH not in KNOWN_CRASHES or structure != "MSGQ01":
            return False
        held = sum(m.digest[0] for m in self.model.msgs.values()
                   if m.structure == structure and m.recoverable)
        return held + recoverable_bytes > RECORD

    def size_faults(self, sizes, recoverable_bytes, ops=1):
        """(must, may) refuse MESSAGE_TOO_LARGE: past max_message, or recoverable
        payloads past one log record (docs/robustness.md)."""
        must = any(n > self.shape.max_message for n in sizes) or recoverable_bytes > RECORD
        may = recoverable_bytes + 128 * ops > RECORD - KiB
        return ({"MESSAGE_TOO_LARGE"} if must else set()), (MAY_BE_TOO_LARGE if may else set())

    # -- messages ------------------------------------------------------------------------

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, key=keys, size=sizes, recoverable=st.booleans(),
          brief=st.booleans(), timing=delays)
    def put(self, i, structure, key, size, recoverable, brief, timing):
        self.put_on(self.pick(i), structure, key, size, recoverable, brief, timing)

    def put_on(self, peer, structure, key, size, recoverable, brief, timing=(None, None)):
        n = self.size(size, structure)
        if recoverable and self.moves_too_much(n, structure):
            Checks.stats["skipped known crash"] += 1
            return
        data = payload(n)
        fields = {"structure": structure, "queue": key[1], "qtype": key[0], "data": data,
                  "recoverable": recoverable}
        fields = terse("put", fields) if brief and peer.kind == "raw" else fields
        fields = with_timing(fields, delay=timing[0], not_before=timing[1])
        if peer.client is None:
            return self.unregistered(peer, "put", fields)
        must, may = self.size_faults([n], n if recoverable else 0)
        faults = self.structure_faults(structure) | self.key_faults(*key) | must
        if not delay_valid(*timing):
            faults.add("INVALID_REQUEST")
        if peer.kind == "raw" and self.too_big(peer, "put", fields):
            return self.frame_refused(peer, "put", fields)

        def stored(result):
            self.model.added(structure, result["entry_id"], (qtype_name(key[0]), key[1]),
                             digest(data), recoverable)
            self.unsynced &= not recoverable  # its reply waited for an fsync
        self.judge(self.send(peer, "put", fields), faults, may=CAPACITY | may, on_ok=stored)

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, structure=st.sampled_from(["MSGQ01", "SMALL"]), key=good_keys,
          count=st.integers(1, 8), size=sizes,
          recoverable=st.booleans())
    def put_several(self, i, structure, key, count, size, recoverable):
        """Plain traffic, so that there is something to read, lock, move and lose."""
        peer = self.pick(i, registered=True)
        for _ in range(count):
            if not peer.closed:
                self.put_on(peer, structure, key, size, recoverable, False)

    @precondition(lambda self: self.live(registered=True) and self.model.ready_keys())
    @rule(i=picks, k=picks, n=st.sampled_from([1, 1, 2, 7]))
    def read_a_queue_with_work(self, i, k, n):
        ready = sorted(self.model.ready_keys())
        structure, key = ready[k % len(ready)]
        self.read(i, structure, key, n, None, False)

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, key=keys, n=counts, wait=waits, brief=st.booleans(),
          lease=leases)
    def read(self, i, structure, key, n, wait, brief, lease="absent"):
        peer = self.pick(i)
        fields = {"structure": structure, "queue": key[1], "qtype": key[0], "n": n, "wait": wait}
        fields = terse("read", fields) if brief and peer.kind == "raw" else fields
        fields = with_timing(fields, lease=lease)
        if peer.client is None:
            return self.unregistered(peer, "read", fields)
        faults = self.structure_faults(structure) | self.key_faults(*key)
        if not 1 <= n <= MAX_BATCH or not lease_valid(lease):
            faults.add("INVALID_REQUEST")
        got = [] if faults else self.readable(structure, (qtype_name(key[0]), key[1]), n)
        if not faults and not got:
            valid_wait = wait is None or wait == 0 or 0 < wait <= MAX_WAIT
            faults.add("NO_MESSAGE" if valid_wait else "INVALID_REQUEST")
        self.judge(self.send(peer, "read", fields), faults,
                   on_ok=lambda r: self.locked(peer.client, got, r["messages"]))

    def sync_the_log(self):
        """While UNSYNCED_LOCK is a known crash: after a lock,
        have a record that waits for an fsync make the log durable (a move of a ready
        recoverable message to its own queue, which changes nothing, or a put);
        False if there is no way."""
        if UNSYNCED_LOCK not in KNOWN_CRASHES or not self.unsynced:
            return True
        for m in self.model.msgs.values():
            if m.recoverable and m.where == "ready" and not m.home:
                reply = self.checker.request("move", structure=m.structure, entry_id=m.eid,
                                             queue=m.key[1], qtype=m.key[0])
                assert reply is not None and reply.ok, f"a move to its own queue: {reply}"
                self.unsynced = False
                return True
        for structure in ("MSGQ01", "SMALL"):
            data = payload(8)
            reply = self.checker.request("put", structure=structure, queue="SYNC", data=data)
            if reply is not None and reply.ok:
                self.model.added(structure, reply.result["entry_id"], ("TRAN", "SYNC"),
                                 digest(data), True)
                self.unsynced = False
                return True
        return False

    def readable(self, structure, key, n):
        return self.model.readable(structure, key, n, self.shape.max_message)

    def parked(self, structure, key, count):
        """Until query queues shows ``count`` reads waiting on the queue (each round
        trip lets the daemon's tasks run)."""
        for _ in range(1000):
            rows = self.checked_query("queues", structure)
            if any((r["qtype"], r["queue"]) == key and r["waiting"] >= count for r in rows):
                return
        raise AssertionError(f"{count} waiting reads on {key} never showed in query queues")

    def locked(self, client, expected, messages):
        """A read's reply: the oldest readable messages, now locked by ``client``."""
        self.unsynced |= any(m.recoverable for m in expected)
        assert [m["entry_id"] for m in messages] == [m.eid for m in expected], (
            f"read gave {[m['entry_id'] for m in messages]}, "
            f"the oldest readable are {[m.eid for m in expected]}")
        for m, wire in zip(expected, messages, strict=True):
            assert digest(wire["data"]) == m.digest, f"entry {m.eid} came back with other data"
            self.model.lock(m, client)
            assert wire["delivery_count"] == m.count, (
                f"entry {m.eid}: delivery_count {wire['delivery_count']}, expected {m.count}")

    @precondition(lambda self: len(self.live(registered=True)) >= 1)
    @rule(i=picks, j=picks, structure=st.sampled_from(["MSGQ01", "SMALL"]),
          key=good_keys,
          n=st.sampled_from([1, 2, 3]), puts=st.integers(0, 3), second=st.booleans(),
          reader_dies=st.booleans(), meanwhile=st.sampled_from([None] * 4 + ["rebuild", "purge"]))
    def read_with_wait(self, i, j, structure, key, n, puts, second, reader_dies, meanwhile):
        """Waiting reads are served first come first served by the puts that follow,
        also after a rebuild of their structure; one whose connection died is served
        nothing; a purge of the structure fails them (STRUCTURE_FAILED). Puts the
        waiting readers take whole tell no interested client of work."""
        key = (qtype_name(key[0]), key[1])
        writer = self.pick(j, registered=True)
        readers = []
        for _ in range(2 if second else 1):
            if len(self.live()) >= MAX_PEERS:
                break
            name = next((c for c in CLIENTS if not self.register_faults(c)), None)
            if name is None:
                break
            peer = RawPeer(self.d.socket)
            self.peers.append(peer)
            self.registered(peer, name, False, locked_ids(peer.register(name)))
            rid = peer.send_request("read", structure=structure, queue=key[1], qtype=key[0],
                                    n=n, wait=MAX_WAIT)
            got = self.readable(structure, key, n)
            if got:  # served at once
                self.judge(peer.reply(rid), set(), on_ok=lambda r, p=peer, g=got: self.locked(
                    p.client, g, r["messages"]))
                continue
            # a request pipelined behind the read is answered: the read waits in the daemon
            assert peer.request("query", kind="clients").ok
            readers.append((peer, rid))
            if LOST_WAKEUP in KNOWN_CRASHES:
                self.parked(structure, key, len(readers))
        if reader_dies and readers:
            peer, _ = readers.pop(0)
            before = self.lost_count(peer.client)
            peer.close()
            self.ended(peer, before)
        if meanwhile == "rebuild":
            self.judge(self.send(writer, "rebuild", {"structure": structure, "size": None}), set())
        elif meanwhile == "purge" and self.sync_the_log():
            purge = {"structure": structure, "force": True}
            self.judge(self.send(writer, "delete_structure", purge), set(),
                       on_ok=lambda r: self.model.recovered(structure, True))
            for peer, rid in readers:
                self.judge(peer.reply(rid), {"STRUCTURE_FAILED"})
            readers = []
        handing_off = bool(readers) and not self.model.ready(structure, key)
        if puts:
            datas = [payload(10 + p) for p in range(puts)]
            fields = {"structure": structure, "ops": [
                {"op": "put", "queue": key[1], "qtype": key[0], "data": data} for data in datas]}
            reply = self.send(writer, "commit", fields)
            if reply is not None and reply.ok:
                for data, eid in zip(datas, reply.result["entry_ids"], strict=True):
                    self.model.added(structure, eid, key, digest(data), True)
            else:
                self.judge(reply, set(), may=CAPACITY)
        for peer, rid in readers:
            got = self.readable(structure, key, n)
            if not got:
                before = self.lost_count(peer.client)
                peer.close()  # nothing came for it: give up the wait
                self.ended(peer, before)
                continue
            self.judge(peer.reply(rid), set(), on_ok=lambda r, p=peer, g=got: self.locked(
                p.client, g, r["messages"]))
        if handing_off and not self.model.ready(structure, key):
            self.quiet.add((structure, key))  # every put went straight to a reader's lock

    @precondition(lambda self: len(self.live(registered=True)) >= 2)
    @rule(structure=st.sampled_from(["MSGQ01", "SMALL"]), key=good_keys,
          plan=st.lists(st.sampled_from(["put", "read", "put read", "read put"]), min_size=2,
                        max_size=MAX_PEERS))
    def race(self, structure, key, plan):
        """Clients put to and read one queue at the same moment: every put is stored,
        no message goes to two readers, and the readers together take the oldest
        messages (ids only grow, so a read always takes the oldest left)."""
        key = (qtype_name(key[0]), key[1])
        peers = [p for p in self.live(registered=True) if p.kind == "raw"]
        before = [m.eid for m in self.model.ready(structure, key)]
        sent = []
        for peer, ops in zip(peers, plan, strict=False):
            frames = [(op, payload(30) if op == "put" else None) for op in ops.split()]
            frames = [(op, data, *peer.frame_for(op, structure=structure, queue=key[1],
                                                  qtype=key[0], **({"data": data} if data else {})))
                      for op, data in frames]
            peer.send(b"".join(frame for *_, frame in frames))
            sent.append((peer, frames))
        puts, reads, misses = [], [], 0
        for peer, frames in sent:
            for op, data, rid, _ in frames:
                reply = peer.reply(rid)
                if op == "put":
                    self.judge(reply, set(), may=CAPACITY,
                               on_ok=lambda r, d=data: puts.append((r["entry_id"], d)))
                else:
                    self.judge(reply, set(), may={"NO_MESSAGE"},
                               on_ok=lambda r, p=peer: reads.append((p.client, r["messages"])))
                    misses += not reply.ok
        for eid, data in sorted(puts):
            self.model.added(structure, eid, key, digest(data), True)
        ready = {m.eid: m for m in self.model.ready(structure, key)}
        taken = sorted(m["entry_id"] for _, messages in reads for m in messages)
        assert len(taken) == len(set(taken)), f"a message went to two readers: {taken}"
        assert taken == sorted(ready)[:len(taken)], (
            f"the readers took {taken}, not the oldest of {sorted(ready)}")
        if key[0] == "TRAN_SERIAL":
            assert len(taken) <= len(self.readable(structure, key, 1)), (
                f"{taken} in flight at once on a SERIAL queue")
        else:
            assert not misses or set(before) <= set(taken), (
                f"a read found no message while {sorted(set(before) - set(taken))} were ready")
        for client, messages in reads:
            self.locked(client, [ready[m["entry_id"]] for m in messages], messages)

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, structure=st.sampled_from(["MSGQ01", "SMALL"]), key=good_keys)
    def read_then_put_in_one_write(self, i, structure, key):
        """A waiting read and a put to its queue, pipelined: the read gets the message."""
        peer = self.pick(i, registered=True)
        if peer.kind != "raw" or LOST_WAKEUP in KNOWN_CRASHES:
            return
        key, data = (qtype_name(key[0]), key[1]), payload(20)
        rid, read = peer.frame_for("read", structure=structure, queue=key[1], qtype=key[0], wait=2)
        put_rid, put = peer.frame_for("put", structure=structure, queue=key[1], qtype=key[0],
                                      data=data)
        peer.send(read + put)
        at_once = self.readable(structure, key, 1)
        if at_once:
            self.judge(peer.reply(rid), set(), on_ok=lambda r: self.locked(
                peer.client, at_once, r["messages"]))
        self.judge(peer.reply(put_rid), set(), may=CAPACITY, on_ok=lambda r: self.model.added(
            structure, r["entry_id"], key, digest(data), True))
        if not at_once:
            got = self.readable(structure, key, 1)
            self.judge(peer.reply(rid), set() if got else {"NO_MESSAGE"},
                       on_ok=lambda r: self.locked(peer.client, got, r["messages"]))

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, qtype=st.one_of(st.none(), qtypes),
          queue=st.one_of(st.none(), queues), limit=counts,
          cursor=st.sampled_from(["none"] * 4 + ["follow", "junk", "odd"]))
    def browse(self, i, structure, qtype, queue, limit, cursor):
        peer = self.pick(i)
        if peer.kind == "sdk" and queue is not None and qtype is None:
            qtype = "TRAN"  # the SDK's reading of a queue without a type
        start = {"none": None, "follow": None, "junk": [1, 2], "odd": [75, "B", 7]}[cursor]
        fields = {"structure": structure, "queue": queue, "qtype": qtype, "cursor": start,
                  "limit": limit}
        if peer.client is None:
            return self.unregistered(peer, "browse", fields)
        faults = self.structure_faults(structure)
        if (not 1 <= limit <= MAX_BATCH or (queue is not None and qtype is None)
                or (qtype is not None and qtype_name(qtype) is None)
                or (queue is not None and not valid_queue(queue)) or cursor == "junk"):
            faults.add("INVALID_REQUEST")
        if faults:
            return self.judge(self.send(peer, "browse", fields), faults)
        shown = [m for m in self.model.listing(structure)
                 if (qtype is None or (m.where == "ready" and m.key[0] == qtype_name(qtype)))
                 and (queue is None or m.key[1] == queue)]
        if cursor == "odd":
            shown = None  # a cursor this server never gave: only the shape is checked
        pages = 0
        while True:
            reply = self.send(peer, "browse", fields)
            self.judge(reply, set())
            page, more = reply.result["messages"], reply.result["cursor"]
            if shown is not None:
                check_page(page, more, shown, limit, self.shape.max_message)
                shown = shown[len(page):]
            pages += 1
            if more is None or cursor != "follow" or pages > 20:
                break
            fields["cursor"] = more

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, eid=eids, operator=st.booleans(), then=next_reads)
    def delete(self, i, structure, eid, operator, then):
        self.delete_on(self.pick(i), structure, self.entry(eid, structure), operator, then)

    @precondition(lambda self: any(self.model.locks_of(p.client)
                                   for p in self.live(registered=True)))
    @rule(i=picks, k=picks, n=st.sampled_from([1, 1, 2, 7]), other=st.booleans())
    def ack_and_read_next(self, i, k, n, other):
        """A consumer's ack carrying its next read: a message it holds deleted, and
        the oldest of its queue read (or of another queue with work, if asked or if
        its own has none)."""
        holders = [p for p in self.live(registered=True) if self.model.locks_of(p.client)]
        peer = holders[i % len(holders)]
        held = self.model.locks_of(peer.client)
        m = held[k % len(held)]
        ready = sorted(key for structure, key in self.model.ready_keys()
                       if structure == m.structure)
        key = m.key if not ready or (m.key in ready and not other) else ready[k % len(ready)]
        self.delete_on(peer, m.structure, m.eid, False, ("read", key, n))

    def delete_on(self, peer, structure, eid, operator, then):
        if peer.kind == "sdk" and then is not None and (operator or then[0] == "bad"):
            then = None  # the SDK's delete_and_read is a client's, and well formed
        fields = {"structure": structure, "entry_id": eid, "operator": operator}
        key, n, faults = self.next_read(then, fields, peer.kind)
        if type(fields.get("next", {})) is not dict:  # refused as the request is parsed
            return self.judge(self.send(peer, "delete", fields), {"INVALID_REQUEST"})
        if peer.client is None:
            return self.unregistered(peer, "delete", fields)
        m = self.model.find(structure, eid)
        # the structure first, then next (checked before the delete), then the entry
        faults = self.structure_faults(structure) or faults or self.entry_faults(m)
        # docs/protocol.md (delete): a client deletes what it holds; an operator, anything not
        # locked by another client
        if not faults and (m.owner != peer.client if m.where == "locked" else not operator):
            faults.add("LOCK_NOT_HELD")

        def deleted(result):
            self.model.delete(m)
            if then is not None:  # read as a read right after the delete would
                self.locked(peer.client, self.readable(structure, key, n), result["messages"])
                Checks.stats["deletes reading next"] += 1
                Checks.stats["messages a delete read next"] += len(result["messages"])
        self.judge(self.send(peer, "delete", fields), faults, on_ok=deleted)

    def next_read(self, then, fields, kind):
        """Put a delete's drawn ``next`` in its fields; (key, n, faults) of the read."""
        if then is None:
            return None, 0, set()
        if then[0] == "bad":
            fields["next"] = then[1]
            return None, 0, {"INVALID_REQUEST"}
        if then[0] == "queue" and kind == "raw":
            fields["next"] = {"queue": then[1]}
            return ("TRAN", then[1]), 1, set()
        (qtype, queue), n = then[1:] if then[0] == "read" else (("TRAN", then[1]), 1)
        fields["next"] = {"queue": queue, "qtype": qtype, "n": n}
        faults = self.key_faults(qtype, queue)
        if not 1 <= n <= MAX_BATCH:
            faults.add("INVALID_REQUEST")
        return (qtype_name(qtype), queue), n, faults

    @staticmethod
    def entry_faults(m):
        return {"ENTRY_NOT_FOUND"} if m is None else set()

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, eid=eids, key=keys)
    def move(self, i, structure, eid, key):
        peer = self.pick(i)
        eid = self.entry(eid, structure)
        fields = {"structure": structure, "entry_id": eid, "queue": key[1], "qtype": key[0]}
        if peer.client is None:
            return self.unregistered(peer, "move", fields)
        m = self.model.find(structure, eid)
        faults = self.structure_faults(structure) or self.entry_faults(m)
        faults |= self.key_faults(*key)
        if m is not None and m.where == "locked" and m.owner != peer.client:
            faults.add("LOCK_NOT_HELD")
        self.judge(self.send(peer, "move", fields), faults,
                   on_ok=lambda r: self.model.move(m, (qtype_name(key[0]), key[1])))

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, eid=eids, failed=st.booleans(),
          to=st.one_of(st.none(), st.tuples(st.one_of(st.none(), qtypes),
                                                st.one_of(st.none(), queues))))
    def unlock(self, i, structure, eid, failed, to):
        peer = self.pick(i)
        eid = self.entry(eid, structure)
        qtype, queue = to or (None, None)
        fields = {"structure": structure, "entry_id": eid, "failed": failed, "queue": queue,
                  "qtype": qtype}
        if peer.client is None:
            return self.unregistered(peer, "unlock", fields)
        m = self.model.find(structure, eid)
        faults = self.structure_faults(structure) or self.entry_faults(m)
        to = None
        if m is not None:
            faults |= self.unlock_faults(m, peer.client, qtype, queue)
            to = None if faults else self.model.unlock_target(m, qtype, queue)

        def unlocked(result):
            self.model.unlock(m, failed, to)
            assert (result["qtype"], result["queue"]) == m.key, (
                f"unlock says entry {m.eid} went to {result}, the model says {m.key}")
        self.judge(self.send(peer, "unlock", fields), faults, on_ok=unlocked)

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, eid=eids, lease=leases)
    def renew(self, i, structure, eid, lease):
        """A renew changes no place: the model only checks who may, and the lease's value
        (one the model accepts never ends within a run)."""
        peer = self.pick(i)
        eid = self.entry(eid, structure)
        fields = {"structure": structure, "entry_id": eid,
                  "lease": LONG_LEASE if lease in ("absent", None) else lease}
        if peer.client is None:
            return self.unregistered(peer, "renew", fields)
        m = self.model.find(structure, eid)
        faults = self.structure_faults(structure) or self.entry_faults(m)
        if m is not None and (m.where != "locked" or m.owner != peer.client):
            faults.add("LOCK_NOT_HELD")
        if not lease_valid(fields["lease"]):
            faults = {"INVALID_REQUEST"}  # checked before anything else
        self.judge(self.send(peer, "renew", fields), faults)

    def unlock_faults(self, m, client, qtype, queue):
        faults = set()
        if qtype is not None or queue is not None:
            if (qtype is not None and qtype_name(qtype) is None
                    or not valid_queue(queue or m.key[1])):
                faults.add("INVALID_REQUEST")
        if m.where != "locked" or m.owner != client:
            faults.add("LOCK_NOT_HELD")
        return faults

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, ops=commit_ops)
    def commit(self, i, structure, ops):
        peer = self.pick(i)
        wire, effects, faults, logged, seen = [], [], self.structure_faults(structure), 0, set()
        put_sizes = []
        for op in ops:
            kind = op[0]
            if kind == "put":
                _, key, size, recoverable = op
                n = self.size(size, structure)
                data = payload(n)
                wire.append({"op": "put", "queue": key[1], "qtype": key[0], "data": data,
                             "recoverable": recoverable})
                faults |= self.key_faults(*key)
                put_sizes.append(n)
                logged += n if recoverable else 0
                effects.append(("put", (qtype_name(key[0]), key[1]), digest(data), recoverable))
                continue
            eid = self.entry(op[1], structure)
            m = self.model.find(structure, eid)
            faults |= self.entry_faults(m)
            if eid in seen:
                faults.add("INVALID_REQUEST")  # an entry appears once in a commit
            seen.add(eid)
            if kind == "delete":
                wire.append({"op": "delete", "entry_id": eid})
                if m is not None and (m.where != "locked" or m.owner != peer.client):
                    faults.add("LOCK_NOT_HELD")
                effects.append(("delete", m))
            elif kind == "move":
                key = op[2]
                wire.append({"op": "move", "entry_id": eid, "queue": key[1], "qtype": key[0]})
                faults |= self.key_faults(*key)
                if m is not None and m.where == "locked" and m.owner != peer.client:
                    faults.add("LOCK_NOT_HELD")
                effects.append(("move", m, (qtype_name(key[0]), key[1])))
            else:
                failed, (qtype, queue) = op[2], op[3] or (None, None)
                wire.append({"op": "unlock", "entry_id": eid, "failed": failed, "queue": queue,
                             "qtype": qtype})
                if m is not None:
                    faults |= self.unlock_faults(m, peer.client, qtype, queue)
                    if not faults:
                        effects.append(("unlock", m, failed,
                                        self.model.unlock_target(m, qtype, queue)))
        if self.moves_too_much(logged, structure):
            Checks.stats["skipped known crash"] += 1
            return
        fields = {"structure": structure, "ops": wire}
        if peer.client is None:
            return self.unregistered(peer, "commit", fields)
        if peer.kind == "sdk" and not wire:
            return  # an empty unit of work sends nothing
        if self.too_big(peer, "commit", fields):
            if peer.kind == "raw":
                return self.frame_refused(peer, "commit", fields)
            faults.add("MESSAGE_TOO_LARGE")
        must, may = self.size_faults(put_sizes, logged, len(wire))
        self.judge(self.send(peer, "commit", fields), faults | must,
                   may=(CAPACITY if put_sizes else set()) | may,
                   on_ok=lambda r: self.committed(structure, effects, r))

    def committed(self, structure, effects, result):
        ids = list(result["entry_ids"])
        assert len(ids) == sum(1 for e in effects if e[0] == "put"), f"entry_ids {ids}"
        for e in effects:
            if e[0] == "delete":
                self.model.delete(e[1])
            elif e[0] == "move":
                self.model.move(e[1], e[2])
            elif e[0] == "unlock":
                self.model.unlock(e[1], e[2], e[3])
        for e in effects:
            if e[0] == "put":
                self.model.added(structure, ids.pop(0), e[1], e[2], e[3])

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=st.sampled_from(["MSGQ01", "SMALL"]),
          count=st.sampled_from([30, 1000, requests.MAX_COMMIT_OPS, requests.MAX_COMMIT_OPS + 1]),
          size=st.sampled_from([0, 0, 1, KiB, MiB]), kind=st.sampled_from(["put", "delete"]),
          recoverable=st.booleans())
    def commit_near_its_limits(self, i, structure, count, size, kind, recoverable):
        """Units of work near and past MAX_COMMIT_OPS, the frame limit, and (30 x 1 MiB
        recoverable puts) the log's record limit."""
        peer = self.pick(i)
        data = payload(size)
        logged = count * size if kind == "put" and recoverable else 0
        if self.moves_too_much(logged, structure) or count * size > 2 * self.max_frame:
            Checks.stats["skipped"] += 1
            return
        if kind == "put":
            op = {"op": "put", "queue": "A", "data": data, "recoverable": recoverable}
            ops = [terse("put", op) if peer.kind == "raw" else op] * count  # most in a frame
        else:
            ops = [{"op": "delete", "entry_id": 0}] * count
        fields = {"structure": structure, "ops": ops}
        if peer.client is None:
            return self.unregistered(peer, "commit", fields)
        must, may = self.size_faults([size], logged, count)
        if must:
            faults = must
        elif count > requests.MAX_COMMIT_OPS:
            faults = {"INVALID_REQUEST"}
        else:  # 0 is no entry, and appears more than once
            faults = {"ENTRY_NOT_FOUND", "INVALID_REQUEST"} if kind == "delete" else set()
        if self.too_big(peer, "commit", fields):
            if peer.kind == "raw":
                return self.frame_refused(peer, "commit", fields)
            faults = {"MESSAGE_TOO_LARGE"}
        puts = count if kind == "put" else 0
        effects = [("put", ("TRAN", "A"), digest(data), recoverable)] * puts
        self.judge(self.send(peer, "commit", fields), faults,
                   may=(CAPACITY if kind == "put" else set()) | may,
                   on_ok=lambda r: self.committed(structure, effects, r))

    # -- interest, queries, operator requests ---------------------------------------------

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, key=keys, register=st.booleans())
    def interest(self, i, structure, key, register):
        peer = self.pick(i)
        op = "register_interest" if register else "deregister_interest"
        fields = {"structure": structure, "queue": key[1], "qtype": key[0]}
        if peer.client is None:
            return self.unregistered(peer, op, fields)
        faults = self.structure_faults(structure) | self.key_faults(*key)
        watched = (structure, (qtype_name(key[0]), key[1]))

        def done(result):
            if register:
                peer.interests.add(watched)
                if self.model.ready(*watched):
                    peer.expect.add(watched)  # "a notification follows at once"
            else:
                peer.interests.discard(watched)
        self.judge(self.send(peer, op, fields), faults, on_ok=done)

    @precondition(lambda self: self.live())
    @rule(i=picks, kind=st.sampled_from(KINDS + ["nope"]),
          structure=st.sampled_from([None, None, "MSGQ01", "SMALL", "MSGQ01OV", "NOPE"]))
    def query(self, i, kind, structure):
        peer = self.pick(i)
        fields = {"kind": kind, "structure": structure}
        if peer.client is None:
            return self.unregistered(peer, "query", fields)
        faults = set()
        if kind != "backups":
            if structure is not None:
                faults |= self.structure_faults(structure)
            if kind not in KINDS:
                faults.add("INVALID_REQUEST")
        self.judge(self.send(peer, "query", fields), faults,
                   on_ok=lambda r: self.check_rows(kind, structure, r["rows"]))

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, eid=eids)
    def requeue(self, i, structure, eid):
        peer = self.pick(i)
        eid = self.entry(eid, structure)
        fields = {"structure": structure, "entry_id": eid}
        if peer.client is None:
            return self.unregistered(peer, "requeue", fields)
        m = self.model.find(structure, eid)
        faults = self.structure_faults(structure) or self.entry_faults(m)
        if not faults and m.where != "cold" and not (m.where == "ready" and m.home):
            faults.add("INVALID_REQUEST")

        def requeued(result):
            self.model.requeue(m)
            assert (result["qtype"], result["queue"]) == m.key, f"requeue went to {result}"
        self.judge(self.send(peer, "requeue", fields), faults, on_ok=requeued)

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=structures, key=keys)
    def dequeue(self, i, structure, key):
        peer = self.pick(i)
        fields = {"structure": structure, "queue": key[1], "qtype": key[0]}
        if peer.client is None:
            return self.unregistered(peer, "dequeue", fields)
        faults = self.structure_faults(structure) | self.key_faults(*key)
        gone = [] if faults else self.model.ready(structure, (qtype_name(key[0]), key[1]))

        def dequeued(result):
            assert result["count"] == len(gone), f"dequeue of {len(gone)} said {result}"
            for m in gone:
                self.model.delete(m)
        self.judge(self.send(peer, "dequeue", fields), faults, on_ok=dequeued)

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=operator_structures,
          size=st.sampled_from([0, -1, 1, 512, 4 * KiB, 8 * KiB, 8 * KiB + 1, 300 * KiB, MiB,
                                2 * MiB, 2 * MiB + 1, 48 * MiB, 2**62]), rebuild=st.booleans())
    def alter_or_rebuild(self, i, structure, size, rebuild):
        """SIZE changes: refused (INVALID_REQUEST) or done, and never a message changed."""
        peer = self.pick(i)
        op = "rebuild" if rebuild else "alter"
        fields = {"structure": structure, "size": size}
        if peer.client is None:
            return self.unregistered(peer, op, fields)
        faults = self.structure_faults(structure, operator=True)
        if size < 0 or (size == 0 and not rebuild):
            faults.add("INVALID_REQUEST")
        reply = self.send(peer, op, fields)
        if faults:
            return self.judge(reply, faults)
        # within limits the daemon decides (in use, current size): done or INVALID_REQUEST
        assert reply is not None, "the daemon closed a connection over a well-formed request"
        assert reply.ok or reply.reason == "INVALID_REQUEST", f"{op} refused with {reply}"

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=st.sampled_from(["MSGQ01", "SMALL", "MSGQ01OV", "NOPE"]))
    def connect_to_a_structure(self, i, structure):
        peer = self.pick(i)
        fields = {"structure": structure}
        if peer.client is None:
            return self.unregistered(peer, "connect", fields)
        self.judge(self.send(peer, "connect", fields), self.structure_faults(structure))

    @precondition(lambda self: self.live())
    @rule(i=picks, structure=operator_structures,
          op=st.sampled_from(["delete_structure", "recover"]))
    def purge_a_structure(self, i, structure, op):
        """delete_structure and recover --purge: no Spark job, so always in."""
        self.structure_operation(i, structure, op, True)

    @precondition(lambda self: self.spark and self.live())
    @rule(i=picks, structure=operator_structures, op=st.sampled_from(["recover", "checkpoint"]))
    def spark_job(self, i, structure, op):
        """checkpoint and recover from the log: a Spark job each, so only with
        CQSD_FUZZ_SPARK."""
        self.structure_operation(i, structure, op, False)

    def structure_operation(self, i, structure, op, purge):
        if op != "checkpoint" and not self.sync_the_log():
            Checks.stats["skipped known crash"] += 1
            return
        peer = self.pick(i)
        fields = {"structure": structure} | ({"purge": purge} if op == "recover" else {})
        if op == "delete_structure":
            fields["force"] = True  # the model empties it whatever it holds
        if peer.client is None:
            return self.unregistered(peer, op, fields)
        faults = self.structure_faults(structure, operator=op == "checkpoint")
        if op == "delete_structure" and structure == "MSGQ01OV":
            faults = {"INVALID_REQUEST"}
        purged = op == "delete_structure" or purge
        reply = self.send(peer, op, fields, timeout=None if purge else SPARK_TIMEOUT)
        if op == "checkpoint":
            return self.judge(reply, faults)
        self.judge(reply, faults, on_ok=lambda r: self.model.recovered(structure, purged))



# -- the tests ------------------------------------------------------------------------------


def run(examples, derandomize, seed=None, spark=False):
    DaemonFuzz.spark = spark
    test = get_state_machine_test(DaemonFuzz, settings=settings(
        max_examples=examples, stateful_step_count=STEPS, deadline=None, derandomize=derandomize,
        database=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                               HealthCheck.data_too_large]))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    test()


@pytest.mark.timeout(SECONDS + 900 if SECONDS else 600)
def test_no_request_sequence_stops_the_daemon_or_loses_an_acknowledged_message():
    """Random sequences of every request, from SDK and raw clients that come and go,
    leave the daemon running, answering, and storing exactly what it acknowledged."""
    Checks.stats.clear()
    started = time.monotonic()
    if not SECONDS:
        print(f"cqsd fuzz: {IN_SUITE_EXAMPLES} derandomized examples (a fixed seed)")
        run(IN_SUITE_EXAMPLES, derandomize=True)
    else:
        first = int(os.environ.get("CQSD_FUZZ_SEED") or random.randrange(2**32))
        seed = first
        while time.monotonic() - started < SECONDS:
            print(f"cqsd fuzz: seed {seed} ({CHUNK} examples; replay with "
                  f"CQSD_FUZZ_SEED={seed} CQSD_FUZZ_SECONDS=1)", flush=True)
            run(CHUNK, derandomize=False, seed=seed, spark=SPARK)
            seed += 1
    print(f"cqsd fuzz: {time.monotonic() - started:.0f}s, {dict(Checks.stats)}", flush=True)
