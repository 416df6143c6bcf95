"""Who may take a free pair, and the view read from a group's etcd keys."""

import json

from cqsd.group.etcd import KV
from cqsd.group.ownership import Node, View, key, may_take, to_take


def live(*names):
    return {n: Node(n, f"tcp://{n}", n + ".1", "warm") for n in names}


def test_without_a_preference_list_any_node_may_take_a_pair():
    """absent prefer = any node: the first transaction to land wins."""
    assert may_take(None, "NODE2", live("NODE1", "NODE2"))


def test_a_node_takes_a_pair_only_if_no_live_node_before_it_in_the_list():
    """The first live node of the preference list takes the pair."""
    prefer = ("NODE1", "NODE2", "NODE3")
    assert may_take(prefer, "NODE1", live("NODE1", "NODE2"))
    assert not may_take(prefer, "NODE2", live("NODE1", "NODE2"))
    assert may_take(prefer, "NODE2", live("NODE2", "NODE3"))  # NODE1 is down
    assert not may_take(prefer, "NODE3", live("NODE2", "NODE3"))


def test_a_node_not_in_the_list_never_takes_the_pair():
    """As with CFRM's preference list, a structure is never placed outside its list."""
    assert not may_take(("NODE1",), "NODE2", live("NODE2"))


def test_to_take_lists_free_pairs_this_node_is_wanted_for():
    """Owned pairs are never taken; free ones go by preference."""
    view = View(nodes=live("NODE1", "NODE2"))
    pairs = {"A": None, "B": ("NODE1",), "C": ("NODE2", "NODE1"), "D": ("NODE3", "NODE2")}
    assert to_take("NODE2", pairs, view) == ["A", "C", "D"]
    assert to_take("NODE1", pairs, view) == ["A", "B"]


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
