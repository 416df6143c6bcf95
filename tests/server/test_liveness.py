"""A peer that does not do its part is let go: one that never registers, one
whose request frame stalls, one that reads none of its replies (on the mock
clock, over memory streams)."""

import pytest
import trio
import trio.testing

from cqsd.server.liveness import overdue, send_or_stall
from cqsd.server.session import SEND_BATCH

from .conftest import unsocketed

HANDSHAKE, FRAME, SEND = 10.0, 30.0, 20.0  # seconds


async def test_a_peer_that_never_registers_is_overdue_after_the_handshake_timeout(
        journal, autojump_clock):
    """An unregistered session is "handshake" overdue handshake_timeout after it began."""
    session, start = unsocketed(journal), trio.current_time()
    assert await overdue(session, HANDSHAKE, FRAME) == "handshake"
    assert trio.current_time() - start == pytest.approx(HANDSHAKE)


async def test_a_stalled_request_frame_is_overdue_after_the_frame_timeout(
        journal, autojump_clock):
    """A registered session whose frame began arriving and never finished is "frame"
    overdue frame_timeout after it began."""
    session = unsocketed(journal)
    session.client = "A"
    session.partial_since = began = trio.current_time()
    assert await overdue(session, HANDSHAKE, FRAME) == "frame"
    assert trio.current_time() - began == pytest.approx(FRAME)


async def test_an_idle_registered_peer_or_a_paused_one_is_never_overdue(
        journal, autojump_clock):
    """No frame arriving, or a frame that waits because the daemon paused reading,
    keeps no deadline."""
    idle, paused = unsocketed(journal), unsocketed(journal)
    idle.client = paused.client = "A"
    paused.partial_since, paused.paused = trio.current_time(), True
    for session in (idle, paused):
        with trio.move_on_after(100 * FRAME) as waited:
            await overdue(session, HANDSHAKE, FRAME)
        assert waited.cancelled_caught


async def test_a_send_the_peer_takes_returns_true():
    """Replies a reader takes go out whole, batch by batch."""
    sender, receiver = trio.testing.memory_stream_pair()
    data = bytes(range(256)) * (3 * SEND_BATCH // 256 + 1)
    got = bytearray()

    async def read():
        while len(got) < len(data):
            got.extend(await receiver.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        assert await send_or_stall(sender, data, SEND)
    assert got == data


async def test_a_peer_that_reads_nothing_stalls_the_send_for_the_send_timeout(autojump_clock):
    """A send the peer takes none of gives up after send_timeout, batch or not."""
    for size in (100, 3 * SEND_BATCH):
        sender, _ = trio.testing.lockstep_stream_pair()  # each byte waits for a reader
        start = trio.current_time()
        assert not await send_or_stall(sender, b"x" * size, SEND)
        assert trio.current_time() - start == pytest.approx(SEND)
