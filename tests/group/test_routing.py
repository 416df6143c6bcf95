"""Routing in the SDK (docs/sdk.md, Groups): one connect() to a group reaches pairs
owned by different nodes, on one registration per node, without asking a wrong
node twice; a planned move of one pair is followed while the other keeps its
connection; a SIGKILLed node's pair is followed to its next owner with nothing
acknowledged lost. Real etcd, real daemons, real signals."""

from __future__ import annotations

import itertools
import time

import pytest
import trio

import cqsclient
import cqsclient.aio
from cqsclient import ctl, ops
from cqsclient.errors import InvalidRequest

from .cluster import Node, shared_data

STRUCTURES = """
[[structure]]
name = "A1"
size = "4MiB"
prefer = ["NODE1", "NODE2"]

[[structure]]
name = "A2"
size = "4MiB"
prefer = ["NODE2", "NODE1"]
"""
GROUPS = (f"RT{i}" for i in itertools.count())


def owners(node: Node) -> dict[str, str | None]:
    with cqsclient.connect(node.address, client="LOOKER", operator=True) as c:
        return {r["structure"]: r["owner"] for r in c.query("owners")}


def placed(node: Node, want: dict[str, str], timeout: float = 30) -> None:
    """Block until ``node`` sees the pairs owned as ``want`` says."""
    deadline = time.monotonic() + timeout
    while (seen := owners(node)) != want:
        assert time.monotonic() < deadline, f"not placed as {want}: {seen}"
        time.sleep(0.1)  # polling a view the node updates every poll interval


def registrations(node: Node, client: str) -> int:
    return len(node.events("register", client=client))


@pytest.fixture(scope="module")
def two(etcd_server):
    """NODE1 owning A1 and NODE2 owning A2 (their prefer lists)."""
    group, data = next(GROUPS), shared_data()
    nodes = [Node(n, data, etcd_server.endpoint, group=group, lease=2, standby="warm",
                  daemon_keys="resync_grace = 30", structures=STRUCTURES)
             for n in ("NODE1", "NODE2")]
    try:
        for node in nodes:
            node.start()
        placed(nodes[0], {"A1": "NODE1", "A2": "NODE2"})
        yield nodes
    finally:
        for node in nodes:
            node.cleanup()


def move(node: Node, structure: str, to: str) -> None:
    assert ctl.main(["--address", node.address, "--json", "move-structure", structure,
                     "--to", to]) == 0


def test_one_connect_reaches_pairs_on_two_nodes_and_follows_a_planned_move(two, capsys):
    """Puts and reads on A1 (NODE1) and A2 (NODE2) through one client: one
    registration on each node, each request on its owner's connection; cqsctl puts on
    A2's owner. Moving A2 to NODE1: its requests follow (a lock read before the move
    stays the client's), its interest notifies from NODE1, A1's connection is the
    same, and NODE2's registration, no longer needed, is ended."""
    a, b = two
    with cqsclient.connect(f"{a.address},{b.address}", client="ROUTER",
                           reconnect=True) as c:
        s1, s2 = c.structure("A1"), c.structure("A2")
        c.register_interest("A2", "NOTEQ")
        for i in range(10):
            s1.put("Q", b"one%d" % i)
            s2.put("Q", b"two%d" % i)
            assert s1.read("Q") is not None and s2.read("Q") is not None
        assert c.owners == {"A1": a.address, "A2": b.address}
        assert (registrations(a, "ROUTER"), registrations(b, "ROUTER")) == (1, 1)
        assert c.address == a.address  # the home: the first address, which serves A1
        s2.put("Q", b"to hold")
        held = s2.read("Q")
        assert held is not None

        assert ctl.main(["--address", f"{a.address},{b.address}", "put", "A2", "Q",
                         "by ctl"]) == 0
        capsys.readouterr()
        with cqsclient.connect(b.address, client="COUNTER") as other:
            assert b"by ctl" in [m.data for m in other.structure("A2").browse_all("Q")]

        move(a, "A2", "NODE1")
        s2.put("Q", b"after the move")
        assert c.owners == {"A1": a.address, "A2": a.address}
        assert registrations(a, "ROUTER") == 1  # A1's connection carried A2 on
        s2.delete(held.entry_id)  # the lock came with the pair
        with cqsclient.connect(b.address, client="LOOKER", operator=True) as looker:
            assert "ROUTER" not in [r["client"] for r in looker.query("clients")]
        s2.put("NOTEQ", b"work")
        note = next(n for n in c.notifications(10.0) if n.queue == "NOTEQ")
        assert note.structure == "A2"
    move(a, "A2", "NODE2")  # as the next test expects
    placed(a, {"A1": "NODE1", "A2": "NODE2"})


def test_the_async_client_routes_each_pair_to_its_owner(two):
    """cqsclient.aio, under Trio: puts on both pairs, one registration on each node,
    the second pair's interest notifying from its owner."""
    a, b = two

    async def main() -> tuple[dict[str, str], list[cqsclient.Notification]]:
        async with cqsclient.aio.connect(f"{b.address},{a.address}",
                                         client="ASYNCR") as c:
            s1, s2 = await c.structure("A1"), await c.structure("A2")
            await c.register_interest("A1", "ANOTE")
            for i in range(5):
                await s1.put("Q", b"one%d" % i)
                await s2.put("Q", b"two%d" % i)
            await s1.put("ANOTE", b"work")
            return c.owners, [n async for n in c.notifications(5.0)]

    routes, notes = trio.run(main)
    assert routes == {"A1": a.address, "A2": b.address}
    assert (registrations(a, "ASYNCR"), registrations(b, "ASYNCR")) == (1, 1)
    assert [(n.structure, n.queue) for n in notes] == [("A1", "ANOTE")]


def test_a_unit_of_work_naming_another_pair_is_refused_naming_why(two):
    """A commit on A1 with an operation naming A2 is refused INVALID_REQUEST by A1's
    owner, saying that a unit of work spans one pair; nothing is followed or put."""
    a, b = two
    with cqsclient.connect(f"{b.address},{a.address}", client="UOW") as c:
        s1 = c.structure("A1")
        put = {"op": "put", "structure": "A2", "queue": "UOWQ", "data": b"x"}
        with pytest.raises(InvalidRequest, match="a unit of work spans one structure pair"):
            c._do(ops.commit("A1", [put]))
        assert [m.data for m in s1.browse_all("UOWQ")] == []
        assert [m.data for m in c.structure("A2").browse_all("UOWQ")] == []


def test_a_killed_node_is_followed_and_the_other_pair_keeps_its_connection(two):
    """SIGKILL of NODE2, the client's way in (its home) and A2's owner: A2's puts
    follow it to NODE1 once it has taken A2 over, every acknowledged put of both
    pairs is there, the lock held on A2 is still the client's, its interest in A2
    notifies from NODE1, and A1 went on over the one registration NODE1 had."""
    a, b = two
    with cqsclient.connect(f"{b.address},{a.address}", client="KILLED",
                           reconnect=True) as c:
        s2, s1 = c.structure("A2"), c.structure("A1")  # NODE2 serves first: it stays home
        c.register_interest("A2", "KNOTE")
        acked = {"A1": [s1.put("KQ", b"one%d" % i) for i in range(10)],
                 "A2": [s2.put("KQ", b"two%d" % i) for i in range(10)]}
        held = s2.read("KQ")
        assert held is not None and c.owners == {"A1": a.address, "A2": b.address}
        assert c.address == b.address
        b.kill()
        acked["A2"].append(s2.put("KQ", b"after the kill"))
        acked["A1"].append(s1.put("KQ", b"one more"))
        assert c.owners == {"A1": a.address, "A2": a.address} and c.address == a.address
        assert registrations(a, "KILLED") == 1
        s2.delete(held.entry_id)
        acked["A2"].remove(held.entry_id)
        for name, s in (("A1", s1), ("A2", s2)):
            assert sorted(m.entry_id for m in s.browse_all("KQ")) == sorted(acked[name])
        s2.put("KNOTE", b"work")
        note = next(n for n in c.notifications(10.0) if n.queue == "KNOTE")
        assert note.structure == "A2"
