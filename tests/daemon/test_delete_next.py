"""A delete that delivers the next message (issue 18): ``delete`` with ``next`` deletes,
then reads as a ``read`` sent right after it would, in one round trip, durable before
its reply; a bad ``next`` or a failed delete changes nothing it should not."""

import pytest

import cqsclient
from cqsclient.errors import LockNotHeld
from cqsproto import encode_frame

from .harness import Raw
from .test_smds import SMDS, payload

S = "MSGQ01"


def ready(s, queue, qtype="TRAN"):
    """The entry ids of the queue's ready messages, as a browse shows them."""
    return [m.entry_id for m in s.browse(queue, qtype)]


def test_the_next_message_comes_back_locked_with_the_delete(daemon):
    """The deleted message is gone and the next one is locked by the caller, delivered once."""
    with cqsclient.connect(daemon.address, client="A") as c:
        s = c.structure(S)
        first, second, third = s.put_batch("Q", [b"1", b"2", b"3"])
        [m] = s.delete_and_read(s.read("Q").entry_id, "Q")
        assert (m.entry_id, m.data, m.delivery_count) == (second, b"2", 1)
        assert [(r["entry_id"], r["owner"]) for r in c.query("locks", S)] == [(second, "A")]
        assert ready(s, "Q") == [third]
        assert first not in [x.entry_id for x in s.browse_all()]


def test_n_messages_come_back_oldest_first_and_an_empty_queue_gives_none(daemon):
    """``n`` reads up to n, as a read of n would; a queue with nothing readable gives []."""
    with cqsclient.connect(daemon.address, client="A") as c:
        s = c.structure(S)
        ids = s.put_batch("Q", [b"a", b"b", b"c", b"d"])
        held = s.read("Q").entry_id
        got = s.delete_and_read(held, "Q", n=2)
        assert [m.entry_id for m in got] == ids[1:3]
        assert [m.entry_id for m in s.delete_and_read(got[0].entry_id, "Q", n=10)] == ids[3:]
        assert s.delete_and_read(got[1].entry_id, "EMPTY") == []
        assert s.delete_and_read(ids[3], "Q") == []
        assert list(s.browse_all()) == []


@pytest.mark.parametrize(("bad", "words"), [
    ({"queue": "Q", "wait": 5}, "unknown field 'wait'"),
    ({"qtype": "TRAN"}, "field 'queue' is required"),
    ({"queue": 7}, "field 'queue' must be str"),
    ({"queue": "Q", "n": "2"}, "field 'n' must be int"),
    ({"queue": "Q", "n": 0}, "n must be 1 to 10000"),
    ({"queue": "Q", "n": 10_001}, "n must be 1 to 10000"),
    ({"queue": "Q", "qtype": "TRAN_STAGING"}, "TRAN_STAGING"),
    ({"queue": "Q", "qtype": "BOGUS"}, "BOGUS"),
    ({"queue": "Q", "lease": 0}, "delete next: lease must be more than 0"),
    ({"queue": "Q", "lease": "30"}, "field 'lease' must be"),
    ({"queue": "Q23456789ABCDEFG"}, "Q23456789ABCDEFG"),
    ("Q", "field 'next' must be dict or nil"),
])
def test_a_bad_next_is_refused_and_the_message_stays_undeleted(daemon, bad, words):
    """Every fault of ``next`` is INVALID_REQUEST naming it, found before the delete:
    the message is still held by its reader, and nothing else was read."""
    raw = Raw(daemon.socket)
    raw.register("RAW")
    raw.request("put", structure=S, queue="Q", data=b"held")
    raw.request("put", structure=S, queue="Q", data=b"next")
    held = raw.request("read", structure=S, queue="Q")["result"]["messages"][0]["entry_id"]
    reply = raw.request("delete", structure=S, entry_id=held, next=bad)
    assert reply["reason"] == "INVALID_REQUEST" and words in reply["message"], reply
    locks = raw.request("query", kind="locks", structure=S)["result"]["rows"]
    assert [r["entry_id"] for r in locks] == [held]
    assert raw.request("delete", structure=S, entry_id=held)["ok"]
    raw.close()


def test_a_next_read_on_a_lease_is_given_back_when_it_expires(daemon):
    """``next`` with a lease locks as ``read(lease=)`` does: unrenewed, the message goes
    back as a failed delivery, and its old holder's delete is LOCK_NOT_HELD."""
    with cqsclient.connect(daemon.address, client="A") as a, \
            cqsclient.connect(daemon.address, client="B") as b:
        sa = a.structure(S)
        sa.put_batch("Q", [b"1", b"2"])
        [m] = sa.delete_and_read(sa.read("Q").entry_id, "Q", lease=0.2)
        again = b.structure(S).read("Q", wait=10)
        assert (again.entry_id, again.delivery_count) == (m.entry_id, 2)
        with pytest.raises(LockNotHeld):
            sa.delete(m.entry_id)


def test_a_failed_delete_reads_nothing(daemon):
    """A delete refused (not held, not found) takes no lock on the next queue."""
    with cqsclient.connect(daemon.address, client="A") as a, \
            cqsclient.connect(daemon.address, client="B") as b:
        sa, sb = a.structure(S), b.structure(S)
        ids = sa.put_batch("Q", [b"x", b"y"])
        theirs = sb.read("Q").entry_id
        with pytest.raises(LockNotHeld):
            sa.delete_and_read(theirs, "Q")
        with pytest.raises(cqsclient.errors.EntryNotFound):
            sa.delete_and_read(10**15, "Q")
        assert ready(sa, "Q") == ids[1:]
        assert [r["owner"] for r in a.query("locks", S)] == ["B"]


def test_a_serial_queue_hands_its_next_message_to_the_deleter(daemon):
    """On a TRAN_SERIAL queue the delete ends the message in flight, so the next one is
    readable by the same request."""
    with cqsclient.connect(daemon.address, client="A") as c:
        s = c.structure(S)
        ids = s.put_batch("SER", [b"1", b"2", b"3"], qtype="TRAN_SERIAL")
        first = s.read("SER", "TRAN_SERIAL")
        assert s.read("SER", "TRAN_SERIAL") is None  # one in flight
        got = s.delete_and_read(first.entry_id, "SER", n=5, qtype="TRAN_SERIAL")
        assert [m.entry_id for m in got] == [ids[1]]  # still one at a time


def test_a_reader_waiting_on_a_serial_queue_is_served_first(daemon):
    """A read already waiting on the SERIAL queue gets the message the delete frees, as
    it would if the delete and the read were two requests; the next read finds none."""
    with cqsclient.connect(daemon.address, client="A") as c:
        s = c.structure(S)
        ids = s.put_batch("SER", [b"1", b"2"], qtype="TRAN_SERIAL")
        first = s.read("SER", "TRAN_SERIAL")
        waiter = Raw(daemon.socket)
        waiter.register("W")
        waiter.next_id += 1
        waiter.send(encode_frame({  # a read parked on the daemon
            "id": waiter.next_id, "op": "read", "structure": S, "queue": "SER",
            "qtype": "TRAN_SERIAL", "wait": 10}))
        for _ in range(1000):  # each round trip lets the daemon's tasks run
            if any(r["queue"] == "SER" and r["waiting"] for r in c.query("queues", S)):
                break
        else:
            raise AssertionError("the read never waited")
        assert s.delete_and_read(first.entry_id, "SER", qtype="TRAN_SERIAL") == []
        served = waiter.receive()
        assert [m["entry_id"] for m in served["result"]["messages"]] == [ids[1]]
        waiter.close()


def test_the_delete_survives_a_sigkill_right_after_the_reply(make_daemon):
    """The reply waits for the delete's log record: killed at once, the daemon comes back
    without the message; the next one, whose lock died with it, is readable again."""
    d = make_daemon().start()
    c = cqsclient.connect(d.address, client="A")
    s = c.structure(S)
    gone, nxt = s.put_batch("Q", [b"acked", b"next"])
    [m] = s.delete_and_read(s.read("Q").entry_id, "Q")
    d.kill()
    c.abort()
    d.restart()
    with cqsclient.connect(d.address, client="AFTER") as again:
        s2 = again.structure(S)
        assert m.entry_id == nxt and [x.entry_id for x in s2.browse_all()] == [nxt]
        assert s2.read("Q").entry_id == nxt
        with pytest.raises(cqsclient.errors.EntryNotFound):
            s2.operator_delete(gone)


def test_a_next_message_that_cannot_be_read_leaves_the_delete_standing(make_daemon):
    """An offloaded next message whose data set is stopped: the delete is done and
    acknowledged, its read passes over that message (docs/smds.md, "Read"), so
    nothing comes back and nothing stays locked; a plain read then gets the
    SMDS_UNAVAILABLE."""
    d = make_daemon(structures=SMDS).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure(S)
        small = s.put("Q", b"small")
        big = s.put("Q", payload(100_000, 1))
        held = s.read("Q").entry_id
        assert held == small
        c.stop_smdsconn(S, "A")
        assert s.delete_and_read(held, "Q") == []
        assert not d.events("delete_next_unread")  # passed over: nothing failed
        assert c.query("locks", S) == []
        with pytest.raises(cqsclient.errors.CQSError) as unreadable:
            s.read("Q")
        assert unreadable.value.reason == "SMDS_UNAVAILABLE"
        c.start_smdsconn(S, "A")
        assert [m.entry_id for m in s.browse_all()] == [big]
