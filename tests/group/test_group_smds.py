"""SMDS offload in a group (docs/smds.md, "In a group of daemons"): data sets per
node incarnation, inherited ones read and never written, deleted once empty;
a deposed owner's late write lands only in its own incarnation's data set.
Real etcd, real daemons, real SIGKILLs, a FUSE mount that holds a write."""

import hashlib
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest

import cqsclient
import logstream
from cqsd.records import EFFECTS, PUT
from cqsd.records import STRUCTURE as KEY
from cqsproto import encode_frame

from ..daemon.harness import Raw
from . import checker
from .checker import QUEUE, STRUCTURE, owner_messages, reference_messages
from .cluster import FaultyGroup, Node, shared_data

LEASE = 3  # 2 fenced nodes by load alone on a loaded 2-core machine (CI)
# payloads over entry_max go to the data set of the client putting them
SMDS = 'offload = "smds"\nentry_max = "1KiB"\ndssize = "512KiB"\ndsblock = "64KiB"'
SIZE = 3000  # bytes of each payload: offloaded
LATE = 1 << 60  # the entry id of a deposed owner's late put: never one the owners gave
# the recovery job, and no checkpoint job competing with the clients meanwhile
SPARK = 'spark_master = "local[2]"\ncheckpoint_interval = 0\ncheckpoint_log_volume = 0'
HELD_LEASE = 3  # on FUSE a data set's first write costs the event loop more: some margin


def datasets(data, structure: str = STRUCTURE) -> list[str]:
    return sorted(p.stem for p in (data / "smds" / structure).glob("*.smds"))


def series_of(node) -> str:
    [joined] = node.events("node_joined")[-1:]
    return joined["writer"]


def take_over(dead, heir) -> None:
    mark = heir.mark()
    dead.kill()
    heir.wait_for("takeover_done", after=mark, structure=STRUCTURE, timeout=60)


def progress(history: checker.History, n: int) -> None:
    history.wait_for_puts(len(history.put_ok) + n)


def test_offloaded_messages_survive_two_takeovers_and_a_recovery(etcd_server):
    """Producers put offloaded recoverable messages and consumers take them while the
    owner is killed twice (a warm takeover, then a cold one inheriting two
    incarnations' data sets), and the deposed second owner's series gets a late
    put past its seal: the checker finds nothing lost, unexpected or resurrected
    (every payload read back byte for byte), the owner holds what the sealed
    log's fold holds, cqsctl fail + recover on the owner (the Spark job given the
    seals' cuts, materialising across epochs) gives exactly the same messages
    back, the late put left out, and once they are all consumed the inherited
    data sets are gone."""
    data, group = shared_data(), "S" + uuid.uuid4().hex[:6].upper()
    a = Node("NODE1", data, etcd_server.endpoint, group=group, lease=LEASE, daemon_keys=SPARK,
             structure_keys=SMDS)
    b = Node("NODE2", data, etcd_server.endpoint, group=group, lease=LEASE, daemon_keys=SPARK,
             structure_keys=SMDS, standby="warm")
    nodes = [a, b]
    history, stop, stop_consumers = checker.History(), threading.Event(), threading.Event()
    addresses = [n.address for n in nodes]
    workers = [checker.Producer(0, addresses, history, stop, size=SIZE),
               checker.Consumer(0, addresses, history, stop_consumers)]
    try:
        started, phases = time.monotonic(), {}
        a.start().wait_for("takeover_done", structure=STRUCTURE, timeout=30)
        b.start()
        for w in workers:
            w.start()
        progress(history, 30)
        take_over(a, b)  # warm: b tails the log, the rows' maps name a's data sets
        a.start()
        progress(history, 30)
        stop_consumers.set()  # what b's incarnation put stays in its data sets
        progress(history, 30)
        second = series_of(b)
        take_over(b, a)  # cold: a's new incarnation inherits the earlier ones
        third = series_of(a)
        with logstream.Writer.open(data / "logstream", second) as late:  # b resumed, deposed
            late.append({KEY: STRUCTURE, EFFECTS: [[PUT, LATE, "TRAN", QUEUE, b"late", 0]]})
            late.flush()
        progress(history, 30)
        phases["epochs"] = time.monotonic() - started
        stop.set()
        for w in workers:
            w.join(60)
        assert all(w.error is None for w in workers), [w.error for w in workers]
        kept = set(datasets(data))
        assert {f"PUT0.{second}", f"PUT0.{third}"} <= kept, kept

        live = owner_messages(a.address)
        assert len(live) >= 30 and all(len(p) == SIZE for p in live.values())
        assert set(live) == set(reference_messages(data)) and LATE not in live
        done = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", a.address,
                               "--json", "fail", STRUCTURE], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        done = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", a.address,
                               "--json", "recover", STRUCTURE], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["messages"] == len(live)
        assert owner_messages(a.address) == live  # the late put left out, as by the seal
        phases["recover"] = time.monotonic() - started - phases["epochs"]

        verdict = history.verdict(checker.drain([a.address]))
        print({"messages": len(live), "acknowledged": len(history.put_ok),
               "seconds": round(time.monotonic() - started, 1)}
              | {k: round(v, 1) for k, v in phases.items()})
        assert verdict["lost"] == [] and verdict["unexpected"] == []
        assert verdict["resurrected"] == [] and verdict["duplicated_at_end"] == []
        left = datasets(data)  # every message consumed: the inherited ones deleted
        assert left and all(name.endswith(f".{third}") for name in left), left
        assert a.events("smds_inherited_deleted", structure=STRUCTURE)
    finally:
        stop.set()
        stop_consumers.set()
        for node in nodes:
            node.cleanup()


@pytest.fixture
def held(etcd_server):
    """Two nodes of a fresh group on lazyfs mounts of one directory, offloading."""
    group = FaultyGroup(("NODE1", "NODE2"), etcd_server.endpoint,
                        "L" + uuid.uuid4().hex[:6].upper(), HELD_LEASE, structure_keys=SMDS)
    try:
        yield group
    finally:
        for mount in group.mounts.values():
            if mount.proc is not None:
                mount.stall(None)
        group.close()


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_deposed_owners_late_write_lands_in_its_own_data_set_only(held):
    """NODE1 hangs in the middle of writing an offloaded put's block (its lazyfs mount
    holds the write, as a pause would) until NODE2 has taken the pair over and put
    and deleted messages of the same client; let go, NODE1's late block lands in
    NODE1's data set of that client, which NODE2 reads and never writes: NODE2's
    own data set is byte for byte what it was, every message NODE2 holds reads
    back as put, and the late put is acknowledged nowhere."""
    a, b = held.nodes["NODE1"], held.nodes["NODE2"]
    a.start().wait_for("takeover_done", structure=STRUCTURE, timeout=30)
    b.start()
    early = [b"early-%d " % i + b"e" * SIZE for i in range(6)]
    raw = Raw(a.socket)
    assert raw.register("APP")["ok"] is True
    for payload in early:
        put = raw.request("put", structure=STRUCTURE, queue=QUEUE, data=payload)
        assert put["ok"] is True, put
    old = f"APP.{series_of(a)}"
    mount = held.mounts["NODE1"]
    mount.stall(".smds")
    late = b"late " + b"L" * SIZE
    raw.send(encode_frame({"id": 99, "op": "put", "structure": STRUCTURE, "queue": QUEUE,
                           "data": late}))
    deadline = time.monotonic() + 20
    while mount.stalled() != [f"{old}.smds"]:  # NODE1 is inside the block's pwrite now
        assert time.monotonic() < deadline, mount.stalled()
        time.sleep(0.05)  # polling the mount's held writes

    b.wait_for("takeover_done", structure=STRUCTURE, timeout=30)
    new = f"APP.{series_of(b)}"
    with cqsclient.connect(b.address, client="APP", timeout=10) as c:
        s = c.structure(STRUCTURE)
        fresh = [b"fresh-%d " % i + b"f" * SIZE for i in range(6)]
        s.put_batch(QUEUE, fresh)
        for _ in range(2):  # two of the inherited ones consumed
            s.delete(s.read(QUEUE).entry_id)
    before = owner_messages(b.address)
    assert sorted(before.values()) == sorted(early[2:] + fresh)
    on_disk = held.data / "smds" / STRUCTURE
    assert datasets(held.data) == sorted([old, new])
    mine = digest(on_disk / f"{new}.smds")
    inherited = (on_disk / f"{old}.smds").read_bytes()

    fenced = a.mark()
    mount.stall(None)  # the late write lands
    a.wait_for("fenced", after=fenced, timeout=30)
    reply = raw.receive()
    assert reply is not None and reply["id"] == 99 and reply["ok"] is False, reply
    seen_by_a = (held.root / "NODE1" / "data" / "smds" / STRUCTURE / f"{old}.smds").read_bytes()
    assert late[:64] in seen_by_a and late[:64] not in inherited  # late, and in its own
    assert digest(on_disk / f"{new}.smds") == mine
    for name in datasets(held.data):
        assert late[:64] not in (on_disk / f"{name}.smds").read_bytes() or name == old
    assert owner_messages(b.address) == before
    assert set(before) == set(reference_messages(held.data))
    assert late not in before.values()
