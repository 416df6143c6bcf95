"""What the in-process tests of the server's pieces share: a real journal on a
temporary directory (real files, real fsync), a session whose raw socket is one
end of a socket pair, and the frames the other end, the client's, received."""

import socket
from typing import Any

import pytest

from cqsd.server.journal import Journal
from cqsd.server.session import Session
from cqsproto import NEED_DATA, FrameDecoder

SEGMENT = 1024 * 1024  # a small segment: preallocating it is quick
SEND_QUEUE = 16  # the least the configuration allows: reading pauses at 4 frames
SEND_QUEUE_BYTES = 64 * 1024 * 1024  # the default
MAX_FRAME = 1024 * 1024
RECORD = {"s": "S", "e": [("D", 1)]}  # a record whose reply would wait for it


@pytest.fixture
def journal(tmp_path):
    """A journal on a fresh log directory; closed after the test."""
    j = Journal(tmp_path / "log", SEGMENT)
    yield j
    j.close()


class Opened:
    """What a test opened that must be closed after it (a data directory, a journal)."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def close_after(self, thing: Any) -> Any:
        """``thing``, closed after the test."""
        self.made.append(thing)
        return thing


@pytest.fixture
def opened():
    """Yields an ``Opened``; closes what it holds, newest first, after the test."""
    o = Opened()
    yield o
    for thing in reversed(o.made):
        thing.close()


@pytest.fixture
def connected():
    """Make sessions whose frames go out on a socket pair; yields the maker, which
    returns (session, the client's end), and closes every socket after the test."""
    sockets = []

    def make(journal, **kw):
        daemon_end, client = socket.socketpair()
        daemon_end.setblocking(False)  # as the daemon's duplicate of a trio socket is
        client.setblocking(False)
        sockets.extend((daemon_end, client))
        session = unsocketed(journal, **kw)
        session.raw = daemon_end
        return session, client

    yield make
    for s in sockets:
        s.close()


def received(client: socket.socket) -> list[dict]:
    """Every whole frame waiting on the client's end of the pair."""
    decoder = FrameDecoder(MAX_FRAME)
    while True:
        try:
            data = client.recv(1 << 20)
        except BlockingIOError:
            break
        if not data:
            break
        decoder.receive_data(data)
    frames = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        frames.append(frame)
    assert not decoder.buffered, "a frame arrived in part"
    return frames


def unsocketed(journal, **kw) -> Session:
    """A session without a raw socket, as over TLS: every frame waits in its queue
    for the connection's writer task."""
    return Session("test", False, kw.pop("send_queue", SEND_QUEUE), MAX_FRAME, journal,
                   kw.pop("send_queue_bytes", SEND_QUEUE_BYTES), **kw)
