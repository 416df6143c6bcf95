"""Tests for cqsclient.aio against the fake server, under both Trio and asyncio.

The tests are plain functions that call ``anyio.run(..., backend=...)``, so
each runs once per event loop whatever pytest plugin owns ``async def`` tests
(pytest-trio's trio_mode); the last test is a native Trio test as well.
"""

from __future__ import annotations

import functools
import socket

import anyio
import pytest

import cqsclient.aio
from cqsclient import errors
from cqsclient.model import Notification

from .fakeserver import error, ok

pytestmark = pytest.mark.parametrize("backend", ["trio", "asyncio"])


def run(backend, fn, *args):
    return anyio.run(fn, *args, backend=backend)


def test_round_trips(backend, server, address):
    """connect registers; put, read, delete, browse, query and errors behave as when blocking."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            assert c.max_message == server.max_message
            s = await c.structure("MSGQ01")
            eid = await s.put("TRANX", b"hello")
            m = await s.read("TRANX")
            assert (m.entry_id, m.data, m.structure) == (eid, b"hello", "MSGQ01")
            await s.delete(m.entry_id)
            assert await s.read("TRANX") is None
            assert await s.read_batch("TRANX", 3) == []
            ids = await s.put_batch("TRANX", [b"a", b"b", b"c"])
            assert [m.entry_id async for m in s.browse_all("TRANX", page_size=2)] == ids
            assert (await s.query("queues"))[0]["depth"] == 3
            with pytest.raises(errors.UnknownStructure):
                await c.structure("NOPE")
            with pytest.raises(errors.LockNotHeld):
                await s.delete(ids[0])
            first = await s.read("TRANX")
            got = await s.delete_and_read(first.entry_id, "TRANX", n=5)
            assert [m.entry_id for m in got] == ids[1:] and got[0].structure == "MSGQ01"

    run(backend, main)
    assert server.ops("deregister")


def test_concurrent_tasks_pipeline_on_one_connection(backend, server, address):
    """Many tasks share one connection; shuffled replies reach the tasks that asked."""
    server.shuffle = True
    server.handlers["put"] = lambda conn, f: ok(f["id"], entry_id=int(f["data"]))

    async def worker(s, t):
        for i in range(50):
            n = t * 1000 + i
            assert await s.put("Q", str(n).encode()) == n

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            async with anyio.create_task_group() as tg:
                for t in range(20):
                    tg.start_soon(worker, s, t)

    run(backend, main)
    assert len(server.ops("put")) == 1000


def test_a_waiting_read_overtaken_by_a_later_reply(backend, server, address):
    """A parked read is answered after a later put's reply, and both tasks get their own reply."""
    got = {}

    async def reader(s):
        got["message"] = await s.read("WAITQ", wait=30)

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader, s)
                await anyio.to_thread.run_sync(server.wait_parked, 1)
                got["eid"] = await s.put("WAITQ", b"late")

    run(backend, main)
    assert got["message"].entry_id == got["eid"]


def test_notifications_interleaved_and_from_other_clients(backend, server, address):
    """Notifications between replies are queued, and one caused by another client arrives."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            server.notify_before_reply = True
            await s.put("Q", b"1")
            server.notify_before_reply = False
            await c.register_interest("MSGQ01", "WORKQ")
            async with cqsclient.aio.connect(address, client="A2") as other:
                await (await other.structure("MSGQ01")).put("WORKQ", b"job")
            notes = []
            async for note in c.notifications(timeout=10):
                notes.append(note)
                if note.queue == "WORKQ":
                    break
            assert notes == [
                Notification("MSGQ01", "TRAN", "NOISE"),  # sent just before the put's reply
                Notification("MSGQ01", "TRAN", "WORKQ"),
            ]
            assert [n async for n in c.notifications(timeout=0.02)] == []

    run(backend, main)


def test_connection_drop_fails_every_waiter(backend, server, address):
    """A dropped connection fails every waiting task, and later calls, with ConnectionLost."""
    failures = []

    async def reader(s, queue):
        try:
            await s.read(queue, wait=30)
        except errors.ConnectionLost as lost:
            failures.append(lost)

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader, s, "Q1")
                tg.start_soon(reader, s, "Q2")
                await anyio.to_thread.run_sync(server.wait_parked, 2)
                server.drop_all()
            with pytest.raises(errors.ConnectionLost):
                await s.put("Q", b"x")
            with pytest.raises(errors.ConnectionLost):
                async for _ in c.notifications(timeout=5):
                    pass
            assert c.closed

    run(backend, main)
    assert len(failures) == 2
    assert all(server.path in str(f) for f in failures)


def test_server_error_frame_before_close_is_reported(backend, server, address):
    """The server's id-less error frame explains the ConnectionLost that follows it."""

    def refuse(conn, frame):
        conn.send(error(None, "INVALID_REQUEST", "frame too big"))
        conn.sock.shutdown(socket.SHUT_RDWR)

    server.handlers["query"] = refuse

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            with pytest.raises(errors.ConnectionLost, match="frame too big"):
                await c.query("structures")

    run(backend, main)


def test_cancelled_read_gives_its_message_back(backend, server, address):
    """A read cancelled while parked has the message it later locks unlocked, not stranded."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(functools.partial(s.read, "Q", wait=30))
                    await anyio.to_thread.run_sync(server.wait_parked, 1)
                    scope.cancel()
            eid = await s.put("Q", b"x")  # served to the cancelled read, then given back
            m = await s.read("Q", wait=10)
            assert (m.entry_id, m.delivery_count) == (eid, 2)

    run(backend, main)
    [unlock] = server.ops("unlock")
    assert unlock["failed"] is False


def test_unit_of_work_commits_once_or_gives_back(backend, server, address):
    """An async unit of work sends one commit on success and plain unlocks on an exception."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            await s.put_batch("TRANX", [b"1", b"2"])
            async with s.unit_of_work() as uow:
                m = await uow.read("TRANX")
                uow.put("LTERMZ", b"reply", qtype="LTERM")
                uow.delete(m.entry_id)
            assert len(uow.entry_ids) == 1
            with pytest.raises(ValueError):
                async with s.unit_of_work() as failing:
                    await failing.read("TRANX")
                    failing.put("OUT", b"never")
                    raise ValueError("app failed")
            m2 = await s.read("TRANX")
            assert (m2.data, m2.delivery_count) == (b"2", 2)
            return m, failing.read_ids

    m, given_back = run(backend, main)
    assert len(server.ops("commit")) == 2  # put_batch's and the unit of work's
    assert [op["op"] for op in server.ops("commit")[1]["ops"]] == ["put", "delete"]
    assert [(u["entry_id"], u["failed"]) for u in server.ops("unlock")] == [(given_back[0], False)]


def test_message_too_large_is_refused_before_sending(backend, server, address):
    """The async client checks payloads against max_message before sending anything."""
    server.max_message = 100

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            with pytest.raises(errors.MessageTooLarge):
                await s.put("Q", b"x" * 101)
            with pytest.raises(errors.MessageTooLarge):
                await s.put_batch("Q", [b"x" * 101])

    run(backend, main)
    assert server.ops("put") == [] and server.ops("commit") == []


def test_cannot_connect_names_the_address(backend, tmp_path):
    """Entering a client whose address has no listener raises CannotConnect naming it."""
    address = f"unix://{tmp_path}/absent.sock"

    async def main():
        with pytest.raises(errors.CannotConnect, match="absent.sock"):
            async with cqsclient.aio.connect(address, client="A1"):
                pass

    run(backend, main)


def test_large_messages_cross_many_reads(backend, server, address):
    """A multi-megabyte message round trips whole through the async client's reader."""
    server.max_message = 8 * 1024 * 1024
    payload = bytes(range(256)) * (server.max_message // 256)

    async def main():
        async with cqsclient.aio.connect(address, client="BIG") as c:
            s = await c.structure("MSGQ01")
            eid = await s.put("BIGQ", payload)
            m = await s.read("BIGQ")
            assert (m.entry_id, m.data == payload) == (eid, True)

    run(backend, main)


def test_explicit_deregister_then_leaving_the_block(backend, server, address):
    """deregister() inside the block ends the session; later calls raise ConnectionLost."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1") as c:
            await c.deregister()
            assert c.closed
            with pytest.raises(errors.ConnectionLost, match="deregistered by this client"):
                await c.query("clients")

    run(backend, main)
    assert len(server.ops("deregister")) == 1


def test_a_large_payload_is_sent_from_where_it_is(backend, server, address):
    """A large put's payload reaches the stream as itself, around the frame's other
    bytes, not joined into one frame (a copy of every byte); it arrives whole."""
    payload = bytes(range(256)) * (4 * 1024)

    async def main():
        async with cqsclient.aio.connect(address, client="BIG") as c:
            s = await c.structure("MSGQ01")
            stream = c._conn._stream
            sent = []
            real = stream.send

            async def recorded(item):
                sent.append(item)
                await real(item)

            stream.send = recorded
            eid = await s.put("BIGQ", payload)
            stream.send = real
            assert any(memoryview(item).obj is payload for item in sent)
            m = await s.read("BIGQ")
            assert (m.entry_id, m.data == payload) == (eid, True)

    run(backend, main)
