"""Tests for the blocking client against the fake server: pipelining, errors, drops, UoW."""

from __future__ import annotations

import gc
import os
import socket
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pytest

import cqsclient
from cqsclient import errors
from cqsclient.connection import CHUNK
from cqsclient.model import HeldLock, Notification
from cqsproto import PROTOCOL_VERSION

from .fakeserver import error, ok


@pytest.fixture
def client(address):
    """A client registered with the fake server, closed after the test."""
    with cqsclient.connect(address, client="T1") as c:
        yield c


def test_register_then_round_trips(server, address):
    """connect registers (with the protocol version), and put/read/delete round trip."""
    with server.engine() as held:  # what IMS1 still holds from an earlier connection
        eid = held.put("TRAN", "Q", b"held").entry_id
        held.read("IMS1", "TRAN", "Q")
    with cqsclient.connect(address, client="IMS1", secret="s3", cold=False) as c:
        assert c.max_message == server.max_message
        assert c.structures == ["MSGQ01", "MSGQ01OV"]
        assert c.resync_locks == [HeldLock("MSGQ01", eid, "Q", "TRAN")]
        s = c.structure("MSGQ01")
        eid = s.put("TRANX", b"hello")
        m = s.read("TRANX")
        assert (m.entry_id, m.data, m.queue, m.qtype) == (eid, b"hello", "TRANX", "TRAN")
        assert m.delivery_count == 1
        assert m.structure == "MSGQ01"
        s.delete(m.entry_id)
        assert s.read("TRANX") is None
    register = server.ops("register")[0]
    assert (register["client"], register["secret"], register["cold"]) == ("IMS1", "s3", False)
    assert register["version"] == PROTOCOL_VERSION
    ids = [r["id"] for r in server.requests]
    assert len(set(ids)) == len(ids)
    assert server.ops("deregister")


def test_a_small_reply_is_read_without_allocating_a_read_of_chunk_bytes(client):
    """Replies are read into the connection's own buffer: a ``recv(CHUNK)`` made a
    256 KiB bytes object for each (with glibc's mmap, mremap and munmap)."""
    s = client.structure("MSGQ01")
    s.put("Q", b"warm")
    tracemalloc.start()
    try:
        for n in range(20):
            s.put("Q", b"m%d" % n)
            s.delete(s.read("Q").entry_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CHUNK  # the fake server, in this process, takes some 100 KiB


def test_delete_and_read_is_one_delete_carrying_the_read(server, client):
    """delete_and_read sends one delete with next; the next messages come back locked,
    [] when there are none, and nothing is read when the delete is refused."""
    s = client.structure("MSGQ01")
    ids = s.put_batch("Q", [b"a", b"b", b"c"], qtype="LTERM")
    first = s.read("Q", "LTERM")
    got = s.delete_and_read(first.entry_id, "Q", 5, "LTERM")
    assert [(m.entry_id, m.qtype, m.delivery_count) for m in got] == [
        (ids[1], "LTERM", 1), (ids[2], "LTERM", 1)]
    assert s.delete_and_read(ids[1], "Q", qtype="LTERM") == []
    with pytest.raises(errors.EntryNotFound):
        s.delete_and_read(ids[1], "Q", qtype="LTERM")
    assert [r["next"]["n"] for r in server.ops("delete")] == [5, 1, 1]
    assert [(m.entry_id, m.where) for m in server.messages()] == [(ids[2], "locked")]


def test_error_reply_raises_the_class_of_its_reason(client):
    """Error replies raise the matching CQSError subclass, with reason and message."""
    with pytest.raises(errors.UnknownStructure) as caught:
        client.structure("NOPE")
    assert caught.value.reason == "UNKNOWN_STRUCTURE"
    assert "NOPE" in caught.value.message
    s = client.structure("MSGQ01")
    with pytest.raises(errors.EntryNotFound):
        s.delete(424242)


def test_a_waiting_read_overtaken_by_a_later_reply(server, client):
    """A read parked on the server is answered after a later put's reply, and both match."""
    s = client.structure("MSGQ01")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(s.read, "WAITQ", wait=30)
        server.wait_parked(1)
        eid = s.put("WAITQ", b"late")  # its reply precedes the read's on the wire
        message = pending.result(timeout=10)
    assert (message.entry_id, message.data) == (eid, b"late")
    put, read = server.ops("put")[0], server.ops("read")[0]
    assert read["id"] < put["id"]


def test_many_threads_pipeline_on_one_connection(server, client):
    """Threads share one connection; replies shuffled by the server still reach their callers."""
    server.shuffle = True
    server.handlers["put"] = lambda conn, f: ok(f["id"], entry_id=int(f["data"]))
    s = client.structure("MSGQ01")
    barrier = threading.Barrier(8)

    def work(t):
        barrier.wait()
        for i in range(200):
            n = t * 1000 + i
            assert s.put("Q", str(n).encode()) == n
        return t

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(work, range(8))) == list(range(8))
    assert len(server.ops("put")) == 1600


def test_notifications_interleaved_with_replies(server, client):
    """Notifications arriving between replies are kept for notifications(), replies unharmed."""
    server.notify_before_reply = True
    s = client.structure("MSGQ01")
    assert s.put("Q", b"1") != s.put("Q", b"2")
    notes = list(client.notifications(timeout=0.05))
    assert notes == [Notification("MSGQ01", "TRAN", "NOISE")] * 3


def test_notifications_read_the_socket_when_none_is_buffered(server, address, client):
    """notifications() waits on the socket for a notification caused by another client."""
    client.register_interest("MSGQ01", "WORKQ")
    with cqsclient.connect(address, client="T2") as other:
        other.structure("MSGQ01").put("WORKQ", b"job")
    note = next(client.notifications(timeout=10))
    assert note == Notification("MSGQ01", "TRAN", "WORKQ")
    client.deregister_interest("MSGQ01", "WORKQ")
    assert list(client.notifications(timeout=0.01)) == []


def test_a_notification_reaches_a_thread_while_another_leads(server, address, client):
    """A thread waiting for notifications gets one read by the thread blocked on its own reply."""
    s = client.structure("MSGQ01")
    client.register_interest("MSGQ01", "WORKQ")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(s.read, "BLOCKQ", wait=30)
        server.wait_parked(1)
        with cqsclient.connect(address, client="T2") as other:
            o = other.structure("MSGQ01")
            o.put("WORKQ", b"job")
            note = next(client.notifications(timeout=10))
            o.put("BLOCKQ", b"unblock")
        assert pending.result(timeout=10).data == b"unblock"
    assert note.queue == "WORKQ"


def test_notifications_stop_after_the_timeout(client):
    """With nothing to say, notifications() ends instead of waiting forever."""
    assert list(client.notifications(timeout=0.02)) == []


def test_connection_drop_fails_every_request_in_flight(server, client):
    """When the connection drops, every waiting caller and every later one gets ConnectionLost."""
    s = client.structure("MSGQ01")
    with ThreadPoolExecutor(2) as pool:
        pending = [pool.submit(s.read, f"Q{i}", wait=30) for i in range(2)]
        server.wait_parked(2)
        server.drop_all()
        for future in pending:
            with pytest.raises(errors.ConnectionLost) as caught:
                future.result(timeout=10)
            assert server.path in str(caught.value)
            assert caught.value.address == f"unix://{server.path}"
    with pytest.raises(errors.ConnectionLost):
        s.put("Q", b"x")
    with pytest.raises(errors.ConnectionLost):
        list(client.notifications(timeout=1))
    assert client.closed


def test_server_error_frame_before_close_is_reported(server, client):
    """The server's id-less error frame, sent before it closes, explains the ConnectionLost."""

    def refuse(conn, frame):
        conn.send(error(None, "INVALID_REQUEST", "frame too big"))
        conn.sock.shutdown(socket.SHUT_RDWR)

    server.handlers["query"] = refuse
    with pytest.raises(errors.ConnectionLost, match="INVALID_REQUEST: frame too big"):
        client.query("structures")


@pytest.mark.parametrize(("leave", "why"), [("abort", "closed by this client"),
                                             ("close", "deregistered by this client")])
def test_leaving_fails_a_request_waiting_in_another_thread(server, client, leave, why):
    """abort() or close() from one thread wakes another blocked on its reply with
    ConnectionLost saying why."""
    s = client.structure("MSGQ01")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(s.read, "Q", wait=30)
        server.wait_parked(1)
        getattr(client, leave)()
        with pytest.raises(errors.ConnectionLost, match=why):
            pending.result(timeout=10)


def test_message_too_large_is_refused_before_sending(server, address):
    """Payloads over max_message, and commits over the frame limit, never reach the server."""
    server.max_message = 1000
    with cqsclient.connect(address, client="T1") as c:
        s = c.structure("MSGQ01")
        with pytest.raises(errors.MessageTooLarge):
            s.put("Q", b"x" * 1001)
        with pytest.raises(errors.MessageTooLarge):
            s.put_batch("Q", [b"x"] * 3 + [b"y" * 1001])
        with pytest.raises(errors.MessageTooLarge, match="frame"):
            s.put_batch("Q", [b"z" * 1000] * 2000)  # each fits, the request does not
        with pytest.raises(errors.MessageTooLarge):
            with s.unit_of_work() as uow:
                uow.put("Q", b"x" * 1001)
        assert s.put("Q", b"x" * 1000) > 0  # the connection is still fine
    assert len(server.ops("put")) == 1
    assert server.ops("commit") == []


def test_put_batch_is_one_commit(server, client):
    """put_batch sends one commit and returns the new ids in order."""
    s = client.structure("MSGQ01")
    ids = s.put_batch("Q", [b"a", b"b", b"c"], qtype="LTERM", recoverable=False)
    assert len(ids) == 3 and ids == sorted(ids)
    [commit] = server.ops("commit")
    assert [op["data"] for op in commit["ops"]] == [b"a", b"b", b"c"]
    assert [m.data for m in s.read_batch("Q", 10, qtype="LTERM")] == [b"a", b"b", b"c"]
    assert s.read_batch("Q", 10, qtype="LTERM") == []


def test_unit_of_work_sends_one_commit_of_what_it_gathered(server, client):
    """Inside a unit of work only reads are sent; the rest goes in one commit at the end."""
    s = client.structure("MSGQ01")
    s.put("TRANX", b"request")
    before = len(server.requests)
    with s.unit_of_work() as uow:
        m = uow.read("TRANX")
        uow.put("LTERMZ", b"reply", qtype="LTERM")
        uow.delete(m.entry_id)
        assert [r["op"] for r in server.requests[before:]] == ["read"]
    assert [r["op"] for r in server.requests[before:]] == ["read", "commit"]
    [commit] = server.ops("commit")
    assert [op["op"] for op in commit["ops"]] == ["put", "delete"]
    assert len(uow.entry_ids) == 1
    assert s.read("TRANX") is None
    assert s.read("LTERMZ", qtype="LTERM").data == b"reply"


def test_unit_of_work_gives_back_its_reads_on_an_exception(server, client):
    """Leaving a unit of work with an exception sends no commit and plainly unlocks what it read."""
    s = client.structure("MSGQ01")
    s.put_batch("TRANX", [b"1", b"2"])
    with pytest.raises(RuntimeError, match="app failed"):
        with s.unit_of_work() as uow:
            uow.read("TRANX")
            uow.read("TRANX")
            uow.put("OUT", b"never")
            raise RuntimeError("app failed")
    assert server.ops("commit")[1:] == []  # only put_batch's
    unlocks = server.ops("unlock")
    assert [(u["entry_id"], u["failed"]) for u in unlocks] == [(i, False) for i in uow.read_ids]
    again = s.read_batch("TRANX", 5)
    assert [(m.data, m.delivery_count) for m in again] == [(b"1", 2), (b"2", 2)]


def test_refused_commit_gives_back_the_reads_and_raises(server, client):
    """A commit the daemon refuses applies nothing: the reads are given back, the error raised."""
    s = client.structure("MSGQ01")
    s.put("TRANX", b"1")
    with pytest.raises(errors.EntryNotFound):
        with s.unit_of_work() as uow:
            m = uow.read("TRANX")
            uow.delete(m.entry_id)
            uow.delete(987654)
    assert [u["entry_id"] for u in server.ops("unlock")] == [m.entry_id]
    assert s.read("TRANX").entry_id == m.entry_id


def test_give_back_skips_messages_already_released(server, client):
    """A read message deleted outside the unit of work is not reported when giving back."""
    s = client.structure("MSGQ01")
    s.put("TRANX", b"1")
    with pytest.raises(KeyError) as caught:
        with s.unit_of_work() as uow:
            m = uow.read("TRANX")
            s.delete(m.entry_id)
            raise KeyError("boom")
    assert not getattr(caught.value, "__notes__", None)
    with pytest.raises(RuntimeError, match="ended"):
        uow.put("Q", b"late")


def test_browse_pages_and_browse_all(server, client):
    """browse returns one page with a cursor; browse_all follows cursors up to a limit."""
    s = client.structure("MSGQ01")
    ids = s.put_batch("Q", [bytes([i]) for i in range(7)])
    page = s.browse("Q", limit=3)
    assert [m.entry_id for m in page] == ids[:3] and page.cursor is not None
    assert page[0].where == "ready"
    assert [m.entry_id for m in s.browse_all("Q", page_size=2)] == ids
    assert [m.entry_id for m in s.browse_all(limit=5, page_size=2)] == ids[:5]
    assert server.ops("browse")[0]["qtype"] == "TRAN"


def test_operator_helpers(server, client):
    """operator_delete, move, unlock, dequeue and query send what cqsctl relies on."""
    s = client.structure("MSGQ01")
    a, b, c = s.put_batch("Q", [b"a", b"b", b"c"])
    s.operator_delete(a)
    assert server.ops("delete")[-1]["operator"] is True
    s.move(b, "Q2", qtype="LTERM")
    m = s.read("Q")
    assert s.unlock(m.entry_id, queue="Q3").queue == "Q3"
    assert s.dequeue("Q3") == 1
    rows = s.query("queues")
    assert [(r["structure"], r["qtype"], r["queue"], r["depth"]) for r in rows] == [
        ("MSGQ01", "LTERM", "Q2", 1)]


def test_cannot_connect_names_the_address(tmp_path):
    """An address with nobody listening raises CannotConnect, a ConnectionLost, naming it."""
    address = f"unix://{tmp_path}/absent.sock"
    with pytest.raises(errors.CannotConnect) as caught:
        cqsclient.connect(address, client="T1")
    assert isinstance(caught.value, errors.ConnectionLost)
    assert address in str(caught.value)


def test_refused_registration_raises_its_reason(server, address, client):
    """Registering a name already in use raises ClientActive."""
    with pytest.raises(errors.ClientActive):
        cqsclient.connect(address, client="T1")


def test_client_name_comes_from_the_environment(monkeypatch, address, server):
    """Without client=, $CQSD_CLIENT names the client; with neither, connect refuses."""
    monkeypatch.setenv("CQSD_CLIENT", "ENVNAME")
    with cqsclient.connect(address) as c:
        assert c.name == "ENVNAME"
    monkeypatch.delenv("CQSD_CLIENT")
    with pytest.raises(ValueError, match="client"):
        cqsclient.connect(address)


def test_large_messages_cross_many_reads(server, address):
    """A multi-megabyte message goes out in one frame and comes back whole across many reads."""
    server.max_message = 8 * 1024 * 1024
    payload = bytes(range(256)) * (server.max_message // 256)
    with cqsclient.connect(address, client="BIG") as c:
        s = c.structure("MSGQ01")
        eid = s.put("BIGQ", payload)
        m = s.read("BIGQ")
        assert (m.entry_id, len(m.data), m.data == payload) == (eid, len(payload), True)


def test_explicit_deregister_then_leaving_the_block(server, address):
    """deregister() inside the block ends the session once; later calls raise ConnectionLost."""
    with cqsclient.connect(address, client="T1") as c:
        c.deregister()
        assert c.closed
        with pytest.raises(errors.ConnectionLost, match="deregistered by this client"):
            c.query("clients")
    assert len(server.ops("deregister")) == 1


def test_a_dropped_connection_closes_its_wake_up_pipe(server, address):
    """The pipe poke() writes to is closed when its connection object goes (in both
    builds: the compiled one's classes take no weak reference, so it is ``__del__``)."""
    def pipes() -> int:  # not sockets: the fake server closes its ends in its own time
        return sum(_is_pipe(fd) for fd in os.listdir("/proc/self/fd"))

    with cqsclient.connect(address, client="WARM") as warm:  # imports and caches made
        warm.structure("MSGQ01").put("Q", b"x")
    gc.collect()
    before = pipes()
    for n in range(20):
        with cqsclient.connect(address, client=f"C{n}") as c:
            c.structure("MSGQ01").put("Q", b"x")
        del c
    gc.collect()
    assert pipes() <= before  # 40 more without __del__ (fewer if an earlier test's go)


def _is_pipe(fd: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:  # the listing's own descriptor, closed by now
        return False
