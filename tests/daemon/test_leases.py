"""Lock leases and delayed puts through a real daemon: expiry, renewal, the suspend
queue, a restart after SIGKILL, waiting readers, and delayed messages recovered."""

import time

import pytest

import cqsclient
from cqsclient.errors import LockNotHeld

from .test_checkpoints import JOBS, ONE

S = "MSGQ01"


def test_an_unrenewed_lease_is_redelivered_and_its_old_holder_no_longer_holds_it(daemon):
    """A waiting reader gets the message once the lease runs out, with one delivery
    more; the first holder's delete is then LOCK_NOT_HELD, and the expiry is logged."""
    with (cqsclient.connect(daemon.address, client="A") as a,
          cqsclient.connect(daemon.address, client="B") as b):
        eid = a.structure(S).put("Q", b"work")
        first = a.structure(S).read("Q", lease=0.5)
        again = b.structure(S).read("Q", wait=10)  # served by the expiry
        assert (again.entry_id, first.delivery_count, again.delivery_count) == (eid, 1, 2)
        with pytest.raises(LockNotHeld):
            a.structure(S).delete(eid)
        b.structure(S).delete(eid)
    assert daemon.events("leases_expired", structure=S, messages=1)


def test_a_renewed_lease_keeps_the_lock(daemon):
    """Renewed before its end, the lock stays its holder's: a reader waiting past the
    first deadline gets nothing, and the holder deletes the message."""
    with (cqsclient.connect(daemon.address, client="A") as a,
          cqsclient.connect(daemon.address, client="B") as b):
        s = a.structure(S)
        eid = s.put("Q", b"long job")
        s.read("Q", lease=0.5)
        s.renew(eid, 30)
        assert b.structure(S).read("Q", wait=1.0) is None
        s.delete(eid)
    assert not daemon.events("leases_expired")


def test_expiries_are_failed_deliveries_that_end_on_the_suspend_queue(make_daemon):
    """With max_deliveries 2, the second expiry sends the message to TRAN_SUSPEND,
    where a reader waiting there gets it."""
    d = make_daemon("max_deliveries = 2").start()
    with cqsclient.connect(d.address, client="A") as a:
        s = a.structure(S)
        eid = s.put("Q", b"poison")
        s.read("Q", lease=0.2)
        assert s.read("Q", wait=10, lease=0.2).delivery_count == 2
        suspended = s.read("Q", qtype="TRAN_SUSPEND", wait=10)
        assert (suspended.entry_id, suspended.queue) == (eid, "Q")


def test_a_leased_consumer_s_ack_brings_the_next_message_on_the_same_lease(daemon):
    """consume(lease=): the read an ack carries (delete with next) takes the lease too,
    so the message it brought, left unacked, expires as a failed delivery."""
    with cqsclient.connect(daemon.address, client="A") as a, \
            cqsclient.connect(daemon.address, client="B") as b:
        s = a.structure(S)
        s.put_batch("Q", [b"1", b"2"])
        consumer = s.consume("Q", lease=0.3)
        first = next(iter(consumer))
        first.ack()
        [held] = [r["entry_id"] for r in a.query("locks", S)]  # the ack brought it
        brought = next(iter(consumer))
        assert brought.entry_id == held
        again = b.structure(S).read("Q", wait=10)
        assert (again.entry_id, again.delivery_count) == (brought.entry_id, 2)
        consumer.stop()


def test_a_lease_survives_sigkill_and_restart_and_still_expires(make_daemon):
    """The lease is logged: after SIGKILL and restart its holder gets the lock back at
    resync, but does not renew it, and it expires as a failed delivery."""
    d = make_daemon("resync_grace = 60").start()
    a = cqsclient.connect(d.address, client="A")
    s = a.structure(S)
    eid = s.put("Q", b"leased")
    s.read("Q", lease=4)
    s.put("OTHER", b"x")  # acknowledged once durable: the lease's record is before it
    d.kill()
    a.abort()
    after = d.mark()
    d.restart()
    with (cqsclient.connect(d.address, client="A") as again,
          cqsclient.connect(d.address, client="B") as b):
        assert [lock.entry_id for lock in again.resync_locks] == [eid]
        got = b.structure(S).read("Q", wait=20)
        assert (got.entry_id, got.delivery_count) == (eid, 2)
        with pytest.raises(LockNotHeld):
            again.structure(S).delete(eid)
    assert d.events("leases_expired", after, structure=S)


def test_a_delayed_put_is_invisible_until_its_time_then_fifo_among_its_peers(daemon):
    """Neither read nor a browse of its queue sees it before its time; display queues
    counts it as delayed; then two delayed messages come in entry-id order."""
    with cqsclient.connect(daemon.address, client="A") as a:
        s = a.structure(S)
        first = s.put("Q", b"first", delay=1.0)
        second = s.put("Q", b"second", not_before=time.time() + 1.0)
        assert first < second
        assert s.read("Q") is None and list(s.browse("Q")) == []
        row = next(r for r in a.query("queues", S) if r["queue"] == "Q")
        assert (row["depth"], row["delayed"]) == (0, 2)
        got = [s.read("Q", wait=10), s.read("Q", wait=10)]
        assert [m.entry_id for m in got] == [first, second]
        assert [m.data for m in got] == [b"first", b"second"]


def test_a_waiting_read_is_woken_when_a_delayed_put_becomes_due(daemon):
    """A read waiting on an empty queue gets a message put with a delay as soon as it is
    due, not at the end of its wait."""
    with cqsclient.connect(daemon.address, client="A") as a:
        s = a.structure(S)
        t0 = time.monotonic()
        eid = s.put("Q", b"soon", delay=0.5)
        assert s.read("Q", wait=20).entry_id == eid
        assert 0.5 <= time.monotonic() - t0 < 10


def test_delayed_puts_survive_a_crash_and_a_checkpoint_and_recover(make_daemon):
    """A delayed recoverable put comes back delayed after SIGKILL, and after a
    checkpoint and an operator recover (the Spark fold carries not_before)."""
    d = make_daemon(JOBS, structures=ONE).start()
    with cqsclient.connect(d.address, client="A") as a:
        crashed = a.structure(S).put("Q", b"crash", delay=4)
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="A") as a:
        s = a.structure(S)
        assert s.read("Q") is None
        assert s.read("Q", wait=20).entry_id == crashed
        checkpointed = s.put("R", b"checkpoint", delay=3600)  # two Spark jobs take a while
        a.checkpoint(S)
        a.recover(S)
        assert s.read("R") is None
        assert next(r for r in a.query("queues", S) if r["queue"] == "R")["delayed"] == 1
        assert [m.entry_id for m in s.browse() if m.where == "delayed"] == [checkpointed]
