"""Acknowledged recoverable work survives SIGKILL of the daemon.

Worker processes put, read, delete and commit while the daemon is killed at
random moments and restarted. Each worker writes to its journal only what the
daemon acknowledged; the checker then holds the recovered structure to it.
"""

import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import cqsclient

from .harness import STRUCTURES

WORKER = r"""
import json, os, random, sys, time
import cqsclient
from cqsclient.errors import CQSError

address, name, journal_path, stop_path, seed, large, pace = sys.argv[1:8]
pace = float(pace)  # seconds between requests: a load that leaves the machine room
rng = random.Random(int(seed))
journal = open(journal_path, "a", buffering=1)
n = 0

def body(data):
    # its identity, then with `large` a filler of 40 KB to 2 MB that the checker can
    # verify, so that a large message must come back byte for byte
    if large == "0":
        return data.encode()
    seq = data.split("-")[1]
    return (data + "|" + f"{int(seq):08d}" * rng.randrange(5_000, 250_000)).encode()

def note(**kw):
    journal.write(json.dumps(kw) + "\n")

def session():
    global n
    c = cqsclient.connect(address, client=name, timeout=5)
    s = c.structure("MSGQ01")
    while not os.path.exists(stop_path):
        if pace:
            time.sleep(pace)
        queue = f"Q{rng.randrange(3)}"
        roll = rng.random()
        if roll < 0.45:
            n += 1
            data = f"{name}-{n}"
            eid = s.put(queue, body(data))
            note(op="put", eid=eid, data=data, queue=queue)
        elif roll < 0.6:
            datas = [f"{name}-{n + i + 1}" for i in range(3)]
            n += 3
            eids = s.put_batch(queue, [body(d) for d in datas])
            for eid, data in zip(eids, datas):
                note(op="put", eid=eid, data=data, queue=queue)
        elif roll < 0.85:
            m = s.read(queue)
            if m is not None:
                note(op="try", eid=m.entry_id)  # in doubt until acknowledged
                s.delete(m.entry_id)
                note(op="del", eid=m.entry_id)
        else:
            m = s.read(queue)
            if m is not None:
                n += 1
                data = f"{name}-{n}"
                note(op="try", eid=m.entry_id)
                with s.unit_of_work() as uow:
                    uow.put(queue, body(data))
                    uow.delete(m.entry_id)
                # the commit is acknowledged: both happened
                note(op="del", eid=m.entry_id)
                note(op="put", eid=uow.entry_ids[0], data=data, queue=queue)
    c.close()

deadline = time.monotonic() + 120
while not os.path.exists(stop_path) and time.monotonic() < deadline:
    try:
        session()
    except (CQSError, OSError):
        time.sleep(0.05)  # the daemon is down: try again until it is back
"""


def start_workers(daemon, n, seed, large=False, pace=0.0):
    """``n`` worker processes; ``pace``: seconds each waits before each request (0: as
    fast as the daemon answers)."""
    stop = daemon.dir / "stop"
    procs, journals = [], []
    for i in range(n):
        journal = daemon.dir / f"w{i}.jsonl"
        journals.append(journal)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, daemon.address, f"W{i}", str(journal), str(stop),
             str(seed + i), "1" if large else "0", str(pace)]))
    return procs, journals, stop


def survivors(daemon):
    with cqsclient.connect(daemon.address, client="CHECKER") as c:
        s = c.structure("MSGQ01")
        return {q: list(s.browse_all(q, "TRAN", page_size=10_000)) for q in ("Q0", "Q1", "Q2")}


def check(journals, found):
    """No acknowledged put missing unless a delete of it was sent (a delete that was
    sent but not acknowledged is in doubt: it may have happened), no acknowledged
    delete back, nothing twice, FIFO per queue among survivors."""
    puts, deleted, tried = {}, set(), set()
    order = defaultdict(list)  # (worker, queue) -> payloads in put order
    for path in journals:
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["op"] == "put":
                puts[rec["eid"]] = rec
                order[(rec["data"].split("-")[0], rec["queue"])].append(rec["data"])
            elif rec["op"] == "try":
                tried.add(rec["eid"])
            else:
                deleted.add(rec["eid"])
    seen = [m for q in found.values() for m in q]
    by_id = {m.entry_id: m for m in seen}
    payloads = [identity(m) for m in seen]
    assert len(payloads) == len(set(payloads)), "a message appears twice"
    assert len(by_id) == len(seen)
    missing = [eid for eid in puts if eid not in tried and eid not in by_id]
    assert not missing, f"acknowledged puts lost: {missing[:5]}"
    back = [eid for eid in deleted if eid in by_id]
    assert not back, f"acknowledged deletes came back: {back[:5]}"
    for queue, msgs in found.items():
        ids = [m.entry_id for m in msgs]
        assert ids == sorted(ids), f"{queue} is not FIFO"
        for (worker, q), sequence in order.items():
            if q == queue:
                mine = [identity(m) for m in msgs if identity(m).split("-")[0] == worker]
                rank = {d: i for i, d in enumerate(sequence)}
                ranks = [rank[d] for d in mine if d in rank]
                assert ranks == sorted(ranks), f"{worker} on {queue} out of put order"
    return len(puts), len(deleted), len(seen)


def identity(m):
    """A message's identity (worker-sequence), once its filler checks out."""
    ident, _, filler = m.data.decode().partition("|")
    if filler:
        stamp = f"{int(ident.split('-')[1]):08d}"
        assert filler == stamp * (len(filler) // 8), f"{ident} came back with wrong bytes"
    return ident


def test_sigkill_at_random_moments_loses_no_acknowledged_work(make_daemon):
    """Five SIGKILL/restart cycles under load from three workers keep every acknowledgement."""
    crash_under_load(make_daemon(), cycles=5, large=False)


def test_sigkill_with_large_offloaded_puts_in_flight_loses_nothing(make_daemon):
    """The same with payloads of 40 KB to 2 MB offloaded to SMDS: nothing acknowledged
    is lost, nothing comes back with wrong bytes."""
    smds = STRUCTURES.replace('overflow = "MSGQ01OV"', 'overflow = "MSGQ01OV"\noffload = "smds"')
    d = make_daemon(structures=smds)
    crash_under_load(d, cycles=3, large=True, least=10)
    assert list((d.data / "smds" / "MSGQ01").glob("W*.smds"))


def crash_under_load(d, cycles, large, least=50):
    seed = int(os.environ.get("CQSD_CRASH_SEED", random.randrange(1 << 30)))
    print(f"crash test seed {seed}")
    rng = random.Random(seed)
    d.start()
    procs, journals, stop = start_workers(d, 3, seed, large)
    try:
        for _ in range(cycles):
            time.sleep(rng.uniform(0.3, 1.2))  # the random moment of the crash, not a sync
            d.kill()
            d.restart()
            assert d.events("structure_rebuilt")
        # work on after the last restart: until every worker has journalled again
        sizes = [j.stat().st_size for j in journals]
        deadline = time.monotonic() + 60
        while any(j.stat().st_size == n for j, n in zip(journals, sizes, strict=True)):
            assert time.monotonic() < deadline, "a worker never got back to work"
            time.sleep(0.01)
    finally:
        stop.touch()
        for p in procs:
            p.wait(60)
    puts, deletes, left = check(journals, survivors(d))
    assert puts > least, f"the workload made too little progress ({puts} puts)"
    replays = [e["records_replayed"] for e in d.events("structure_rebuilt")
               if e["structure"] == "MSGQ01"]
    assert max(replays) > 0


def test_locked_messages_come_back_after_a_crash(make_daemon):
    """A message locked when the daemon died is unlocked at restart with its delivery count."""
    d = make_daemon().start()
    c = cqsclient.connect(d.address, client="HOLDER")
    s = c.structure("MSGQ01")
    eid = s.put("Q", b"locked at the crash")
    nonrec = s.put("Q", b"not recoverable", recoverable=False)
    assert s.read("Q").entry_id == eid
    d.kill()
    c.close()
    d.restart()
    with cqsclient.connect(d.address, client="AFTER") as c2:
        s2 = c2.structure("MSGQ01")
        m = s2.read("Q")
        assert m.entry_id == eid and m.delivery_count == 2
        assert s2.read("Q") is None, "a non-recoverable message survived a crash"
        assert s2.put("Q", b"new") > max(eid, nonrec)


def test_crash_after_clean_restart_recovers_from_the_base_image(make_daemon):
    """Clean stop, restart, more work, crash: the base image plus the tail has it all."""
    d = make_daemon().start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        before = s.put_batch("Q", [b"a", b"b", b"c"])
        s.put("Q", b"gone", recoverable=False)
    assert d.stop() == 0
    d.restart()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        s.delete(s.read("Q").entry_id)
        after = s.put("Q", b"d")
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="A") as c:
        assert [m.entry_id for m in c.structure("MSGQ01").browse("Q")] == before[1:] + [after]


def _maps_arrow(d) -> bool:
    return "libarrow" in Path(f"/proc/{d.proc.pid}/maps").read_text()


def test_a_start_and_a_crash_restart_with_no_checkpoint_never_load_pyarrow(make_daemon):
    """pyarrow reads and writes a slot's files (cqsd/srds/slotfiles.py): a daemon with
    no slot to read starts without it, a crash restart from the log included. Its
    import was ~0.27 CPU-s of a start's ~0.57 (issue 30)."""
    d = make_daemon().start()
    assert not _maps_arrow(d)
    with cqsclient.connect(d.address, client="A") as c:
        eid = c.structure("MSGQ01").put("Q", b"kept")
    d.kill()
    d.restart()
    assert not _maps_arrow(d)
    with cqsclient.connect(d.address, client="A") as c:
        assert c.structure("MSGQ01").read("Q").entry_id == eid
