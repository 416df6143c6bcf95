"""One blocking, thread-safe, pipelining connection to the daemon, without a reader thread.

Design note
-----------
Any number of threads may have requests in flight on one connection. A thread
sends its frame (under the send lock, so frames never interleave) and then
waits for the reply carrying its id. Instead of a background reader thread,
which would add two thread switches to every round trip, the waiting threads
take turns reading (the leader/follower pattern): under the condition lock a
thread looks in ``_replies`` for its reply; if it is not there and nobody is
reading, it becomes the leader, reads one chunk from the socket *without* the
lock, files every frame in it (replies by id into ``_replies``, notifications
into ``_notes``), gives up the lead and wakes the others. Followers sleep on
the condition. A single-threaded caller therefore pays one send, one receive
and three uncontended lock acquisitions per round trip, and allocates nothing
but its frame and its reply.

``next_notification`` follows the same scheme, reading with a deadline (a
poll on the socket) so that it can stop when no notification comes.

When the connection drops, every thread waiting or arriving afterwards gets a
fresh :class:`ConnectionLost` naming the address: nobody can tell whether the
server acted on a request whose reply never came, so nothing is retried.

TLS sockets are different: OpenSSL does not allow one SSL object to be read
and written by two threads at once, so the TLS channel works non-blocking
and holds a lock around each SSL call, waiting for readiness outside it.
"""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import threading
import time
from collections import deque
from typing import Any, Final

from cqsproto import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    MAX_FRAME_LIMIT,
    NEED_DATA,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)

from . import ops
from .errors import ConnectionLost, MessageTooLarge
from .model import Notification

__all__ = ["CHUNK", "Connection"]

# Bytes asked of the socket per read: big enough that a 100 MiB reply takes
# some 400 reads, small enough not to hold megabytes for small replies.
CHUNK: Final = 256 * 1024


class _PlainChannel:
    """A connected Unix or TCP socket in blocking mode."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(None)
        # Only the leader reads, so one poll object serves every reading thread.
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def recv(self, timeout: float | None) -> bytes | None:
        """Up to CHUNK bytes, b"" at EOF, None if *timeout* passed first."""
        if timeout is not None and not self._poll.poll(max(0, int(timeout * 1000 + 0.999))):
            return None
        return self.sock.recv(CHUNK)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)


class _TLSChannel:
    """A TLS socket in non-blocking mode, one SSL call at a time (see the design note)."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._ssl_lock = threading.Lock()

    def recv(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._ssl_lock:
                try:
                    return self.sock.recv(CHUNK)
                except ssl.SSLWantReadError:
                    event = select.POLLIN
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            _wait_ready(self.sock, event, remaining)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            with self._ssl_lock:
                try:
                    view = view[self.sock.send(view) :]
                    continue
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
                except ssl.SSLWantReadError:
                    event = select.POLLIN
            _wait_ready(self.sock, event, None)


def _wait_ready(sock: socket.socket, event: int, timeout: float | None) -> None:
    poller = select.poll()
    poller.register(sock, event)
    poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))


class Connection:
    """Sends requests and matches replies by id; see the module's design note."""

    def __init__(self, sock: socket.socket, address: str, timeout: float | None = None) -> None:
        self.address = address
        self._channel: _TLSChannel | _PlainChannel
        if isinstance(sock, ssl.SSLSocket):
            self._channel = _TLSChannel(sock)
        else:
            self._channel = _PlainChannel(sock)
        self._sock = sock
        # The daemon is trusted to frame its replies; a batch read may exceed
        # the request limit, so only the 4-byte prefix bounds what it sends.
        self._decoder = FrameDecoder(MAX_FRAME_LIMIT)
        self.max_frame = DEFAULT_MAX_FRAME
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._replies: dict[int, dict[str, Any]] = {}
        self._notes: deque[Notification] = deque()
        self._reading = False
        self._lost: str | None = None
        self._closed = False
        # Words from the server's id-less error frame, if it sent one before closing.
        self._close_detail: str | None = None
        # While registering, reads give up at this monotonic time.
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def end_handshake(self, max_frame: int) -> None:
        """Registration is over: no more read deadline, and frames up to *max_frame*."""
        self._deadline = None
        self.max_frame = max_frame

    @property
    def lost(self) -> bool:
        """True once the connection has dropped or been closed."""
        return self._lost is not None

    def lost_error(self) -> ConnectionLost:
        """A fresh ConnectionLost saying why (fresh so tracebacks do not pile up)."""
        return ConnectionLost(
            f"connection to {self.address} lost: {self._lost}", address=self.address
        )

    # --- requests ---

    def roundtrip(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send *request* with a fresh id and return the reply frame with that id.

        Raises MessageTooLarge if the frame exceeds max_frame (nothing is sent)
        and ConnectionLost if the connection is or goes down before the reply.
        """
        rid = next(self._ids)
        request["id"] = rid
        try:
            frame = encode_frame(request, self.max_frame)
        except ProtocolError as error:
            raise MessageTooLarge(f"request refused before sending: {error.message}") from None
        if self._lost is not None:
            raise self.lost_error()
        try:
            with self._send_lock:
                self._channel.sendall(frame)
        except OSError as error:
            self._fail(f"send failed: {error}")
            raise self.lost_error() from error
        except BaseException:
            # Interrupted part-way (KeyboardInterrupt): the byte stream has
            # lost its frame boundaries, so the connection cannot go on.
            self._fail("a send was interrupted part-way")
            raise
        return self._await_reply(rid)

    def _await_reply(self, rid: int) -> dict[str, Any]:
        cond = self._cond
        while True:
            with cond:
                while True:
                    reply = self._replies.pop(rid, None)
                    if reply is not None:
                        return reply
                    if self._lost is not None:
                        raise self.lost_error()
                    if not self._reading:
                        self._reading = True
                        break
                    cond.wait()
            self._lead(None if self._deadline is None else self._deadline - time.monotonic())

    # --- notifications ---

    def next_notification(self, timeout: float) -> Notification | None:
        """The next notification, waiting at most *timeout* seconds; None if none came."""
        deadline = time.monotonic() + timeout
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._notes:
                        return self._notes.popleft()
                    if self._lost is not None:
                        raise self.lost_error()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    if not self._reading:
                        self._reading = True
                        break
                    cond.wait(remaining)
            self._lead(remaining)

    # --- reading, as the leader ---

    def _lead(self, timeout: float | None) -> None:
        """Read once (we hold the lead), file what came, hand the lead back."""
        frames: list[dict[str, Any]] = []
        lost: str | None = None
        try:
            try:
                data = self._channel.recv(None if timeout is None else max(timeout, 0.0))
            except OSError as error:
                data, lost = b"", f"receive failed: {error}"
            if data is None:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    lost = "timed out waiting for the server"
            elif lost is None:
                lost = self._decode(data, frames)
        finally:
            with self._cond:
                self._reading = False
                for frame in frames:
                    self._file(frame)
                if lost is not None and self._lost is None:
                    self._lost = self._close_detail or lost
                self._cond.notify_all()
            if self._lost is not None:
                self._release_socket()

    def _decode(self, data: bytes, frames: list[dict[str, Any]]) -> str | None:
        """Decode every whole frame of *data* into *frames*; the loss detail, if any."""
        decoder = self._decoder
        decoder.receive_data(data)
        while True:
            try:
                frame = decoder.next_frame()
            except ProtocolError as error:
                return f"the server sent a bad frame: {error}"
            if frame is NEED_DATA:
                return None
            if frame is CLOSED:
                return "the server closed the connection"
            frames.append(frame)

    def _file(self, frame: dict[str, Any]) -> None:
        # Called with the condition lock held.
        rid = frame.get("id")
        if rid is not None:
            self._replies[rid] = frame
        elif "notify" in frame:
            note = ops.notification_from_wire(frame)
            if note is not None:
                self._notes.append(note)
        elif frame.get("ok") is False:
            self._close_detail = ops.unexpected_close_detail(frame)

    # --- loss and closing ---

    def expect_close(self, detail: str) -> None:
        """The server will close the connection (deregister): say *detail* when it does."""
        self._close_detail = detail

    def _fail(self, detail: str) -> None:
        with self._cond:
            if self._lost is None:
                self._lost = detail
            self._cond.notify_all()
        self._release_socket()

    def close(self) -> None:
        """Close the connection; requests in flight get ConnectionLost. Idempotent."""
        with self._cond:
            if self._lost is None:
                self._lost = self._close_detail or "closed by this client"
            self._cond.notify_all()
        self._release_socket()

    def _release_socket(self) -> None:
        # shutdown() wakes a leader blocked in recv and a sender blocked in
        # sendall; the descriptor itself is closed only when no thread can be
        # using it, because a closed number may be reused by another socket.
        if self._closed:
            return
        try:
            # The plain socket's shutdown, also for TLS: SSLSocket.shutdown
            # would drop the SSL object under a thread that is using it.
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass
        with self._send_lock, self._cond:
            if self._closed or self._reading:
                return  # the leader calls us again on its way out
            self._closed = True
        self._sock.close()
