"""A stopping daemon's connections: drained, then cut (on the mock clock)."""

import pytest
import trio

from cqsd.server.connections import DRAIN_TIMEOUT, Connections
from cqsd.server.waiters import ReadWaiters

from .conftest import MAX_FRAME, unsocketed


async def test_the_drain_cuts_what_is_left_and_passes_over_a_tls_handshake_not_yet_done(
        journal, autojump_clock):
    """A TLS connection's session is counted before its handshake, with no cancel
    scope yet: when DRAIN_TIMEOUT ends, the drain cuts the running connections and
    lets that one be (its handshake_timeout ends it), instead of failing the stop."""
    running, handshaking = unsocketed(journal), unsocketed(journal)
    running.scope = trio.CancelScope()
    connections = Connections(None, journal, MAX_FRAME, MAX_FRAME, None, None,
                              {running, handshaking}, ReadWaiters(MAX_FRAME))
    try:
        started = trio.current_time()
        await connections.drain()
    finally:
        if connections.poller is not None:
            connections.poller.close()
    assert trio.current_time() - started == pytest.approx(DRAIN_TIMEOUT)
    assert running.scope.cancel_called and handshaking.scope is None
    assert connections.closing
