"""Many clients sharing queues through a real daemon, over real sockets, with the SDK."""

import subprocess
import sys
import threading
from collections import Counter

import pytest

import cqsclient
from cqsclient.errors import CQSError
from cqsproto import encode_frame

from .harness import Raw

CHILD = """
import sys, cqsclient
c = cqsclient.connect(sys.argv[1], client=sys.argv[2])
s = c.structure("MSGQ01")
got = [s.read("WORK", wait=10) for _ in range(int(sys.argv[3]))]
print(" ".join(str(m.entry_id) for m in got), flush=True)
sys.stdin.read()  # hold the locks until killed
"""


def connect(daemon, name, **kw):
    return cqsclient.connect(daemon.address, client=name, **kw)


def reader_holding_locks(daemon, name, n):
    """A separate process that reads n messages with a lock and then waits to be killed."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, daemon.address, name, str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ids = [int(x) for x in proc.stdout.readline().split()]
    assert len(ids) == n
    return proc, ids


def wait_until_waiting(c, queue, n):
    """Block until the daemon reports n readers waiting on a queue (observed, not slept)."""
    for _ in range(10_000):
        rows = [r for r in c.query("queues", "MSGQ01") if r["queue"] == queue]
        if rows and rows[0]["waiting"] >= n:
            return
    raise AssertionError(f"{n} readers never waited on {queue}")


def test_clients_share_a_queue_and_no_message_goes_to_two(daemon):
    """Eight consumers drain one queue: every message once, and the work is spread."""
    total = 4000
    with connect(daemon, "PROD") as p:
        s = p.structure("MSGQ01")
        for i in range(0, total, 100):
            s.put_batch("WORK", [f"{j}".encode() for j in range(i, i + 100)])
    seen = Counter()
    per_client = Counter()
    lock = threading.Lock()

    def consume(name):
        with connect(daemon, name) as c:
            s = c.structure("MSGQ01")
            while True:
                batch = s.read_batch("WORK", 20, wait=0.5)
                if not batch:
                    return
                for m in batch:
                    s.delete(m.entry_id)
                with lock:
                    seen.update(m.data for m in batch)
                    per_client[name] += len(batch)

    threads = [threading.Thread(target=consume, args=(f"C{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == total and set(seen.values()) == {1}
    assert len(per_client) >= 2, per_client


def test_an_operator_delete_takes_any_message_not_locked_by_another(daemon):
    """docs/protocol.md (delete): an operator delete takes a ready message and one the caller holds
    locked, and refuses one another client holds."""
    with connect(daemon, "OPA") as a, connect(daemon, "OPB") as b:
        sa, sb = a.structure("MSGQ01"), b.structure("MSGQ01")
        ready, mine, theirs = (sa.put("OPQ", bytes([i])) for i in range(3))
        assert sa.read("OPQ").entry_id == ready
        assert sa.read("OPQ").entry_id == mine
        assert sb.read("OPQ").entry_id == theirs
        sa.unlock(ready)
        sa.operator_delete(ready)
        sa.operator_delete(mine)
        with pytest.raises(CQSError) as err:
            sa.operator_delete(theirs)
        assert err.value.reason == "LOCK_NOT_HELD"
        assert [m.entry_id for m in sa.browse(None, None) if m.queue == "OPQ"] == [theirs]


def test_32_clients_register_and_the_33rd_is_refused(daemon):
    """The default max_clients is 32; a 33rd registration gets CLIENT_LIMIT."""
    clients = [connect(daemon, f"IMS{i}") for i in range(32)]
    try:
        for i, c in enumerate(clients):
            c.structure("MSGQ01").put("SHARED", f"{i}".encode())
        got = [c.structure("MSGQ01").read("SHARED") for c in clients]
        assert sorted(int(m.data) for m in got) == list(range(32))
        with pytest.raises(CQSError) as err:
            connect(daemon, "IMS32")
        assert err.value.reason == "CLIENT_LIMIT"
    finally:
        for c in clients:
            c.close()


def test_locks_across_clients(daemon):
    """Lock, unlock, delete, move and browse behave across two clients."""
    with connect(daemon, "A") as a, connect(daemon, "B") as b:
        sa, sb = a.structure("MSGQ01"), b.structure("MSGQ01")
        first = sa.put("TRANX", b"one")
        second = sa.put("TRANX", b"two")
        m = sa.read("TRANX")
        assert m.entry_id == first and m.delivery_count == 1
        for call in (lambda: sb.delete(first), lambda: sb.unlock(first),
                     lambda: sb.move(first, "ELSE")):
            with pytest.raises(CQSError) as err:
                call()
            assert err.value.reason == "LOCK_NOT_HELD"
        assert [x.entry_id for x in sb.browse("TRANX")] == [second]
        sa.unlock(first)
        assert [x.entry_id for x in sb.browse("TRANX")] == [first, second]
        sb.move(second, "OTHER")
        n = sb.read("TRANX")
        assert n.entry_id == first and n.delivery_count == 2
        sb.delete(first)
        assert sa.read("TRANX") is None
        assert sa.read("OTHER").data == b"two"


def test_killed_reader_gives_its_messages_to_another_client(daemon):
    """A reader SIGKILLed while holding locks: another client gets them, delivered twice."""
    with connect(daemon, "PROD") as p:
        ids = p.structure("MSGQ01").put_batch("WORK", [b"a", b"b", b"c"])
    proc, held = reader_holding_locks(daemon, "DOOMED", 3)
    assert held == ids
    proc.kill()
    proc.wait()
    daemon.wait_for("peer_recovery")
    with connect(daemon, "HEIR") as c:
        got = c.structure("MSGQ01").read_batch("WORK", 3, wait=5)
    assert [m.entry_id for m in got] == ids
    assert {m.delivery_count for m in got} == {2}


def test_warm_resync_inside_the_grace(make_daemon):
    """A client that comes back within resync_grace is handed its locks and may delete them."""
    d = make_daemon("resync_grace = 60").start()
    with connect(d, "PROD") as p:
        (eid,) = p.structure("MSGQ01").put_batch("WORK", [b"held"])
    proc, _ = reader_holding_locks(d, "IMS1", 1)
    proc.kill()
    proc.wait()
    d.wait_for("connection_lost")
    with connect(d, "IMS1") as c:
        assert [lk.entry_id for lk in c.resync_locks] == [eid]
        s = c.structure("MSGQ01")
        assert s.read("WORK") is None  # still locked: not released by peer recovery
        s.delete(eid)
    assert not d.events("peer_recovery")


def test_cold_start_moves_old_locks_to_the_cold_queue(make_daemon):
    """Registering cold leaves the earlier life's locks on the cold queue for the operator."""
    d = make_daemon("resync_grace = 60").start()
    with connect(d, "PROD") as p:
        (eid,) = p.structure("MSGQ01").put_batch("WORK", [b"orphan"])
    proc, _ = reader_holding_locks(d, "IMS1", 1)
    proc.kill()
    proc.wait()
    d.wait_for("connection_lost")
    with connect(d, "IMS1", cold=True) as c:
        assert c.resync_locks == []
        s = c.structure("MSGQ01")
        cold = [m for m in s.browse() if m.where == "cold"]
        assert [m.entry_id for m in cold] == [eid] and cold[0].owner == "IMS1"
        assert s.read("WORK") is None
        s.requeue(eid)
        assert s.read("WORK").entry_id == eid


def test_notification_once_per_empty_to_non_empty_transition(daemon):
    """Interested clients are told once when a queue gets work, again only after it empties."""
    with connect(daemon, "WATCH1") as w1, connect(daemon, "WATCH2") as w2, \
            connect(daemon, "PROD") as p:
        for w in (w1, w2):
            w.register_interest("MSGQ01", "TRANX")
        s = p.structure("MSGQ01")
        for i in range(3):
            s.put("TRANX", b"%d" % i)
        for w in (w1, w2):
            got = list(w.notifications(timeout=0.5))
            assert [(n.structure, n.qtype, n.queue) for n in got] == [("MSGQ01", "TRAN", "TRANX")]
        for m in w1.structure("MSGQ01").read_batch("TRANX", 3):
            w1.structure("MSGQ01").delete(m.entry_id)
        s.put("TRANX", b"again")
        assert len(list(w2.notifications(timeout=0.5))) == 1


def test_a_waiting_reader_gets_a_put_directly_and_nobody_is_told_of_work(daemon):
    """A put to a queue a reader waits on goes straight to that reader's lock (seed 004:
    "placed on LOCKQ instead of Ready Queue"), so interested clients are not told of
    work that was never there for them; the next put, which nobody waits for, is."""
    with connect(daemon, "WATCH") as w, connect(daemon, "READER") as r, \
            connect(daemon, "PROD") as p:
        w.register_interest("MSGQ01", "HANDQ")
        w.register_interest("MSGQ01", "LASTQ")
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault(
            "m", r.structure("MSGQ01").read("HANDQ", wait=30)))
        reader.start()
        wait_until_waiting(w, "HANDQ", 1)
        s = p.structure("MSGQ01")
        handed = s.put("HANDQ", b"for the waiting reader")
        reader.join()
        assert (got["m"].entry_id, got["m"].delivery_count) == (handed, 1)
        s.put("HANDQ", b"for anyone")
        s.put("LASTQ", b"the end of the test")
        heard = []
        for n in w.notifications(timeout=10):
            heard.append(n.queue)
            if n.queue == "LASTQ":
                break
        assert heard == ["HANDQ", "LASTQ"]


def test_interest_in_a_queue_that_already_has_work_notifies_at_once(daemon):
    """Registering interest in a non-empty queue gives one notification straight away."""
    with connect(daemon, "PROD") as p, connect(daemon, "LATE") as late:
        p.structure("MSGQ01").put("LTERMZ", b"x", qtype="LTERM")
        late.register_interest("MSGQ01", "LTERMZ", qtype="LTERM")
        got = list(late.notifications(timeout=0.5))
        assert [(n.qtype, n.queue) for n in got] == [("LTERM", "LTERMZ")]
        late.deregister_interest("MSGQ01", "LTERMZ", qtype="LTERM")
        p.structure("MSGQ01").read("LTERMZ", qtype="LTERM")


def test_waiting_readers_are_woken_in_order(daemon):
    """Readers waiting on an empty queue are served first come, first served."""
    results = {}
    clients = [connect(daemon, f"W{i}") for i in range(3)]
    try:
        threads = []
        for i, c in enumerate(clients):
            t = threading.Thread(
                target=lambda i=i, c=c: results.__setitem__(
                    i, c.structure("MSGQ01").read("WQ", wait=30))
            )
            t.start()
            threads.append(t)
            wait_until_waiting(clients[0], "WQ", i + 1)
        with connect(daemon, "PROD") as p:
            ids = [p.structure("MSGQ01").put("WQ", b"%d" % i) for i in range(3)]
        for t in threads:
            t.join()
        assert [results[i].entry_id for i in range(3)] == ids
    finally:
        for c in clients:
            c.close()


def test_wait_read_times_out_with_none(daemon):
    """A waiting read that sees nothing returns None after its wait."""
    with connect(daemon, "W") as c:
        assert c.structure("MSGQ01").read("EMPTY", wait=0.2) is None


def test_unit_of_work_commits_and_rolls_back(daemon):
    """A unit of work applies its puts and deletes together; an exception unlocks its reads."""
    with connect(daemon, "UOW") as c:
        s = c.structure("MSGQ01")
        first = s.put("TRANX", b"in1")
        with s.unit_of_work() as uow:
            m = uow.read("TRANX")
            uow.put("LTERMZ", b"reply", qtype="LTERM")
            uow.delete(m.entry_id)
        assert s.read("TRANX") is None
        assert s.read("LTERMZ", qtype="LTERM").data == b"reply"
        second = s.put("TRANX", b"in2")
        with pytest.raises(RuntimeError):
            with s.unit_of_work() as uow:
                m = uow.read("TRANX")
                uow.put("LTERMZ", b"never", qtype="LTERM")
                raise RuntimeError("application failed")
        assert [x.entry_id for x in s.browse("TRANX")] == [second]
        assert s.browse("LTERMZ", qtype="LTERM") == []  # "never" was not committed
        assert first != second


def test_failed_commit_changes_nothing(daemon):
    """A commit refused for one operation leaves every message where it was."""
    with connect(daemon, "UOW") as c:
        s = c.structure("SMALL")
        eid = s.put("TRANX", b"x")
        with pytest.raises(CQSError) as err:
            with s.unit_of_work() as uow:
                m = uow.read("TRANX")
                uow.delete(m.entry_id)
                uow.put("BIG", b"y" * 20000)  # more than SMALL holds
        assert err.value.reason == "STRUCTURE_FULL"
        assert [x.entry_id for x in s.browse("TRANX")] == [eid]


def test_serial_queue_across_two_clients(daemon):
    """A TRAN_SERIAL queue lets only one message be in flight, whoever reads."""
    with connect(daemon, "S1") as a, connect(daemon, "S2") as b:
        sa, sb = a.structure("MSGQ01"), b.structure("MSGQ01")
        ids = [sa.put("SERQ", b"%d" % i, qtype="TRAN_SERIAL") for i in range(3)]
        m = sa.read("SERQ", qtype="TRAN_SERIAL")
        assert m.entry_id == ids[0]
        assert sb.read("SERQ", qtype="TRAN_SERIAL") is None
        sa.delete(m.entry_id)
        n = sb.read("SERQ", qtype="TRAN_SERIAL")
        assert n.entry_id == ids[1]
        assert sa.read("SERQ", qtype="TRAN_SERIAL") is None
        sb.unlock(n.entry_id)
        assert sa.read("SERQ", qtype="TRAN_SERIAL").entry_id == ids[1]


def test_failed_deliveries_end_on_the_suspend_queue(make_daemon):
    """A message failed max_deliveries times is suspended, and the operator can requeue it."""
    d = make_daemon("max_deliveries = 2").start()
    with connect(d, "APP") as c:
        s = c.structure("MSGQ01")
        eid = s.put("POISON", b"bad")
        for _ in range(2):
            s.unlock(s.read("POISON").entry_id, failed=True)
        assert s.read("POISON") is None
        (suspended,) = s.browse("POISON", qtype="TRAN_SUSPEND")
        assert suspended.entry_id == eid and suspended.delivery_count == 2
        s.requeue(eid)
        assert s.read("POISON").entry_id == eid


def test_clean_stop_and_restart_keeps_every_message(make_daemon):
    """SIGTERM writes an image of everything; the restarted daemon has it all, locks resynced."""
    d = make_daemon("resync_grace = 60").start()
    c = connect(d, "KEEP")
    s = c.structure("MSGQ01")
    kept = [s.put("TRANX", b"r%d" % i) for i in range(5)]
    kept += [s.put("TRANX", b"n%d" % i, recoverable=False) for i in range(5)]
    big = s.put("LTERMZ", bytes(range(256)) * 1000, qtype="LTERM")  # staged
    locked = s.read("TRANX")
    assert d.stop() == 0  # with the lock still held
    c.close()
    d.restart()
    with connect(d, "KEEP") as c:
        assert [lk.entry_id for lk in c.resync_locks] == [locked.entry_id]
        s = c.structure("MSGQ01")
        browsed = s.browse("TRANX", limit=100)
        assert [m.entry_id for m in browsed] == kept[1:]
        assert [m.recoverable for m in browsed] == [True] * 4 + [False] * 5
        assert s.read("LTERMZ", qtype="LTERM").data == bytes(range(256)) * 1000
        s.delete(locked.entry_id)
        new = s.put("TRANX", b"after")
        assert new > big


def test_a_daemon_restart_returns_locked_messages_without_counting_a_failure(make_daemon):
    """With max_deliveries = 1 a read message whose holder's delivery fails is suspended;
    one whose lock a clean stop or a crash released goes back to its place instead, its
    delivery count kept: the daemon stopping is no failure of the client's."""
    d = make_daemon("max_deliveries = 1").start()
    holder = Raw(d.socket)
    assert holder.register("HOLDER")["ok"]
    with connect(d, "PROD") as p:
        eid = p.structure("MSGQ01").put("HELD", b"m")
    for stop in (d.stop, d.kill):
        got = holder.request("read", structure="MSGQ01", queue="HELD")
        assert got["ok"] and got["result"]["messages"][0]["entry_id"] == eid
        stop()
        holder.close()
        before = d.mark()
        d.restart()
        [recovered] = d.wait_for("peer_recovery", after=before, client="HOLDER")
        assert (recovered["returned"], recovered["suspended"]) == (1, 0)
        holder = Raw(d.socket)
        assert holder.register("HOLDER")["ok"]
    got = holder.request("read", structure="MSGQ01", queue="HELD")["result"]["messages"]
    assert [(m["entry_id"], m["delivery_count"]) for m in got] == [(eid, 3)]
    holder.close()  # its own failure: this one counts
    d.wait_for("peer_recovery", after=before, client="HOLDER", suspended=1)
    with connect(d, "OPS") as c:
        [suspended] = c.structure("MSGQ01").browse("HELD", qtype="TRAN_SUSPEND")
        assert suspended.entry_id == eid


def test_clean_stop_answers_waiting_readers(make_daemon):
    """A read waiting at shutdown is answered SHUTTING_DOWN, and the daemon exits 0."""
    d = make_daemon().start()
    c = connect(d, "WAITER")
    outcome = {}

    def wait():
        try:
            outcome["result"] = c.structure("MSGQ01").read("NEVER", wait=60)
        except CQSError as err:
            outcome["reason"] = err.reason

    t = threading.Thread(target=wait)
    t.start()
    with connect(d, "OBSERVER") as o:
        wait_until_waiting(o, "NEVER", 1)
    assert d.stop() == 0
    t.join()
    assert outcome == {"reason": "SHUTTING_DOWN"}


def test_a_reader_that_hangs_up_while_waiting_takes_nothing_with_it(daemon):
    """A waiting read has no task of its own: when its connection closes, it leaves
    the line (the queue's waiting count drops to 0), and the next put goes to the
    reader that waits after it, not to a lock of the reader that is gone."""
    gone = Raw(daemon.socket)
    assert gone.register("GONE")["ok"]
    gone.next_id += 1
    gone.send(encode_frame({"id": gone.next_id, "op": "read", "structure": "MSGQ01",
                            "queue": "HUNG", "wait": 60}))
    with connect(daemon, "OBSERVER") as o:
        wait_until_waiting(o, "HUNG", 1)
        gone.close()
        for _ in range(10_000):
            if not [r for r in o.query("queues", "MSGQ01")
                    if r["queue"] == "HUNG" and r["waiting"]]:
                break
        else:
            raise AssertionError("the hung-up reader still waits")
        outcome = {}
        with connect(daemon, "LIVE") as live:
            t = threading.Thread(target=lambda: outcome.update(
                got=live.structure("MSGQ01").read("HUNG", wait=30)))
            t.start()
            wait_until_waiting(o, "HUNG", 1)
            eid = o.structure("MSGQ01").put("HUNG", b"for the living")
            t.join()
        assert outcome["got"].entry_id == eid
