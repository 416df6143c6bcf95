"""Exactly-once puts when the nodes' clocks disagree (docs/group.md, "Clocks"): the
node that takes a pair over runs five minutes ahead of the one that took the put.
Real etcd, real daemons, a real SIGKILL; the clock faked by libfaketime."""

from __future__ import annotations

import itertools

import pytest

import cqsclient

from ..daemon.harness import Raw
from ..faults.clock import faked_clock
from .cluster import Node, shared_data

S = "MSGQ01"
AHEAD = 300  # seconds: more than the default dedup_window of 120
GROUPS = (f"CLK{i}" for i in itertools.count())
PUT = {"structure": S, "queue": "ONCEQ", "data": b"once", "key": ["inc1", 1]}


def put_once(node: Node) -> int:
    """The keyed put, taken by ``node``: its entry id (the reply the client lost)."""
    raw = Raw(node.socket)
    raw.register("KEYED")
    return raw.request("put", **PUT)["result"]["entry_id"]


def assert_stored_once(node: Node, first: int) -> None:
    """The put sent again to ``node`` gets the ``first`` entry id, and is there once."""
    raw = Raw(node.socket)
    assert raw.register("KEYED")["ok"]
    assert raw.request("put", **PUT)["result"]["entry_id"] == first
    with cqsclient.connect(node.address, client="COUNTER") as c:
        assert [m.data for m in c.structure(S).browse_all("ONCEQ")] == [b"once"]


@pytest.mark.parametrize("standby", ["cold", "warm"])
def test_a_put_resent_to_a_node_five_minutes_ahead_is_stored_once(etcd_server, tmp_path,
                                                                    standby):
    """A put the owner applied but whose reply was lost, then SIGKILL of the owner;
    sent again with its key to the node that took over, whose wall clock runs five
    minutes ahead, it gets the first entry id and is stored once. (That node counted
    the key's age on its own clock against the old owner's stamp: older than the
    window, forgotten, and the put applied twice.)"""
    group, data = next(GROUPS), shared_data()
    prefer = 'prefer = ["NODE1", "NODE2"]'
    a = Node("NODE1", data, etcd_server.endpoint, group=group, prefer=prefer)
    b = Node("NODE2", data, etcd_server.endpoint, group=group, prefer=prefer, standby=standby,
             env=faked_clock(tmp_path / "NODE2.faketime", AHEAD))
    try:
        a.start()
        a.wait_for("takeover_done", structure=S, timeout=30)
        b.start()
        if standby == "warm":
            b.wait_for("warm_standby_loaded", structure=S, timeout=60)
        first = put_once(a)
        a.kill()
        b.wait_for("takeover_done", structure=S, timeout=30)
        assert_stored_once(b, first)
    finally:
        for node in (a, b):
            node.cleanup()


# a checkpoint job would not finish in a second: a cold takeover's base image is the base
BASED = 'checkpoint_interval = 0\ncheckpoint_log_volume = "128KiB"\njob_timeout = 1'
FILLER = 200  # 1 KiB puts: more than the volume


def test_a_put_its_warm_standbys_base_covers_is_stored_once_by_a_node_ahead(etcd_server,
                                                                             tmp_path):
    """A keyed put whose reply was lost, taken by NODE1; NODE3 takes the pair over cold
    and saves a base image that covers the put; only then NODE2, five minutes ahead,
    loads as a warm standby, reading the keys its base covers back from the log, and
    takes over from NODE3. The resend gets the first entry id. (Loading, NODE2 counted
    the window back from its own clock: the key looked older than the window, was
    never read back, and the resend was applied twice.)"""
    group, data = next(GROUPS), shared_data()
    prefer = 'prefer = ["NODE1", "NODE3", "NODE2"]'
    a, c = (Node(name, data, etcd_server.endpoint, group=group, prefer=prefer, lease=3,
                 daemon_keys=BASED) for name in ("NODE1", "NODE3"))
    b = Node("NODE2", data, etcd_server.endpoint, group=group, prefer=prefer, lease=3,
             daemon_keys=BASED, standby="warm",
             env=faked_clock(tmp_path / "NODE2.faketime", AHEAD))
    try:
        a.start()
        a.wait_for("takeover_done", structure=S, timeout=30)
        c.start()
        first = put_once(a)
        with cqsclient.connect(a.address, client="FILLER") as filler:
            for i in range(FILLER):
                filler.structure(S).put("FILLQ", b"%04d" % i + bytes(1020))
        mark = c.mark()
        a.kill()
        c.wait_for("takeover_done", structure=S, timeout=30, after=mark)
        c.wait_for("base_image_saved", structure=S, timeout=30, after=mark)
        b.start()
        [loaded] = b.wait_for("warm_standby_loaded", structure=S, timeout=60)
        assert loaded["sources"][S] == "base", loaded  # the put is behind the base
        mark = b.mark()
        c.kill()
        b.wait_for("takeover_done", structure=S, timeout=30, after=mark)
        assert_stored_once(b, first)
    finally:
        for node in (a, b, c):
            node.cleanup()
