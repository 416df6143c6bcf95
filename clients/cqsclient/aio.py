"""The async client, on AnyIO: the names of the blocking client, under Trio or asyncio.

::

    async with cqsclient.aio.connect(client="IMS1") as c:
        s = await c.structure("MSGQ01")
        await s.put("TRANX", b"...")
        async with s.unit_of_work() as uow:
            m = await uow.read("TRANX")
            uow.put("LTERMZ", b"reply", qtype="LTERM")   # gathered: no await
            uow.delete(m.entry_id)
        async for n in c.notifications(timeout=1.0): ...

Design note
-----------
``connect()`` returns an unopened :class:`Client`; ``async with`` opens the
stream, starts one reader task in a task group and registers. The reader
decodes frames and hands each reply to the waiter registered under its id (an
``anyio.Event`` and a slot) and each notification to an unbounded memory
stream, so the reader never blocks on a slow consumer. Any number of tasks may
have requests in flight; sends are serialized by an ``anyio.Lock`` so frames
never interleave. When the connection drops, the reader wakes every waiter,
which raises ConnectionLost.

Cancellation is safe for the connection. A waiter cancelled before its reply
comes is dropped, and the reply is discarded when it arrives; if it was a read,
the messages it locked are given back (a plain unlock) by a task in the group,
so a ``with anyio.move_on_after(1): await s.read(q, wait=10)`` never strands a
lock. A send is shielded from cancellation when the frame is small (it goes to
the kernel at once); a large frame's send may be cancelled part-way, which
leaves the byte stream without frame boundaries, so the connection is then
closed and everything in flight gets ConnectionLost.
"""

from __future__ import annotations

import itertools
import math
import ssl
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
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
    max_frame_for,
)

from . import ops
from .address import Address, parse_address
from .client import DEFAULT_TIMEOUT, client_name, tls_context
from .connection import CHUNK
from .errors import CannotConnect, ConnectionLost, CQSError, MessageTooLarge
from .model import BrowsePage, HeldLock, Location, Message, Notification
from .ops import Call, Payload, QType
from .unitofwork import ALREADY_RELEASED, UnitOfWorkBase

__all__ = ["Client", "StructureHandle", "UnitOfWork", "connect"]

# Frames up to this size are sent shielded from cancellation: they fit in the
# socket's send buffer, so the send cannot hang, and finishing it keeps the
# connection usable. Larger sends stay cancellable (see the design note).
SHIELDED_SEND: Final = 64 * 1024

# How long closing work (deregister, giving back locks) may take when the
# caller is being cancelled: it runs shielded, so it must be bounded.
CLEANUP_TIMEOUT: Final = 5.0


class _Waiter:
    __slots__ = ("abandoned", "call", "event", "reply")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.event = anyio.Event()
        self.reply: dict[str, Any] | None = None
        self.abandoned = False


class _Connection:
    """Sends requests, and (in its reader task) files replies and notifications."""

    def __init__(self, stream: anyio.abc.ByteStream, address: str) -> None:
        self.address = address
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

    def lost_error(self) -> ConnectionLost:
        return ConnectionLost(
            f"connection to {self.address} lost: {self._lost}", address=self.address
        )

    async def roundtrip(self, call: Call) -> dict[str, Any]:
        """Send *call*'s request with a fresh id and return its reply frame."""
        if self._lost is not None:
            raise self.lost_error()
        rid = next(self._ids)
        request = call.request
        request["id"] = rid
        try:
            frame = encode_frame(request, self.max_frame)
        except ProtocolError as error:
            raise MessageTooLarge(f"request refused before sending: {error.message}") from None
        waiter = _Waiter(call)
        # Registered before sending, so the reader cannot miss a fast reply.
        self._waiters[rid] = waiter
        sent = False
        try:
            await self._send(frame)
            sent = True
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

    async def _send(self, frame: bytes) -> None:
        async with self._send_lock:
            if self._lost is not None:
                raise self.lost_error()
            try:
                if len(frame) <= SHIELDED_SEND:
                    with anyio.CancelScope(shield=True):
                        await self._stream.send(frame)
                else:
                    await self._stream.send(frame)
            except BaseException as error:
                if isinstance(error, anyio.get_cancelled_exc_class()):
                    self._fail("a large send was cancelled part-way")
                    raise
                self._fail(f"send failed: {error!r}")
                raise self.lost_error() from error

    # --- the reader task ---

    async def read_loop(self, task_group: anyio.abc.TaskGroup) -> None:
        """Read frames until the connection ends; then fail whatever still waits."""
        self._task_group = task_group
        detail = "the server closed the connection"
        try:
            while True:
                try:
                    data = await self._stream.receive(CHUNK)
                except anyio.EndOfStream:
                    data = b""
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
                note = ops.notification_from_wire(frame)
                if note is not None:
                    self._notes_in.send_nowait(note)
            elif frame.get("ok") is False:
                self._close_detail = ops.unexpected_close_detail(frame)
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
        if frame.get("ok") is not True or self._task_group is None:
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


def connect(
    address: str | None = None,
    client: str | None = None,
    secret: str | None = None,
    cold: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    *,
    ssl_context: ssl.SSLContext | None = None,
    cafile: str | None = None,
    operator: bool = False,
) -> Client:
    """An unopened Client: use ``async with cqsclient.aio.connect(...) as c``.

    Arguments and errors as :func:`cqsclient.connect`; ValueError for a bad
    address or missing client name is raised here, the rest on entering.
    """
    return Client(
        parse_address(address), client_name(client), secret, cold, timeout, ssl_context, cafile,
        operator,
    )


async def _open_stream(
    address: Address, ssl_context: ssl.SSLContext | None, cafile: str | None
) -> anyio.abc.ByteStream:
    if address.scheme == "unix":
        return await anyio.connect_unix(address.path)
    if address.scheme == "tls":
        context = tls_context(ssl_context, cafile)
        return await anyio.connect_tcp(
            address.host, address.port, ssl_context=context, tls_hostname=address.host
        )
    # anyio sets TCP_NODELAY on the sockets it connects.
    return await anyio.connect_tcp(address.host, address.port)


class Client:
    """A registered client on one connection, shared by any number of tasks."""

    def __init__(
        self,
        address: Address,
        name: str,
        secret: str | None,
        cold: bool,
        timeout: float | None,
        ssl_context: ssl.SSLContext | None,
        cafile: str | None,
        operator: bool = False,
    ) -> None:
        self.name = name
        self._operator = operator
        self.address = address.text
        self._parsed = address
        self._secret = secret
        self._cold = cold
        self._timeout = timeout
        self._ssl_context = ssl_context
        self._cafile = cafile
        self._conn: _Connection | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self.server = ""
        self.server_version = 0
        self.max_message = 0
        self.structures: list[str] = []
        self.resync_locks: list[HeldLock] = []

    def __repr__(self) -> str:
        state = "open" if self._conn is not None and not self._conn.lost else "closed"
        return f"<cqsclient.aio.Client {self.name!r} at {self.address} ({state})>"

    @property
    def closed(self) -> bool:
        """True until opened, and once the connection is closed or lost."""
        return self._conn is None or self._conn.lost

    async def _do(self, call: Call) -> Any:
        if self._conn is None:
            raise RuntimeError("use `async with cqsclient.aio.connect(...) as client`")
        return call.finish(await self._conn.roundtrip(call))

    # --- opening and closing ---

    async def __aenter__(self) -> Client:
        if self._conn is not None:
            raise RuntimeError("this client has already been opened")
        timeout = math.inf if self._timeout is None else self._timeout
        try:
            with anyio.fail_after(timeout):
                stream = await _open_stream(self._parsed, self._ssl_context, self._cafile)
        except (OSError, TimeoutError, anyio.BrokenResourceError) as error:
            raise CannotConnect(
                f"cannot connect to {self.address}: {error or 'timed out'}", address=self.address
            ) from error
        self._conn = _Connection(stream, self.address)
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._conn.read_loop, self._task_group)
        try:
            await self._register(timeout)
        except BaseException:
            await self._shutdown(deregister=False)
            raise
        return self

    # the register reply's own deadline, not the caller's: hence a parameter
    async def _register(self, timeout: float) -> None:  # noqa: ASYNC109
        assert self._conn is not None
        try:
            with anyio.fail_after(timeout):
                session: ops.Session = await self._do(
                    ops.register(self.name, self._secret, self._cold, self._operator)
                )
        except TimeoutError as error:
            raise CannotConnect(
                f"cannot register with {self.address}: timed out", address=self.address
            ) from error
        except CannotConnect:
            raise
        except ConnectionLost as error:
            raise CannotConnect(
                f"cannot register with {self.address}: {error.message}", address=self.address
            ) from error
        self.server = session.server
        self.server_version = session.version
        self.max_message = session.max_message
        self.structures = session.structures
        self.resync_locks = session.locks
        self._conn.max_frame = max_frame_for(session.max_message)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._shutdown(deregister=True, quiet=exc is not None)

    async def _shutdown(self, deregister: bool, quiet: bool = True) -> None:
        assert self._conn is not None and self._task_group is not None
        try:
            if deregister and not self._conn.lost:
                # Shielded so that a cancelled caller still deregisters cleanly.
                with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                    self._conn.expect_close("deregistered by this client")
                    try:
                        await self._do(ops.deregister())
                    except CQSError:
                        if not quiet:
                            raise
        finally:
            await self._conn.aclose()
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
            self._conn.close_notifications()

    async def deregister(self) -> None:
        """End the session cleanly, then close the connection."""
        if self._conn is not None:
            self._conn.expect_close("deregistered by this client")
        try:
            await self._do(ops.deregister())
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the connection without deregistering (the daemon treats it as a drop)."""
        if self._conn is not None:
            await self._conn.aclose()

    # --- requests ---

    async def structure(self, name: str) -> StructureHandle:
        """A handle on structure *name*; raises UnknownStructure if it is not defined."""
        stats = await self._do(ops.connect(name))
        return StructureHandle(self, name, stats)

    async def register_interest(self, structure: str, queue: str, qtype: QType = "TRAN") -> None:
        """Be notified when the queue goes from empty to non-empty (at once if it has work)."""
        await self._do(ops.register_interest(structure, queue, qtype))

    async def deregister_interest(
        self, structure: str, queue: str, qtype: QType = "TRAN"
    ) -> None:
        """Stop the notifications for the queue."""
        await self._do(ops.deregister_interest(structure, queue, qtype))

    def notifications(self, timeout: float = 1.0) -> AsyncIterator[Notification]:
        """An async iterator of notifications as they arrive; it stops once *timeout*
        seconds pass without one, and raises ConnectionLost if the connection drops
        (after what came before)."""
        if self._conn is None:
            raise RuntimeError("use `async with cqsclient.aio.connect(...) as client`")
        return _Notifications(self._conn, timeout)

    async def query(self, kind: str, structure: str | None = None) -> list[dict[str, Any]]:
        """The rows of a display: structures, queues, clients, locks, headers or backups."""
        rows: list[dict[str, Any]] = await self._do(ops.query(kind, structure))
        return rows

    async def checkpoint(self, structure: str) -> dict[str, Any]:
        """Checkpoint a structure to its SRDS now; waits for the job and returns its report."""
        result: dict[str, Any] = await self._do(ops.checkpoint(structure))
        return result

    async def alter(self, structure: str, size: int) -> dict[str, Any]:
        """SETXCF START,ALTER (see the blocking client); returns the structure's stats."""
        result: dict[str, Any] = await self._do(ops.alter(structure, size))
        return result

    async def rebuild(self, structure: str, size: int | None = None) -> dict[str, Any]:
        """Structure copy (see the blocking client); returns the structure's stats."""
        result: dict[str, Any] = await self._do(ops.rebuild(structure, size))
        return result

    async def delete_structure(self, structure: str) -> dict[str, Any]:
        """SETXCF FORCE (see the blocking client)."""
        result: dict[str, Any] = await self._do(ops.delete_structure(structure))
        return result

    async def recover(self, structure: str, purge: bool = False) -> dict[str, Any]:
        """RECOVER CFSTRUCT (see the blocking client); returns a report."""
        result: dict[str, Any] = await self._do(ops.recover(structure, purge))
        return result


class StructureHandle:
    """The requests on one structure; from ``await client.structure(name)``."""

    def __init__(self, client: Client, name: str, stats: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self.stats = stats

    def __repr__(self) -> str:
        return f"<aio.StructureHandle {self.name!r} of {self.client!r}>"

    async def _do(self, call: Call) -> Any:
        return await self.client._do(call)

    async def put(
        self, queue: str, data: Payload, qtype: QType = "TRAN", recoverable: bool = True
    ) -> int:
        """Put a message; returns its entry id. Raises MessageTooLarge before sending."""
        call = ops.put(self.name, queue, data, qtype, recoverable, self.client.max_message)
        entry_id: int = await self._do(call)
        return entry_id

    async def put_batch(
        self,
        queue: str,
        payloads: Iterable[Payload],
        qtype: QType = "TRAN",
        recoverable: bool = True,
    ) -> list[int]:
        """Put several messages in one atomic commit; returns their entry ids in order."""
        max_message = self.client.max_message
        call = ops.put_batch(self.name, queue, payloads, qtype, recoverable, max_message)
        entry_ids: list[int] = await self._do(call)
        return entry_ids

    async def read(
        self, queue: str, qtype: QType = "TRAN", wait: float | None = None
    ) -> Message | None:
        """Read and lock the next message, waiting up to *wait* seconds; None if there is none."""
        message: Message | None = await self._do(ops.read(self.name, queue, qtype, wait))
        return message

    async def read_batch(
        self, queue: str, n: int, qtype: QType = "TRAN", wait: float | None = None
    ) -> list[Message]:
        """Read and lock up to *n* messages; [] if there is none (after waiting)."""
        messages: list[Message] = await self._do(ops.read_batch(self.name, queue, n, qtype, wait))
        return messages

    async def delete(self, entry_id: int) -> None:
        """Delete a message this client holds locked (LOCK_NOT_HELD otherwise)."""
        await self._do(ops.delete(self.name, entry_id))

    async def unlock(
        self,
        entry_id: int,
        failed: bool = False,
        queue: str | None = None,
        qtype: QType | None = None,
    ) -> Location:
        """Give back a locked message (see the blocking client); returns where it went."""
        location: Location = await self._do(ops.unlock(self.name, entry_id, failed, queue, qtype))
        return location

    async def move(self, entry_id: int, queue: str, qtype: QType = "TRAN") -> None:
        """Move a message not locked by another client to another queue."""
        await self._do(ops.move(self.name, entry_id, queue, qtype))

    async def browse(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int = ops.BROWSE_PAGE,
        cursor: Any = None,
    ) -> BrowsePage:
        """One page of messages (nothing locked), with ``cursor`` for the next page."""
        page: BrowsePage = await self._do(ops.browse(self.name, queue, qtype, limit, cursor))
        return page

    def browse_all(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int | None = None,
        page_size: int = ops.BROWSE_PAGE,
    ) -> AsyncIterator[Message]:
        """An async iterator of every message (at most *limit*), following cursors."""
        return _BrowseAll(self, queue, qtype, limit, page_size)

    def unit_of_work(self) -> UnitOfWork:
        """An async context manager gathering puts, deletes, moves and unlocks into one commit."""
        return UnitOfWork(self)

    async def operator_delete(self, entry_id: int) -> None:
        """Delete any message not locked by another client (operator delete)."""
        await self._do(ops.delete(self.name, entry_id, operator=True))

    async def requeue(self, entry_id: int) -> Location:
        """Put a cold or suspended message back on its home queue; returns where."""
        location: Location = await self._do(ops.requeue(self.name, entry_id))
        return location

    async def dequeue(self, queue: str, qtype: QType = "TRAN") -> int:
        """Delete every message of the queue; returns how many went."""
        count: int = await self._do(ops.dequeue(self.name, queue, qtype))
        return count

    async def query(self, kind: str) -> list[dict[str, Any]]:
        """The rows of a display, for this structure only."""
        return await self.client.query(kind, self.name)


# Iterators are classes rather than async generators: a caller that breaks out
# of `async for` early leaves nothing to finalize later (an abandoned async
# generator is closed by the garbage collector, possibly outside its event loop).


class _Notifications:
    def __init__(self, conn: _Connection, timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout

    def __aiter__(self) -> _Notifications:
        return self

    async def __anext__(self) -> Notification:
        note: Notification | None = None
        with anyio.move_on_after(self._timeout):
            try:
                note = await self._conn.notes.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise self._conn.lost_error() from None
        if note is None:
            raise StopAsyncIteration
        return note


class _BrowseAll:
    def __init__(
        self,
        handle: StructureHandle,
        queue: str | None,
        qtype: QType | None,
        limit: int | None,
        page_size: int,
    ) -> None:
        self._handle = handle
        self._args = (queue, qtype)
        self._limit = limit
        self._page_size = page_size
        self._page: list[Message] = []
        self._index = 0
        self._count = 0
        self._cursor: Any = None
        self._done = False

    def __aiter__(self) -> _BrowseAll:
        return self

    async def __anext__(self) -> Message:
        while self._index >= len(self._page):
            size = self._page_size
            if self._limit is not None:
                size = min(size, self._limit - self._count)
            if self._done or size <= 0:
                raise StopAsyncIteration
            page = await self._handle.browse(*self._args, size, self._cursor)
            self._page, self._index = page, 0
            self._count += len(page)
            self._cursor = page.cursor
            self._done = page.cursor is None or not page
        message = self._page[self._index]
        self._index += 1
        return message


class UnitOfWork(UnitOfWorkBase):
    """Reads now (awaited), one commit at the end; ``put``/``delete``/``move``/``unlock``
    only gather, so they are not awaited. See :mod:`cqsclient.unitofwork`."""

    def __init__(self, handle: StructureHandle) -> None:
        super().__init__(handle.name, handle.client.max_message)
        self._handle = handle

    async def read(
        self, queue: str, qtype: QType = "TRAN", wait: float | None = None
    ) -> Message | None:
        """Read and lock a message now; it is given back if the unit of work fails."""
        self._check_open()
        message = await self._handle.read(queue, qtype, wait)
        if message is not None:
            self._note_read([message])
        return message

    async def read_batch(
        self, queue: str, n: int, qtype: QType = "TRAN", wait: float | None = None
    ) -> list[Message]:
        """Read and lock up to *n* messages now; given back if the unit of work fails."""
        self._check_open()
        messages = await self._handle.read_batch(queue, n, qtype, wait)
        self._note_read(messages)
        return messages

    async def __aenter__(self) -> UnitOfWork:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await self._give_back(exc)
            return
        call = self._commit_call()
        if call is None:
            return
        try:
            self.entry_ids = await self._handle._do(call)
        except ConnectionLost:
            raise
        except CQSError as error:
            await self._give_back(error)
            raise

    async def _give_back(self, cause: BaseException) -> None:
        if isinstance(cause, ConnectionLost):
            self._closed = True
            return
        # Shielded: a unit of work ended by cancellation still gives back its reads.
        with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            for call in self._giveback_calls():
                try:
                    await self._handle._do(call)
                except ConnectionLost:
                    return
                except ALREADY_RELEASED:
                    continue
                except CQSError as error:
                    self._note_giveback_error(cause, call.request["entry_id"], error)
