"""Per-request timeouts against the fake server: when they fire, what they say of
the request, and what happens to a reply that comes after all."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import RequestTimeout, ops

from .fakeserver import ok


def silent(conn, frame):
    """A handler that never replies, as a daemon that hangs."""
    return None


def test_a_request_without_a_reply_times_out_and_the_connection_carries_on(server, address):
    """No reply within the client's timeout: RequestTimeout, a TimeoutError that cannot
    say whether the request was applied; the next request goes through."""
    with cqsclient.connect(address, client="T1", timeout=0.2) as c:
        server.handlers["query"] = silent
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as caught:
            c.query("structures")
        assert 0.2 <= time.monotonic() - started < 2
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.applied is None and caught.value.reason == "TIMEOUT"
        del server.handlers["query"]
        assert c.query("structures")


def test_a_per_call_timeout_overrides_the_clients(server, address):
    """timeout= on a call wins over the client's: shorter, longer, or None for no limit."""
    def slow(conn, frame):
        time.sleep(0.3)
        return ok(frame["id"], entry_id=7)

    with cqsclient.connect(address, client="T1", timeout=0.1) as c:
        s = c.structure("MSGQ01")
        server.handlers["put"] = slow
        with pytest.raises(RequestTimeout):
            s.put("Q", b"x")
        assert s.put("Q", b"x", timeout=5.0) == 7
        assert s.put("Q", b"x", timeout=None) == 7


def test_a_waiting_read_times_out_only_after_its_wait(server, address):
    """A read may wait its ``wait`` on the server: the timeout counts beyond it."""
    with cqsclient.connect(address, client="T1", timeout=0.2) as c:
        s = c.structure("MSGQ01")
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            s.read("EMPTY", wait=0.4)  # the fake never ends a wait on its own
        assert time.monotonic() - started >= 0.6


def test_a_late_read_reply_has_its_messages_given_back(server, address):
    """A read that timed out and is served later locks a message nobody will see:
    the SDK unlocks it once the reply is read."""
    with cqsclient.connect(address, client="T1", timeout=0.1) as c:
        s = c.structure("MSGQ01")
        with pytest.raises(RequestTimeout):
            s.read("LATE", wait=0.2)
        server.wait_parked(1)
        with cqsclient.connect(address, client="T2") as other:
            eid = other.structure("MSGQ01").put("LATE", b"served after the timeout")
        assert s.query("queues")  # reading its reply reads the late one too
        assert [r["entry_id"] for r in server.wait_ops("unlock")] == [eid]
        assert [(m.entry_id, m.where) for m in server.messages()] == [(eid, "ready")]


def test_a_late_delete_and_read_reply_has_its_messages_given_back(server, address):
    """A delete_and_read that timed out still deleted; what it read, nobody will see:
    the SDK unlocks it once the late reply is read."""
    with cqsclient.connect(address, client="T1", timeout=0.1) as c:
        s = c.structure("MSGQ01")
        ids = s.put_batch("Q", [b"acked", b"next"])
        held = s.read("Q")
        gate = threading.Event()
        real = server.op_delete

        def late(conn, rid, **f):
            gate.wait(5)
            return real(conn, rid, **f)
        server.op_delete = late
        with pytest.raises(RequestTimeout):
            s.delete_and_read(held.entry_id, "Q")
        gate.set()
        assert s.query("queues")  # reading its reply reads the late one too
        assert [r["entry_id"] for r in server.wait_ops("unlock")] == [ids[1]]
        assert [(m.entry_id, m.where) for m in server.messages()] == [(ids[1], "ready")]


def test_jobs_wait_as_long_as_they_take_by_default():
    """checkpoint, recover, rebuild and delete_structure ignore the client's timeout
    unless the call gives one; every other request has it."""
    for call in (ops.checkpoint("S"), ops.recover("S", False), ops.rebuild("S", None),
                 ops.delete_structure("S")):
        assert ops.seconds(ops.CLIENT_TIMEOUT, 10.0, call) is None
        assert ops.seconds(60.0, 10.0, call) == 60.0
    assert ops.seconds(ops.CLIENT_TIMEOUT, 10.0, ops.query("queues")) == 10.0


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_client_times_out_the_same_way(server, address, backend):
    """The async client raises RequestTimeout too, and gives back a late read's messages."""
    server.handlers["query"] = silent

    async def main():
        async with cqsclient.aio.connect(address, client="A1", timeout=0.1) as c:
            with pytest.raises(RequestTimeout) as caught:
                await c.query("structures")
            assert caught.value.applied is None
            s = await c.structure("MSGQ01")
            with pytest.raises(RequestTimeout):
                await s.read("LATE", wait=0.1)
            await anyio.to_thread.run_sync(server.wait_parked, 1)
            await s.put("LATE", b"for the abandoned read")
            await anyio.to_thread.run_sync(server.wait_ops, "unlock")
            assert [m.where for m in server.messages()] == ["ready"]

    anyio.run(main, backend=backend)
