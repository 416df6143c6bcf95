"""The takeover fault loop: the owner of a pair killed, or paused past its lease,
over and over while clients put and consume; the total-queue checker finds
nothing acknowledged lost, nothing unexpected or resurrected.

``CQSD_TAKEOVER_CYCLES=N`` runs N cycles of each fault (default 2).
"""

import os
import signal
import threading
import time
import uuid
from datetime import datetime

import pytest

import cqsclient

from .checker import (
    STRUCTURE,
    Consumer,
    History,
    Producer,
    drain,
    owner_messages,
    reference_messages,
    spark_messages,
)
from .cluster import Node, shared_data

CYCLES = int(os.environ.get("CQSD_TAKEOVER_CYCLES", "2"))
LEASE = 2
PROGRESS = 20  # acknowledged puts between two faults: the clients are really working


def owner_of(nodes):
    """The node that owns STRUCTURE now, by asking each live node; None if none does."""
    for node in nodes.values():
        if node.proc is None or node.proc.poll() is not None:
            continue
        try:
            with cqsclient.connect(node.address, client="OBSERVER", timeout=2) as c:
                rows = {r["structure"]: r for r in c.query("owners")}
        except cqsclient.errors.CQSError:
            continue
        owner = rows[STRUCTURE]["owner"]
        if owner is not None:
            return nodes[owner]
    return None


def wait_owner(nodes, not_node=None, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner = owner_of(nodes)
        if owner is not None and owner is not not_node:
            return owner
        time.sleep(0.1)  # polling the group through its public query
    raise AssertionError(f"no new owner of {STRUCTURE} within {timeout} s")


def when(event) -> float:
    """An event's wall-clock time, as the daemon stamped it (UTC, ISO 8601)."""
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def trouble(nodes):
    """What the nodes said of the group and its faults, for a failure's message."""
    names = ("owner_acquired", "takeover_done", "takeover_failed", "fenced", "node_joined",
             "etcd_unreachable", "task_died", "owner_lost")
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


@pytest.fixture(params=["cold", "warm"])
def group(etcd_server, request):
    data = shared_data()
    name = "G" + uuid.uuid4().hex[:6].upper()
    nodes = {n: Node(n, data, etcd_server.endpoint, group=name, lease=LEASE,
                     standby=request.param)
             for n in ("NODE1", "NODE2")}
    for node in nodes.values():
        node.start()
    yield nodes
    for node in nodes.values():
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.cleanup()


def test_owner_killed_or_paused_loses_nothing_acknowledged(group):
    """SIGKILL, and SIGSTOP past the lease, of the owner: the standby takes over,
    the old owner acknowledges nothing after it resumes, and the checker is clean."""
    nodes = group
    addresses = [n.address for n in nodes.values()]
    history, stop, stop_consumers = History(), threading.Event(), threading.Event()
    workers = [Producer(i, addresses, history, stop) for i in range(2)] + [
        Consumer(i, addresses, history, stop_consumers) for i in range(2)]
    wait_owner(nodes)
    for w in workers:
        w.start()
    pauses = []
    try:
        for cycle in range(2 * CYCLES):
            base = len(history.put_ok)
            deadline = time.monotonic() + 60
            while len(history.put_ok) < base + PROGRESS:
                assert time.monotonic() < deadline, (
                    f"the clients made no progress: {trouble(nodes)} {stacks(workers)}")
                time.sleep(0.05)
            owner = wait_owner(nodes)
            other = next(n for n in nodes.values() if n is not owner)
            if pauses and pauses[-1][3] is None:  # the paused node may own it again now
                pauses[-1][3] = time.time()
            mark = len(other.lines)
            if cycle % 2 == 0:
                owner.kill()
                other.wait_for("takeover_done", after=mark, structure=STRUCTURE, timeout=30)
                owner.start()
            else:
                owner_mark = len(owner.lines)
                os.kill(owner.proc.pid, signal.SIGSTOP)
                other.wait_for("takeover_done", after=mark, structure=STRUCTURE, timeout=30)
                resumed, resumed_mark = time.time(), len(owner.lines)
                os.kill(owner.proc.pid, signal.SIGCONT)
                owner.wait_for("fenced", after=owner_mark, timeout=30)
                pauses.append([owner, resumed, resumed_mark, None])
        stop_consumers.set()  # the structure fills again: the folds below have work
        base = len(history.put_ok)
        while len(history.put_ok) < base + 5 * PROGRESS:
            time.sleep(0.05)
    finally:
        stop.set()
        stop_consumers.set()
        for w in workers:
            w.join(60)
    assert all(w.error is None for w in workers), [w.error for w in workers]
    for node, resumed, mark, until in pauses:  # what the clients were told, by the node's log
        # until it owns the pair again (a takeover of its own: its successor was fenced too)
        again = [when(e) for e in node.events("owner_acquired", mark, structure=STRUCTURE)]
        end = min([until or float("inf"), *again])
        late = [t for t, a in history.acks if a == node.address and resumed < t < end]
        assert late == [], f"{node.name} acknowledged {len(late)} puts after it resumed, deposed"
    data = next(iter(nodes.values())).data
    live = owner_messages(wait_owner(nodes).address)
    assert len(live) >= 5 * PROGRESS
    assert live == reference_messages(data), "the owner differs from the sealed log's fold"
    assert live == spark_messages(data), "the Spark fold of the whole log differs"
    verdict = history.verdict(drain(addresses))
    print(verdict | {k: len(verdict[k]) for k in ("lost", "unexpected", "resurrected")})
    assert verdict["acknowledged"] >= 2 * CYCLES * PROGRESS
    assert verdict["lost"] == [] and verdict["unexpected"] == []
    assert verdict["resurrected"] == [] and verdict["duplicated_at_end"] == []
