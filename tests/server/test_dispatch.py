"""Dispatch hands each request to its handler, and settle turns what it did into
log records, notifications and waiter hand-offs: a reply that acknowledges a
change waits for the log, everything else goes at once.

The daemon runs in-process (``Daemon.run`` in the test's nursery, on a real
data directory); requests are fed to ``dispatch`` directly, from sessions whose
raw socket is one end of a socket pair, so that what a client would receive is
read off the other end.
"""

import itertools

import pytest
import structlog
import trio
import trio.testing

import logstream
from cqsd.config import loads
from cqsd.engine import Reason
from cqsd.engine.qtypes import list_header
from cqsd.server.daemon import Daemon, InternalFailure
from cqsd.server.limits import EFFECT_BOUND, RECORD_BUDGET
from cqsproto import PROTOCOL_VERSION

from .conftest import received

CONFIG = """
[daemon]
data_dir = "{data}"
socket = "{socket}"
max_message = "64KiB"
log_segment = "1MiB"
checkpoint_interval = 0
checkpoint_log_volume = 0
[[structure]]
name = "MSGQ01"
size = "128MiB"
"""
_ids = itertools.count(1)


def config(tmp_path, tmp_path_factory):
    socket = tmp_path_factory.mktemp("sock") / "s"  # short enough for AF_UNIX
    return loads(CONFIG.format(data=tmp_path / "data", socket=socket))


@pytest.fixture
async def daemon(tmp_path, tmp_path_factory):
    """A daemon serving in the test's trio run; stopped after the test."""
    d = Daemon(config(tmp_path, tmp_path_factory))
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        yield d
        d.stop("end of test")


@pytest.fixture
def register(daemon, connected):
    """Register a client on a fresh session: returns (session, the client's end)."""
    def make(name):
        session, client = connected(daemon.journal)
        send(daemon, session, "register", client=name, version=PROTOCOL_VERSION)
        [reply] = received(client)
        assert reply["ok"], reply
        return session, client

    return make


def send(d, session, op, **fields):
    """Dispatch one request; returns its id."""
    rid = next(_ids)
    d.dispatch(session, {"id": rid, "op": op, **fields})
    return rid


def put(d, session, queue="Q", data=b"m", **fields):
    return send(d, session, "put", structure="MSGQ01", queue=queue, data=data, **fields)


def contents(d):
    """Every message of MSGQ01 as (id, queue, where, owner, deliveries), and its totals."""
    pair = d.registry.pairs["MSGQ01"]
    return [(e.entry_id, e.name, e.where, e.owner, e.delivery_count) for e in pair], pair.stats()


async def test_a_puts_reply_waits_for_the_log_and_the_flusher_sends_it(daemon, register):
    """The reply to a put is held until its record is durable, then sent by the
    flusher after the fsync."""
    session, client = register("A")
    rid = put(daemon, session)
    lsn = daemon.journal.position
    assert received(client) == [] and daemon.journal.durable < lsn
    assert await daemon.journal.wait_durable(lsn)
    [reply] = received(client)
    assert reply["id"] == rid and reply["ok"] and reply["result"]["entry_id"] > 0


async def test_a_reads_lock_record_does_not_hold_its_reply(daemon, register):
    """A read is logged as a lock, which nobody waits for: the reply goes at once
    and the record waits, unsynced, for the next fsync."""
    session, client = register("A")
    put(daemon, session)
    await daemon.journal.wait_durable(daemon.journal.position)
    received(client)
    rid = send(daemon, session, "read", structure="MSGQ01", queue="Q")
    [reply] = received(client)
    assert reply["id"] == rid and reply["ok"] and len(reply["result"]["messages"]) == 1
    await trio.testing.wait_all_tasks_blocked()
    assert daemon.journal.durable == daemon.journal.position - 1


@pytest.mark.parametrize(("fields", "reason"), [
    ({"op": "dance"}, Reason.INVALID_REQUEST),
    ({"op": "put", "structure": "MSGQ01", "queue": "Q", "data": "text"}, Reason.INVALID_REQUEST),
    ({"op": "put", "structure": "NOPE", "queue": "Q", "data": b"m"}, Reason.UNKNOWN_STRUCTURE),
    ({"op": "put", "structure": "MSGQ01", "queue": "Q", "data": b"m" * 65537},
     Reason.MESSAGE_TOO_LARGE),
    ({"op": "read", "structure": "MSGQ01", "queue": "Q", "n": 0}, Reason.INVALID_REQUEST),
    ({"op": "delete", "structure": "MSGQ01", "entry_id": "the held one"}, Reason.LOCK_NOT_HELD),
    ({"op": "commit", "structure": "MSGQ01", "ops": [
        {"op": "put", "queue": "Q", "data": b"new"}, {"op": "delete", "entry_id": 1}]},
     Reason.ENTRY_NOT_FOUND),
], ids=["unknown op", "bad field", "unknown structure", "too large", "bad n",
        "lock not held", "commit"])
async def test_a_refused_request_changes_nothing(daemon, register, fields, reason):
    """A request the daemon refuses is answered at once with its reason, and
    neither the structure nor the log changes."""
    holder, _ = register("A")
    put(daemon, holder)
    send(daemon, holder, "read", structure="MSGQ01", queue="Q")
    session, client = register("B")
    if fields.get("entry_id") == "the held one":
        fields = {**fields, "entry_id": contents(daemon)[0][0][0]}
    before, position = contents(daemon), daemon.journal.position
    rid = next(_ids)
    daemon.dispatch(session, {"id": rid, **fields})
    [reply] = received(client)
    assert (reply["id"], reply["ok"], reply["reason"]) == (rid, False, str(reason))
    assert contents(daemon) == before and daemon.journal.position == position


async def test_a_request_before_register_is_refused(daemon, connected):
    """Only register may come first: anything else is NOT_REGISTERED."""
    session, client = connected(daemon.journal)
    put(daemon, session)
    [reply] = received(client)
    assert reply["reason"] == str(Reason.NOT_REGISTERED)
    assert contents(daemon)[0] == []


async def test_new_work_notifies_the_sessions_interested_in_its_queue(daemon, register):
    """A put that makes a queue non-empty sends a notification to each session
    interested in it, at once; a put to a queue that already had work does not. (The
    register_interest reply waits for the system checkpoint: its task is awaited.)"""
    interested, told = register("A")
    _, not_told = register("C")
    async with trio.open_nursery() as interested.waits:
        send(daemon, interested, "register_interest", structure="MSGQ01", queue="Q")
    assert [r["ok"] for r in received(told)] == [True]  # empty: no notification yet
    producer, _ = register("B")
    put(daemon, producer)
    put(daemon, producer)
    assert received(told) == [
        {"notify": "work", "structure": "MSGQ01", "qtype": "TRAN", "queue": "Q"}]
    assert received(not_told) == []


async def test_a_waiting_read_is_served_by_the_put_that_makes_its_queue_readable(
        daemon, register):
    """A read with wait= defers; the next put on its queue hands it the message,
    and its reply goes without waiting for the log."""
    reader, got = register("A")
    producer, _ = register("B")
    async with trio.open_nursery() as reader.waits:
        rid = send(daemon, reader, "read", structure="MSGQ01", queue="Q", wait=30.0)
        await trio.testing.wait_all_tasks_blocked()
        assert received(got) == [] and reader.deferred == 1
        put(daemon, producer, data=b"for the waiter")
    [reply] = received(got)
    assert reply["id"] == rid
    assert [m["data"] for m in reply["result"]["messages"]] == [b"for the waiter"]
    assert contents(daemon)[0][0][2:4] == ("locked", "A")


async def test_a_waiting_read_nobody_serves_ends_after_its_wait(daemon, register, autojump_clock):
    """A waiting read on a queue that stays empty replies NO_MESSAGE once its wait
    is over (on the mock clock), from the daemon's one timer for every wait."""
    reader, got = register("A")
    start = trio.current_time()
    send(daemon, reader, "read", structure="MSGQ01", queue="Q", wait=30.0)
    await trio.lowlevel.wait_readable(got)
    assert trio.current_time() - start == pytest.approx(30.0)
    [reply] = received(got)
    assert reply["reason"] == str(Reason.NO_MESSAGE)


async def test_a_record_too_large_for_the_log_is_split(daemon, register):
    """A dequeue of more deletes than one record may list is logged as two records
    the log takes, and its reply waits for the second."""
    session, client = register("A")
    producer, _ = register("B")  # its replies, too large for the socket, wait for a writer
    count = RECORD_BUDGET // EFFECT_BOUND + 1  # one delete more than a record holds
    for n in (count // 2, count - count // 2):
        send(daemon, producer, "commit", structure="MSGQ01",
             ops=[{"op": "put", "queue": "Q", "data": b""}] * n)
    before = daemon.journal.position
    rid = send(daemon, session, "dequeue", structure="MSGQ01", queue="Q")
    assert daemon.journal.position == before + 2 and received(client) == []
    assert [lsn for lsn, _, _ in session.queue] == [before + 2]
    assert await daemon.journal.wait_durable(before + 2)
    assert received(client) == [{"id": rid, "ok": True, "result": {"count": count}}]
    records = [r.body for r in logstream.read(daemon.datadir.logstream) if r.lsn > before]
    assert [len(r["e"]) for r in records] == [count - 1, 1]
    assert {e[0] for r in records for e in r["e"]} == {"D"}


async def test_an_exception_inside_the_engine_stops_the_daemon(
        tmp_path, tmp_path_factory, connected):
    """An engine method that raises part-way fails its request, makes every reply
    still waiting for the log an error, and stops the daemon with exit code 4."""
    def damage(pair, queue):
        """The engine loses its list header's entry for ``queue`` (a bug planted in its
        memory, not in its code, which may be compiled): the delete that empties the
        queue takes its message off it, then raises."""
        [(qtype, _)] = [key for key in pair.primary._queues if key[1] == queue]
        del pair.primary._headers[list_header(qtype, queue)][queue]

    d = Daemon(config(tmp_path, tmp_path_factory))
    stopped = []

    async def run(task_status):
        with pytest.raises(InternalFailure) as caught:
            await d.run(task_status=task_status)
        stopped.append(caught.value)

    # a bound, not a pace: a daemon that went on serving would keep the nursery open
    with structlog.testing.capture_logs() as logs, trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            session, client = connected(d.journal)
            send(d, session, "register", client="A", version=PROTOCOL_VERSION)
            held = put(d, session, queue="planted")
            [(eid, *_)], _ = contents(d)
            damage(d.registry.pairs["MSGQ01"], "planted")
            failed = send(d, session, "delete", structure="MSGQ01", entry_id=eid, operator=True)
    assert stopped[0].exit_code == 4
    reasons = {r["id"]: r.get("reason") for r in received(client)}
    assert reasons[held] == str(Reason.SHUTTING_DOWN)
    assert reasons[failed] == str(Reason.INVALID_REQUEST)
    [event] = [e for e in logs if e["event"] == "internal_error"]
    assert (event["op"], event["error"]) == ("delete", "KeyError: 'planted'")
