"""One task that reads every plain-socket connection.

Design note. A reader task per connection cost each request a Trio scheduler
round, a re-arm of Trio's one-shot epoll registration, and a ``recv`` that
found nothing before the task could wait again. The poller keeps its own
level-triggered epoll with every plain connection registered once; when it
reports work, one pass gives each ready connection one ``recv`` and handles
the requests in it, then yields, so that the flusher's next fsync covers the
whole pass (group commit, the way Redis's event loop batches its AOF fsync).
One ``recv`` per connection per pass keeps a client whose requests keep coming
taking turns with the others. The poller's epoll is itself a file Trio can
wait on, so the poller sleeps like any other task when nothing arrives.
TLS connections, whose bytes Trio's stream must decrypt, keep a reader task,
as every connection does where there is no epoll (macOS).
"""

import select
from collections.abc import Callable

import trio

from cqsproto import FrameDecoder

from .session import Session

MAX_EVENTS = 256
RECEIVE_SIZE = 256 * 1024


class _Connection:
    __slots__ = ("session", "decoder", "ended")

    def __init__(self, session: Session, max_frame: int) -> None:
        self.session = session
        self.decoder = FrameDecoder(max_frame)
        self.ended = trio.Event()


class Poller:
    available = hasattr(select, "epoll")

    def __init__(self, handle: Callable[[Session, FrameDecoder, bytes], bool],
                 max_frame: int) -> None:
        """``handle(session, decoder, data)`` dispatches the requests in ``data``;
        False when the connection has ended (closed, a protocol error, deregistered)."""
        self._epoll = select.epoll()
        self._connections: dict[int, _Connection] = {}
        self._handle = handle
        self._max_frame = max_frame

    async def read(self, session: Session) -> None:
        """Hand ``session``'s requests to ``handle`` until its connection ends (or
        this is cancelled)."""
        fd = session.raw.fileno()
        connection = _Connection(session, self._max_frame)
        self._epoll.register(fd, select.EPOLLIN)
        self._connections[fd] = connection
        try:
            await connection.ended.wait()
        finally:
            self._forget(fd)

    async def run(self) -> None:
        epoll, connections, handle = self._epoll, self._connections, self._handle
        while True:
            events = epoll.poll(0, MAX_EVENTS)
            if not events:
                await trio.lowlevel.wait_readable(epoll)
                continue
            for fd, _ in events:
                connection = connections.get(fd)
                if connection is None:
                    continue
                session = connection.session
                try:
                    data = session.raw.recv(RECEIVE_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not handle(session, connection.decoder, data):
                    self._forget(fd)
            await trio.lowlevel.checkpoint()  # the flusher and other tasks run here

    def _forget(self, fd: int) -> None:
        connection = self._connections.pop(fd, None)
        if connection is not None:
            self._epoll.unregister(fd)
            connection.ended.set()

    def close(self) -> None:
        self._epoll.close()
