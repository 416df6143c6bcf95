"""The poller reads every plain connection from one task: each ``recv`` reaches the
handler, which gets whole frames in order however the bytes were cut; a connection
gives up its turn after TURN_FRAMES requests so that others' come between; a paused
session is read no more until it resumes, and then the requests already received
come first; a closed peer ends the connection's ``read``; a pass that ends in a
flush looks again first, so that requests that arrived meanwhile share it.

The real Poller runs in the test's trio run on real socket pairs (the daemon's end
in the poller's epoll, the test writes on the client's end); the handler is the
test's, decoding as the daemon's does and recording what it got.
"""

import socket

import pytest
import trio
import trio.testing

from cqsd.server.poller import TURN_FRAMES, Poller, Turn
from cqsd.server.session import Session
from cqsproto import CLOSED, NEED_DATA, FrameDecoder, encode_frame
from cqsproto.codec import LARGE

from .conftest import MAX_FRAME


class Handler:
    """Decodes what the poller hands it, up to TURN_FRAMES frames a turn, as
    ``Connections.handle`` does, and records each frame with its session."""

    def __init__(self) -> None:
        self.frames: list[tuple[Session, dict]] = []
        self.data: list[bytes | None] = []  # what each call was given
        self.kinds: list[type] = []  # and its type
        self.on_frame = lambda session, frame: None
        self._waits: list[tuple[int, trio.Event]] = []

    def __call__(self, session: Session, decoder: FrameDecoder, data: bytes | None) -> Turn:
        self.data.append(None if data is None else bytes(data))
        self.kinds.append(type(data))
        if data is not None:
            decoder.receive_data(data)
        for _ in range(TURN_FRAMES):
            if session.paused:
                return Turn.DONE
            frame = decoder.next_frame()
            if frame is NEED_DATA:
                return Turn.DONE
            if frame is CLOSED:
                return Turn.ENDED
            assert isinstance(frame, dict)
            self.frames.append((session, frame))
            self.on_frame(session, frame)
            for count, event in self._waits:
                if len(self.frames) >= count:
                    event.set()
        return Turn.MORE

    async def until(self, count: int) -> None:
        """Wait until ``count`` frames have been handled in all."""
        if len(self.frames) >= count:
            return
        event = trio.Event()
        self._waits.append((count, event))
        with trio.fail_after(10):
            await event.wait()

    def seqs(self, session=None) -> list[int]:
        return [f["n"] for s, f in self.frames if session is None or s is session]


def frame(n: int, pad: int = 0) -> bytes:
    return encode_frame({"op": "test", "n": n, "pad": b"x" * pad}, MAX_FRAME, large=pad >= LARGE)


class Polling:
    """A running poller, its handler, and the nursery its tasks run in."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.handler = Handler()
        self.poller = Poller(self.handler, MAX_FRAME)
        self.nursery = nursery

    def start(self, session: Session) -> trio.Event:
        """Read ``session`` in a task of its own; the event is set when ``read`` returns."""
        ended = trio.Event()

        async def read():
            await self.poller.read(session)
            ended.set()

        self.nursery.start_soon(read)
        return ended


@pytest.fixture
async def polling():
    """The poller running in the test's trio run; its tasks cancelled and its epoll
    closed after the test."""
    async with trio.open_nursery() as nursery:
        p = Polling(nursery)
        nursery.start_soon(p.poller.run)
        yield p
        nursery.cancel_scope.cancel()
    p.poller.close()


async def test_several_frames_in_one_read_reach_the_handler_whole_and_in_order(
        polling, connected, journal):
    """Five frames written at once are handed over as five frames, in the order sent."""
    handler = polling.handler
    session, client = connected(journal)
    polling.start(session)
    client.sendall(b"".join(frame(n) for n in range(5)))
    await handler.until(5)
    assert handler.seqs() == [0, 1, 2, 3, 4]
    assert all(s is session for s, _ in handler.frames)


async def test_small_reads_are_received_into_the_pollers_one_buffer(
        polling, connected, journal):
    """A read that is not a large frame's is received into a buffer the poller keeps and
    handed on as a copy of what it got (a bytearray), not as a fresh 256 KiB bytes a
    read; the next read, into the same buffer, leaves the frames before it whole."""
    handler = polling.handler
    session, client = connected(journal)
    polling.start(session)
    client.sendall(frame(1, pad=300))
    await handler.until(1)
    client.sendall(frame(2, pad=200) + frame(3)[:5])
    await handler.until(2)
    client.sendall(frame(3)[5:])
    await handler.until(3)
    assert handler.seqs() == [1, 2, 3] and handler.frames[0][1]["pad"] == b"x" * 300
    assert handler.kinds == [bytearray] * 3


async def test_a_frame_split_across_reads_reaches_the_handler_once_whole(
        polling, connected, journal):
    """A frame cut into pieces, with the next frame's start in the last one, is handled
    only when whole: nothing for the first pieces, then each frame once, in order."""
    handler = polling.handler
    session, client = connected(journal)
    polling.start(session)
    first, second = frame(1, pad=100), frame(2)
    cuts = [first[:3], first[3:50], first[50:] + second[:2], second[2:]]
    for piece in cuts[:2]:
        client.sendall(piece)
        await trio.testing.wait_all_tasks_blocked()
    assert handler.frames == []
    assert b"".join(d for d in handler.data if d) == cuts[0] + cuts[1]  # every byte handed on
    client.sendall(cuts[2])
    await handler.until(1)
    client.sendall(cuts[3])
    await handler.until(2)
    assert handler.seqs() == [1, 2]
    assert handler.frames[0][1]["pad"] == b"x" * 100


async def test_a_large_frame_split_across_reads_is_received_into_the_decoder(
        polling, connected, journal):
    """The rest of a large frame goes straight into the decoder's room (the handler is
    called with None) and still arrives whole."""
    handler = polling.handler
    session, client = connected(journal)
    polling.start(session)
    big = frame(7, pad=4 * LARGE)
    client.sendall(big[:1000])
    await trio.testing.wait_all_tasks_blocked()
    assert handler.frames == []

    async def rest():  # more than the socket buffer holds: a blocking send in a thread
        client.setblocking(True)
        await trio.to_thread.run_sync(client.sendall, big[1000:])

    async with trio.open_nursery() as sending:
        sending.start_soon(rest)
        await handler.until(1)
    assert handler.frames[0][1]["pad"] == b"x" * 4 * LARGE
    assert None in handler.data


async def test_a_closed_peer_ends_the_read_after_its_last_frames(polling, connected, journal):
    """Frames sent before the close are handled; the close is handed on as b"" and the
    connection's ``read`` returns."""
    handler = polling.handler
    session, client = connected(journal)
    ended = polling.start(session)
    client.sendall(frame(1) + frame(2))
    client.shutdown(socket.SHUT_WR)
    with trio.fail_after(10):
        await ended.wait()
    assert handler.seqs() == [1, 2]
    assert handler.data[-1] == b""


async def test_a_closed_peer_leaves_the_other_connections_read(polling, connected, journal):
    """One connection's end is its own: another's frames are still handled after it."""
    handler = polling.handler
    gone, gone_client = connected(journal)
    stays, stays_client = connected(journal)
    gone_ended = polling.start(gone)
    stays_ended = polling.start(stays)
    gone_client.shutdown(socket.SHUT_WR)
    with trio.fail_after(10):
        await gone_ended.wait()
    stays_client.sendall(frame(3))
    await handler.until(1)
    assert handler.frames == [(stays, handler.frames[0][1])]
    assert not stays_ended.is_set()


async def test_pipelining_connections_take_turns_of_turn_frames(polling, connected, journal):
    """Two connections each sending many frames at once are handled TURN_FRAMES at a time
    in alternation, not one connection's whole read before the other's."""
    handler = polling.handler
    a, a_client = connected(journal)
    b, b_client = connected(journal)
    count = 3 * TURN_FRAMES + 2
    polling.start(a)
    polling.start(b)
    await trio.testing.wait_all_tasks_blocked()  # both in the epoll, nothing to read yet
    a_client.sendall(b"".join(frame(n) for n in range(count)))  # no yield between the two
    b_client.sendall(b"".join(frame(n) for n in range(count)))
    await handler.until(2 * count)
    runs: list[tuple[Session, int]] = []  # (session, frames in a row)
    for s, _ in handler.frames:
        if runs and runs[-1][0] is s:
            runs[-1] = (s, runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    assert all(n <= TURN_FRAMES for _, n in runs)
    assert len(runs) >= 2 * (count // TURN_FRAMES)
    assert handler.seqs(a) == list(range(count)) == handler.seqs(b)


async def paused(polling, connected, journal):
    """A session read by the poller that has paused with two requests received beyond
    the pause: each of its first ``pause_frames`` requests defers its reply until the
    returned event is set, as a client's waiting reads do. (session, client's end,
    the event, pause_frames)."""
    session, client = connected(journal)
    session.waits = polling.nursery
    release = trio.Event()

    async def later():
        await release.wait()

    polling.handler.on_frame = lambda s, f: s.defer(later)
    polling.start(session)
    pause_at = session.pause_frames
    client.sendall(b"".join(frame(n) for n in range(pause_at + 2)))
    await polling.handler.until(pause_at)
    await trio.testing.wait_all_tasks_blocked()
    polling.handler.on_frame = lambda s, f: None
    return session, client, release, pause_at


async def test_a_paused_session_is_read_no_more_until_it_resumes(polling, connected, journal):
    """Once the session pauses the poller stops handing its requests on, those already
    received and those arriving meanwhile; when it resumes they are all handled."""
    handler = polling.handler
    session, client, release, pause_at = await paused(polling, connected, journal)
    assert session.paused
    client.sendall(frame(pause_at + 2))
    await trio.testing.wait_all_tasks_blocked()
    assert handler.seqs() == list(range(pause_at))  # nothing read while paused
    release.set()
    await handler.until(pause_at + 3)
    assert handler.seqs() == list(range(pause_at + 3))
    assert not session.paused


async def test_requests_received_before_a_pause_get_a_turn_when_it_resumes(
        polling, connected, journal):
    """Requests left in the decoder at the pause are handled when the session resumes,
    though no more bytes arrive to wake the poller; later frames are read again."""
    handler = polling.handler
    _, client, release, pause_at = await paused(polling, connected, journal)
    assert handler.seqs() == list(range(pause_at))
    release.set()
    await handler.until(pause_at + 2)
    assert handler.data[-1] is None  # a turn for what was received, not a read
    client.sendall(frame(pause_at + 2))
    await handler.until(pause_at + 3)
    assert handler.seqs() == list(range(pause_at + 3))


class Writes:
    """The journal's side of a pass, recorded: each frame handled, and each pass's end,
    which is a flush when a frame made one due."""

    def __init__(self) -> None:
        self.log: list = []
        self.due = False

    def defer_writes(self) -> None:
        pass

    def write_deferred(self) -> None:
        pass

    def flush_due(self) -> bool:
        return self.due

    def pass_ended(self) -> None:
        self.log.append("flush" if self.due else "end")
        self.due = False


@pytest.mark.parametrize("due", [True, False])
async def test_a_request_that_arrives_during_a_round_shares_the_flush_it_ends_in(
        connected, journal, due):
    """A request received while a round handles another that made a flush due is handled
    before that flush, in the same pass: its record shares the fsync rather than wait
    for the next (a consumer's delete, sent as its read's reply arrives). With no flush
    due the pass ends at once, as before, and the request comes in the next."""
    writes = Writes()
    handler = Handler()
    poller = Poller(handler, MAX_FRAME, writes)
    a, a_client = connected(journal)
    b, b_client = connected(journal)

    def on_frame(session, f):
        writes.log.append(f["n"])
        if f["n"] == 0:
            writes.due = due
            b_client.sendall(frame(1))  # arrives while the round is under way

    handler.on_frame = on_frame
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        nursery.start_soon(poller.read, a)
        nursery.start_soon(poller.read, b)
        await trio.testing.wait_all_tasks_blocked()
        a_client.sendall(frame(0))
        await handler.until(2)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    poller.close()
    assert writes.log == ([0, 1, "flush"] if due else [0, "end", 1, "end"])
