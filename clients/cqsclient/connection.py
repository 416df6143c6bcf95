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
server acted on a request whose reply never came, so nothing is retried here
(``applied`` says False for a request that never went whole).

Timeouts. Each request may have a deadline: its send (waiting for the send
lock, then the socket) and its wait for the reply both end there, raising
:class:`RequestTimeout`. A request that gives up (a timeout, an interrupt, a
``cancelled()`` that turned true) is *abandoned*: its reply, when it comes, is
dropped, and if it was a read the messages it locked are given back by plain
unlocks queued in ``_giveback``: the reading thread that got the late reply
sends them if the socket takes them at once (a non-blocking send, never a
wait: a reader must not block on a send), and whatever is left goes ahead of
the next request's frame. ``poke()``
wakes the threads waiting on this connection so that they look at their
``cancelled()`` again; it only writes a byte to a pipe the reader polls, so a
signal handler may call it.

TLS sockets are different: OpenSSL does not allow one SSL object to be read
and written by two threads at once, so the TLS channel works non-blocking
and holds a lock around each SSL call, waiting for readiness outside it.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, TypeVar

from cqsproto import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    MAX_FRAME_LIMIT,
    NEED_DATA,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    encode_frame_parts,
)
from cqsproto.codec import Parts

from . import ops
from .errors import ConnectionLost, MessageTooLarge, RequestTimeout
from .keepalive import PING, SILENT, Keepalive
from .model import Notification
from .replies import Call, notification_from_wire, unexpected_close_detail

__all__ = ["CHUNK", "Abandoned", "Connection"]

T = TypeVar("T")

# Bytes asked of the socket per read: big enough that a 100 MiB reply takes
# some 400 reads, small enough not to hold megabytes for small replies.
CHUNK: Final = 256 * 1024


class Abandoned(Exception):
    """The caller's ``cancelled()`` turned true while its request waited (it was abandoned)."""


class _PlainChannel:
    """A connected Unix or TCP socket in blocking mode."""

    def __init__(self, sock: socket.socket, wakeup: int) -> None:
        self.sock = sock
        sock.settimeout(None)
        # Only the leader reads, so one poll object serves every reading thread.
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._poll.register(wakeup, select.POLLIN)
        self._wakeup = wakeup

    def recv_into(self, room: memoryview, timeout: float | None) -> int | None:
        """Read into *room*: the bytes written there, 0 at EOF, or None if *timeout*
        passed or poke() woke us."""
        ready = self._poll.poll(_millis(timeout))
        if not ready:
            return None
        for fd, _ in ready:
            if fd == self._wakeup:
                _drain(self._wakeup)
                return None
        return self.sock.recv_into(room)

    def send_now(self, data: bytes | memoryview) -> int:
        """Send what the socket takes without waiting; the bytes sent."""
        try:
            return self.sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0

    def send(self, data: bytes | memoryview, deadline: float | None) -> int:
        """Send *data*; the bytes sent, fewer than all only if *deadline* passed."""
        if deadline is None:
            self.sock.sendall(data)
            return len(data)
        sent = self.send_now(data)
        if sent == len(data):  # the common case: the kernel took it all
            return sent
        view = memoryview(data)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return sent
            _wait_ready(self.sock, select.POLLOUT, remaining)
            try:
                sent += self.sock.send(view[sent:], socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            if sent == len(view):
                return sent


class _TLSChannel:
    """A TLS socket in non-blocking mode, one SSL call at a time (see the design note)."""

    def __init__(self, sock: ssl.SSLSocket, wakeup: int) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._ssl_lock = threading.Lock()
        self._wakeup = wakeup

    def recv_into(self, room: memoryview, timeout: float | None) -> int | None:
        return self._read(lambda: self.sock.recv_into(room), timeout)

    def _read(self, read: Callable[[], T], timeout: float | None) -> T | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._ssl_lock:
                try:
                    return read()
                except ssl.SSLWantReadError:
                    event = select.POLLIN
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            if _wait_ready(self.sock, event, remaining, self._wakeup):
                return None

    def send_now(self, data: bytes | memoryview) -> int:
        # A TLS record may not be split across calls at will: leave it to send().
        return 0

    def send(self, data: bytes | memoryview, deadline: float | None) -> int:
        view, sent = memoryview(data), 0
        while sent < len(view):
            with self._ssl_lock:
                try:
                    sent += self.sock.send(view[sent:])
                    event = 0
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
                except ssl.SSLWantReadError:
                    event = select.POLLIN
            if not event:
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return sent
            _wait_ready(self.sock, event, remaining)
        return sent


def _millis(timeout: float | None) -> int | None:
    """A poll timeout: milliseconds, at most what poll takes (about 24 days; a
    longer wait simply polls again)."""
    return None if timeout is None else min(max(0, int(timeout * 1000 + 0.999)), POLL_MAX)


POLL_MAX = 2**31 - 1


def _wait_ready(
    sock: socket.socket, event: int, timeout: float | None, wakeup: int | None = None
) -> bool:
    """Wait until *sock* is ready for *event* or *timeout* passes; True if poke() woke us."""
    poller = select.poll()
    poller.register(sock, event)
    if wakeup is not None:
        poller.register(wakeup, select.POLLIN)
    ready = poller.poll(_millis(timeout))
    if wakeup is not None and any(fd == wakeup for fd, _ in ready):
        _drain(wakeup)
        return True
    return False


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class Connection:
    """Sends requests and matches replies by id; see the module's design note."""

    def __init__(self, sock: socket.socket, address: str, keepalive: float | None = None) -> None:
        # Closed only with the connection object (``__del__``), so that a late poke()
        # can never write to a descriptor number reused by something else.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.address = address
        # cqsclient.keepalive: a silent daemon is noticed while something waits
        self._keepalive = Keepalive(keepalive) if keepalive is not None else None
        self._channel: _TLSChannel | _PlainChannel
        if isinstance(sock, ssl.SSLSocket):
            self._channel = _TLSChannel(sock, self._wake_r)
        else:
            self._channel = _PlainChannel(sock, self._wake_r)
        self._sock = sock
        # The daemon is trusted to frame its replies; a batch read may exceed
        # the request limit, so only the 4-byte prefix bounds what it sends.
        self._decoder = FrameDecoder(MAX_FRAME_LIMIT)
        self._chunk = memoryview(bytearray(CHUNK))  # what a read that is not a large frame's fills
        self.max_frame = DEFAULT_MAX_FRAME
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        # The request path enters the condition through its lock: Condition.__enter__
        # and __exit__ are Python calls, three of each a round trip.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._replies: dict[int, dict[str, Any]] = {}
        self._notes: deque[Notification] = deque()
        # Requests whose callers gave up: their replies are dropped when they come,
        # after giving back what a read among them locked (None: nothing to give back).
        self._abandoned: dict[int, Call | None] = {}
        self._giveback: list[bytes] = []  # unlock frames to send ahead of the next request
        self._reading = False
        self._followers = 0  # threads waiting on the condition for the leader's news
        self._lost: str | None = None
        self._closed = False
        # Words from the server's id-less error frame, if it sent one before closing.
        self._close_detail: str | None = None

    def __del__(self) -> None:
        # Not weakref.finalize: the compiled build's classes take no weak reference.
        os.close(self._wake_r)
        os.close(self._wake_w)

    @property
    def lost(self) -> bool:
        """True once the connection has dropped or been closed."""
        return self._lost is not None

    def lost_error(self, applied: bool | None = None) -> ConnectionLost:
        """A fresh ConnectionLost saying why (fresh so tracebacks do not pile up)."""
        return ConnectionLost(
            f"connection to {self.address} lost: {self._lost}",
            address=self.address,
            applied=applied,
        )

    # --- requests ---

    def roundtrip(
        self,
        call: Call,
        timeout: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Send *call*'s request with a fresh id and return the reply frame with that id.

        *timeout* bounds the send and the wait for the reply, beyond the request's
        own server-side ``wait``. Raises MessageTooLarge if the frame exceeds
        max_frame (nothing is sent), RequestTimeout when the deadline passes,
        Abandoned when *cancelled()* turns true (checked when poke() wakes the
        waiters), and ConnectionLost if the connection is or goes down first.
        """
        rid = next(self._ids)
        request = call.request
        request["id"] = rid
        try:  # a large payload is sent from where it is, not joined into the frame
            frame: Parts = (encode_frame_parts(request, self.max_frame) if call.large
                            else [encode_frame(request, self.max_frame)])
        except ProtocolError as error:
            raise MessageTooLarge(f"request refused before sending: {error.message}") from None
        deadline = None if timeout is None else time.monotonic() + timeout + call.wait
        self._send(frame, deadline)
        return self._await_reply(rid, call, deadline, cancelled)

    def _send(self, frame: Parts, deadline: float | None) -> None:
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if self._lost is not None:
            raise self.lost_error(applied=False)
        if not self._send_lock.acquire(True, wait):
            raise RequestTimeout(
                "timed out waiting for other requests' sends; not sent", applied=False
            )
        giveback: list[bytes] = []
        try:
            if self._lost is not None:
                raise self.lost_error(applied=False)
            if self._giveback:  # read unlocked: one that just missed goes with the next
                with self._cond:
                    giveback, self._giveback = self._giveback, []
            data = frame if not giveback else [b"".join([*giveback, frame[0]]), *frame[1:]]
            sent = self._send_parts(data, deadline)
        except OSError as error:
            # Not sent whole, so the daemon cannot have acted on it.
            self._send_lock.release()
            self._fail(f"send failed: {error}")
            raise self.lost_error(applied=False) from error
        except BaseException as error:
            self._send_lock.release()
            if not isinstance(error, ConnectionLost):
                # Interrupted part-way (KeyboardInterrupt): the byte stream has
                # lost its frame boundaries, so the connection cannot go on.
                self._fail("a send was interrupted part-way")
            raise
        self._send_lock.release()
        if sent == sum(len(part) for part in data):
            return
        if sent == 0:
            with self._cond:
                self._giveback[:0] = giveback
            raise RequestTimeout("timed out sending the request; not sent", applied=False)
        self._fail("a send timed out part-way")
        raise RequestTimeout(
            "timed out part-way through sending the request; not sent, and the "
            "connection is closed",
            applied=False,
        )

    def _send_parts(self, parts: Parts, deadline: float | None) -> int:
        """Send the frame's buffers in order; the bytes sent, fewer than all only if
        *deadline* passed."""
        sent = 0
        for part in parts:
            n = self._channel.send(part, deadline)
            sent += n
            if n < len(part):
                break
        return sent

    def _await_reply(
        self,
        rid: int,
        call: Call,
        deadline: float | None,
        cancelled: Callable[[], bool] | None,
    ) -> dict[str, Any]:
        since = time.monotonic()
        try:
            while True:
                with self._lock:
                    while True:
                        reply = self._replies.pop(rid, None)
                        if reply is not None:
                            return reply
                        if self._lost is not None:
                            raise self.lost_error()
                        if cancelled is not None and cancelled():
                            raise Abandoned(f"{call.request['op']} abandoned")
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise RequestTimeout(
                                f"no reply to {call.request['op']} within its timeout; "
                                "whether the daemon applied it is unknown"
                            )
                        if not self._reading:
                            self._reading = True
                            break
                        self._follow(remaining)
                self._lead(remaining, since)
        except BaseException:
            self._abandon(rid, call)
            raise

    def _abandon(self, rid: int, call: Call) -> None:
        """Nobody waits for *rid* any more; see the design note."""
        with self._cond:
            if self._lost is not None:
                return
            reply = self._replies.pop(rid, None)
            if reply is None:
                self._abandoned[rid] = call if call.locks else None
            elif call.locks:
                self._give_back(call, reply)

    def _give_back(self, call: Call, reply: dict[str, Any]) -> None:
        # With the condition lock held: queue unlocks of what a dropped read locked.
        if reply.get("ok") is not True:
            return
        structure = call.structure
        for message in (reply.get("result") or {}).get("messages") or []:
            unlock = ops.unlock(structure, message["entry_id"])
            rid = next(self._ids)
            unlock.request["id"] = rid
            self._abandoned[rid] = None
            self._giveback.append(encode_frame(unlock.request))

    def poke(self) -> None:
        """Wake the threads waiting on this connection, to look at their ``cancelled()``.

        Safe in a signal handler: it takes no lock.
        """
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    def nap(self, seconds: float) -> None:
        """Sleep *seconds*, or until poke() (a reconnect's back-off on a lost connection)."""
        if seconds <= 0:
            return
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if poller.poll(_millis(seconds)):
            _drain(self._wake_r)

    # --- notifications ---

    def next_notification(self, timeout: float) -> Notification | None:
        """The next notification, waiting at most *timeout* seconds; None if none came."""
        since = time.monotonic()
        deadline = since + timeout
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
                    self._follow(remaining)
            self._lead(remaining, since)

    def _follow(self, timeout: float | None) -> None:
        """Wait (holding the lock) for the leader's news, counted so that a leader with
        no follower notifies no one."""
        self._followers += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._followers -= 1

    # --- reading, as the leader ---

    def _lead(self, timeout: float | None, since: float) -> None:
        """Read once (we hold the lead), file what came, hand the lead back; the
        caller has waited *since* then (for the keepalive)."""
        frames: list[dict[str, Any]] = []
        lost: str | None = None
        try:
            keepalive = self._keepalive
            if keepalive is not None:
                action, cap = keepalive.step(time.monotonic(), since)
                if action == SILENT:
                    lost = keepalive.silence()
                    return
                if action == PING:
                    self._ping(keepalive.interval)
                timeout = cap if timeout is None else min(timeout, cap)
            try:
                received = self._receive(None if timeout is None else max(timeout, 0.0))
            except OSError as error:
                received, lost = False, f"receive failed: {error}"
            if received:
                if keepalive is not None:
                    keepalive.heard(time.monotonic())
                lost = self._decode(frames)
        finally:
            with self._lock:
                self._reading = False
                for frame in frames:
                    self._file(frame)
                if lost is not None and self._lost is None:
                    self._lost = self._close_detail or lost
                if self._followers:
                    self._cond.notify_all()
            if self._lost is not None:
                self._release_socket()
            elif self._giveback:
                self._send_giveback()

    def _ping(self, patience: float) -> None:
        """Ask the daemon for a sign of life (cqsclient.keepalive); its reply is
        dropped. Only by the leader, so no reply is filed before the id is known
        abandoned; skipped while another thread sends (its reply will do), and
        given up after *patience* seconds if the socket takes nothing."""
        ping = ops.ping()
        rid = next(self._ids)
        ping.request["id"] = rid
        frame = encode_frame(ping.request)
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            sent = self._channel.send(frame, time.monotonic() + patience)
        except OSError:
            return  # the reader sees the connection end
        finally:
            self._send_lock.release()
        if sent == len(frame):
            with self._cond:
                self._abandoned[rid] = None
        elif sent:
            self._fail("a keepalive ping could not be sent whole")

    def _send_giveback(self) -> None:
        """Send the queued give-back unlocks if the socket takes them now; what it
        does not take stays at the head of the queue, for the next send."""
        if not self._send_lock.acquire(blocking=False):
            return  # a sender is busy: it takes them along
        try:
            with self._cond:
                data, self._giveback = b"".join(self._giveback), []
            try:
                sent = self._channel.send_now(data)
            except OSError:
                sent = 0  # the reader will see the connection end
            if sent < len(data):
                with self._cond:
                    self._giveback.insert(0, data[sent:])
        finally:
            self._send_lock.release()

    def _receive(self, timeout: float | None) -> bool:
        """One read into the decoder: straight into its room for the rest of a large
        frame, one copy fewer; False if *timeout* passed or poke() woke us.

        Other reads go into the connection's own buffer, kept: a ``recv(CHUNK)``
        allocated CHUNK bytes for each reply, which glibc served with an mmap, a
        mremap to the size read and a munmap, three system calls a request more."""
        decoder = self._decoder
        room = decoder.room()
        if room is None:
            chunk = self._chunk
            got = self._channel.recv_into(chunk, timeout)
            if got is None:
                return False
            decoder.receive_data(chunk[:got])  # copied there; nothing read: the end
            return True
        with room:
            got = self._channel.recv_into(room, timeout)
        if got is None:
            return False
        if got:
            decoder.received(got)
        else:
            decoder.receive_data(b"")
        return True

    def _decode(self, frames: list[dict[str, Any]]) -> str | None:
        """Decode every whole frame received into *frames*; the loss detail, if any."""
        decoder = self._decoder
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
            if rid in self._abandoned:
                call = self._abandoned.pop(rid)
                if call is not None:
                    self._give_back(call, frame)
                return
            self._replies[rid] = frame
        elif "notify" in frame:
            note = notification_from_wire(frame)
            if note is not None:
                self._notes.append(note)
        elif frame.get("ok") is False:
            self._close_detail = unexpected_close_detail(frame)

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
        self.poke()
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

