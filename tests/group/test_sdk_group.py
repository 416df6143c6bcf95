"""The SDK follows the owner (docs/sdk.md, Groups): address lists, etcd:// groups,
NOT_OWNER followed, a SIGKILLed and a SIGSTOPped owner ridden through with
``reconnect`` and the keepalive. Real etcd, real daemons, real signals."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time

import pytest
import trio

import cqsclient
import cqsclient.aio
from cqsclient import ConnectionLost, ctl
from cqsclient.errors import CannotConnect
from cqsproto import encode_frame

from ..daemon.harness import Raw
from .checker import History, ResendingProducer, drain
from .cluster import Node, shared_data

S = "MSGQ01"
LEASE = 2
GROUPS = (f"SDK{i}" for i in itertools.count())


@pytest.fixture
def pair(etcd_server):
    """Two nodes of a fresh group: NODE1 owns every pair, NODE2 stands by and
    knows NODE1 as the owner."""
    group, data = next(GROUPS), shared_data()
    keys = "resync_grace = 30"  # a client's locks wait for it across a takeover
    prefer = 'prefer = ["NODE1", "NODE2"]'  # else the spread would call MSGQ01 to NODE2
    a = Node("NODE1", data, etcd_server.endpoint, group=group, lease=LEASE, daemon_keys=keys,
             prefer=prefer)
    b = Node("NODE2", data, etcd_server.endpoint, group=group, lease=LEASE, daemon_keys=keys,
             prefer=prefer)
    try:
        a.start()
        a.wait_for("takeover_done", count=2, timeout=30)
        b.start()
        owners_seen_by(b, "NODE1")
        yield a, b
    finally:
        for node in (a, b):
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
            node.cleanup()


def owners_seen_by(node: Node, owner: str, timeout: float = 20) -> None:
    """Block until ``node``'s display owners names ``owner`` for every pair: the view
    is the node's poll of etcd, which logs nothing to wait for."""
    deadline = time.monotonic() + timeout
    with cqsclient.connect(node.address, client="LOOKER", operator=True) as c:
        while True:
            rows = c.query("owners")
            if rows and all(r["owner"] == owner for r in rows):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{node.name} did not see {owner} own every pair: {rows}")
            time.sleep(0.1)  # polling a view the node updates every poll interval


def payloads_on(node: Node) -> list[bytes]:
    with cqsclient.connect(node.address, client="COUNTER") as c:
        return [m.data for m in c.structure(S).browse_all("TRANX")]


def test_an_address_list_connects_past_a_dead_first_address(pair, tmp_path):
    """The first address has no daemon: the client registers with the next one."""
    a, _ = pair
    dead = f"unix://{tmp_path}/none.sock"
    with cqsclient.connect(f"{dead},{a.address}", client="LISTED") as c:
        assert c.address == a.address
        assert c.structure(S).put("TRANX", b"listed") > 0
    with pytest.raises(CannotConnect, match="none.sock"):
        cqsclient.connect(f"{dead},{dead}2", client="LISTED")


def test_a_put_to_a_non_owner_is_followed_to_the_owner_and_applied_once(pair):
    """Connected to the standby only, a put gets NOT_OWNER, the SDK moves to the
    owner it names and sends it again: applied once, on the owner."""
    a, b = pair
    with cqsclient.connect(b.address, client="FOLLOWER") as c:
        assert c.address == b.address
        entry_id = c.structure(S).put("TRANX", b"followed")
        assert c.address == a.address
        assert c.last_resync is not None and "moved to the owner" in c.last_resync.cause
        assert c.structure(S).put("TRANX", b"second") > entry_id  # no second move
    assert payloads_on(a) == [b"followed", b"second"]


def test_an_etcd_url_finds_the_nodes(pair, etcd_server):
    """etcd://HOST:PORT/GROUP lists the live nodes' advertised addresses; a group
    with no live node cannot be connected to."""
    a, b = pair
    group = a.config.read_text().split('name = "')[-1].split('"')[0]
    where = etcd_server.endpoint.removeprefix("http://")
    targets = cqsclient.group.parse_targets(f"etcd://{where}/{group}")
    assert [t.text for t in targets.candidates()] == [a.address, b.address]
    with cqsclient.connect(f"etcd://{where}/{group}", client="FINDER") as c:
        c.structure(S).put("TRANX", b"found")
        assert c.address == a.address
    with pytest.raises(CannotConnect, match="no live node"):
        cqsclient.connect(f"etcd://{where}/NOSUCH", client="FINDER")


def put_loop(c: cqsclient.Client, stop: threading.Event, acked: list, lost: list,
             progress: threading.Condition) -> None:
    """Put numbered messages until ``stop``: each acknowledged (payload, time) or
    lost (payload, applied)."""
    s = c.structure(S)
    for i in itertools.count():
        if stop.is_set():
            return
        data = b"m%06d" % i
        try:
            s.put("TRANX", data)
        except ConnectionLost as error:
            lost.append((data, error.applied))
            continue
        with progress:
            acked.append((data, time.monotonic()))
            progress.notify_all()


def ride(c: cqsclient.Client, fault, after: int = 30) -> tuple[list, list, float]:
    """Put in a loop on ``c``, cause ``fault`` once some puts are acknowledged, and go
    on until ``after`` more are: (acknowledged, lost, the longest pause between two
    acknowledgements after the fault)."""
    stop, progress = threading.Event(), threading.Condition()
    acked: list = []
    lost: list = []
    worker = threading.Thread(target=put_loop, args=(c, stop, acked, lost, progress))
    worker.start()
    try:
        with progress:
            assert progress.wait_for(lambda: len(acked) >= 20, 20)
            before = len(acked)
        faulted = time.monotonic()
        fault()
        with progress:
            assert progress.wait_for(lambda: len(acked) >= before + after, 60), \
                f"no progress after the fault: {len(acked) - before} acknowledged, lost {lost}"
    finally:
        stop.set()
        worker.join(30)
    times = [faulted] + [t for _, t in acked if t > faulted]
    return acked, lost, max(b - a for a, b in itertools.pairwise(times))


def test_a_reconnecting_client_rides_a_sigkill_of_the_owner(pair):
    """SIGKILL of the owner while a client puts in a loop: the client reconnects to
    the standby, waits for it to take over, and carries on; every put was either
    acknowledged or raised ConnectionLost with applied unknown, and every
    acknowledged one is on the new owner, once. The lock it held came back at
    the resync (the reconnect waited for an owner of its structure)."""
    a, b = pair
    with cqsclient.connect(f"{a.address},{b.address}", client="RIDER", reconnect=True,
                           keepalive=1.0) as c:
        s = c.structure(S)
        s.put("HELDQ", b"held")
        held = s.read("HELDQ")
        acked, lost, pause = ride(c, a.kill)
        assert c.address == b.address
        resync = c.last_resync
        assert [lock.entry_id for lock in resync.kept] == [held.entry_id], resync
        assert resync.lost == []
        s.delete(held.entry_id)  # held indeed: LOCK_NOT_HELD otherwise
    assert all(applied is None for _, applied in lost), lost
    assert len(lost) <= 1  # one put at most was in flight when the owner died
    on_b = payloads_on(b)
    assert len(on_b) == len(set(on_b))
    assert {data for data, _ in acked} <= set(on_b)
    assert set(on_b) <= {data for data, _ in acked} | {data for data, _ in lost}
    print(f"SIGKILL takeover, lease {LEASE}: puts paused {pause:.2f} s, "
          f"{len(acked)} acknowledged, {len(lost)} lost in flight")
    assert pause < 4 * LEASE + 5


def test_a_silent_owner_is_noticed_by_the_keepalive(pair):
    """SIGSTOP of the owner for longer than its lease: the client's keepalive notices
    the silence, the client moves to the new owner and carries on, its interest
    registered again. Resumed, the old owner acknowledges nothing: a put sent to
    it while it was stopped is refused."""
    a, b = pair
    raw = Raw(a.socket)
    assert raw.register("LATE")["ok"] is True
    with cqsclient.connect(f"{a.address},{b.address}", client="WATCHER", reconnect=True,
                           keepalive=1.0) as c:
        c.register_interest(S, "WATCHQ")

        def stop_owner() -> None:
            os.kill(a.proc.pid, signal.SIGSTOP)
            raw.send(encode_frame({"id": 99, "op": "put", "structure": S, "queue": "TRANX",
                                   "data": b"late"}))

        acked, lost, pause = ride(c, stop_owner)
        assert c.address == b.address
        assert c.last_resync.interests == [(S, "WATCHQ", "TRAN")]
        c.structure(S).put("WATCHQ", b"work")
        assert next(iter(c.notifications(timeout=10))).queue == "WATCHQ"
        b.wait_for("takeover_done", count=2)
    os.kill(a.proc.pid, signal.SIGCONT)
    a.wait_for("fenced")
    late = raw.receive()
    assert late is not None and late["id"] == 99 and late["ok"] is False, late
    assert all(applied is None for _, applied in lost), lost
    on_b = payloads_on(b)
    assert {data for data, _ in acked} <= set(on_b) and b"late" not in on_b
    print(f"SIGSTOP, lease {LEASE}, keepalive 1 s: puts paused {pause:.2f} s; the late put "
          f"got {late['reason']}: {late['message']}")
    after = raw.request("put", structure=S, queue="TRANX", data=b"after")
    assert after["ok"] is False and after["reason"] in ("NOT_OWNER", "STRUCTURE_FAILED"), after


def test_cqsctl_finds_the_owner_and_displays_the_owners(pair, etcd_server, capsys):
    """cqsctl given the standby first puts on the owner; display owners is answered
    by any node, as a table and as the daemon's rows."""
    a, b = pair

    def cqsctl(*argv: str) -> tuple[int, str]:
        status = ctl.main(["--address", f"{b.address},{a.address}", *argv])
        out, err = capsys.readouterr()
        assert status == 0, err
        return status, out

    _, out = cqsctl("put", S, "TRANX", "by ctl")
    assert int(out) > 0 and payloads_on(a) == [b"by ctl"]
    _, out = cqsctl("display", "owners")
    lines = out.splitlines()
    assert lines[0].split() == ["STRUCTURE", "OWNER", "EPOCH", "LEASE_LEFT", "STANDBYS"]
    assert [line.split()[:2] for line in lines[1:]] == [["EMHQ01", "NODE1"], [S, "NODE1"]]
    assert all(line.split()[-1] == "NODE2" for line in lines[1:])
    _, out = cqsctl("--json", "display", "owners")
    rows = json.loads(out)
    assert [(r["structure"], r["owner"]) for r in rows] == [("EMHQ01", "NODE1"), (S, "NODE1")]
    assert all(type(r["epoch"]) is int and r["standbys"][0]["node"] == "NODE2" for r in rows)


def test_the_async_client_follows_the_owner(pair, etcd_server):
    """cqsclient.aio, given the group's etcd, registers with a node and puts on the
    owner, under Trio."""
    a, b = pair
    group = a.config.read_text().split('name = "')[-1].split('"')[0]
    where = etcd_server.endpoint.removeprefix("http://")

    async def main() -> str:
        async with cqsclient.aio.connect(f"etcd://{where}/{group}", client="ASYNC",
                                         keepalive=1.0) as c:
            await (await c.structure(S)).put("TRANX", b"async")
            return c.address

    assert trio.run(main) == a.address
    assert payloads_on(a) == [b"async"]


def test_a_put_resent_after_a_takeover_is_stored_once_on_the_new_owner(pair):
    """Exactly-once puts across a takeover (docs/group.md): a put the owner applied
    but whose reply its client never got, then SIGKILL of the owner; sent again with
    the same key to the node that took over, it gets the first entry id and is
    stored once. Meanwhile SDK producers with ``reconnect`` put through the kill:
    the total-queue checker finds nothing lost and nothing put twice."""
    a, b = pair
    raw = Raw(a.socket)
    raw.register("KEYED")
    put = {"structure": S, "queue": "ONCEQ", "data": b"once", "key": ["inc1", 1]}
    first = raw.request("put", **put)["result"]["entry_id"]  # the reply the client lost
    history, stop = History(), threading.Event()
    producers = [ResendingProducer(n, [a.address, b.address], history, stop) for n in (1, 2)]
    for p in producers:
        p.start()
    history.wait_for_puts(20)  # puts flowing to the owner before it dies
    a.kill()
    b.wait_for("takeover_done", count=2, timeout=30)
    raw = Raw(b.socket)
    assert raw.register("KEYED")["ok"]
    assert raw.request("put", **put)["result"]["entry_id"] == first
    with cqsclient.connect(b.address, client="COUNTER") as c:
        assert [m.data for m in c.structure(S).browse_all("ONCEQ")] == [b"once"]
    acked = len(history.put_ok)
    history.wait_for_puts(acked + 20)  # and flowing to the new owner
    stop.set()
    for p in producers:
        p.join(60)
        assert p.error is None, p.error
    verdict = history.verdict(drain([b.address], history))
    print({k: (len(v) if isinstance(v, list) else v) for k, v in verdict.items()})
    assert verdict["lost"] == [] and verdict["unexpected"] == []
    assert verdict["put_twice"] == [] and verdict["duplicated_at_end"] == []
    assert verdict["in_doubt"] == 0  # every put in flight at the kill was resent
