"""The Trio etcd client against a real etcd on loopback."""

import itertools

import pytest
import trio

from cqsd.group.etcd import Etcd, EtcdUnavailable

from .etcdserver import free_port

_prefix = itertools.count()


@pytest.fixture
def etcd(etcd_server):
    return Etcd([etcd_server.endpoint])


@pytest.fixture
def prefix():
    return f"/test{next(_prefix)}/"


async def test_put_then_get_returns_the_value_and_revisions(etcd, prefix):
    """A key put is read back with its value and the revision it was created at."""
    revision = await etcd.put(prefix + "a", b"one")
    kv = await etcd.get(prefix + "a")
    assert kv is not None and kv.value == b"one"
    assert kv.create_revision == kv.mod_revision == revision
    assert await etcd.get(prefix + "missing") is None


async def test_get_prefix_returns_only_keys_under_it(etcd, prefix):
    """A prefix range returns its keys in order and none of a sibling prefix."""
    await etcd.put(prefix + "x/1", "1")
    await etcd.put(prefix + "x/2", "2")
    await etcd.put(prefix + "y", "3")
    kvs, revision = await etcd.get_prefix(prefix + "x/")
    assert [kv.key for kv in kvs] == [prefix + "x/1", prefix + "x/2"]
    assert revision >= max(kv.mod_revision for kv in kvs)


async def test_create_succeeds_once_and_then_shows_the_winner(etcd, prefix):
    """Only the first create of a key succeeds; a later one sees the first's value."""
    ok, kv = await etcd.create(prefix + "owner", b"NODE1")
    assert ok and kv.value == b"NODE1"
    ok2, kv2 = await etcd.create(prefix + "owner", b"NODE2")
    assert not ok2 and kv2.value == b"NODE1" and kv2.create_revision == kv.create_revision


async def test_delete_if_spares_a_successors_key(etcd, prefix):
    """An owner's conditional delete does nothing once the key was re-created."""
    _, first = await etcd.create(prefix + "k", b"1")
    await etcd.delete(prefix + "k")
    _, second = await etcd.create(prefix + "k", b"2")
    assert not await etcd.delete_if(prefix + "k", first.create_revision)
    assert (await etcd.get(prefix + "k")).value == b"2"
    assert await etcd.delete_if(prefix + "k", second.create_revision)
    assert await etcd.get(prefix + "k") is None


async def test_a_watch_sees_a_delete_made_before_or_while_it_waits(etcd, prefix):
    """``deleted`` answers True for a delete after the given revision, whether made
    before the watch began or while it waits, and waits while there is none."""
    revision = await etcd.put(prefix + "k", b"1")
    with trio.move_on_after(0.2) as waited:
        await etcd.deleted(prefix + "k", revision)
    assert waited.cancelled_caught
    await etcd.delete(prefix + "k")
    with trio.fail_after(5):
        assert await etcd.deleted(prefix + "k", revision)
    revision = await etcd.put(prefix + "k", b"2")
    async with trio.open_nursery() as nursery:
        async def delete_soon():
            await trio.sleep(0.1)
            await etcd.delete(prefix + "k")
        nursery.start_soon(delete_soon)
        with trio.fail_after(5):
            assert await etcd.deleted(prefix + "k", revision)


async def test_a_key_bound_to_a_revoked_lease_goes(etcd, prefix):
    """Keys bound to a lease vanish when it is revoked; keepalive then reports 0."""
    lease, ttl = await etcd.grant(5)
    assert ttl == 5
    await etcd.put(prefix + "leased", b"v", lease=lease)
    assert await etcd.keepalive(lease) == 5
    await etcd.revoke(lease)
    assert await etcd.get(prefix + "leased") is None
    assert await etcd.keepalive(lease) == 0
    await etcd.revoke(lease)  # revoking a gone lease is not an error


async def test_a_lease_not_renewed_expires_with_its_keys(etcd, prefix):
    """etcd drops a key once its lease's TTL passes without a keepalive."""
    lease, _ = await etcd.grant(1)
    await etcd.put(prefix + "short", b"v", lease=lease)
    for _ in range(50):  # etcd tells nobody of an expiry but a watcher: poll, 10 s at most
        if await etcd.get(prefix + "short") is None:
            break
        await trio.sleep(0.2)
    assert await etcd.get(prefix + "short") is None
    assert await etcd.keepalive(lease) == 0


async def test_an_endpoint_that_is_down_is_skipped(etcd_server, prefix):
    """With a dead endpoint listed first, calls go to the live one."""
    etcd = Etcd([f"http://127.0.0.1:{free_port()}", etcd_server.endpoint])
    await etcd.put(prefix + "k", b"v")
    assert (await etcd.get(prefix + "k")).value == b"v"


async def test_no_endpoint_answering_raises_unavailable_naming_them():
    """With every endpoint down the call fails with EtcdUnavailable listing them."""
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailable, match=dead):
        await Etcd([dead], timeout=0.5).get("/x")


async def test_an_endpoint_that_accepts_but_never_answers_times_out():
    """A blackholed endpoint (accepts, says nothing) costs one timeout, then fails."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        async def swallow(stream):
            await trio.sleep_forever()
        nursery.start_soon(trio.serve_listeners, swallow, [listener])
        with trio.fail_after(5), pytest.raises(EtcdUnavailable, match="no answer"):
            await Etcd([f"http://127.0.0.1:{port}"], timeout=0.3).get("/x")
        nursery.cancel_scope.cancel()
