"""A session's send queue paces its connection: reading pauses at a quarter of
either limit, resumes at an eighth, and only the hard limits cut a client off."""

import trio

from cqsd.server.session import Session

KiB = 1024


class Journal:
    """The journal as a session sees it: nothing is durable past LSN 0."""

    durable = 0
    failed = None

    def hold(self, session) -> None:
        pass


def session(frames: int = 64, size: int = 1024 * KiB) -> Session:
    """A session with no socket: every frame queues, as for a client that reads nothing."""
    return Session("peer", False, frames, 1 << 20, Journal(), size)


def test_reading_pauses_at_a_quarter_of_send_queue_and_resumes_at_an_eighth():
    """With send_queue 64, reading pauses at 16 queued frames and resumes at 8."""
    s = session(frames=64)
    for _ in range(4):
        s.send_bytes(b"now")  # may go at once
    for _ in range(11):
        s.send_bytes(b"later", lsn=5)  # waits for the log
    assert not s.paused
    s.send_bytes(b"later", lsn=5)
    assert s.paused
    s.take(0)  # the 4 that may go: 12 left, more than 8
    s.sent()
    assert s.paused
    s.take(5)
    s.sent()
    assert not s.paused and s.unsent == 0


def test_reading_pauses_at_a_quarter_of_send_queue_bytes():
    """With send_queue_bytes 1 MiB, four 64 KiB frames pause reading."""
    s = session(size=1024 * KiB)
    for _ in range(3):
        s.send_bytes(b"x" * 64 * KiB)
    assert not s.paused and s.unsent == 192 * KiB
    s.send_bytes(b"x" * 64 * KiB)
    assert s.paused


def test_only_the_hard_limits_cut_a_client_off():
    """Frames past send_queue, or past send_queue_bytes, cut the client off; one
    frame larger than the byte limit still queues when little is waiting."""
    by_frames = session(frames=16)
    for _ in range(16):
        by_frames.send_bytes(b"n")
    assert by_frames.paused and not by_frames.cut_off
    by_frames.send_bytes(b"n")
    assert by_frames.cut_off and not by_frames.queue and by_frames.unsent == 0
    by_bytes = session(size=1024 * KiB)
    by_bytes.send_bytes(b"x" * 2048 * KiB)
    assert not by_bytes.cut_off
    by_bytes.send_bytes(b"n")
    assert by_bytes.cut_off and by_bytes.paused  # none of its requests is taken any more


def test_requests_waiting_to_reply_count_towards_pausing():
    """A quarter of send_queue deferred requests (waiting reads) pauses reading, and
    it resumes as soon as one of them replies, whose reply then waits to be read."""
    async def main():
        s = session(frames=64)
        done = [trio.Event() for _ in range(16)]

        async def wait_read(event: trio.Event) -> None:
            await event.wait()
            s.send_bytes(b"reply")

        async with trio.open_nursery() as s.waits:
            for event in done[:15]:
                s.defer(wait_read, event)
            assert not s.paused
            s.defer(wait_read, done[15])
            assert s.paused
            done[0].set()
            await s.resumed()
            assert len(s.queue) == 1 and s.deferred == 15
            for event in done[1:]:
                event.set()

    trio.run(main)
