"""Consume loops against the fake server: deliveries that ack and nack, the
context-manager form, prefetch, and stopping (from a thread, a signal handler,
a task, and by the daemon's shutdown)."""

from __future__ import annotations

import signal
import threading
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import Delivery, Message

from .fakeserver import error


@pytest.fixture
def s(address):
    """A handle on MSGQ01 of a client registered with the fake server."""
    with cqsclient.connect(address, client="W1") as c:
        yield c.structure("MSGQ01")


def test_deliveries_are_messages_that_ack_and_nack(server, s):
    """ack() deletes; nack() gives back as a failed delivery, so the message comes
    again with its count up; settling twice is a no-op that says False."""
    ids = s.put_batch("Q", [b"one", b"two"])
    consumer = s.consume("Q")
    first = next(consumer)
    assert isinstance(first, Delivery) and isinstance(first, Message)
    assert (first.entry_id, first.data, first.settled) == (ids[0], b"one", False)
    assert first.ack() is True and first.settled
    assert first.ack() is False
    second = next(consumer)
    assert second.nack() is True
    again = next(consumer)
    assert (again.entry_id, again.delivery_count) == (ids[1], 2)
    assert again.nack(failed=False) is True
    assert [r["failed"] for r in server.ops("unlock")] == [True, False]
    consumer.close()
    assert [m.entry_id for m in server.messages()] == [ids[1]]


def test_the_with_form_acks_on_success_and_fails_on_an_exception(server, s):
    """``with m:`` deletes on success; an exception fails the delivery and goes on up
    (the message comes back, to its place); an interrupt gives it back unfailed."""
    ids = s.put_batch("Q", [b"ok", b"bad"])
    consumer = s.consume("Q")
    with next(consumer) as m:
        assert m.entry_id == ids[0]
    with pytest.raises(ValueError), next(consumer):
        raise ValueError("the handler failed")
    with pytest.raises(KeyboardInterrupt), next(consumer) as again:
        assert (again.entry_id, again.delivery_count) == (ids[1], 2)
        raise KeyboardInterrupt
    assert [(r["entry_id"], r["failed"]) for r in server.ops("unlock")] == [
        (ids[1], True), (ids[1], False)]
    assert [r["entry_id"] for r in server.ops("delete")] == [ids[0]]


def test_prefetch_reads_ahead_and_leaving_gives_the_rest_back(server, s):
    """prefetch=3 locks three at a time; leaving the with block gives back, unfailed,
    the two not handed out."""
    ids = s.put_batch("Q", [b"%d" % i for i in range(5)])
    with s.consume("Q", prefetch=3) as messages:
        for m in messages:
            m.ack()
            break
    assert [r["n"] for r in server.ops("read")] == [3]
    assert [(r["entry_id"], r["failed"]) for r in server.ops("unlock")] == [
        (ids[1], False), (ids[2], False)]
    assert [m.where for m in server.messages()] == ["ready"] * 4


def test_an_ack_with_nothing_read_ahead_brings_the_next_messages(server, s):
    """One message at a time, each ack is a delete carrying the next read: three
    messages take one read and three deletes; the last ack finds the queue empty,
    and the consumer then waits with a plain read."""
    ids = s.put_batch("Q", [b"1", b"2", b"3"])
    consumer = s.consume("Q", prefetch=2, wait=0.01)
    got = []
    for m in consumer:
        got.append(m.entry_id)
        assert m.delivery_count == 1
        assert m.ack() is True
        if len(got) == 3:
            consumer.stop()
    assert got == ids
    assert [r.get("next") for r in server.ops("delete")] == [
        None, {"queue": "Q", "qtype": "TRAN", "n": 2}, {"queue": "Q", "qtype": "TRAN", "n": 2}]
    assert len(server.ops("read")) == 1
    assert server.messages() == []


def test_what_an_ack_brings_to_a_stopped_consumer_goes_back(server, s):
    """A consumer stopped while its ack was on the way gives back, unfailed, what the
    ack read; a consumer stopped before acks carries no read."""
    ids = s.put_batch("Q", [b"1", b"2", b"3"])
    consumer = s.consume("Q")
    first = next(consumer)
    real = server.op_delete

    def stopped_meanwhile(conn, rid, **f):
        consumer.stop()
        return real(conn, rid, **f)
    server.op_delete = stopped_meanwhile
    assert first.ack() is True
    assert [(r["entry_id"], r["failed"]) for r in server.ops("unlock")] == [(ids[1], False)]
    assert list(consumer) == []
    server.op_delete = real
    later = s.consume("Q")
    second = next(later)
    later.stop()
    assert second.entry_id == ids[1] and second.ack() is True
    assert server.ops("delete")[-1].get("next") is None
    assert [(m.entry_id, m.where) for m in server.messages()] == [(ids[2], "ready")]


def test_stop_from_another_thread_ends_a_waiting_consumer_at_once(server, s):
    """A consumer waiting on an empty queue (a 30 s wait on the server) stops as soon
    as another thread calls stop(); a message that comes later is given back."""
    consumer = s.consume("EMPTY", wait=30)
    stopper = threading.Thread(target=lambda: (server.wait_parked(1), consumer.stop()))
    stopper.start()
    started = time.monotonic()
    assert list(consumer) == []
    assert time.monotonic() - started < 5
    stopper.join()
    eid = s.put("EMPTY", b"for the abandoned read")  # served to it, given back
    s.query("queues")  # reads the late reply; the unlock follows at once
    server.wait_ops("unlock")
    assert [(m.entry_id, m.where) for m in server.messages()] == [(eid, "ready")]


def test_stop_from_a_signal_handler(server, s):
    """SIGTERM-style: a handler that calls stop() ends the loop it interrupted."""
    consumer = s.consume("EMPTY", wait=30)
    previous = signal.signal(signal.SIGALRM, lambda *_: consumer.stop())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        assert list(consumer) == []
        assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_daemon_shutting_down_ends_the_loop_of_a_client_without_reconnect(server, s):
    """SHUTTING_DOWN ends the iteration quietly (with reconnect it would wait)."""
    server.handlers["read"] = lambda conn, f: error(f["id"], "SHUTTING_DOWN", "stopping")
    assert list(s.consume("Q")) == []


def test_bad_arguments_are_refused_at_once(s):
    """prefetch below 1 or a wait that is not positive is a ValueError, before any read."""
    with pytest.raises(ValueError, match="prefetch"):
        s.consume("Q", prefetch=0)
    with pytest.raises(ValueError, match="wait"):
        s.consume("Q", wait=0)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_consumer(server, address, backend):
    """``async for`` / ``async with m``: acks and fails as the blocking one; stop()
    from another task cancels the read waiting on the server."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            ids = await s.put_batch("Q", [b"ok", b"bad"])
            got = []
            async with s.consume("Q", prefetch=2) as messages:
                async for m in messages:
                    got.append(m.entry_id)
                    if m.data == b"bad":
                        with pytest.raises(ValueError):
                            async with m:
                                raise ValueError("the handler failed")
                        messages.stop()
                    else:
                        async with m:
                            pass
            assert got == ids
            assert [(r["entry_id"], r["failed"]) for r in server.ops("unlock")] == [(ids[1], True)]
            consumer = s.consume("EMPTY", wait=30)

            async def stop_when_parked():
                await anyio.to_thread.run_sync(server.wait_parked, 1)
                consumer.stop()

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_parked)
                with anyio.fail_after(5):
                    assert [m async for m in consumer] == []

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_consumer_acks_with_the_next_read_too(server, address, backend):
    """``await m.ack()`` with nothing read ahead brings the next message; what it brings
    to a consumer stopped meanwhile goes back, unfailed."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            ids = await s.put_batch("Q", [b"1", b"2", b"3"])
            consumer = s.consume("Q")
            first = await consumer.__anext__()
            assert await first.ack() is True
            second = await consumer.__anext__()
            real = server.op_delete

            def stopped_meanwhile(conn, rid, **f):
                consumer.stop()
                return real(conn, rid, **f)
            server.op_delete = stopped_meanwhile
            assert await second.ack() is True
            assert [m async for m in consumer] == []
            assert (first.entry_id, second.entry_id) == tuple(ids[:2])
            assert len(server.ops("read")) == 1
            assert [(r["entry_id"], r["failed"]) for r in server.ops("unlock")] == [
                (ids[2], False)]
            assert [(m.entry_id, m.where) for m in server.messages()] == [(ids[2], "ready")]

    anyio.run(main, backend=backend)
