"""Who may take a free pair, and the view read from a group's etcd keys."""

import json

from cqsd.group.etcd import KV
from cqsd.group.ownership import (
    Node,
    Owner,
    View,
    home,
    key,
    may_take,
    spread,
    to_call_home,
    to_take,
)


def live(*names):
    return {n: Node(n, f"tcp://{n}", n + ".1", "warm") for n in names}


def view(*names, moves=None):
    return View(nodes=live(*names), moves=moves or {})


def test_without_a_preference_list_the_spread_picks_one_live_node():
    """absent prefer = rendezvous hashing over the live nodes: every node agrees."""
    nodes = ("NODE1", "NODE2", "NODE3")
    takers = [n for n in nodes if may_take("MSGQ01", None, n, view(*nodes))]
    assert takers == [spread("MSGQ01", nodes)]


def test_the_spread_moves_only_the_pairs_of_a_node_that_leaves():
    """Rendezvous hashing: a pair whose home stays live keeps it."""
    names = [f"Q{i}" for i in range(40)]
    three = {n: spread(n, ("NODE1", "NODE2", "NODE3")) for n in names}
    two = {n: spread(n, ("NODE1", "NODE2")) for n in names}
    assert {n for n in names if three[n] != two[n]} == {n for n in names if three[n] == "NODE3"}
    assert len(set(three.values())) == 3


def test_a_node_takes_a_pair_only_if_no_live_node_before_it_in_the_list():
    """The first live node of the preference list takes the pair."""
    prefer = ("NODE1", "NODE2", "NODE3")
    assert may_take("A", prefer, "NODE1", view("NODE1", "NODE2"))
    assert not may_take("A", prefer, "NODE2", view("NODE1", "NODE2"))
    assert may_take("A", prefer, "NODE2", view("NODE2", "NODE3"))  # NODE1 is down
    assert not may_take("A", prefer, "NODE3", view("NODE2", "NODE3"))
    assert home("A", prefer, ("NODE3",)) == "NODE3"


def test_a_node_not_in_the_list_never_takes_the_pair():
    """As with CFRM's preference list, a structure is never placed outside its list."""
    assert not may_take("A", ("NODE1",), "NODE2", view("NODE2"))


def test_a_planned_move_gives_a_free_pair_to_its_live_target_alone():
    """moves/<PAIR> names the taker while that node is live and may own the pair."""
    prefer = ("NODE1", "NODE2")
    moving = view("NODE1", "NODE2", moves={"A": "NODE2"})
    assert may_take("A", prefer, "NODE2", moving)
    assert not may_take("A", prefer, "NODE1", moving)
    gone = view("NODE1", moves={"A": "NODE2"})  # the target died: the home takes it
    assert may_take("A", prefer, "NODE1", gone)


def test_to_take_lists_free_pairs_this_node_is_wanted_for():
    """Owned pairs are never taken; free ones go by preference."""
    v = view("NODE1", "NODE2")
    pairs = {"B": ("NODE1",), "C": ("NODE2", "NODE1"), "D": ("NODE3", "NODE2")}
    assert to_take("NODE2", pairs, v) == ["C", "D"]
    assert to_take("NODE1", pairs, v) == ["B"]


def test_a_node_calls_home_the_pairs_it_is_first_for():
    """A node that joins asks, once, for the pairs that prefer it that another node
    owns; a pair placed by the spread stays with its owner."""
    v = view("NODE1", "NODE2")
    v.owners["C"] = Owner("C", "NODE1", "tcp://a", "NODE1-1", 5, 1)
    v.owners["B"] = Owner("B", "NODE1", "tcp://a", "NODE1-1", 6, 1)
    v.owners["S"] = Owner("S", "NODE1", "tcp://a", "NODE1-1", 7, 1)
    pairs = {"B": ("NODE1",), "C": ("NODE2", "NODE1"), "S": None}
    assert spread("S", {"NODE1", "NODE2"}) == "NODE2"  # its spread home, and yet
    assert to_call_home("NODE2", pairs, v) == ["C"]  # without prefer it stays put
    v.moves["C"] = "NODE2"
    assert to_call_home("NODE2", pairs, v) == []


def kv(k, value, create=1, lease=0):
    return KV(k, json.dumps(value).encode(), create, create, lease)


def test_the_view_reads_nodes_owners_and_seals_and_skips_what_it_cannot():
    """Owner keys give the epoch (their create revision); a broken key is skipped."""
    g = "CQSG1"
    view = View.read(g, [
        kv(key(g, "nodes", "NODE1"), {"advertise": "tcp://a:1", "writer": "NODE1.3"}),
        kv(key(g, "owners", "MSGQ01"), {"node": "NODE1", "advertise": "tcp://a:1",
                                        "writer": "NODE1.3"}, create=42, lease=9),
        kv(key(g, "seals", "MSGQ01", 42), {"writer": "NODE1.3", "cut": {"NODE2.1": 17},
                                           "timestamp": 5}),
        kv(key(g, "seals", "MSGQ01", 30), {"writer": "NODE2.1", "cut": {"NODE1.2": 20,
                                                                        "NODE2.0": 4},
                                           "timestamp": 3}),
        kv(key(g, "seals", "MSGQ01", 50), {"writer": "NODE2.2", "cut": {"NODE1.3": 25,
                                                                        "NODE1.2": 9},
                                           "timestamp": 7}),
        KV(key(g, "owners", "EMHQ01"), b"not json", 3, 3, 0),
        kv(key(g, "nodes", "NODE2"), {"advertise": "tcp://b:1"}),  # no writer: skipped
    ], revision=60)
    assert list(view.nodes) == ["NODE1"]
    owner = view.owners["MSGQ01"]
    assert (owner.node, owner.epoch, owner.lease, owner.writer) == ("NODE1", 42, 9, "NODE1.3")
    assert "EMHQ01" not in view.owners
    assert [s.epoch for s in view.seals["MSGQ01"]] == [30, 42, 50]
    assert view.cuts("MSGQ01") == {"NODE1.2": 20, "NODE2.0": 4, "NODE2.1": 17, "NODE1.3": 25}
    assert view.cuts("EMHQ01") == {}


def test_a_pair_free_for_too_long_is_taken_by_any_node_that_may_own_it():
    """Its home is live but does not take it (a full disk): once stale, the others may,
    within its preference list."""
    v = view("NODE1", "NODE2", "NODE3")
    pairs = {"S": None, "P": ("NODE1", "NODE2")}
    homes = {name: home(name, prefer, {"NODE1", "NODE2", "NODE3"})
             for name, prefer in pairs.items()}
    for me in ("NODE1", "NODE2", "NODE3"):
        fresh = set(to_take(me, pairs, v))
        assert fresh == {n for n, h in homes.items() if h == me}
        assert set(to_take(me, pairs, v, stale={"S", "P"})) == (
            {"S", "P"} if me != "NODE3" else {"S"})
