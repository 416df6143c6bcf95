"""The blocking client: :func:`connect`, :class:`Client`, :class:`StructureHandle`.

Every method builds its request with :mod:`cqsclient.ops` and sends it over
one :class:`~cqsclient.connection.Connection`, which any number of threads
may share (their requests are pipelined). The async client in
:mod:`cqsclient.aio` has the same names.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Final

from cqsproto import max_frame_for

from . import ops
from .address import Address, parse_address
from .connection import Connection
from .errors import CannotConnect, ConnectionLost, CQSError
from .model import BrowsePage, HeldLock, Location, Message, Notification
from .ops import Call, Payload, QType
from .unitofwork import ALREADY_RELEASED, UnitOfWorkBase

__all__ = ["Client", "StructureHandle", "UnitOfWork", "connect"]

CLIENT_ENV: Final = "CQSD_CLIENT"
DEFAULT_TIMEOUT: Final = 10.0

def client_name(client: str | None) -> str:
    """*client*, else ``$CQSD_CLIENT``; raises ValueError if neither is given."""
    name = client or os.environ.get(CLIENT_ENV)
    if not name:
        raise ValueError(f"a client name is required: pass client=... or set ${CLIENT_ENV}")
    return name


def tls_context(ssl_context: ssl.SSLContext | None, cafile: str | None) -> ssl.SSLContext:
    """*ssl_context*, else a default client context trusting *cafile* (if given)."""
    if ssl_context is not None:
        return ssl_context
    return ssl.create_default_context(cafile=cafile)


def open_socket(
    address: Address,
    timeout: float | None,
    ssl_context: ssl.SSLContext | None = None,
    cafile: str | None = None,
) -> socket.socket:
    """A socket connected to *address* (TLS handshake done); raises CannotConnect."""
    sock: socket.socket | None = None
    try:
        if address.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(address.path)
            return sock
        sock = socket.create_connection((address.host, address.port), timeout)
        # Requests are small and latency-bound: do not let Nagle hold them back.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if address.scheme == "tls":
            context = tls_context(ssl_context, cafile)
            sock = context.wrap_socket(sock, server_hostname=address.host)
        return sock
    except (OSError, ValueError) as error:
        if sock is not None:
            sock.close()
        raise CannotConnect(
            f"cannot connect to {address}: {error}", address=address.text
        ) from error


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
    """Connect to the daemon at *address* and register as *client*.

    *address* defaults to ``$CQSD_ADDRESS``, else ``unix://./cqsd-data/cqsd.sock``;
    *client* to ``$CQSD_CLIENT``. ``cold=True`` is a cold start: whatever the
    client still held from a previous connection goes to the cold queue; a warm
    start (the default) gets it back, listed in ``Client.resync_locks``.
    *timeout* bounds connecting and registering, not later requests (a read
    may wait as long as it asks to). For ``tls://`` addresses, *ssl_context*
    (else a default context, trusting *cafile* if given) checks the server.
    ``operator=True`` opens an operator session, as cqsctl does: it takes no
    ``max_clients`` slot and never collides with another session of the same
    name (the client must be allowed operator requests).

    Raises ValueError for a malformed address or a missing client name,
    CannotConnect (a ConnectionLost) if the daemon cannot be reached or drops
    the connection while registering, and the CQSError of a refused
    registration (NotAuthorized, ClientActive, ClientLimit, ShuttingDown, ...).
    """
    parsed = parse_address(address)
    name = client_name(client)
    sock = open_socket(parsed, timeout, ssl_context, cafile)
    connection = Connection(sock, parsed.text, timeout)
    call = ops.register(name, secret, cold, operator)
    try:
        session = call.finish(connection.roundtrip(call.request))
    except ConnectionLost as error:
        connection.close()
        raise CannotConnect(
            f"cannot register with {parsed}: {error.message}", address=parsed.text
        ) from error
    except BaseException:
        connection.close()
        raise
    connection.end_handshake(max_frame_for(session.max_message))
    return Client(connection, name, session)


class Client:
    """A registered client on one connection; thread-safe, usable as a context manager.

    Attributes: ``name``, ``address``, ``server`` (the daemon's version string),
    ``max_message`` (the largest message it accepts), ``structures`` (the names
    it defines) and ``resync_locks`` (what this client still held when its last
    connection dropped: :class:`HeldLock` values).
    """

    def __init__(self, connection: Connection, name: str, session: ops.Session) -> None:
        self._conn = connection
        self.name = name
        self.address = connection.address
        self.server = session.server
        self.server_version = session.version
        self.max_message = session.max_message
        self.structures: list[str] = session.structures
        self.resync_locks: list[HeldLock] = session.locks

    def __repr__(self) -> str:
        state = "closed" if self._conn.lost else "open"
        return f"<cqsclient.Client {self.name!r} at {self.address} ({state})>"

    def _do(self, call: Call) -> Any:
        return call.finish(self._conn.roundtrip(call.request))

    @property
    def closed(self) -> bool:
        """True once the connection is closed or lost."""
        return self._conn.lost

    def structure(self, name: str) -> StructureHandle:
        """A handle on structure *name*; raises UnknownStructure if it is not defined."""
        stats = self._do(ops.connect(name))
        return StructureHandle(self, name, stats)

    def register_interest(self, structure: str, queue: str, qtype: QType = "TRAN") -> None:
        """Be notified when the queue goes from empty to non-empty (at once if it has work)."""
        self._do(ops.register_interest(structure, queue, qtype))

    def deregister_interest(self, structure: str, queue: str, qtype: QType = "TRAN") -> None:
        """Stop the notifications for the queue."""
        self._do(ops.deregister_interest(structure, queue, qtype))

    def notifications(self, timeout: float = 1.0) -> Iterator[Notification]:
        """Yield notifications as they arrive; stop once *timeout* seconds pass without one.

        Raises ConnectionLost if the connection drops (after yielding what came before).
        """
        while True:
            note = self._conn.next_notification(timeout)
            if note is None:
                return
            yield note

    def query(self, kind: str, structure: str | None = None) -> list[dict[str, Any]]:
        """The rows of a display: structures, queues, clients, locks, headers or backups."""
        result: list[dict[str, Any]] = self._do(ops.query(kind, structure))
        return result

    def checkpoint(self, structure: str) -> dict[str, Any]:
        """Checkpoint a structure to its SRDS now (BACKUP CFSTRUCT); waits for the job
        and returns its report (slot, lsn, rows, seconds)."""
        result: dict[str, Any] = self._do(ops.checkpoint(structure))
        return result

    def recover(self, structure: str, purge: bool = False) -> dict[str, Any]:
        """RECOVER CFSTRUCT: the structure is failed, rebuilt from its newest checkpoint
        and the log (or emptied, with *purge*), and available again; returns a report."""
        result: dict[str, Any] = self._do(ops.recover(structure, purge))
        return result

    def alter(self, structure: str, size: int) -> dict[str, Any]:
        """SETXCF START,ALTER: set a structure's current size in bytes (up to its SIZE,
        never below what is in use); returns its stats."""
        result: dict[str, Any] = self._do(ops.alter(structure, size))
        return result

    def rebuild(self, structure: str, size: int | None = None) -> dict[str, Any]:
        """Structure copy: every message copied to a new instance (with a new SIZE if
        given) while requests wait; returns its stats."""
        result: dict[str, Any] = self._do(ops.rebuild(structure, size))
        return result

    def delete_structure(self, structure: str) -> dict[str, Any]:
        """SETXCF FORCE: empty a structure (and its overflow structure) and its
        checkpoints, so that nothing in it is ever recovered."""
        result: dict[str, Any] = self._do(ops.delete_structure(structure))
        return result

    def deregister(self) -> None:
        """End the session cleanly (the daemon releases its state), then close."""
        self._conn.expect_close("deregistered by this client")
        try:
            self._do(ops.deregister())
        finally:
            self._conn.close()

    def close(self) -> None:
        """Close the connection without deregistering (the daemon treats it as a drop).

        Idempotent. Requests in flight in other threads get ConnectionLost.
        """
        self._conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._conn.lost:
            return
        try:
            self.deregister()
        except CQSError:
            # Leaving with an error already: deregistering is a courtesy, and
            # its failure must not hide the error that ended the block.
            if exc is None:
                raise


class StructureHandle:
    """The requests on one structure; from :meth:`Client.structure`.

    ``stats`` is the structure's row as it was when the handle was made.
    """

    def __init__(self, client: Client, name: str, stats: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self.stats = stats

    def __repr__(self) -> str:
        return f"<StructureHandle {self.name!r} of {self.client!r}>"

    def _do(self, call: Call) -> Any:
        return self.client._do(call)

    def put(
        self, queue: str, data: Payload, qtype: QType = "TRAN", recoverable: bool = True
    ) -> int:
        """Put a message; returns its entry id. Raises MessageTooLarge before sending."""
        call = ops.put(self.name, queue, data, qtype, recoverable, self.client.max_message)
        entry_id: int = self._do(call)
        return entry_id

    def put_batch(
        self,
        queue: str,
        payloads: Iterable[Payload],
        qtype: QType = "TRAN",
        recoverable: bool = True,
    ) -> list[int]:
        """Put several messages in one atomic commit; returns their entry ids in order."""
        max_message = self.client.max_message
        call = ops.put_batch(self.name, queue, payloads, qtype, recoverable, max_message)
        entry_ids: list[int] = self._do(call)
        return entry_ids

    def read(self, queue: str, qtype: QType = "TRAN", wait: float | None = None) -> Message | None:
        """Read and lock the next message, waiting up to *wait* seconds; None if there is none."""
        message: Message | None = self._do(ops.read(self.name, queue, qtype, wait))
        return message

    def read_batch(
        self, queue: str, n: int, qtype: QType = "TRAN", wait: float | None = None
    ) -> list[Message]:
        """Read and lock up to *n* messages; [] if there is none (after waiting)."""
        messages: list[Message] = self._do(ops.read_batch(self.name, queue, n, qtype, wait))
        return messages

    def delete(self, entry_id: int) -> None:
        """Delete a message this client holds locked (LOCK_NOT_HELD otherwise)."""
        self._do(ops.delete(self.name, entry_id))

    def unlock(
        self,
        entry_id: int,
        failed: bool = False,
        queue: str | None = None,
        qtype: QType | None = None,
    ) -> Location:
        """Give back a locked message; ``failed`` counts a failed delivery (and may
        suspend it); *queue*/*qtype* put it on another queue. Returns where it went."""
        location: Location = self._do(ops.unlock(self.name, entry_id, failed, queue, qtype))
        return location

    def move(self, entry_id: int, queue: str, qtype: QType = "TRAN") -> None:
        """Move a message not locked by another client to another queue."""
        self._do(ops.move(self.name, entry_id, queue, qtype))

    def browse(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int = ops.BROWSE_PAGE,
        cursor: Any = None,
    ) -> BrowsePage:
        """One page of messages (nothing locked): a list with a ``cursor`` attribute
        to pass back for the next page (None when done). With *queue* and no
        *qtype* the type is TRAN; with neither, the whole structure is browsed."""
        page: BrowsePage = self._do(ops.browse(self.name, queue, qtype, limit, cursor))
        return page

    def browse_all(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int | None = None,
        page_size: int = ops.BROWSE_PAGE,
    ) -> Iterator[Message]:
        """Every message (at most *limit*), following cursors page by page."""
        cursor: Any = None
        count = 0
        while True:
            size = page_size if limit is None else min(page_size, limit - count)
            if size <= 0:
                return
            page = self.browse(queue, qtype, size, cursor)
            for message in page:
                yield message
            count += len(page)
            cursor = page.cursor
            if cursor is None or not page:
                return

    def unit_of_work(self) -> UnitOfWork:
        """A context manager gathering puts, deletes, moves and unlocks into one commit."""
        return UnitOfWork(self)

    # --- operator requests ---

    def operator_delete(self, entry_id: int) -> None:
        """Delete any message not locked by another client (operator delete)."""
        self._do(ops.delete(self.name, entry_id, operator=True))

    def requeue(self, entry_id: int) -> Location:
        """Put a cold or suspended message back on its home queue; returns where."""
        location: Location = self._do(ops.requeue(self.name, entry_id))
        return location

    def dequeue(self, queue: str, qtype: QType = "TRAN") -> int:
        """Delete every message of the queue; returns how many went."""
        count: int = self._do(ops.dequeue(self.name, queue, qtype))
        return count

    def query(self, kind: str) -> list[dict[str, Any]]:
        """The rows of a display, for this structure only."""
        return self.client.query(kind, self.name)


class UnitOfWork(UnitOfWorkBase):
    """Reads now, one commit at the end; see :mod:`cqsclient.unitofwork`."""

    def __init__(self, handle: StructureHandle) -> None:
        super().__init__(handle.name, handle.client.max_message)
        self._handle = handle

    def read(self, queue: str, qtype: QType = "TRAN", wait: float | None = None) -> Message | None:
        """Read and lock a message now; it is given back if the unit of work fails."""
        self._check_open()
        message = self._handle.read(queue, qtype, wait)
        if message is not None:
            self._note_read([message])
        return message

    def read_batch(
        self, queue: str, n: int, qtype: QType = "TRAN", wait: float | None = None
    ) -> list[Message]:
        """Read and lock up to *n* messages now; given back if the unit of work fails."""
        self._check_open()
        messages = self._handle.read_batch(queue, n, qtype, wait)
        self._note_read(messages)
        return messages

    def __enter__(self) -> UnitOfWork:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._give_back(exc)
            return
        call = self._commit_call()
        if call is None:
            return
        try:
            self.entry_ids = self._handle._do(call)
        except ConnectionLost:
            raise
        except CQSError as error:
            # The daemon applied none of it: give the reads back, then report.
            self._give_back(error)
            raise

    def _give_back(self, cause: BaseException) -> None:
        if isinstance(cause, ConnectionLost):
            self._closed = True
            return
        for call in self._giveback_calls():
            try:
                self._handle._do(call)
            except ConnectionLost:
                return  # the daemon's peer recovery releases them
            except ALREADY_RELEASED:
                continue
            except CQSError as error:
                self._note_giveback_error(cause, call.request["entry_id"], error)
