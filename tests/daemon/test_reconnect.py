"""The SDK through daemon trouble, against real daemons: a consume loop across
SIGKILL and restart, locks that outlive a crash, a name taken over from a dying
connection, and timeouts while the daemon is stopped (SIGSTOP)."""

import os
import signal
import threading
import time

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import Reconnect, RequestTimeout
from cqsproto import encode_frame

from .harness import Raw
from .test_sharing import wait_until_waiting


def test_a_consume_loop_carries_on_through_daemon_crashes(make_daemon):
    """SIGKILL and restart under a running consume loop, once with a message in
    hand and more read ahead, once with a read waiting on the daemon: every message
    is processed at least once and none is lost, the locks held across the crash
    come back to the worker (its ack succeeds), and the loop carries on without
    the application handling anything."""
    d = make_daemon("resync_grace = 60").start()
    jobs = [b"job%03d" % i for i in range(60)]
    with cqsclient.connect(d.address, client="PRODUCER") as p:
        ids = p.structure("MSGQ01").put_batch("JOBS", jobs[:40])
    processed: list[bytes] = []
    in_hand, restarted = threading.Event(), threading.Event()
    outcome: dict = {}
    resyncs = []

    def worker():
        policy = Reconnect(first_delay=0.05, max_delay=0.2, on_resync=resyncs.append)
        with cqsclient.connect(d.address, client="WORKER", reconnect=policy) as c:
            messages = c.structure("MSGQ01").consume("JOBS", prefetch=5, wait=5)
            for m in messages:
                processed.append(m.data)
                if m.data == b"job010":
                    in_hand.set()
                    restarted.wait(60)
                    outcome["held"] = (m.entry_id, m.ack())
                    outcome["kept"] = [lock.entry_id for lock in c.last_resync.kept]
                else:
                    m.ack()
                if len(set(processed)) == len(jobs):
                    messages.stop()

    thread = threading.Thread(target=worker)
    thread.start()
    assert in_hand.wait(30)
    d.kill()  # job010 in hand, job011-014 read ahead
    d.restart()
    restarted.set()
    with cqsclient.connect(d.address, client="LOOK") as look:
        wait_until_waiting(look, "JOBS", 1)  # the first 40 done, a read waiting
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="PRODUCER") as p:
        p.structure("MSGQ01").put_batch("JOBS", jobs[40:])
    thread.join(60)
    assert not thread.is_alive()
    assert len(resyncs) == 2
    assert set(processed) == set(jobs)
    held, acked = outcome["held"]
    assert acked is True, "the lock held across the crash did not come back"
    assert held == ids[10] and set(ids[10:15]) <= set(outcome["kept"])
    with cqsclient.connect(d.address, client="CHECK") as c:
        assert list(c.structure("MSGQ01").browse("JOBS")) == []


def test_locks_held_at_a_crash_wait_out_the_grace_for_their_holder(make_daemon):
    """A lock outlives SIGKILL for resync_grace: its holder, registering again,
    gets it back; meanwhile nobody else can read the message."""
    d = make_daemon("resync_grace = 60").start()
    c = cqsclient.connect(d.address, client="HOLDER")
    s = c.structure("MSGQ01")
    eid = s.put("HELD", b"locked at the crash")
    assert s.read("HELD").entry_id == eid
    d.kill()
    c.abort()
    d.restart()
    with cqsclient.connect(d.address, client="OTHER") as other:
        assert other.structure("MSGQ01").read("HELD") is None
    with cqsclient.connect(d.address, client="HOLDER") as again:
        assert [lock.entry_id for lock in again.resync_locks] == [eid]
        again.structure("MSGQ01").delete(eid)


def test_a_registration_token_takes_the_name_over_from_its_old_connection(daemon):
    """A name held by a connection the daemon still thinks alive is refused
    (CLIENT_ACTIVE) without its token, or with a wrong one; with it, the new
    connection gets the name and the locks, the old one is cut off, and its
    waiting read is never served."""
    old = Raw(daemon.socket)
    token = old.register("TAKEN")["result"]["token"]
    old.request("put", structure="MSGQ01", queue="TQ", data=b"x")
    locked = old.request("read", structure="MSGQ01", queue="TQ")["result"]["messages"][0]
    old.send(encode_frame({"id": 99, "op": "read", "structure": "MSGQ01", "queue": "TW",
                           "wait": 30.0}))
    with cqsclient.connect(daemon.address, client="LOOK") as look:
        wait_until_waiting(look, "TW", 1)
    intruder = Raw(daemon.socket)
    assert intruder.register("TAKEN")["reason"] == "CLIENT_ACTIVE"
    assert intruder.register("TAKEN", takeover="not the token")["reason"] == "CLIENT_ACTIVE"
    new = Raw(daemon.socket)
    reply = new.register("TAKEN", takeover=token)
    assert [lock["entry_id"] for lock in reply["result"]["locks"]] == [locked["entry_id"]]
    assert reply["result"]["token"] != token
    assert old.receive() is None, "the old connection was not cut off"
    new.request("put", structure="MSGQ01", queue="TW", data=b"for the new one")
    got = new.request("read", structure="MSGQ01", queue="TW")
    assert got["ok"] and got["result"]["messages"][0]["data"] == b"for the new one"
    assert daemon.events("client_cut_off", client="TAKEN")
    assert not daemon.events("peer_recovery", client="TAKEN")


def test_requests_time_out_while_the_daemon_is_stopped(daemon):
    """SIGSTOP: a put times out after the client's timeout, a waiting read after its
    wait and the timeout; after SIGCONT the same connection carries on, and shows
    what "applied unknown" means: the put was applied after all."""
    with cqsclient.connect(daemon.address, client="PATIENT", timeout=0.3) as c:
        s = c.structure("MSGQ01")
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeout) as caught:
                s.put("STOPPED", b"maybe")
            assert 0.3 <= time.monotonic() - started < 3 and caught.value.applied is None
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                s.read("STOPPED", wait=0.4)
            assert time.monotonic() - started >= 0.7
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        m = s.read("STOPPED", wait=10, timeout=10)  # once the late read's lock is given back
        assert m is not None and m.data == b"maybe"
        s.delete(m.entry_id)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_async_requests_time_out_while_the_daemon_is_stopped(daemon, backend):
    """The async client's timeouts fire against a stopped daemon too."""

    async def main():
        async with cqsclient.aio.connect(daemon.address, client=f"A{backend[:3]}",
                                         timeout=0.3) as c:
            s = await c.structure("MSGQ01")
            os.kill(daemon.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(RequestTimeout):
                    await s.query("queues")
            finally:
                os.kill(daemon.proc.pid, signal.SIGCONT)
            with anyio.fail_after(10):
                assert await s.query("queues", timeout=None) is not None

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_client_coming_back_warm_finds_its_interests(make_daemon, stop):
    """Registrations and interests outlive a daemon restart, clean or a crash (the
    CQS system checkpoint): the SDK's reconnect finds its interest kept and sends no
    register_interest; a new connection under a name that dropped is notified of a
    put without registering its interest again; one deregistered stays gone; a cold
    start forgets them."""
    d = make_daemon().start()
    a = cqsclient.connect(d.address, client="IMSA", reconnect=Reconnect(first_delay=0.05))
    a.register_interest("MSGQ01", "TRANX")
    b = cqsclient.connect(d.address, client="IMSB")
    b.register_interest("MSGQ01", "TRANB", qtype=1)
    b.register_interest("MSGQ01", "GONE")
    b.deregister_interest("MSGQ01", "GONE")
    b.abort()  # the IMS goes too, without deregistering
    d.kill() if stop == "SIGKILL" else d.stop()
    d.restart()
    a.ping()  # the reconnect and its resync
    assert a.resumed_interests == [("MSGQ01", "TRANX", "TRAN")]
    assert a.last_resync.interests == [("MSGQ01", "TRANX", "TRAN")]
    b = cqsclient.connect(d.address, client="IMSB")  # no register_interest on it
    assert b.resumed_interests == [("MSGQ01", "TRANB", "TRAN")]
    with cqsclient.connect(d.address, client="FRONT") as front:
        front.structure("MSGQ01").put("TRANB", b"for IMSB")
        front.structure("MSGQ01").put("TRANX", b"for IMSA")
        front.structure("MSGQ01").put("GONE", b"nobody's")
    assert next(b.notifications(timeout=10)).queue == "TRANB"
    assert next(a.notifications(timeout=10)).queue == "TRANX"
    a.close()  # deregisters: a normal end forgets the registration
    lost = len(d.events("connection_lost", client="IMSB"))
    b.abort()
    d.wait_for("connection_lost", lost + 1, client="IMSB")  # else IMSB is still active
    with cqsclient.connect(d.address, client="IMSA") as again:
        assert again.resumed_interests == []
    with cqsclient.connect(d.address, client="IMSB", cold=True) as cold:
        assert cold.resumed_interests == []
    with cqsclient.connect(d.address, client="IMSB") as warm:
        assert warm.resumed_interests == []  # the cold start forgot them for good
