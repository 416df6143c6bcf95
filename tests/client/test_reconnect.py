"""Reconnect with resync against the fake server (which releases a dropped client's
locks at once, as a daemon with ``resync_grace = 0``), and its pure parts: the
back-off and the lock book."""

from __future__ import annotations

import socket
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import HeldLock, Message, Reconnect, errors, ops
from cqsclient.reconnect import LockBook, policy

FAST = Reconnect(first_delay=0.01, max_delay=0.05)


def cut_without_releasing(conn) -> None:
    """End a fake connection as if the daemon still held its locks (within resync_grace)."""
    conn.deregistered = True  # the fake then skips its peer recovery
    conn.sock.shutdown(socket.SHUT_RDWR)


def lose_the_next_read(server) -> None:
    """The next read locks its message, and its reply is lost with the connection."""
    def read_then_drop(conn, frame):
        del server.handlers["read"]
        with server.engine() as pair:
            pair.read(conn.client, "TRAN", frame["queue"])
        cut_without_releasing(conn)

    server.handlers["read"] = read_then_drop


def test_a_put_after_the_drop_is_sent_on_a_new_connection(server, address):
    """A request that could not be sent on the lost connection goes on the new one,
    and the resync report says the lock the daemon released was lost."""
    reports = []
    policy_ = Reconnect(first_delay=0.01, on_resync=reports.append)
    with cqsclient.connect(address, client="R1", reconnect=policy_) as c:
        s = c.structure("MSGQ01")
        s.put("Q", b"held")
        held = s.read("Q")
        server.drop_all()
        server.wait_connections(0)  # the fake has released the lock (no grace)
        assert s.put("Q", b"after") > held.entry_id
        assert reports == [c.last_resync]
        assert c.last_resync.lost == [HeldLock("MSGQ01", held.entry_id, "Q", "TRAN")]
        assert c.last_resync.kept == [] and c.holds("MSGQ01", held.entry_id) is False
        first, second = server.ops("register")
        assert "takeover" not in first and second["takeover"]


def test_a_read_lost_in_flight_has_its_lock_given_back_and_is_sent_again(server, address):
    """A read whose reply was lost locked a message the application never saw: the
    resync gives it back, and the read, safe to repeat, gets it again."""
    with cqsclient.connect(address, client="R1", reconnect=FAST) as c:
        s = c.structure("MSGQ01")
        eid = s.put("Q", b"locked in flight")
        lose_the_next_read(server)
        m = s.read("Q")
        assert (m.entry_id, m.delivery_count) == (eid, 2)
        assert c.last_resync.given_back == [HeldLock("MSGQ01", eid, "Q", "TRAN")]
        assert [r["entry_id"] for r in server.ops("unlock")] == [eid]


def test_a_put_lost_in_flight_raises_connection_lost_and_the_client_carries_on(server, address):
    """A put whose reply was lost may have been applied: it raises ConnectionLost
    (``applied`` unknown, a note saying the client reconnected); the next request works."""
    with cqsclient.connect(address, client="R1", reconnect=FAST) as c:
        s = c.structure("MSGQ01")

        def drop(conn, frame):
            del server.handlers["put"]
            cut_without_releasing(conn)

        server.handlers["put"] = drop
        with pytest.raises(errors.ConnectionLost) as caught:
            s.put("Q", b"maybe")
        assert caught.value.applied is None
        assert any("reconnected" in note for note in caught.value.__notes__)
        assert s.put("Q", b"surely") >= 1


def test_interests_are_registered_again_and_notify_at_once(server, address):
    """After a reconnect, notifications() goes on: the interest is registered again,
    and a queue holding work notifies at once."""
    with cqsclient.connect(address, client="R1", reconnect=FAST) as c:
        c.register_interest("MSGQ01", "WORK")
        with server.engine() as pair:
            pair.put("TRAN", "WORK", b"waiting")
        list(c.notifications(timeout=0.2))  # the notification of the put
        server.drop_all()
        notes = list(c.notifications(timeout=0.5))
        assert [(n.structure, n.queue) for n in notes] == [("MSGQ01", "WORK")]
        assert len(server.ops("register_interest")) == 2
        assert c.last_resync.interests == [("MSGQ01", "WORK", "TRAN")]


def test_a_reconnect_gives_up_after_its_limit(server, address):
    """With the daemon gone for good, the request raises its ConnectionLost once
    give_up_after seconds of attempts have passed."""
    give_up = Reconnect(first_delay=0.01, max_delay=0.02, give_up_after=0.3)
    c = cqsclient.connect(address, client="R1", reconnect=give_up)
    server.stop()
    started = time.monotonic()
    with pytest.raises(errors.ConnectionLost):
        c.query("structures")
    assert 0.3 <= time.monotonic() - started < 3
    c.close()


def test_without_reconnect_a_lost_connection_stays_lost(server, address):
    """The default: ConnectionLost for this request and every later one."""
    with cqsclient.connect(address, client="R1") as c:
        server.drop_all()
        for _ in range(2):
            with pytest.raises(errors.ConnectionLost):
                c.query("structures")
        assert c.holds("MSGQ01", 1) is None


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_client_reconnects_the_same_way(server, address, backend):
    """The async client resyncs too: the lost read's lock is given back, the read sent again."""

    async def main():
        async with cqsclient.aio.connect(address, client="A1", reconnect=FAST) as c:
            s = await c.structure("MSGQ01")
            eid = await s.put("Q", b"locked in flight")
            lose_the_next_read(server)
            m = await s.read("Q")
            assert (m.entry_id, m.delivery_count) == (eid, 2)
            assert [lock.entry_id for lock in c.last_resync.given_back] == [eid]
            server.drop_all()
            assert await s.put("Q", b"after") > eid

    anyio.run(main, backend=backend)


def test_the_back_off_starts_at_once_grows_and_is_capped():
    """0 first, then first_delay growing by multiplier up to max_delay, each less a
    random part of up to jitter."""
    delays = Reconnect(first_delay=0.1, max_delay=0.5, multiplier=2, jitter=0.5).delays(
        rand=lambda: 1.0)
    assert [next(delays) for _ in range(6)] == [0.0, 0.05, 0.1, 0.2, 0.25, 0.25]
    assert policy(False) is None and policy(True) == Reconnect()
    with pytest.raises(TypeError):
        policy("yes")  # type: ignore[arg-type]


def message(entry_id: int, queue: str = "Q") -> Message:
    return Message(entry_id, queue, "TRAN", b"", True, 0, 1, structure="S")


def test_the_lock_book_sorts_a_resync_into_kept_lost_and_orphans():
    """Locks read and not given up are held; the daemon's list sorts them: held and
    handed back (kept), held and not (lost, dropped by lose()), handed back and
    never seen (orphans)."""
    book = LockBook()
    book.adopt([HeldLock("S", 1, "Q", "TRAN")])
    book.note(ops.read_batch("S", "Q", 3, "TRAN", None), [message(2), message(3), message(4)])
    book.note(ops.read("S", "Q", "TRAN", None), message(5))
    book.note(ops.read("S", "Q", "TRAN", None), None)
    book.note(ops.delete("S", 2), None)
    book.note(ops.delete_and_read("S", 6, "Q", 1, "TRAN"), [message(8)])
    book.note(ops.delete("S", 8), None)
    book.note(ops.commit("S", [ops.unlock_op(3, False, None, None), ops.delete_op(9)]), [])
    assert sorted(key for key in [("S", i) for i in range(10)] if key in book) == [
        ("S", 1), ("S", 4), ("S", 5)]
    handed = [HeldLock("S", i, "Q", "TRAN") for i in (1, 5, 7)]
    kept, lost, orphans = book.resync(handed)
    assert [x.entry_id for x in kept] == [1, 5]
    assert [x.entry_id for x in lost] == [4]
    assert [x.entry_id for x in orphans] == [7]
    assert len(book) == 3, "the book changes only once the reconnect succeeded"
    book.lose(lost)
    assert len(book) == 2
