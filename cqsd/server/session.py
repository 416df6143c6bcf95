"""One client connection: who registered on it, and the bounded queue of frames
waiting to be sent to it.

The queue is bounded twice over. A connection whose replies are not being
read is paced: once its unsent frames pass a quarter of ``send_queue`` (or
their bytes a quarter of ``send_queue_bytes``), or as many of its requests
wait to reply later (waiting reads, jobs), its reader stops taking requests
from it, and starts again when the queue is down to an eighth. Reading a
request is what makes a reply, so a client that sends without reading blocks
only itself, and never waits for the daemon's memory. What still arrives
while reading is paused, notifications and the replies of waiting reads, is
bounded by the hard limits, ``send_queue`` frames and ``send_queue_bytes``
bytes: past them the client is cut off, never waited for, because waiting
would stall every other client served by the same loop. Only a client that
reads nothing at all gets there. The checks are a few integer comparisons,
and only when a frame has to be queued: the fast path does none of them.

Design note. A frame goes out on the spot when nothing is queued ahead of it
and what it acknowledges is durable: a non-blocking send on a duplicate of the
socket's descriptor. A reply that must wait for the log is queued and the
session is held by the journal, which releases it after the fsync that makes
it durable: the flusher then sends it the same way. Only what a non-blocking
send cannot take (a slow reader, TLS) goes through the connection's writer
task. That saves each durable reply the writer task's wake-ups and a scheduler
round (measured in the note of issue 4).
"""

import itertools
import socket
from collections import deque

import structlog
import trio

from cqsproto import ProtocolError, encode_frame, encode_frame_parts, encode_reply
from cqsproto.codec import Parts

from ..engine import Reason
from .access import Rights
from .journal import Journal
from .wire import Large

log = structlog.get_logger()
_ids = itertools.count(1)
SEND_BATCH = 256 * 1024  # bytes of small frames joined into one send
PAUSE_SHARE = 4  # reading pauses at a quarter of either send queue limit, resumes at an eighth

Frame = bytes | memoryview
IOV_MAX = 1024  # buffers one sendmsg takes (Linux's UIO_MAXIOV)


class Session:
    def __init__(self, peer: str, over_tcp: bool, send_queue: int, max_frame: int,
                 journal: Journal, send_queue_bytes: int) -> None:
        self.id = next(_ids)
        self.peer = peer
        self.over_tcp = over_tcp
        self.client: str | None = None  # the lock owner: the name, or name:id (operator)
        self.name: str | None = None  # the configured client it registered as
        self.operator = False  # an operator session (cqsctl): no client slot
        self.rights: Rights | None = None  # None for unrestricted
        self.cert_cn: str | None = None  # the TLS client certificate's common name
        self.peer_uid: int | None = None  # the Unix socket peer's user (SO_PEERCRED)
        self.deregistered = False
        self.interests: set[tuple[str, int, str]] = set()
        self.max_frame = max_frame
        self.journal = journal
        # frames not yet sent, in order: (LSN that must be durable first, request id, frame)
        self.queue: deque[tuple[int, int | None, Frame]] = deque()
        self.send_queue = send_queue
        self.send_queue_bytes = send_queue_bytes
        self.unsent = 0  # bytes of the frames in the queue
        self.deferred = 0  # requests whose reply comes later (waiting reads, jobs)
        self.in_order = 0  # of them, those the connection's later requests wait for
        self.pause_frames = send_queue // PAUSE_SHARE
        self.pause_bytes = send_queue_bytes // PAUSE_SHARE
        self.paused = False  # the reader takes no requests from this connection
        self._congested = False  # the queue passed a pause mark and is not yet down to half of it
        self._resumed = trio.Event()
        self.partial_since: float | None = None  # trio time the request frame arriving began
        self.need = 0  # the highest LSN a queued frame waits for
        self.sending = False  # the writer task is sending frames it took from the queue
        self.closing = False  # no more frames: the writer sends what is queued, then ends
        self._work = trio.Event()  # for the writer task
        self.cut_off = False
        # A duplicate of a plain socket's descriptor, for sending without the writer
        # task (measured 48 -> 32 µs of daemon CPU a request); None for TLS.
        self.raw: socket.socket | None = None
        self.scope: trio.CancelScope | None = None  # the whole connection
        self.reader_scope: trio.CancelScope | None = None
        self.waits: trio.Nursery | None = None  # requests replying later (jobs…)
        # its reads parked for a message (waiters.py, which imports this module)
        self.waiting: set[object] = set()

    def send_bytes(self, frame: Frame | Parts, lsn: int = 0,
                   request_id: int | None = None) -> None:
        """Send an encoded frame (or its parts) once log position ``lsn`` is durable;
        a client whose queue is full is cut off."""
        if self.cut_off:
            return
        durable = self.journal.acknowledged
        if self.journal.unwritten and type(frame) is list:  # large: not copied into the queue
            self.journal.write_now()
        if lsn > durable and self.journal.ended() is not None:
            frame, lsn = self._unacknowledged(request_id), 0
        if (lsn <= durable and not self.queue and not self.sending and self.raw is not None
                and not self.journal.unwritten):
            if lsn and self.journal.gate is not None and not self.journal.gate():
                frame, lsn = self._unacknowledged(request_id), 0
            rest = self._send_now(frame)
            if rest is None:
                return
            frame, lsn = rest, 0
        if isinstance(frame, list):  # parts to queue: joined once, here
            frame = b"".join(frame)
        if len(self.queue) >= self.send_queue or self.unsent >= self.send_queue_bytes:
            self.cut("too many replies and notifications waiting to be sent")
            return
        self.queue.append((lsn, request_id, frame))
        self.unsent += len(frame)
        if not self._congested and (len(self.queue) >= self.pause_frames
                                    or self.unsent >= self.pause_bytes):
            self._flow()
        if lsn > durable:
            self.need = max(self.need, lsn)
            self.journal.hold(self)
        elif self.queue[0][0] <= durable:
            if self.journal.unwritten:  # a lock record first (journal.py's note)
                self.journal.await_write(self)
            else:
                self._work.set()

    def send(self, frame: dict, lsn: int = 0, large: bool = False) -> None:
        try:
            data: Frame | Parts = (encode_frame_parts(frame, self.max_frame) if large
                                   else encode_frame(frame, self.max_frame))
            if type(data) is list and len(data) > IOV_MAX:  # more than one sendmsg takes
                data = b"".join(data)
        except ProtocolError as err:  # a reply larger than a frame may be: its request fails
            log.warning("reply_too_large", client=self.client, message=err.message)
            data = encode_frame({"id": frame.get("id"), "ok": False, "reason": str(err.reason),
                                 "message": f"the reply is too large: {err.message}"})
        self.send_bytes(data, lsn, frame.get("id"))

    def reply(self, request_id: int, result: dict, lsn: int = 0) -> None:
        if type(result) is Large:
            self.send({"id": request_id, "ok": True, "result": result}, lsn, True)
            return
        try:  # a reply a request: packed around a constant prefix (codec.encode_reply)
            data = encode_reply(request_id, result, self.max_frame)
        except ProtocolError:  # too large: send words the error
            self.send({"id": request_id, "ok": True, "result": result}, lsn)
            return
        self.send_bytes(data, lsn, request_id)

    def fail(self, request_id: int | None, reason: str, message: str,
             details: dict | None = None) -> None:
        frame = {"id": request_id, "ok": False, "reason": str(reason), "message": message}
        if details:
            frame.update(details)
        self.send(frame)

    def release(self, durable: int, failed: BaseException | None) -> bool:
        """The journal's call after a flush: send what is now durable (or, the log
        having failed, turn what never will be into errors). True while frames
        still wait for a later flush."""
        q = self.queue
        if self.cut_off:
            return False
        if failed is not None:
            self._refuse(durable)
        if q and q[0][0] <= durable:
            if self.raw is None or self.sending:
                self._work.set()
            else:
                self.still_owner()
                batch = self.take(durable)
                rest = self._send_now(batch)
                if rest is not None:
                    q.appendleft((0, None, rest))
                    self.unsent += len(rest)
                if q and q[0][0] <= durable:
                    self._work.set()  # a slow reader, or more than a batch
                if self.paused:
                    self._flow()
        return self.need > durable

    def _refuse(self, durable: int) -> None:
        """Replies waiting for a log position past ``durable`` will never be sent as they
        are: each becomes the error saying it was not acknowledged."""
        for i, (lsn, rid, frame) in enumerate(self.queue):
            if lsn > durable:
                self.queue[i] = (0, rid, self._unacknowledged(rid))
                self.unsent += len(self.queue[i][2]) - len(frame)
        self.need = 0

    def still_owner(self) -> bool:
        """Checked before replies that waited for the log leave, in a group: a node whose
        lease ran out meanwhile (paused past it, say) sends none of them, not even those
        made durable in time; they become errors, in doubt (docs/group.md)."""
        gate = self.journal.gate
        if gate is None or gate():
            return True
        self._refuse(0)
        return False

    def take(self, durable: int) -> Frame:
        """Frames from the head of the queue that may go now, joined up to SEND_BATCH."""
        q = self.queue
        first = q.popleft()[2]
        if not q or q[0][0] > durable:
            self.unsent -= len(first)
            return first
        parts, size = [first], len(first)
        while q and q[0][0] <= durable and size < SEND_BATCH:
            frame = q.popleft()[2]
            parts.append(frame)
            size += len(frame)
        self.unsent -= size
        return b"".join(parts)

    def sent(self) -> None:
        """The writer task has sent what it took: reading may resume."""
        self.sending = False
        if self.paused:
            self._flow()

    def defer(self, async_fn, *args, in_order: bool = False) -> None:
        """Run a request whose reply comes later (a waiting read, a job) in the
        connection's nursery. Each counts towards pausing as a queued frame would:
        its reply may come when the client is reading nothing. ``in_order``: the
        connection's later requests wait until it is done, so its reply and
        effects keep their place (a request run again, runagain.py)."""
        self.deferred += 1
        self.in_order += in_order
        if self.deferred >= self.pause_frames or in_order:
            self._flow()
        assert self.waits is not None  # handlers run while the connection reads, in _run
        self.waits.start_soon(self._deferred, async_fn, args, in_order)

    async def _deferred(self, async_fn, args, in_order: bool) -> None:
        try:
            await async_fn(*args)
        finally:
            self.deferred -= 1
            self.in_order -= in_order
            if self.paused:
                self._flow()

    def park(self, waiter: object) -> None:
        """A read of this connection waits for a message (waiters.py): it counts
        towards pausing as a deferred request does."""
        self.waiting.add(waiter)
        self.deferred += 1
        if self.deferred >= self.pause_frames:
            self._flow()

    def unpark(self, waiter: object) -> None:
        self.waiting.discard(waiter)
        self.deferred -= 1
        if self.paused:
            self._flow()

    def _flow(self) -> None:
        """Pause reading this connection when its queue reaches a pause mark or
        as many requests wait to reply, resume it when the queue is down to half
        the marks (so that a paced client is not paused on every reply)."""
        if self.cut_off:
            return
        frames, size = len(self.queue), self.unsent
        if self._congested:
            self._congested = frames > self.pause_frames // 2 or size > self.pause_bytes // 2
        else:
            self._congested = frames >= self.pause_frames or size >= self.pause_bytes
        paused = self._congested or self.deferred >= self.pause_frames or self.in_order > 0
        if paused == self.paused:
            return
        self.paused = paused
        if paused:
            self._resumed = trio.Event()
            self.partial_since = None  # the frame clock stops while the daemon does not read
            log.debug("reading_paused", client=self.client, peer=self.peer, unsent_frames=frames,
                      unsent_bytes=size, deferred=self.deferred)
        else:
            self._resumed.set()
            log.debug("reading_resumed", client=self.client, peer=self.peer)

    async def resumed(self) -> None:
        """Wait until reading this connection may go on."""
        while self.paused:
            await self._resumed.wait()

    def cut(self, why: str) -> None:
        """Give up on this client: drop what is queued for it, take no more of its
        requests (their replies could not reach it), and end its connection."""
        self.cut_off = self.paused = True
        self.queue.clear()
        self.unsent = 0
        log.warning("client_cut_off", client=self.client, peer=self.peer, why=why)
        if self.scope is not None:
            self.scope.cancel()

    async def wait_for_work(self) -> None:
        await self._work.wait()
        self._work = trio.Event()

    def finish_sending(self) -> None:
        """No more frames: the writer sends what is queued, then ends."""
        self.closing = True
        self._work.set()

    def _send_now(self, frame: Frame | Parts) -> Frame | None:
        """A non-blocking send (of parts: one ``sendmsg``); what it could not take, or
        None."""
        raw = self.raw
        assert raw is not None  # both callers check it first
        try:
            sent = raw.sendmsg(frame) if isinstance(frame, list) else raw.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            return None  # the peer is gone; the reader sees it and ends the session
        if isinstance(frame, list):
            if sent == sum(len(part) for part in frame):
                return None
            frame = b"".join(frame)
        return None if sent == len(frame) else memoryview(frame)[sent:]

    def _unacknowledged(self, request_id: int | None) -> bytes:
        """A reply whose log record will never be durable (or never acknowledged)."""
        if self.journal.failed is None and self.journal.fenced is not None:
            return encode_frame({
                "id": request_id, "ok": False, "reason": str(Reason.STRUCTURE_FAILED),
                "message": f"not acknowledged: {self.journal.fenced}; this node stopped "
                           "acknowledging (fenced), the structure's next owner has the "
                           "request only if it was logged in time",
            })
        return encode_frame({
            "id": request_id, "ok": False, "reason": str(Reason.SHUTTING_DOWN),
            "message": f"not acknowledged: the log write failed ({self.journal.failed}); "
                       "the daemon is stopping for recovery",
        })

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()
            self.raw = None
