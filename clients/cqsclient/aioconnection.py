"""The async client's connection: one reader task, a waiter per request.

Design note
-----------
The reader task decodes frames and hands each reply to the waiter registered
under its id (an ``anyio.Event`` and a slot) and each notification to an
unbounded memory stream, so the reader never blocks on a slow consumer. Any
number of tasks may have requests in flight; sends are serialized by an
``anyio.Lock`` so frames never interleave. When the connection drops, the
reader wakes every waiter, which raises ConnectionLost.

Cancellation is safe for the connection. A waiter cancelled before its reply
comes is dropped, and the reply is discarded when it arrives; if it was a read,
the messages it locked are given back (a plain unlock) by a task in the group,
so a ``with anyio.move_on_after(1): await s.read(q, wait=10)`` never strands a
lock (a timed-out request is such a cancellation). A send is shielded from
cancellation when the frame is small (it goes to the kernel at once); a large
frame's send may be cancelled part-way, which leaves the byte stream without
frame boundaries, so the connection is then closed and everything in flight
gets ConnectionLost. ``Progress.sent`` tells the caller of a cancelled request
whether its frame went whole (so whether the daemon may have applied it).
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Final

import anyio
import anyio.abc

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
from .connection import CHUNK
from .errors import ConnectionLost, CQSError, MessageTooLarge
from .keepalive import PING, SILENT, Keepalive
from .model import Notification
from .replies import Call, notification_from_wire, unexpected_close_detail

__all__ = ["AsyncConnection", "Progress"]

# Frames up to this size are sent shielded from cancellation: they fit in the
# socket's send buffer, so the send cannot hang, and finishing it keeps the
# connection usable. Larger sends stay cancellable (see the design note).
SHIELDED_SEND: Final = 64 * 1024


class Progress:
    """How far one request got: ``sent`` once its frame went whole to the kernel."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class _Waiter:
    __slots__ = ("abandoned", "call", "event", "reply", "since")

    def __init__(self, call: Call) -> None:
        self.since = time.monotonic()
        self.call = call
        self.event = anyio.Event()
        self.reply: dict[str, Any] | None = None
        self.abandoned = False


class AsyncConnection:
    """Sends requests, and (in its reader task) files replies and notifications."""

    def __init__(
        self, stream: anyio.abc.ByteStream, address: str, keepalive: float | None = None
    ) -> None:
        self.address = address
        # cqsclient.keepalive: a silent daemon is noticed while a request waits
        self._keepalive = Keepalive(keepalive) if keepalive is not None else None
        self._stream = stream
        self._decoder = FrameDecoder(MAX_FRAME_LIMIT)
        self.max_frame = DEFAULT_MAX_FRAME
        self._ids = itertools.count(1)
        self._send_lock = anyio.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._notes_in, self.notes = anyio.create_memory_object_stream[Notification](math.inf)
        self._lost: str | None = None
        self._close_detail: str | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def lost_error(self, applied: bool | None = None) -> ConnectionLost:
        return ConnectionLost(
            f"connection to {self.address} lost: {self._lost}",
            address=self.address,
            applied=applied,
        )

    async def roundtrip(self, call: Call, progress: Progress | None = None) -> dict[str, Any]:
        """Send *call*'s request with a fresh id and return its reply frame; *progress*
        learns whether it was sent."""
        if self._lost is not None:
            raise self.lost_error(applied=False)
        rid = next(self._ids)
        request = call.request
        request["id"] = rid
        try:  # a large payload is sent from where it is, not joined into the frame
            frame: Parts = (encode_frame_parts(request, self.max_frame) if call.large
                            else [encode_frame(request, self.max_frame)])
        except ProtocolError as error:
            raise MessageTooLarge(f"request refused before sending: {error.message}") from None
        waiter = _Waiter(call)
        # Registered before sending, so the reader cannot miss a fast reply.
        self._waiters[rid] = waiter
        sent = False
        try:
            await self._send(frame)
            sent = True
            if progress is not None:
                progress.sent = True
            await waiter.event.wait()
        except BaseException:
            self._abandon(rid, waiter, sent)
            raise
        if waiter.reply is None:
            raise self.lost_error()
        return waiter.reply

    def _abandon(self, rid: int, waiter: _Waiter, sent: bool) -> None:
        """The caller of request *rid* is gone (cancelled): nobody will take its reply."""
        if waiter.reply is not None:
            # The reply came in the same instant as the cancellation.
            self._give_back(waiter.call, waiter.reply)
        elif self._waiters.get(rid) is waiter:
            if sent and waiter.call.locks:
                waiter.abandoned = True  # the reader gives back what it locks
            else:
                del self._waiters[rid]

    async def _send(self, frame: Parts) -> None:
        """Send the frame's buffers in order, none of another frame between them."""
        async with self._send_lock:
            if self._lost is not None:
                raise self.lost_error(applied=False)
            try:
                with anyio.CancelScope(shield=sum(len(part) for part in frame) <= SHIELDED_SEND):
                    for part in frame:  # anyio's streams take any buffer, if typed bytes
                        await self._stream.send(part)  # type: ignore[arg-type]
            except BaseException as error:
                if isinstance(error, anyio.get_cancelled_exc_class()):
                    self._fail("a large send was cancelled part-way")
                    raise
                self._fail(f"send failed: {error!r}")
                raise self.lost_error(applied=False) from error

    # --- the reader task ---

    async def read_loop(self, task_group: anyio.abc.TaskGroup) -> None:
        """Read frames until the connection ends; then fail whatever still waits."""
        self._task_group = task_group
        detail = "the server closed the connection"
        if self._keepalive is not None:
            task_group.start_soon(self._watch, self._keepalive)
        try:
            while True:
                try:
                    data = await self._stream.receive(CHUNK)
                except anyio.EndOfStream:
                    data = b""
                if self._keepalive is not None:
                    self._keepalive.heard(time.monotonic())
                self._decoder.receive_data(data)
                if self._drain():
                    break
        except ProtocolError as error:
            detail = f"the server sent a bad frame: {error}"
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as error:
            detail = f"receive failed: {error!r}"
        except Exception as error:  # a bug here must not leave waiters hanging
            detail = f"internal error in the reader: {error!r}"
        finally:
            self._fail(detail)

    async def _watch(self, keepalive: Keepalive) -> None:
        """While requests wait, ping a quiet daemon and declare a silent one lost
        (cqsclient.keepalive)."""
        while self._lost is None:
            waiting = [w.since for w in self._waiters.values() if not w.abandoned]
            if not waiting:
                await anyio.sleep(keepalive.interval)
                continue
            action, cap = keepalive.step(time.monotonic(), min(waiting))
            if action == SILENT:
                self._fail(keepalive.silence())
                await anyio.aclose_forcefully(self._stream)
                return
            if action == PING and self._task_group is not None:
                self._task_group.start_soon(self._ping)
            await anyio.sleep(cap)

    async def _ping(self) -> None:
        """Send a ping whose reply is dropped: a dropped waiter of no locks."""
        call = ops.ping()
        rid = next(self._ids)
        call.request["id"] = rid
        waiter = _Waiter(call)
        waiter.abandoned = True
        self._waiters[rid] = waiter
        try:
            await self._send([encode_frame(call.request)])
        except (CQSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._waiters.pop(rid, None)

    def _drain(self) -> bool:
        """Dispatch every whole frame; True once the stream has ended."""
        while True:
            frame = self._decoder.next_frame()
            if frame is NEED_DATA:
                return False
            if frame is CLOSED:
                return True
            self._dispatch(frame)

    def _dispatch(self, frame: dict[str, Any]) -> None:
        rid = frame.get("id")
        if rid is None:
            if "notify" in frame:
                note = notification_from_wire(frame)
                if note is not None:
                    self._notes_in.send_nowait(note)
            elif frame.get("ok") is False:
                self._close_detail = unexpected_close_detail(frame)
            return
        waiter = self._waiters.pop(rid, None)
        if waiter is None:
            return
        if waiter.abandoned:
            self._give_back(waiter.call, frame)
            return
        waiter.reply = frame
        waiter.event.set()

    def _give_back(self, call: Call, frame: dict[str, Any]) -> None:
        # The reply to a cancelled read: unlock what it locked.
        if frame.get("ok") is not True or self._task_group is None or not call.locks:
            return
        structure = call.request["structure"]
        messages = (frame.get("result") or {}).get("messages") or []
        for message in messages:
            unlock = ops.unlock(structure, message["entry_id"])
            self._task_group.start_soon(self._quiet, unlock)

    async def _quiet(self, call: Call) -> None:
        try:
            await self.roundtrip(call)
        except CQSError:
            pass

    # --- loss and closing ---

    def expect_close(self, detail: str) -> None:
        """The server will close the connection (deregister): say *detail* when it does."""
        self._close_detail = detail

    def _fail(self, detail: str) -> None:
        if self._lost is None:
            self._lost = self._close_detail or detail
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.event.set()
        self._notes_in.close()

    async def aclose(self) -> None:
        """Close the stream; requests in flight get ConnectionLost. Idempotent."""
        if self._lost is None:
            self._lost = self._close_detail or "closed by this client"
        self._fail(self._lost)
        # Forcefully: a TLS close_notify exchange could wait on a peer that is
        # gone, and the session is over whatever the peer says.
        await anyio.aclose_forcefully(self._stream)

    def close_notifications(self) -> None:
        """Drop the notifications nobody took; for the very end of the client."""
        self.notes.close()
