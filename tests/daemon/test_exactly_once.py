"""Exactly-once puts through real daemons (docs/sdk.md, "Reconnect"): a put or
commit whose reply is lost is sent again by the SDK with its idempotency key and
stored once, across a dropped reply, a SIGKILL and restart, and only within the
daemon's ``dedup_window``."""

import hashlib
import threading
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import ConnectionLost, Reconnect
from tests.faults.clock import faked_clock
from tests.faults.proxy import Proxy

from .harness import Raw, free_port

FAST = Reconnect(first_delay=0.02, max_delay=0.2)
SECRET = "once-secret"
CLIENTS = "".join(f'[[client]]\nname = "{name}"\n'
                  f'secret_sha256 = "{hashlib.sha256(SECRET.encode()).hexdigest()}"\n'
                  for name in ("PRODUCER", "PLAIN", "LOOK"))


def stored(address: str, queue: str) -> list[int]:
    """The entry ids of the messages on ``queue``, as a browse finds them."""
    with cqsclient.connect(address, client="LOOK", secret=SECRET) as look:
        return [m.entry_id for m in look.structure("MSGQ01").browse_all(queue)]


@pytest.fixture
def proxied(make_daemon):
    """A daemon on TCP behind a proxy that can lose a reply and cut connections."""
    port = free_port()
    d = make_daemon(f'tcp = "127.0.0.1:{port}"\nresync_grace = 30', extra=CLIENTS).start()
    with Proxy(("127.0.0.1", port)) as proxy:
        yield d, proxy, "tcp://%s:%d" % proxy.address


def put_in_doubt(address: str, proxy: Proxy, then, send):
    """Run ``send(handle)`` on a reconnecting client whose reply the proxy drops; once
    it is dropped call ``then()``, then cut the connection: what ``send`` returned."""
    outcome: dict = {}
    with cqsclient.connect(address, client="PRODUCER", secret=SECRET, reconnect=FAST) as c:
        # the structure's handle first: getting it is a request of its own, whose
        # reply the proxy dropped, and the put or commit was never in doubt
        structure = c.structure("MSGQ01")
        proxy.drop_replies(1)
        thread = threading.Thread(target=lambda: outcome.setdefault("result", send(structure)))
        thread.start()
        assert proxy.wait(lambda st: st.replies_dropped == 1)
        then()
        proxy.reset()  # the client sees the connection die with its put in doubt
        proxy.heal()
        thread.join(30)
        assert not thread.is_alive()
    return outcome["result"]


def test_a_put_whose_reply_is_lost_is_sent_again_and_stored_once(proxied):
    """The proxy swallows a put's reply and cuts the connection: the SDK reconnects,
    sends the put again with its key, and gets the entry id of the one stored."""
    d, proxy, address = proxied
    entry_id = put_in_doubt(address, proxy, lambda: None,
                               lambda s: s.put("ONCE", b"exactly once"))
    assert stored(d.address, "ONCE") == [entry_id]


def test_a_commit_in_doubt_across_a_sigkill_is_answered_from_the_log(proxied):
    """A commit durable but unanswered when the daemon is killed: after the restart
    the daemon has read its key back from the log, and the resend gets the
    original entry ids; nothing is stored twice."""
    d, proxy, address = proxied

    def kill_and_restart() -> None:
        d.kill()
        d.restart()

    ids = put_in_doubt(address, proxy, kill_and_restart,
                          lambda s: s.put_batch("BATCH", [b"one", b"two", b"three"]))
    assert stored(d.address, "BATCH") == ids and len(ids) == 3


def test_a_restart_with_its_clock_five_minutes_ahead_answers_a_put_from_before(make_daemon,
                                                                             tmp_path):
    """A put applied, its reply lost, the daemon SIGKILLed and started again with its
    wall clock five minutes ahead (stepped while it was down, or simply down that
    long): the put sent again gets its first entry id, and is stored once.
    (Counted on that clock, the key was older than the window and was not read
    back: the put was applied twice. docs/group.md, "Clocks".)"""
    d = make_daemon().start()
    raw = Raw(d.socket)
    raw.register("RAW")
    put = {"structure": "MSGQ01", "queue": "KEYED", "data": b"x", "key": ["inc1", 7]}
    first = raw.request("put", **put)["result"]["entry_id"]
    d.kill()
    d.env = faked_clock(tmp_path / "clock", 300)
    d.restart()
    raw = Raw(d.socket)
    raw.register("RAW")
    assert raw.request("put", **put)["result"]["entry_id"] == first
    assert stored(d.address, "KEYED") == [first]


def test_the_async_client_sends_a_put_in_doubt_again(proxied):
    """The async client does the same: its put whose reply was lost returns the
    entry id of the one message stored."""
    d, proxy, address = proxied

    async def main() -> int:
        async with cqsclient.aio.connect(address, client="PRODUCER", secret=SECRET,
                                         reconnect=FAST) as c:
            s = await c.structure("MSGQ01")
            proxy.drop_replies(1)
            got: dict = {}
            async with anyio.create_task_group() as tg:
                async def put() -> None:
                    got["id"] = await s.put("AIO", b"once, async")

                tg.start_soon(put)
                assert await anyio.to_thread.run_sync(
                    proxy.wait, lambda st: st.replies_dropped == 1)
                await anyio.to_thread.run_sync(proxy.reset)
                await anyio.to_thread.run_sync(proxy.heal)
            return got["id"]

    entry_id = anyio.run(main)
    assert stored(d.address, "AIO") == [entry_id]


def test_without_reconnect_a_put_in_doubt_still_raises(proxied):
    """Without ``reconnect`` nothing is sent again: ConnectionLost(applied=None)."""
    d, proxy, address = proxied
    with cqsclient.connect(address, client="PLAIN", secret=SECRET) as c:
        s = c.structure("MSGQ01")
        proxy.drop_replies(1)
        raised: list[BaseException] = []

        def put() -> None:
            try:
                s.put("PLAIN", b"in doubt")
            except ConnectionLost as lost:
                raised.append(lost)

        thread = threading.Thread(target=put)
        thread.start()
        assert proxy.wait(lambda st: st.replies_dropped == 1)
        proxy.reset()
        thread.join(30)
    assert len(raised) == 1 and raised[0].applied is None
    assert len(stored(d.address, "PLAIN")) == 1


def test_keys_are_forgotten_after_the_window_and_bad_ones_refused(make_daemon):
    """A key is answered with its first entry id; once ``dedup_window`` has passed it
    is forgotten, and the same key puts again. A malformed key is refused, naming it."""
    d = make_daemon("dedup_window = 1").start()
    raw = Raw(d.socket)
    assert raw.register("RAW")["result"]["dedup_window"] == 1
    put = {"structure": "MSGQ01", "queue": "KEYED", "data": b"x", "key": ["inc1", 7]}
    first = raw.request("put", **put)["result"]["entry_id"]
    assert raw.request("put", **put)["result"]["entry_id"] == first
    other = raw.request("put", **{**put, "key": ["inc2", 7]})["result"]["entry_id"]
    assert other != first  # another incarnation: another key
    assert sorted(stored(d.address, "KEYED")) == [first, other]
    time.sleep(1.1)  # the window itself is what is tested: nothing else to wait on
    again = raw.request("put", **put)["result"]["entry_id"]
    assert again not in (first, other)
    for key in (["inc1"], ["", 1], ["x" * 33, 1], ["inc1", -1], [1, 2]):
        bad = raw.request("put", **{**put, "key": key})
        assert (bad["ok"], bad["reason"]) == (False, "INVALID_REQUEST") and "key" in bad["message"]
    assert raw.request("ping")["ok"]  # the daemon carries on


def test_a_put_with_the_key_of_a_commit_that_put_nothing_is_refused(make_daemon):
    """A key names one request: a put sent with the key of a commit that put nothing
    is INVALID_REQUEST, and the daemon carries on. (It raised IndexError, an internal
    error, looking for the commit's first entry id; found by the group fuzz.)"""
    d = make_daemon().start()
    raw = Raw(d.socket)
    raw.register("RAW")
    assert raw.request("commit", structure="MSGQ01", ops=[], key=["inc1", 3])["ok"]
    refused = raw.request("put", structure="MSGQ01", queue="Q", data=b"x", key=["inc1", 3])
    assert (refused["ok"], refused["reason"]) == (False, "INVALID_REQUEST"), refused
    assert "commit" in refused["message"]
    assert not d.events("request_internal_error")
    assert raw.request("put", structure="MSGQ01", queue="Q", data=b"x", key=["inc1", 4])["ok"]
