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
        raw = Raw(a.socket)
        raw.register("KEYED")
        put = {"structure": S, "queue": "ONCEQ", "data": b"once", "key": ["inc1", 1]}
        first = raw.request("put", **put)["result"]["entry_id"]  # the reply the client lost
        a.kill()
        b.wait_for("takeover_done", structure=S, timeout=30)
        raw = Raw(b.socket)
        assert raw.register("KEYED")["ok"]
        assert raw.request("put", **put)["result"]["entry_id"] == first
        with cqsclient.connect(b.address, client="COUNTER") as c:
            assert [m.data for m in c.structure(S).browse_all("ONCEQ")] == [b"once"]
    finally:
        for node in (a, b):
            node.cleanup()
