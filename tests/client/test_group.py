"""Tests for cqsclient.group and cqsclient.keepalive: address lists and etcd://
groups parsed, the order addresses are tried in, NOT_OWNER followed and a
structure with no owner waited for (against fake servers), and the keepalive's
clock; tests/group/test_sdk_group.py runs them against real nodes."""

from __future__ import annotations

import base64
import json
import threading
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import errors
from cqsclient.group import (
    MOVE_PATIENCE,
    MOVE_RETRY,
    QUICK_HOPS,
    Patience,
    nodes_from_kvs,
    parse_targets,
    redirect,
)
from cqsclient.keepalive import PING, SILENT, Keepalive
from cqsclient.reconnect import Reconnect

from .fakeserver import FakeServer, error, short_socket_path


def texts(targets) -> list[str]:
    return [a.text for a in targets.candidates()]


def test_an_address_list_is_split_on_commas(monkeypatch):
    """Several addresses, commas between (spaces allowed), each parsed as alone;
    $CQSD_ADDRESS may hold a list too."""
    assert texts(parse_targets("tcp://a:7410, tcp://b:7410,unix:///s")) == [
        "tcp://a:7410", "tcp://b:7410", "unix:///s"]
    assert texts(parse_targets("tcp://[::1]:7410")) == ["tcp://[::1]:7410"]
    monkeypatch.setenv("CQSD_ADDRESS", "tcp://a:1,tcp://b:2")
    assert texts(parse_targets(None)) == ["tcp://a:1", "tcp://b:2"]


def test_an_etcd_url_names_the_group_s_etcd():
    """etcd://HOST:PORT/GROUP: where the nodes are read from, and the key range."""
    group = parse_targets("etcd://127.0.0.1:2379/CQSG1").etcd
    assert group is not None
    assert (group.host, group.port, group.group) == ("127.0.0.1", 2379, "CQSG1")
    assert group.key_range() == ("/cqsd/CQSG1/nodes/", "/cqsd/CQSG1/nodes0")
    assert parse_targets("etcd://[::1]:2379/G").etcd.host == "::1"


@pytest.mark.parametrize("text", [
    "tcp://a:1,", ",tcp://a:1", "tcp://a:1,,tcp://b:2", "tcp://a:1,tcp://b",
    "etcd://h:2379", "etcd://h:2379/", "etcd://h/G", "etcd://h:2379/G/x",
    "etcd://h:2379/G,tcp://a:1", "tcp://a:1,http://b:2",
])
def test_bad_address_lists_are_refused_with_a_reason(text):
    """A malformed entry, an empty one, or an etcd group in a list is a ValueError."""
    with pytest.raises(ValueError, match="address"):
        parse_targets(text)


def test_connect_refuses_a_bad_list_before_connecting():
    with pytest.raises(ValueError, match="empty entry"):
        cqsclient.connect("tcp://a:1,", client="X")
    with pytest.raises(ValueError, match="empty entry"):
        cqsclient.aio.connect("tcp://a:1,", client="X")


def test_candidates_put_the_owner_first_and_the_lost_node_last():
    """The node a NOT_OWNER named is tried first; the one whose connection was lost
    (perhaps stopped, still accepting connections) last."""
    targets = parse_targets("tcp://a:1,tcp://b:2,tcp://c:3")
    targets.prefer = parse_targets("tcp://c:3").addresses[0]
    assert texts(targets) == ["tcp://c:3", "tcp://a:1", "tcp://b:2"]
    targets.lost("tcp://c:3")
    assert texts(targets) == ["tcp://a:1", "tcp://b:2", "tcp://c:3"]
    targets.lost("tcp://a:1")
    assert texts(targets) == ["tcp://b:2", "tcp://c:3", "tcp://a:1"]
    targets.prefer = parse_targets("tcp://d:4").addresses[0]  # a node not listed
    assert texts(targets) == ["tcp://d:4", "tcp://b:2", "tcp://c:3", "tcp://a:1"]


def kv(key: str, value) -> dict[str, str]:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return {"key": base64.b64encode(key.encode()).decode(),
            "value": base64.b64encode(raw).decode()}


def test_nodes_are_read_from_etcd_s_range_reply():
    """The advertise address of each node key, in key order; values that are not a
    node's are skipped; none at all is CannotConnect."""
    kvs = [kv("/cqsd/G/nodes/NODE2", {"advertise": "tcp://b:2", "writer": "W2"}),
           kv("/cqsd/G/nodes/NODE1", {"advertise": "unix:///n1", "writer": "W1"}),
           kv("/cqsd/G/nodes/BAD", b"not json"),
           kv("/cqsd/G/nodes/NOADDR", {"writer": "W3"})]
    assert [a.text for a in nodes_from_kvs(kvs, "etcd://x:1/G")] == ["unix:///n1", "tcp://b:2"]
    with pytest.raises(errors.CannotConnect, match="no live node"):
        nodes_from_kvs([], "etcd://x:1/G")


def test_an_unreachable_etcd_is_cannot_connect(tmp_path):
    with pytest.raises(errors.CannotConnect, match="cannot read the nodes of group G"):
        cqsclient.connect("etcd://127.0.0.1:1/G", client="X", timeout=1)


def test_which_refusals_are_followed():
    """NOT_OWNER names where to go; "has no owner" for the request's structure means
    wait; any other refusal is the caller's."""
    assert redirect(errors.NotOwner("moved", "tcp://b:2", 7), "S") == "tcp://b:2"
    assert redirect(errors.NotOwner("moved"), "S") == ""
    assert redirect(errors.StructureFailed("structure S has no owner: a takeover"), "S") == ""
    assert redirect(errors.StructureFailed("structure S failed"), "S") is None
    assert redirect(errors.StructureFailed("structure T has no owner: x"), "S") is None
    assert redirect(errors.UnknownStructure("structure S is not defined"), "S") is None


def test_patience_hops_at_once_then_backs_off_then_gives_up():
    refused = errors.StructureFailed("structure S has no owner: x")
    alone = Patience(None)
    named = errors.NotOwner("structure S is owned by node N2 (epoch 7) at tcp://b:2")
    assert all(alone.quick_hop(named) for _ in range(QUICK_HOPS)) and not alone.quick_hop(named)
    with pytest.raises(errors.StructureFailed):
        alone.next_delay(refused)
    patient = Patience(Reconnect(first_delay=0.01, jitter=0, give_up_after=0.05))
    assert patient.next_delay(refused) == 0.01
    assert patient.next_delay(refused) == 0.02
    patient.started -= 1
    with pytest.raises(errors.StructureFailed):
        patient.next_delay(refused)


def test_once_a_move_was_seen_every_refusal_is_asked_again_at_the_move_cadence():
    """A planned move's refusals, and the NOT_OWNER bounces after its old owner let the
    structure go (the target may name the old owner for a moment), are asked again
    every MOVE_RETRY, with or without a reconnect policy, for MOVE_PATIENCE seconds."""
    released = errors.NotOwner("structure S moved to the node at tcp://b:2", "tcp://b:2")
    stale = errors.NotOwner("structure S is owned by node N1 (epoch 7) at tcp://a:1",
                            "tcp://a:1", 7)
    alone = Patience(None)
    assert alone.quick_hop(released) and alone.quick_hop(stale) and alone.quick_hop(released)
    assert not alone.quick_hop(stale)
    assert alone.next_delay(stale) == MOVE_RETRY
    moving = Patience(None)
    assert moving.next_delay(errors.StructureFailed(
        "structure S has no owner: it is moving to this node")) == MOVE_RETRY
    moving.started -= MOVE_PATIENCE
    with pytest.raises(errors.NotOwner):
        moving.next_delay(stale)


def test_the_keepalive_pings_a_quiet_daemon_and_declares_a_silent_one():
    """Pings every third of the keepalive of quiet; silent a keepalive after the wait
    began or the daemon last spoke, whichever is later."""
    k = Keepalive(3.0)
    assert k.step(100.0, since=100.0) == (None, 1.0)
    assert k.step(101.0, since=100.0) == (PING, 1.0)
    assert k.step(101.5, since=100.0) == (None, 0.5)
    assert k.step(102.0, since=100.0) == (PING, 1.0)
    assert k.step(103.0, since=100.0) == (SILENT, 0.0)
    k.heard(102.5)  # the ping's reply
    assert k.step(103.0, since=100.0) == (None, 0.5)
    assert k.step(105.5, since=100.0) == (SILENT, 0.0)
    assert k.step(105.5, since=105.0) == (None, 0.5)  # a new wait, long after
    with pytest.raises(ValueError):
        Keepalive(0)


@pytest.fixture
def owner(tmp_path):
    (tmp_path / "o").mkdir()
    fake = FakeServer(short_socket_path(tmp_path / "o")).start()
    yield fake
    fake.stop()


@pytest.fixture
def other(tmp_path):
    (tmp_path / "x").mkdir()
    fake = FakeServer(short_socket_path(tmp_path / "x")).start()
    yield fake
    fake.stop()


def not_owner(owner_address: str):
    def refuse(conn, frame):
        return {**error(frame["id"], "NOT_OWNER", f"structure {frame['structure']} is owned "
                        f"by node N1 (epoch 9) at {owner_address}"),
                "owner": owner_address, "epoch": 9}
    return refuse


def test_a_blocking_client_follows_not_owner(owner, other):
    """A put refused NOT_OWNER is sent again to the owner it names, once; the client
    now talks to the owner, where its interest is registered again, and the node it
    left saw it deregister."""
    at_owner = f"unix://{owner.path}"
    other.handlers["put"] = not_owner(at_owner)
    with cqsclient.connect(f"unix://{other.path}", client="F1") as c:
        c.register_interest("MSGQ01", "TRANX")
        c.structure("MSGQ01").put("TRANX", b"x")
        assert c.address == at_owner
        assert c.owners == {"MSGQ01": at_owner}
        assert c.last_resync.interests == [("MSGQ01", "TRANX", "TRAN")]
    assert [m.data for m in owner.messages()] == [b"x"]
    assert len(other.ops("put")) == 1 and len(owner.ops("put")) == 1
    assert other.ops("deregister") and owner.ops("register_interest")


def test_an_owner_out_of_reach_ends_in_not_owner_without_reconnect(owner, tmp_path):
    """A NOT_OWNER naming a node that cannot be reached: with no reconnect policy the
    NotOwner is raised after the quick tries, carrying the owner and epoch."""
    owner.handlers["put"] = not_owner(f"unix://{tmp_path}/gone.sock")
    with cqsclient.connect(f"unix://{owner.path}", client="F2") as c:
        with pytest.raises(errors.NotOwner) as caught:
            c.structure("MSGQ01").put("TRANX", b"x")
        assert caught.value.owner.endswith("gone.sock") and caught.value.epoch == 9
    assert len(owner.ops("put")) == 1 + QUICK_HOPS


def test_a_structure_with_no_owner_is_waited_for_with_reconnect(owner):
    """STRUCTURE_FAILED "has no owner": raised at once without reconnect; with it the
    request is asked again with back-off until the structure has an owner."""
    refusals = iter(range(3))

    def takeover_under_way(conn, frame):
        if next(refusals, None) is None:
            del owner.handlers["put"]
            return owner._handle(conn, frame, [])
        return error(frame["id"], "STRUCTURE_FAILED", "structure MSGQ01 has no owner: no "
                     "node owns it now (a takeover is under way)")

    owner.handlers["put"] = takeover_under_way
    address = f"unix://{owner.path}"
    with cqsclient.connect(address, client="F3") as c, pytest.raises(errors.StructureFailed):
        c.structure("MSGQ01").put("TRANX", b"x")
    policy = Reconnect(first_delay=0.01)
    with cqsclient.connect(address, client="F3", reconnect=policy) as c:
        assert c.structure("MSGQ01").put("TRANX", b"y") > 0
    assert [m.data for m in owner.messages()] == [b"y"]


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_client_follows_not_owner(owner, other, backend):
    at_owner = f"unix://{owner.path}"
    other.handlers["put"] = not_owner(at_owner)

    async def main():
        async with cqsclient.aio.connect(f"unix://{other.path}", client="F4") as c:
            await (await c.structure("MSGQ01")).put("TRANX", b"x")
            assert c.address == at_owner

    anyio.run(main, backend=backend)
    assert [m.data for m in owner.messages()] == [b"x"]
    assert other.ops("deregister")


def silent(conn, frame):
    return None  # never answered: a stopped daemon


def test_the_keepalive_notices_a_daemon_that_answers_nothing(owner):
    """A put that no reply (nor any ping's) follows raises ConnectionLost, applied
    unknown, a keepalive after it was sent."""
    owner.handlers["put"] = owner.handlers["ping"] = silent
    with cqsclient.connect(f"unix://{owner.path}", client="K1", keepalive=0.3) as c:
        started = time.monotonic()
        with pytest.raises(errors.ConnectionLost, match="keepalive") as caught:
            c.structure("MSGQ01").put("TRANX", b"x")
        waited = time.monotonic() - started
    assert caught.value.applied is None
    assert 0.3 <= waited < 1.5
    assert owner.ops("ping")


def test_a_long_read_wait_is_not_silence(owner):
    """A read waiting for longer than the keepalive stays up: the daemon answers the
    pings sent meanwhile, and the read gets the message put later."""
    at = f"unix://{owner.path}"
    with cqsclient.connect(at, client="K2", keepalive=0.3) as c, \
            cqsclient.connect(at, client="K3") as putter:
        def put_later():
            owner.wait_parked(1)
            time.sleep(1.2)  # four keepalives of a read waiting on the daemon
            putter.structure("MSGQ01").put("TRANX", b"late")

        thread = threading.Thread(target=put_later)
        thread.start()
        message = c.structure("MSGQ01").read("TRANX", wait=10)
        thread.join()
        assert message is not None and message.data == b"late"
        assert len(owner.ops("ping")) >= 3


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_keepalive_notices_a_silent_daemon(owner, backend):
    owner.handlers["put"] = owner.handlers["ping"] = silent

    async def main():
        async with cqsclient.aio.connect(f"unix://{owner.path}", client="K4",
                                         keepalive=0.3) as c:
            s = await c.structure("MSGQ01")
            started = time.monotonic()
            with pytest.raises(errors.ConnectionLost, match="keepalive"):
                await s.put("TRANX", b"x")
            return time.monotonic() - started

    assert 0.3 <= anyio.run(main, backend=backend) < 1.5


def test_a_group_client_has_a_keepalive_by_default_and_one_daemon_none():
    """A list or etcd:// gets GROUP_KEEPALIVE unless told; 0 turns it off; one address none."""
    from cqsclient.group import GROUP_KEEPALIVE, keepalive_for, parse_targets

    group = parse_targets("unix:///a/s,unix:///b/s")
    assert keepalive_for(group, None) == GROUP_KEEPALIVE
    assert keepalive_for(group, 0) is None and keepalive_for(group, 7.0) == 7.0
    assert keepalive_for(parse_targets("etcd://127.0.0.1:2379/G1"), None) == GROUP_KEEPALIVE
    assert keepalive_for(parse_targets("unix:///a/s"), None) is None
