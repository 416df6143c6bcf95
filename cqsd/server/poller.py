"""One task that reads every plain-socket connection.

Design note. A reader task per connection cost each request a Trio scheduler
round, a re-arm of Trio's one-shot epoll registration, and a ``recv`` that
found nothing before the task could wait again. The poller keeps its own
level-triggered epoll with every plain connection registered once; when it
reports work, one pass gives each ready connection one ``recv`` and handles
the requests in it, then yields, so that the flusher's next fsync covers the
whole pass (group commit, the way Redis's event loop batches its AOF fsync).
A pass that will end in a flush looks at the epoll once more first, and takes
what arrived during its rounds (a consumer's delete, sent as its read's reply
reached it) into the same flush: with 4 producers and 4 consumers each flush
then covers more records, and the daemon spent 3-12% less CPU a message
(benchmarks/README.md, "A pass looks again before its flush").
One ``recv`` per connection per pass keeps a client whose requests keep coming
taking turns with the others. Within a pass, a connection's requests are
handled TURN_FRAMES at a time, taking turns with the other connections
(polled again between rounds of turns, without yielding, so the pass still
ends in one fsync), so that another client's request waits for a turn of a
pipelining client's requests, not for a whole ``recv`` of them (~3,000 small
requests, ~60 ms). The poller's epoll is itself
a file Trio can wait on, so the poller sleeps like any other task when nothing
arrives; but while Trio has nothing else to run, the poller neither yields at
a pass's end nor waits through Trio's run loop: it waits on an epoll of its
own that holds Trio's too (idle.py).
TLS connections, whose bytes Trio's stream must decrypt, keep a reader task,
as every connection does where there is no epoll (macOS).

A connection whose replies are not being read is paused (session.py): the
poller takes its descriptor out of the epoll, so that its requests wait in
the kernel, and the connection's own task, idle until then, waits for the
session to resume and gives the descriptor back to the poller, with a turn
for the requests already received (an eventfd wakes the poller for it).
"""

import enum
import os
import select
from collections.abc import Callable
from typing import ClassVar, Protocol

import trio

from cqsproto import FrameDecoder

from .idle import TrioIdle
from .session import Session

MAX_EVENTS = 256
RECEIVE_SIZE = 256 * 1024
# Requests of one connection handled before the next connection's turn: ~0.2-0.3
# ms of small requests, against a quiet round trip of ~0.1-0.2 ms. Measured with
# benchmarks/abuse.py (pipeline10k) and a lone pipelining client: 8 gave other
# clients a p99 of 0.4 ms against 1-4 ms with 24 and 60-70 ms with no turns, and
# cost the lone pipeliner 5-8% of its rate (24: 2-3%).
TURN_FRAMES = 8
# A TLS reader's turn, between which it yields to every other task, the flusher
# included: about what a TLS record (16 KiB) holds of small requests, as before
# turns, so that a TLS pipeline keeps its group commit (with 8, its rate fell by
# a quarter).
TLS_TURN_FRAMES = 256
# Rounds of turns before the poller yields to other tasks even with requests
# left: up to ~770 requests for one fsync (group commit), ~15 ms at most.
PASS_ROUNDS = 96


class Turn(enum.IntEnum):
    """What ``handle`` did with a connection's turn."""

    ENDED = 0  # the connection is over (falsy)
    DONE = 1  # every whole request received is handled, or the session paused
    MORE = 2  # TURN_FRAMES requests handled, and more may be waiting


class DeferredWrites(Protocol):
    """What the poller tells the journal: a round begins, a round has ended, the
    pass of rounds has ended."""

    def defer_writes(self) -> None: ...

    def write_deferred(self) -> None: ...

    def pass_ended(self) -> None: ...

    def flush_due(self) -> bool: ...


class _NoWrites:
    def defer_writes(self) -> None:
        pass

    def write_deferred(self) -> None:
        pass

    def pass_ended(self) -> None:
        pass

    def flush_due(self) -> bool:
        return False


class _Connection:
    __slots__ = ("backlogged", "decoder", "ended", "polled", "session", "stopped")

    def __init__(self, session: Session, max_frame: int) -> None:
        self.session = session
        self.decoder = FrameDecoder(max_frame)
        self.ended = False
        self.stopped = trio.Event()  # the poller no longer reads it: paused or ended
        self.polled = False  # registered in the epoll
        self.backlogged = False  # its decoder may hold requests for another turn


class Poller:
    available: ClassVar[bool] = hasattr(select, "epoll")

    def __init__(self, handle: Callable[[Session, FrameDecoder, bytes | bytearray | None], Turn],
                 max_frame: int, writes: DeferredWrites | None = None) -> None:
        """``handle(session, decoder, data)`` dispatches up to TURN_FRAMES of the
        requests in ``data`` (None: those already received) and says whether more may
        be waiting or the connection has ended (closed, a protocol error, deregistered).
        ``writes`` (the journal) writes each round's lock records at its end."""
        self._writes: DeferredWrites = writes if writes is not None else _NoWrites()
        self._epoll = select.epoll()
        self._connections: dict[int, _Connection] = {}
        self._backlog: list[tuple[int, _Connection]] = []  # connections with requests for a turn
        self._wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wakeup, select.EPOLLIN)
        self._handle = handle
        self._max_frame = max_frame
        self._trio: TrioIdle | None = None  # the poller waits in Trio's stead (idle.py)
        self._chunk = bytearray(RECEIVE_SIZE)  # what a read that is not a large frame's fills

    async def read(self, session: Session) -> None:
        """Hand ``session``'s requests to ``handle`` until its connection ends (or
        this is cancelled)."""
        assert session.raw is not None  # the poller reads plain sockets (Connections._run)
        fd = session.raw.fileno()
        connection = _Connection(session, self._max_frame)
        self._connections[fd] = connection
        try:
            while True:
                self._epoll.register(fd, select.EPOLLIN)
                connection.polled = True
                await connection.stopped.wait()
                if connection.ended:
                    return
                connection.stopped = trio.Event()
                await session.resumed()
                connection.backlogged = True  # what it received before the pause comes first
                self._backlog.append((fd, connection))
                os.eventfd_write(self._wakeup, 1)
        finally:
            self._forget(fd)

    async def run(self) -> None:
        epoll = self._epoll
        self._trio = await TrioIdle.attach(epoll.fileno())
        rounds = 0
        events: list[tuple[int, int]] = []
        try:
            while True:
                if not events:
                    events = epoll.poll(0, MAX_EVENTS)
                if not events and not self._backlog:
                    rounds = 0
                    await self._wait()
                    continue
                self._writes.defer_writes()
                try:
                    self._round(events)
                finally:
                    self._writes.write_deferred()
                events = []
                rounds += 1
                if self._backlog and rounds < PASS_ROUNDS:
                    continue
                if rounds < PASS_ROUNDS and self._writes.flush_due():
                    # requests that arrived during the round share the flush it ends in
                    # rather than wait for it: a round's read replies bring deletes back
                    events = epoll.poll(0, MAX_EVENTS)
                    if events:
                        continue
                rounds = 0
                self._writes.pass_ended()
                # what arrived during the pass and its flush is the next pass's first
                # round: level-triggered, still there after the yield (a descriptor
                # closed meanwhile is not among the connections, one paused not
                # polled: _round)
                events = epoll.poll(0, MAX_EVENTS)
                if not self._backlog and not events:
                    await self._wait()
                elif self._trio is None or self._trio.due():
                    await trio.lowlevel.checkpoint()  # the flusher and other tasks run here
        finally:
            if self._trio is not None:
                self._trio.close()

    async def _wait(self) -> None:
        """Wait for requests: on the poller's own while Trio has nothing to run
        (idle.py), else through Trio, whose other tasks run while it waits (one trip
        through the scheduler, not a checkpoint and then a wait)."""
        if self._trio is not None:
            timeout = self._trio.sleep_allowed()
            if timeout > 0:
                if not self._trio.wait(timeout):
                    await trio.lowlevel.checkpoint()  # Trio's turn (or a deadline's)
                return
        await trio.lowlevel.wait_readable(self._epoll)

    def _round(self, events: list[tuple[int, int]]) -> None:
        """A turn for each connection in the backlog, then for each with events."""
        connections = self._connections
        turns, self._backlog = self._backlog, []
        for fd, turn in turns:
            if not turn.ended:
                self._turn(fd, turn, None)
        for fd, _ in events:
            connection = connections.get(fd)
            if connection is None:
                if fd == self._wakeup:
                    os.eventfd_read(self._wakeup)  # a resumed connection is in the backlog
                continue
            if connection.backlogged or not connection.polled:
                continue  # backlogged: nothing more until it is done; unpolled: paused
            if connection.session.paused:  # by frames another request queued for it
                self._stop(fd, connection)
                continue
            try:
                data = self._receive(connection)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            self._turn(fd, connection, data)

    def _receive(self, connection: _Connection) -> bytes | bytearray | None:
        """One ``recv``: its bytes, or None when they went straight into the room the
        decoder keeps for the rest of a large frame (b"" at the end).

        Other reads land in the poller's one buffer (``handle`` copies them into the
        decoder before the next): ``recv(RECEIVE_SIZE)`` made, mapped and unmapped a
        256 KiB bytes a read, ~17 us of a 100-byte request's ~20 (recv_into: ~4)."""
        raw = connection.session.raw
        assert raw is not None  # closed only once read() has ended, and so forgotten it
        room = connection.decoder.room()
        if room is None:
            got = raw.recv_into(self._chunk)
            return self._chunk[:got] if got else b""
        with room:
            got = raw.recv_into(room)
        if not got:
            return b""
        connection.decoder.received(got)
        return None

    def _turn(self, fd: int, connection: _Connection, data: bytes | bytearray | None) -> None:
        turn = self._handle(connection.session, connection.decoder, data)
        connection.backlogged = False
        if not turn:
            self._forget(fd)
        elif connection.session.paused:
            self._stop(fd, connection)
        elif turn is Turn.MORE:
            connection.backlogged = True
            self._backlog.append((fd, connection))

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
        os.close(self._wakeup)
