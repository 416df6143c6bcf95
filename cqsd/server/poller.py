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

A connection whose replies are not being read is paused (session.py): the
poller takes its descriptor out of the epoll, so that its requests wait in
the kernel, and the connection's own task, idle until then, waits for the
session to resume, handles the requests already received, and gives the
descriptor back to the poller.
"""

import select
from collections.abc import Callable

import trio

from cqsproto import FrameDecoder

from .session import Session

MAX_EVENTS = 256
RECEIVE_SIZE = 256 * 1024


class _Connection:
    __slots__ = ("session", "decoder", "ended", "stopped", "polled")

    def __init__(self, session: Session, max_frame: int) -> None:
        self.session = session
        self.decoder = FrameDecoder(max_frame)
        self.ended = False
        self.stopped = trio.Event()  # the poller no longer reads it: paused or ended
        self.polled = False  # registered in the epoll


class Poller:
    available = hasattr(select, "epoll")

    def __init__(self, handle: Callable[[Session, FrameDecoder, bytes | None], bool],
                 max_frame: int) -> None:
        """``handle(session, decoder, data)`` dispatches the requests in ``data`` (None:
        those already received); False when the connection has ended (closed, a
        protocol error, deregistered)."""
        self._epoll = select.epoll()
        self._connections: dict[int, _Connection] = {}
        self._handle = handle
        self._max_frame = max_frame

    async def read(self, session: Session) -> None:
        """Hand ``session``'s requests to ``handle`` until its connection ends (or
        this is cancelled)."""
        fd = session.raw.fileno()
        connection = _Connection(session, self._max_frame)
        self._connections[fd] = connection
        try:
            while True:
                if not session.paused:
                    self._epoll.register(fd, select.EPOLLIN)
                    connection.polled = True
                    await connection.stopped.wait()
                    if connection.ended:
                        return
                    connection.stopped = trio.Event()
                await session.resumed()
                if not self._handle(session, connection.decoder, None):
                    return
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
                elif session.paused:
                    self._stop(fd, connection)
            await trio.lowlevel.checkpoint()  # the flusher and other tasks run here

    def _stop(self, fd: int, connection: _Connection) -> None:
        """Read ``fd`` no more; its connection's task takes over."""
        if connection.polled:
            connection.polled = False
            self._epoll.unregister(fd)
        connection.stopped.set()

    def _forget(self, fd: int) -> None:
        connection = self._connections.pop(fd, None)
        if connection is not None:
            connection.ended = True
            self._stop(fd, connection)

    def close(self) -> None:
        self._epoll.close()
