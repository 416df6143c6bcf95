"""The takeover fault loop: every fault of a group node, mixed, over and over while
clients put and consume; the total-queue checker finds nothing acknowledged lost,
nothing unexpected or resurrected, and the owner equals both folds of the log.

The faults, each on the owner of the pair unless said otherwise (`FAULTS`):
- ``kill``: SIGKILL; the standby takes over; the node restarts as a standby.
- ``pause``: SIGSTOP past the lease, then SIGCONT: the old owner acknowledges
  nothing after it resumes, and is fenced.
- ``partition``: its etcd proxy blackholed: its lease runs out, it is fenced,
  refuses requests with STRUCTURE_FAILED naming etcd, and the standby takes
  over; healed, it rejoins as a standby writing a new series (``NODE-N+1``).
- ``clock``: its wall clock stepped 300 s one way while it works, the
  standby's 300 s the other way, then it is killed: the new epoch's records
  still sort after the sealed ones (checked in the log at the end).
- ``power``: SIGKILL and its unsynced writes dropped (its lazyfs mount): a
  power cut of that node.
- ``disk``: the *standby's* disk full (its lazyfs mount), then the owner killed:
  the standby takes over inside its preallocated log segment, and when it needs
  a new segment it fails cleanly, acknowledging nothing more (or, fenced, it
  cannot start a new series and waits, ``rejoin_failed``); the restarted node
  takes over, and the full node comes back once there is space.
- ``move``: ``move-structure`` to the standby, a planned move: the owner
  stops acknowledging the pair, releases it, and the standby takes it; the old
  owner acknowledges nothing of it afterwards (docs/group.md, "Planned moves").

``CQSD_TAKEOVER_CYCLES=N`` runs N cycles of each fault (default 1).
"""

import json
import os
import signal
import sys
import threading
import time
import uuid
from statistics import median

import pytest

import cqsclient
import logstream
from cqsclient.errors import CQSError

from .checker import (
    QUEUE,
    STRUCTURE,
    Consumer,
    History,
    Producer,
    drain,
    owner_messages,
    reference_messages,
    spark_messages,
)
from .cluster import FaultyGroup

CYCLES = int(os.environ.get("CQSD_TAKEOVER_CYCLES", "1"))
FAULTS = tuple(os.environ.get("CQSD_TAKEOVER_FAULTS", "kill pause partition clock power disk move")
               .split())
# seconds; 2 livelocked a soak at load 17 on 2 cores: a node fenced by load alone
# while rebuilding the pair it had just won (it then gives the takeover up, as it
# must), over and over, every node alike
LEASE = 3
PROGRESS = 20  # acknowledged puts between two faults: the clients are really working
SLACK = 0.5  # seconds a reply sent before a fence may take to reach its client
SEGMENT = "64KiB"  # small log segments: a full disk is met at the next rotation, soon
# checkpoints and base images by volume, as in production but sooner: a cold takeover
# then folds the log since the last of them, not the whole run's (docs/group.md)
CHECKPOINTS = 'checkpoint_log_volume = "1MiB"'
STEP = 300  # seconds a clock is stepped


def owner_of(nodes):
    """The node that owns STRUCTURE now, by asking each live node, confirmed by that
    node's own status; None if none does. (A node's view can name itself owner by a
    key of its last incarnation that etcd has not yet expired: another node may be
    taking the pair over at that moment.)"""
    for node in nodes.values():
        if not node.alive:
            continue
        try:
            with cqsclient.connect(node.address, client="OBSERVER", timeout=2) as c:
                rows = {r["structure"]: r for r in c.query("owners")}
            owner = rows[STRUCTURE]["owner"]
            if owner is None or not nodes[owner].alive:
                continue
            with cqsclient.connect(nodes[owner].address, client="OBSERVER", timeout=2) as c:
                if STRUCTURE in c.query("status")[0]["group"]["owns"]:
                    return nodes[owner]
        except cqsclient.errors.CQSError:
            continue
    return None


def wait_owner(nodes, not_node=None, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner = owner_of(nodes)
        if owner is not None and owner is not not_node:
            return owner
        time.sleep(0.1)  # polling the group through its public query
    raise AssertionError(f"no new owner of {STRUCTURE} within {timeout} s: {trouble(nodes)}")


def trouble(nodes):
    """What the nodes said of the group and its faults, for a failure's message."""
    names = ("owner_acquired", "takeover_done", "takeover_failed", "fenced", "node_joined",
             "etcd_unreachable", "task_died", "owner_lost", "log_write_failed", "loop_stalled")
    return {n: [(e.get("event"), e.get("structure"), e.get("why") or e.get("error"))
                for e in node.lines if e.get("event") in names or e.get("level") == "critical"]
            for n, node in nodes.items()}


def stacks(workers):
    import sys
    import traceback
    frames = sys._current_frames()
    return {w.name: (repr(getattr(w, "last_error", None)), w.follower.address,
                     traceback.format_stack(frames[w.ident])[-6:-3]) for w in workers
            if w.ident in frames}


def series_number(writer: str) -> int:
    return int(writer.rpartition("-")[2])


def refused_for_etcd(node) -> str:
    """A put sent straight to ``node``: it must be refused with STRUCTURE_FAILED naming
    etcd; the refusal's message."""
    with cqsclient.connect(node.address, client="PROBE", timeout=5) as c:
        with pytest.raises(CQSError) as refused:
            c.structure(STRUCTURE).put(QUEUE, b"probe")
    assert refused.value.reason == "STRUCTURE_FAILED" and "etcd" in refused.value.message, (
        refused.value.reason, refused.value.message)
    return refused.value.message


def epochs_sort_after_seals(log_dir) -> set[tuple]:
    """Every epoch record of STRUCTURE stamps after every record its seal keeps of the
    writers it cut, whatever the clocks said: the epochs checked (each its stamp and
    cut). Only those of the series not yet retired (docs/group.md, "Dead series")."""
    from cqsd.records import EPOCH, SEALED
    from cqsd.records import STRUCTURE as KEY
    newest: dict[str, list[tuple[int, int]]] = {}  # writer -> (lsn, timestamp), in order
    epochs = []
    for r in logstream.read(log_dir):
        newest.setdefault(r.writer, []).append((r.lsn, r.timestamp))
        if isinstance(r.body, dict) and r.body.get(KEY) == STRUCTURE and EPOCH in r.body:
            epochs.append((r.timestamp, r.body[SEALED]))
    for stamp, cut in epochs:
        for writer, lsn in cut.items():
            kept = [t for n, t in newest.get(writer, ()) if n <= lsn]
            assert not kept or max(kept) < stamp, (writer, lsn, max(kept), stamp)
    return {(stamp, tuple(sorted(cut.items()))) for stamp, cut in epochs}


def deposed_acks(history: History, node, since: float) -> list[float]:
    """The puts acknowledged by ``node`` after ``since`` and before it next won the pair
    (a node fenced by load alone may win it back at once: its acks then count)."""
    won = [e["seen"] for e in node.events("owner_acquired", structure=STRUCTURE)
           if e["seen"] > since]
    until = min(won, default=float("inf"))
    return [t for t, a in history.acks if a == node.address and since < t < until]


class Loop:
    """The faults, with what each may assert of the nodes and the clients' history."""

    def __init__(self, group: FaultyGroup, history: History):
        self.group, self.nodes, self.history = group, group.nodes, history
        self.deposed: list[tuple] = []  # (node, since): no acknowledgement until it owns again
        self.figures: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.clock_sign = 1
        self.epochs: set[tuple] = set()  # checked after each fault, before a retirement

    def run(self, fault: str, owner, other) -> None:
        try:
            getattr(self, fault)(owner, other)
        except (AssertionError, CQSError) as err:  # what each node said last, for the message
            raise AssertionError(f"{fault} fault, owner {owner.name}: {err} " + json.dumps({
                n: [{k: v for k, v in e.items() if k not in ("level", "timestamp")}
                    for e in node.lines[-30:]] for n, node in self.nodes.items()},
                default=str)) from None
        self.figures[fault] += 1
        for _ in range(5):  # a segment trimmed or retired while it was read: again
            try:
                self.epochs |= epochs_sort_after_seals(self.group.data / "logstream")
                break
            except (OSError, logstream.LogstreamError):
                continue

    def takeover(self, node, mark: int, timeout: float = 30) -> None:
        try:
            done = node.wait_for("takeover_done", after=mark, structure=STRUCTURE,
                                 timeout=timeout)[0]
        except AssertionError as err:
            raise AssertionError(f"{err} {trouble(self.nodes)}") from None
        if CYCLES > 1:  # a long run's progress, with -s: where takeovers spend their time
            rebuilt = [(e["structure"], e["source"], e["records_replayed"])
                       for e in node.events("structure_rebuilt", after=mark)]
            print(f"{sum(self.figures.values())} {node.name} {done.get('seconds')} "
                  f"{done.get('phases')} {rebuilt}", file=sys.stderr, flush=True)

    def kill(self, owner, other) -> None:
        mark = other.mark()
        owner.kill()
        self.takeover(other, mark)
        owner.start()

    def pause(self, owner, other) -> None:
        mark, owner_mark = other.mark(), owner.mark()
        os.kill(owner.proc.pid, signal.SIGSTOP)
        self.takeover(other, mark)
        resumed = time.monotonic()
        os.kill(owner.proc.pid, signal.SIGCONT)
        owner.wait_for("fenced", after=owner_mark, timeout=30)
        self.deposed.append((owner, resumed))

    def partition(self, owner, other) -> None:
        mark, owner_mark = other.mark(), owner.mark()
        [joined] = owner.events("node_joined")[-1:]
        self.group.proxies[owner.name].blackhole()
        owner.wait_for("fenced", after=owner_mark, timeout=30)
        self.deposed.append((owner, time.monotonic() + SLACK))
        self.takeover(other, mark)
        refused_for_etcd(owner)
        self.group.proxies[owner.name].heal()
        [rejoined] = owner.wait_for("node_rejoined", after=owner_mark, timeout=30)
        assert series_number(rejoined["writer"]) > series_number(joined["writer"]), (
            joined, rejoined)

    def clock(self, owner, other) -> None:
        sign, self.clock_sign = self.clock_sign, -self.clock_sign
        self.group.step_clock(owner.name, sign * STEP)
        self.progress()  # the owner stamps records with its stepped clock
        self.group.step_clock(other.name, -sign * STEP)
        now_owner = wait_owner(self.nodes)
        if now_owner is not owner:  # fenced meanwhile (a loaded machine): deposed, the
            self.deposed.append((owner, time.monotonic() + SLACK))  # other owns it now
            owner, other = now_owner, owner
        self.kill(owner, other)

    def power(self, owner, other) -> None:
        mark = other.mark()
        owner.kill()
        self.group.mounts[owner.name].drop()
        self.takeover(other, mark)
        owner.start()

    def disk(self, owner, other) -> None:
        mount = self.group.mounts[other.name]
        mark = other.mark()
        mount.full(True)
        try:
            owner.kill()
            other.wait_until(lambda: not other.alive or any(  # of this pair, not another
                e.get("event") in ("log_write_failed", "rejoin_failed") or (
                    e.get("event") in ("takeover_done", "takeover_failed")
                    and e.get("structure") == STRUCTURE)
                for e in other.lines[mark:]), "its takeover, or its failure", 30)
            owner_mark = owner.mark()
            owner.start()
            # the full node fails at its next segment, at the latest: the other takes over
            other.wait_until(lambda: not other.alive or any(
                e.get("event") in ("log_write_failed", "rejoin_failed") or (
                    e.get("event") == "takeover_failed" and e.get("structure") == STRUCTURE)
                for e in other.lines[mark:]), "the full disk", 60)
            self.deposed.append((other, time.monotonic() + SLACK))
            self.takeover(owner, owner_mark, timeout=60)
            if other.events("log_write_failed", after=mark):  # it stops for recovery
                other.proc.wait(30)
        finally:
            mount.full(False)
        # it failed on the full disk: at a new segment (log_write_failed: the node
        # stops), rebuilding or starting the new series a pair it handed over needs
        # (takeover_failed: it owns nothing of it, and the other takes it once it is
        # free for a lease) or at a new series after a fence (rejoin_failed: it stays
        # fenced until there is room)
        said = json.dumps(other.lines[mark:], default=str)
        assert "No space left on device" in said, said[-3000:]
        if not other.alive:
            other.start()
        elif other.events("fenced", after=mark):  # it rejoins once there is room
            other.wait_for("node_rejoined", after=mark, timeout=30)

    def move(self, owner, other) -> None:
        mark, owner_mark = other.mark(), owner.mark()
        started = max(i for i, e in enumerate(other.lines) if e.get("event") == "starting")
        other.wait_for("node_joined", after=started, timeout=30)  # restarted by the last fault
        deadline = time.monotonic() + 10
        with cqsclient.connect(owner.address, client="MOVER", timeout=30) as c:
            while True:
                try:
                    c.move_structure(STRUCTURE, other.name)
                    break
                except cqsclient.errors.InvalidRequest as err:  # the owner's view lags a poll
                    if "is not live" not in str(err) or time.monotonic() > deadline:
                        raise
                time.sleep(0.1)
        # released; or fenced meanwhile (its lease ran out, a loaded machine), and then
        # the target took the pair over instead: deposed either way
        owner.wait_until(lambda: owner.events("structure_released", after=owner_mark,
                                              structure=STRUCTURE, to=other.name)
                         or owner.events("fenced", after=owner_mark),
                         "structure_released or fenced")
        self.deposed.append((owner, time.monotonic() + SLACK))
        self.takeover(other, mark)

    def progress(self, n: int = PROGRESS) -> None:
        self.history.wait_for_puts(
            len(self.history.put_ok) + n,
            lambda: f"the clients made no progress: {trouble(self.nodes)}")


@pytest.fixture
def faulty(etcd_server):
    name = "G" + uuid.uuid4().hex[:6].upper()
    group = FaultyGroup(("NODE1", "NODE2"), etcd_server.endpoint, name, LEASE,
                        daemon_keys=f'log_segment = "{SEGMENT}"\n{CHECKPOINTS}',
                        standby=("warm", "cold"))
    try:
        for node in group.nodes.values():
            node.start()
        yield group
    finally:
        group.close()


# one cycle of each fault takes 1.5-4 minutes on a loaded 2-core machine; long runs
# (CQSD_TAKEOVER_CYCLES) are bounded by their cycles, not by pytest-timeout's 300 s
@pytest.mark.timeout(0 if CYCLES > 1 else 600)
def test_every_fault_mixed_loses_nothing_acknowledged(faulty):
    """Each fault of FAULTS in turn, CYCLES times: the checker is clean, no deposed
    node acknowledged anything, the owner equals the reference and Spark folds, and
    every epoch stamps after what it sealed."""
    nodes = faulty.nodes
    addresses = [n.address for n in nodes.values()]
    history, stop, stop_consumers = History(), threading.Event(), threading.Event()
    loop = Loop(faulty, history)
    workers = [Producer(i, addresses, history, stop) for i in range(2)] + [
        Consumer(i, addresses, history, stop_consumers) for i in range(2)]
    wait_owner(nodes)
    for w in workers:
        w.start()
    started = time.monotonic()
    try:
        for cycle in range(len(FAULTS) * CYCLES):
            try:
                loop.progress()
            except AssertionError as err:
                raise AssertionError(f"{err} {stacks(workers)}") from None
            owner = wait_owner(nodes)
            other = next(n for n in nodes.values() if n is not owner)
            loop.run(FAULTS[cycle % len(FAULTS)], owner, other)
        stop_consumers.set()  # the structure fills again: the folds below have work
        loop.progress(5 * PROGRESS)
    finally:
        stop.set()
        stop_consumers.set()
        for w in workers:
            w.join(60)
    assert all(w.error is None for w in workers), [w.error for w in workers]
    for node, since in loop.deposed:  # from what the clients were told
        late = deposed_acks(history, node, since)
        assert late == [], (f"{node.name} acknowledged {len(late)} puts while deposed",
                            since, late[:2], late[-1], loop.figures, [
                                (e.get("event"), e.get("seen"), e.get("why"))
                                for e in node.lines if e.get("event") in (
                                    "owner_acquired", "fenced", "takeover_done", "ready",
                                    "node_rejoined", "text")])
    live = owner_messages(wait_owner(nodes).address)
    assert len(live) >= 5 * PROGRESS
    assert live == reference_messages(faulty.data), "the owner differs from the sealed log's fold"
    assert live == spark_messages(faulty.data, faulty.root), (
        "the Spark fold of the whole log differs")
    epochs = len(loop.epochs | epochs_sort_after_seals(faulty.data / "logstream"))
    verdict = history.verdict(drain(addresses, history))
    takeovers = [e["seconds"] for n in nodes.values()
                 for e in n.events("takeover_done", structure=STRUCTURE)]
    print({k: (len(v) if isinstance(v, list) else v) for k, v in verdict.items()}
          | {"faults": loop.figures, "epochs": epochs, "takeovers": len(takeovers),
             "takeover_p50": median(takeovers), "takeover_max": max(takeovers),
             "seconds": round(time.monotonic() - started, 1)})
    assert epochs >= len(FAULTS) * CYCLES
    assert verdict["acknowledged"] >= len(FAULTS) * CYCLES * PROGRESS
    assert verdict["lost"] == [] and verdict["unexpected"] == []
    assert verdict["resurrected"] == [] and verdict["duplicated_at_end"] == []
    assert verdict["put_twice"] == []  # no payload under two entry ids
