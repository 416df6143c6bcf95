"""A session sends a frame on the spot when it can and queues it when it must,
bounds its queue, and paces a client whose replies go unread."""

import socket

import trio
import trio.testing

from cqsproto import encode_frame

from .conftest import RECORD, SEND_QUEUE, received, unsocketed

NOTE = encode_frame({"notify": "work", "structure": "S", "qtype": "TRAN", "queue": "Q"})
PAUSE = SEND_QUEUE // 4  # the frames at which reading pauses (session.PAUSE_SHARE)


def fill(session, frames, lsn=0):
    for _ in range(frames):
        session.send_bytes(NOTE, lsn)


def writer_sends(session):
    """What the connection's writer task does with the head of the queue: take
    what may go now, send it (here: drop it), say so."""
    session.sending = True
    taken = session.take(session.journal.durable)
    session.sent()
    return taken


async def test_a_frame_goes_out_on_the_spot_when_nothing_waits(journal, connected):
    """With an empty queue and nothing to wait for, a frame is sent by the caller."""
    session, client = connected(journal)
    session.reply(1, {"entry_id": 5})
    assert received(client) == [{"id": 1, "ok": True, "result": {"entry_id": 5}}]
    assert not session.queue and session.unsent == 0


async def test_a_frame_behind_a_held_reply_waits_its_turn(journal, connected, nursery):
    """A notification sent after a reply that waits for the log is queued behind
    it, and both go out, in order, after the flush."""
    session, client = connected(journal)
    lsn = journal.append(RECORD, urgent=False)
    session.reply(1, {}, lsn)
    session.send_bytes(NOTE)
    assert [f[0] for f in session.queue] == [lsn, 0]
    assert received(client) == []
    nursery.start_soon(journal.run)
    journal.append(RECORD)
    await journal.wait_durable(lsn)
    assert [f.get("id", "note") for f in received(client)] == [1, "note"]


async def test_release_sends_what_is_durable_and_keeps_the_rest(journal, connected):
    """A flush that covers the first of two held replies sends that one, and the
    session stays held for the second."""
    session, client = connected(journal)
    first, second = journal.append(RECORD), journal.append(RECORD)
    session.reply(1, {}, first)
    session.reply(2, {}, second)
    assert session.release(first, None) is True
    assert [f["id"] for f in received(client)] == [1]
    assert session.release(second, None) is False
    assert [f["id"] for f in received(client)] == [2]


async def test_what_a_full_socket_cannot_take_is_left_to_the_writer(journal, connected, nursery):
    """A frame larger than the socket takes goes out in part; the rest is queued
    first in line, the writer task is woken for it, and nothing is lost."""
    session, client = connected(journal)
    session.raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = encode_frame({"id": 1, "ok": True, "result": {"data": b"x" * 200_000}})
    session.send_bytes(big)
    session.send_bytes(NOTE)
    assert len(session.queue) == 2
    woken = []

    async def writer():
        await session.wait_for_work()
        woken.append(True)

    nursery.start_soon(writer)
    await trio.testing.wait_all_tasks_blocked()
    assert woken == [True]
    sent = client.recv(len(big))
    assert sent + bytes(writer_sends(session)) == big + NOTE
    assert not session.queue and session.unsent == 0


async def test_a_client_past_the_frame_limit_is_cut_off(journal):
    """The frame after send_queue frames cuts the client off: its queue is dropped,
    none of its requests is taken any more, its connection is cancelled, and
    later frames are ignored."""
    session = unsocketed(journal)
    session.scope = trio.CancelScope()
    fill(session, SEND_QUEUE)
    assert not session.cut_off and len(session.queue) == SEND_QUEUE
    fill(session, 1)
    assert session.cut_off and session.paused and session.scope.cancel_called
    assert not session.queue and session.unsent == 0
    fill(session, 1)
    assert not session.queue


async def test_a_client_past_the_byte_limit_is_cut_off(journal):
    """Queued bytes count as much as frames: past send_queue_bytes, cut off."""
    session = unsocketed(journal, send_queue_bytes=1 << 20)
    big = encode_frame({"id": 1, "ok": True, "result": {"data": b"x" * 600_000}})
    session.send_bytes(big)
    session.send_bytes(big)
    assert not session.cut_off
    session.send_bytes(NOTE)
    assert session.cut_off


async def test_reading_pauses_at_the_mark_and_resumes_at_half_of_it(journal, nursery):
    """Reading pauses once a quarter of send_queue frames wait; the reader's
    resumed() returns only once the queue is down to half of that."""
    session = unsocketed(journal)
    lsn = journal.append(RECORD, urgent=False)
    fill(session, 1)
    fill(session, PAUSE - 1, lsn)  # the writer cannot send these before the flush
    assert session.paused
    resumed = []

    async def reader():
        await session.resumed()
        resumed.append(True)

    nursery.start_soon(reader)
    writer_sends(session)  # one frame gone: PAUSE - 1 left, more than half the mark
    await trio.testing.wait_all_tasks_blocked()
    assert session.paused and resumed == []
    nursery.start_soon(journal.run)
    journal.append(RECORD)
    await journal.wait_durable(lsn)
    writer_sends(session)
    await trio.testing.wait_all_tasks_blocked()
    assert not session.paused and resumed == [True]


async def test_requests_whose_replies_come_later_pause_reading_too(journal):
    """As many deferred requests (waiting reads, jobs) as the pause mark pause
    reading; it resumes as soon as one of them has replied."""
    session = unsocketed(journal)
    replies = [trio.Event() for _ in range(PAUSE)]
    async with trio.open_nursery() as session.waits:
        for reply in replies:
            session.defer(reply.wait)
        assert session.paused and session.deferred == PAUSE
        replies[0].set()
        await trio.testing.wait_all_tasks_blocked()
        assert not session.paused and session.deferred == PAUSE - 1
        for reply in replies:
            reply.set()
    assert session.deferred == 0


async def test_a_paused_socket_session_resumes_when_the_flusher_empties_its_queue(
        journal, connected, nursery):
    """A session paused by replies waiting for the log resumes when the flusher
    has sent them on its socket."""
    session, client = connected(journal)
    lsn = journal.append(RECORD, urgent=False)
    for rid in range(PAUSE):
        session.reply(rid, {}, lsn)
    assert session.paused
    nursery.start_soon(journal.run)
    journal.append(RECORD)
    await journal.wait_durable(lsn)
    assert not session.paused and len(received(client)) == PAUSE
