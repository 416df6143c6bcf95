"""The blocking client: :func:`connect`, :class:`Client`, :class:`StructureHandle`.

Every method builds its request with :mod:`cqsclient.ops` and sends it over
a :class:`~cqsclient.connection.Connection`, which any number of threads may
share (their requests are pipelined): to one daemon, one connection; in a
group, one per node that owns a structure the client uses, each request on
its structure's owner's (:mod:`cqsclient.routes`). With ``reconnect``, a lost
connection is replaced by a new one (:mod:`cqsclient.reconnect`) under the
same Client, so handles, units of work and consumers carry on. The async
client in :mod:`cqsclient.aio` has the same names.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, Literal

from cqsproto import max_frame_for

from . import ops
from .address import Address, parse_address
from .connection import Abandoned, Connection
from .consume import Consumer, Delivery
from .credentials import secret_from_env
from .errors import (
    CannotConnect,
    ClientActive,
    ClientLimit,
    ConnectionLost,
    CQSError,
    NotOwner,
    RequestTimeout,
    ShuttingDown,
    StructureFailed,
)
from .group import Patience, Targets, keepalive_for, misdirection, parse_targets, redirect
from .keys import Keys
from .model import (
    BrowsePage,
    HeldLock,
    Location,
    Message,
    Notification,
    SmdsAccess,
    SmdsExpand,
    SmdsStatus,
)
from .ops import CLIENT_TIMEOUT, Call, Payload, QType, Timeout
from .reconnect import LockBook, Reconnect, Resync, policy
from .routes import Routes
from .source import HandleSource
from .unitofwork import ALREADY_RELEASED, UnitOfWorkBase

__all__ = ["Client", "Consumer", "Delivery", "StructureHandle", "UnitOfWork", "connect"]

log = logging.getLogger("cqsclient")

CLIENT_ENV: Final = "CQSD_CLIENT"
DEFAULT_TIMEOUT: Final = 10.0

# What a reconnect attempt may meet and try again after: the daemon is down or
# restarting, still has the old connection's name (a daemon without takeover),
# or is full for now. Anything else (NotAuthorized, ...) ends the reconnect.
TRANSIENT: Final = (ConnectionLost, RequestTimeout, ShuttingDown, ClientActive, ClientLimit)
# seconds a notifications() wait gives each connection in turn when interests are
# served by several nodes (a notification waits at most this long per other node)
NOTE_TURN: Final = 0.05

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
    reconnect: bool | Reconnect = False,
    ssl_context: ssl.SSLContext | None = None,
    cafile: str | None = None,
    operator: bool = False,
    keepalive: float | None = None,
) -> Client:
    """Connect to the daemon at *address* and register as *client*.

    *address* defaults to ``$CQSD_ADDRESS``, else ``unix://./cqsd-data/cqsd.sock``;
    for a group (docs/sdk.md, Groups) it may list several, comma-separated, or be
    ``etcd://HOST:PORT/GROUP``: they are tried in turn, and a request the node
    does not own is followed to the owner (:mod:`cqsclient.group`). *keepalive*
    (seconds; 0 for none; default 2.5 for a group, none for one daemon) declares
    the connection lost when a request waits that long without a word from the
    daemon (:mod:`cqsclient.keepalive`).
    *client* to ``$CQSD_CLIENT``; *secret* to ``$CQSD_SECRET``, else the first line of
    the file ``$CQSD_SECRET_FILE`` names (:mod:`cqsclient.credentials`).
    ``cold=True`` is a cold start: whatever the client still held from a previous
    connection goes to the cold queue; a warm start (the default) gets it back,
    listed in ``Client.resync_locks``.
    *timeout* bounds connecting and registering, and is every request's default
    timeout (beyond a read's ``wait``; jobs such as checkpoint have none): see
    RequestTimeout for what a timed-out request did. *reconnect* (True, or a
    :class:`~cqsclient.reconnect.Reconnect` policy) replaces a lost connection,
    warm (see :mod:`cqsclient.reconnect`). For ``tls://`` addresses,
    *ssl_context* (else a default context, trusting *cafile* if given) checks
    the server.
    ``operator=True`` opens an operator session, as cqsctl does: it takes no
    ``max_clients`` slot and never collides with another session of the same
    name (the client must be allowed operator requests).

    Raises ValueError for a malformed address or a missing client name,
    CannotConnect (a ConnectionLost) if the daemon cannot be reached or drops
    the connection while registering, and the CQSError of a refused
    registration (NotAuthorized, ClientActive, ClientLimit, ShuttingDown, ...).
    """
    targets = parse_targets(address)
    secret = secret if secret is not None else secret_from_env()
    dialer = Dialer(targets, client_name(client), secret, timeout, ssl_context, cafile, operator,
                    keepalive_for(targets, keepalive))
    connection, session = dialer.open(cold, {})
    return Client(dialer, connection, session, policy(reconnect))


class Dialer:
    """Opens a registered connection: for connect(), and again for each reconnect."""

    def __init__(
        self,
        targets: Targets,
        name: str,
        secret: str | None,
        timeout: float | None,
        ssl_context: ssl.SSLContext | None,
        cafile: str | None,
        operator: bool = False,
        keepalive: float | None = None,
    ) -> None:
        self.targets = targets
        self.keepalive = keepalive
        self.operator = operator
        self.name = name
        self.secret = secret
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.cafile = cafile

    def open(
        self, cold: bool, takeover: Mapping[str, str], only: Address | None = None
    ) -> tuple[Connection, ops.Session]:
        """A new connection, registered (taking the name over with the token
        *takeover* holds for its address, if any), to the first of the targets
        that takes it, or to *only*."""
        if only is not None:
            return self._open(only, cold, takeover)
        return self.targets.dial(lambda address: self._open(address, cold, takeover))

    def _open(
        self, parsed: Address, cold: bool, takeover: Mapping[str, str]
    ) -> tuple[Connection, ops.Session]:
        sock = open_socket(parsed, self.timeout, self.ssl_context, self.cafile)
        connection = Connection(sock, parsed.text, self.keepalive)
        call = ops.register(self.name, self.secret, cold, self.operator,
                            takeover.get(parsed.text))
        try:
            session: ops.Session = call.finish(connection.roundtrip(call, self.timeout))
        except (ConnectionLost, RequestTimeout) as error:
            connection.close()
            raise CannotConnect(
                f"cannot register with {parsed}: {error.message}", address=parsed.text
            ) from error
        except BaseException:
            connection.close()
            raise
        connection.max_frame = max_frame_for(session.max_message)
        return connection, session


class Client:
    """A registered client on one connection; thread-safe, usable as a context manager.

    Attributes: ``name``, ``address``, ``server`` (the daemon's version string),
    ``max_message`` (the largest message it accepts), ``structures`` (the names
    it defines), ``resync_locks`` (what this client still held when its last
    connection dropped: :class:`HeldLock` values), ``resumed_interests`` (the
    interests the daemon kept for it, from an earlier connection or before the
    daemon restarted, as ``(structure, queue, qtype)``: they notify this
    connection without a ``register_interest``), ``timeout`` (the requests'
    default timeout), ``reconnect`` (the policy, or None), ``last_resync``
    (the :class:`~cqsclient.reconnect.Resync` report of the last reconnect) and
    ``owners`` (in a group, the node each structure's requests go to).
    ``address`` is the home node's: the one for requests naming no structure.
    """

    def __init__(
        self,
        dialer: Dialer,
        connection: Connection,
        session: ops.Session,
        reconnect: Reconnect | None = None,
    ) -> None:
        self._dialer = dialer
        self._conn = connection  # the home link: requests of no structure, or of one not placed
        # one registered connection per node this client needs, and its takeover token
        self._links: dict[str, Connection] = {connection.address: connection}
        self._tokens: dict[str, str] = {}
        self._routes = Routes(connection.address)
        self.name = dialer.name
        self.address = connection.address
        self.timeout = dialer.timeout
        self.reconnect = reconnect
        self.last_resync: Resync | None = None
        self._keys = Keys()  # each connect() draws a new incarnation
        self._session(connection, session)
        self._closing = False
        self._reconnect_lock = threading.Lock()
        # What a reconnect restores: the locks the application holds and its interests.
        self._book_lock = threading.Lock()
        self._book: LockBook | None = None
        self._interests: dict[tuple[str, str, QType], None] = {}
        if reconnect is not None:
            self._book = LockBook()
            self._book.adopt(session.locks)

    def _session(self, connection: Connection, session: ops.Session) -> None:
        if session.token is not None:
            self._tokens[connection.address] = session.token
        if connection is not self._conn:
            return  # another node's link: the client's attributes are the home's
        self.server = session.server
        self.server_version = session.version
        self.max_message = session.max_message
        self.structures: list[str] = session.structures
        self.resync_locks: list[HeldLock] = session.locks
        # the interests the daemon kept and registered again for this connection
        self.resumed_interests: list[ops.Interest] = session.interests
        self._keys.window = session.dedup_window

    def __repr__(self) -> str:
        state = "closed" if self._conn.lost else "open"
        return f"<cqsclient.Client {self.name!r} at {self.address} ({state})>"

    @property
    def owners(self) -> dict[str, str]:
        """The address of the node each structure's requests go to, as far as this
        client knows (in a group, its owner; docs/sdk.md, Groups)."""
        with self._reconnect_lock:
            return self._routes.owners()

    def _link(self, structure: str) -> Connection:
        """The connection a request on *structure* goes on: its owner's, else home."""
        return self._links.get(self._routes.address(structure), self._conn)

    def _do(
        self,
        call: Call,
        timeout: Timeout = CLIENT_TIMEOUT,
        cancelled: Callable[[], bool] | None = None,
    ) -> Any:
        seconds = ops.seconds(timeout, self.timeout, call)
        patience: Patience | None = None
        stamped = self._keys.stamp(call)
        structure = call.structure
        while True:
            conn = self._link(structure)
            try:
                result = call.finish(conn.roundtrip(call, seconds, cancelled))
            except (NotOwner, StructureFailed) as refused:
                # nothing was applied: follow the owner, or wait for one (cqsclient.group)
                where = redirect(refused, structure)
                if where is None or self._closing:
                    raise
                patience = patience or Patience(self.reconnect)
                if not (where and patience.quick_hop(refused)):
                    conn.nap(patience.next_delay(refused))
                    if cancelled is not None and cancelled():
                        raise Abandoned(f"{call.request['op']} abandoned") from refused
                if where:
                    self._follow(structure, where)
                continue
            except ConnectionLost as lost:
                if self.reconnect is None or self._closing:
                    raise
                self._reconnect(conn, lost, cancelled)
                if lost.applied is False or call.retry or self._keys.may_resend(call, stamped):
                    continue  # a put or commit sent again with its key is applied once
                lost.add_note(
                    "the client has reconnected; whether the daemon applied this request "
                    "is unknown (see Client.last_resync for the locks)"
                )
                raise
            if structure and not self._routes.knows(structure, conn.address):
                self._served(structure, conn)
            if self._book is not None:
                with self._book_lock:
                    self._book.note(call, result)
            return result

    # --- routing (cqsclient.routes) ---

    def _served(self, structure: str, conn: Connection) -> None:
        """A request on *structure* succeeded on *conn*: its node serves it."""
        with self._reconnect_lock:
            if self._links.get(conn.address) is not conn:
                return  # replaced meanwhile: the next request finds out again
            if self._routes.served(structure, conn.address):
                self._restore_interests(conn, {structure})

    def _follow(self, structure: str, owner: str) -> None:
        """Send *structure*'s requests to the node at *owner* a NOT_OWNER named: on
        the link there, opened (registered warm, as a reconnect does) if there is
        none; left as it is if the owner cannot be reached now (the caller waits and
        asks again). Links left owning nothing are closed."""
        resync: Resync | None = None
        with self._reconnect_lock:
            link = self._links.get(owner)
            if link is None or link.lost:
                started = time.monotonic()
                served = self._routes.served_by(owner)
                try:
                    target = parse_address(owner)
                    link, session = self._dialer.open(False, self._tokens, only=target)
                    resync = self._resync(link, session, f"moved to the owner at {owner}",
                                          1, started, within=served | {structure},
                                          interests_in=served)
                except (ValueError, *TRANSIENT):
                    return
                self._dialer.targets.prefer = target
            restored = self._restore_interests(link, {structure})
            if resync is not None:
                resync = replace(resync, interests=[*resync.interests, *(restored or [])])
                self._add_link(link, session, resync)
            self._routes.followed(structure, owner, restored is not None)
            retired = self._settle()
        self._retire(retired)
        if resync is not None and self.reconnect is not None:
            self.reconnect.done(resync)

    def _add_link(self, connection: Connection, session: ops.Session, resync: Resync) -> None:
        """*connection* is the client's link to its node (under the reconnect lock)."""
        if self._book is not None:
            with self._book_lock:
                self._book.lose(resync.lost)
        self._links[connection.address] = connection
        self._session(connection, session)
        self.last_resync = resync

    def _settle(self) -> list[Connection]:
        """Move the home if it serves nothing; the links no longer needed, taken out
        (under the reconnect lock)."""
        retired = self._routes.settle(a for a, c in self._links.items() if not c.lost)
        home = self._links[self._routes.home]
        if home is not self._conn:
            self._conn = home
            self.address = home.address
        return [self._links.pop(address) for address in retired]

    def _retire(self, links: list[Connection]) -> None:
        """Deregister from nodes this client no longer needs (a courtesy: the node
        frees the name at once), then close."""
        for old in links:
            old.expect_close("no structure of this client is served there any more")
            try:
                call = ops.deregister()
                call.finish(old.roundtrip(call, self.timeout))
            except CQSError:
                pass
            old.close()

    def _restore_interests(
        self, conn: Connection, structures: set[str]
    ) -> list[tuple[str, str, QType]] | None:
        """Register on *conn* the interests in *structures*, which moved to its node;
        those registered, or None if the node refused one (it does not serve it yet)."""
        done: list[tuple[str, str, QType]] = []
        for interest in list(self._interests):
            if interest[0] in structures:
                call = ops.register_interest(*interest)
                try:
                    call.finish(conn.roundtrip(call, self.timeout))
                except CQSError:
                    return None
                done.append(interest)
        return done

    # --- reconnecting ---

    def _reconnect(
        self, failed: Connection, lost: ConnectionLost, cancelled: Callable[[], bool] | None
    ) -> None:
        """Replace *failed* (unless another thread did already): in a group where
        another link is alive, by routing its structures afresh (they follow their
        next owner); else by a new registered connection. Raises *lost* if the
        policy gives up or the client closes."""
        assert self.reconnect is not None and self._book is not None
        with self._reconnect_lock:
            if self._links.get(failed.address) is not failed:
                return
            self._dialer.targets.lost(failed.address)
            if any(not c.lost for c in self._links.values() if c is not failed):
                del self._links[failed.address]
                gone = self._routes.lost(failed.address)
                retired = self._settle()
            else:
                retired = None
                resync = self._redial(failed, lost, cancelled)
        if retired is None:
            self.reconnect.done(resync)
            return
        self._retire(retired)
        # Its locks stay this client's at their next owner if it is connected there
        # (docs/group.md); its interests are registered there once the owner is found.
        for structure in sorted({i[0] for i in self._interests} & gone):
            try:
                self._do(ops.connect(structure), self.timeout, cancelled)
            except CQSError as error:
                log.warning("cqsd interests in %s wait for its next owner: %s", structure, error)

    def _redial(
        self, failed: Connection, lost: ConnectionLost, cancelled: Callable[[], bool] | None
    ) -> Resync:
        """A new registered connection to the first target that takes it, backing off
        (under the reconnect lock); its report."""
        assert self.reconnect is not None
        started = time.monotonic()
        attempts = 0
        for delay in self.reconnect.delays():
            failed.nap(delay)
            if self._closing:
                raise lost
            if cancelled is not None and cancelled():
                raise Abandoned("reconnect abandoned") from lost
            attempts += 1
            try:
                connection, session = self._dialer.open(False, self._tokens)
                resync = self._resync(connection, session, lost.message, attempts, started,
                                      probe=True)
            except TRANSIENT as error:
                self.reconnect.failed(attempts, started, error, lost)
                continue
            self._install(connection, session, resync)
            return resync
        raise AssertionError("the reconnect policy's delays never end")

    def _install(self, connection: Connection, session: ops.Session, resync: Resync) -> None:
        """*connection* is the client's only link from now on (under the reconnect lock)."""
        for old in self._links.values():
            old.close()
        self._links = {}
        self._conn = connection
        self.address = connection.address
        self._routes.reset(connection.address)
        self._add_link(connection, session, resync)
        self.resync_locks = resync.kept

    def _resync(
        self,
        connection: Connection,
        session: ops.Session,
        cause: str,
        attempts: int,
        started: float,
        probe: bool = False,
        within: set[str] | None = None,
        interests_in: set[str] | None = None,
    ) -> Resync:
        """On the new connection, before anyone else uses it: give back the orphans
        and register the interests again; the report. With *within* (the structures
        that node serves) only their locks are resynced and their interests
        registered (those in *interests_in* instead, if given). Misdirected if the node does
        not own (or nobody owns) a structure of the interests, or with *probe* one
        the application holds locks in (their resync would be wrong there)."""
        try:
            if probe and self._book is not None:
                with self._book_lock:
                    held = self._book.structures()
                for structure in sorted(held):
                    call = ops.connect(structure)
                    try:
                        call.finish(connection.roundtrip(call, self.timeout))
                    except (NotOwner, StructureFailed) as refused:
                        raise misdirection(self._dialer.targets, connection.address, refused,
                                           structure) from refused
                    except CQSError:
                        pass  # the resync says what became of its locks
            kept, gone, orphans = session.locks, list[HeldLock](), list[HeldLock]()
            if self._book is not None:
                with self._book_lock:
                    kept, gone, orphans = self._book.resync(session.locks, within)
            for lock in orphans:
                unlock = ops.unlock(lock.structure, lock.entry_id)
                try:
                    unlock.finish(connection.roundtrip(unlock, self.timeout))
                except (ConnectionLost, RequestTimeout):
                    raise
                except CQSError:
                    pass  # released already, or its structure failed: not ours to hold
            scope = within if interests_in is None else interests_in
            interests: list[tuple[str, str, QType]] = [
                i for i in self._interests if scope is None or i[0] in scope]
            for structure, queue, qtype in interests:
                if ops.interest(structure, queue, qtype) in session.interests:
                    continue  # the daemon kept it (it restarted, or this is the same one)
                call = ops.register_interest(structure, queue, qtype)
                try:
                    call.finish(connection.roundtrip(call, self.timeout))
                except (NotOwner, StructureFailed) as refused:
                    raise misdirection(self._dialer.targets, connection.address, refused,
                                       structure) from refused
        except BaseException:
            connection.close()
            raise
        return Resync(cause, attempts, time.monotonic() - started, kept, gone, orphans,
                      list(interests))

    def _release(self, structure: str, entry_id: int) -> None:
        """Give back a lock the application never saw (read ahead), without
        reconnecting for it: on a lost connection the next resync gives it back
        (it is an orphan then), or peer recovery does."""
        if self._book is not None:
            with self._book_lock:
                self._book.forget((structure, entry_id))
        call = ops.unlock(structure, entry_id)
        try:
            call.finish(self._link(structure).roundtrip(call, self.timeout))
        except (ConnectionLost, RequestTimeout, *ALREADY_RELEASED):
            pass

    def holds(self, structure: str, entry_id: int) -> bool | None:
        """Whether the application still holds the lock on *entry_id* as far as this
        client knows (None without ``reconnect``, which keeps no book)."""
        if self._book is None:
            return None
        with self._book_lock:
            return (structure, entry_id) in self._book

    @property
    def closed(self) -> bool:
        """True once the connection is closed or lost."""
        return self._conn.lost

    def ping(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> float:
        """A round trip to the daemon (the keepalive's ``ping``); the seconds it took."""
        started = time.monotonic()
        self._do(ops.ping(), timeout)
        return time.monotonic() - started

    def structure(self, name: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> StructureHandle:
        """A handle on structure *name*; raises UnknownStructure if it is not defined."""
        stats = self._do(ops.connect(name), timeout)
        return StructureHandle(self, name, stats)

    def register_interest(
        self, structure: str, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Be notified when the queue goes from empty to non-empty (at once if it has work)."""
        self._do(ops.register_interest(structure, queue, qtype), timeout)
        self._interests[(structure, queue, qtype)] = None

    def deregister_interest(
        self, structure: str, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Stop the notifications for the queue."""
        self._interests.pop((structure, queue, qtype), None)
        self._do(ops.deregister_interest(structure, queue, qtype), timeout)

    def notifications(self, timeout: float = 1.0) -> Iterator[Notification]:
        """Yield notifications as they arrive; stop once *timeout* seconds pass without one.

        Raises ConnectionLost if the connection drops (after yielding what came
        before), unless the client reconnects: then the interests are registered
        again (each queue holding work notifies at once) and the wait goes on. In
        a group each notification comes from the node owning its structure: with
        links to several nodes the wait takes turns of NOTE_TURN seconds on each.
        """
        while True:
            links = [c for c in list(self._links.values()) if not c.lost] or [self._conn]
            deadline = time.monotonic() + timeout
            try:
                note = self._next_note(links, deadline)
            except _LinkLost as gone:
                if self._closing:
                    raise gone.lost from None
                if self._links.get(gone.conn.address) is not gone.conn:
                    continue  # closed by a move, or replaced: wait on the links there are
                if self.reconnect is None:
                    raise gone.lost from None
                self._reconnect(gone.conn, gone.lost, None)
                continue
            if note is None:
                return
            yield note

    @staticmethod
    def _next_note(links: list[Connection], deadline: float) -> Notification | None:
        """The next notification on any of *links* before *deadline*; None if none came."""
        while True:
            remaining = deadline - time.monotonic()
            turn = remaining if len(links) == 1 else min(remaining, NOTE_TURN)
            for conn in links:
                try:
                    note = conn.next_notification(max(turn, 0.0))
                except ConnectionLost as lost:
                    raise _LinkLost(conn, lost) from lost
                if note is not None:
                    return note
            if remaining <= 0:
                return None

    def query(
        self, kind: str, structure: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """The rows of a display: structures, queues, clients, locks, headers or backups."""
        result: list[dict[str, Any]] = self._do(ops.query(kind, structure), timeout)
        return result

    def checkpoint(self, structure: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> dict[str, Any]:
        """Checkpoint a structure to its SRDS now (BACKUP CFSTRUCT); waits for the job
        and returns its report (slot, lsn, rows, seconds)."""
        result: dict[str, Any] = self._do(ops.checkpoint(structure), timeout)
        return result

    def recover(
        self, structure: str | Sequence[str], purge: bool = False, *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """RECOVER CFSTRUCT: the structure is failed, rebuilt from its newest checkpoint
        and the log (or emptied, with *purge*), and available again; returns a report.
        Given a list of structures (no *purge*), they are recovered together by one
        job: ``{"recovered": [a report each], "failed": {name: why}}``; those failed
        stay failed."""
        result: dict[str, Any] = self._do(ops.recover(structure, purge), timeout)
        return result

    def alter(
        self, structure: str, size: int, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """SETXCF START,ALTER: set a structure's current size in bytes (up to its SIZE,
        never below what is in use); returns its stats."""
        result: dict[str, Any] = self._do(ops.alter(structure, size), timeout)
        return result

    def rebuild(
        self, structure: str, size: int | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """Structure copy: every message copied to a new instance (with a new SIZE if
        given) while requests wait; returns its stats."""
        result: dict[str, Any] = self._do(ops.rebuild(structure, size), timeout)
        return result

    def delete_structure(
        self, structure: str, *, force: bool = False, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """SETXCF FORCE: empty a structure (and its overflow structure) and its
        checkpoints, so that nothing in it is ever recovered. Only an empty one
        unless *force*: InvalidRequest says how many messages it holds."""
        result: dict[str, Any] = self._do(ops.delete_structure(structure, force), timeout)
        return result

    # --- shared message data sets (docs/smds.md) ---

    def reset_smds(
        self, structure: str, owner: str, *, access: SmdsAccess | None = None,
        status: SmdsStatus | None = None, timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """RESET SMDS: mark the data set of *owner* in *structure* FAILED (closed at
        once, to be recovered) or RECOVERED (restart processing makes it ACTIVE),
        and/or its ACCESS enabled (a retry) or disabled (closed normally); returns
        its ``display cfstatus`` row."""
        result: dict[str, Any] = self._do(ops.reset_smds(structure, owner, access, status),
                                          timeout)
        return result

    def start_smdsconn(
        self, structure: str, owner: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """START SMDSCONN: make the daemon's connection to the data set of *owner* (or
        every data set of *structure*) available and try to open it; returns the
        ``display smdsconn`` rows."""
        result: list[dict[str, Any]] = self._do(ops.start_smdsconn(structure, owner), timeout)
        return result

    def stop_smdsconn(
        self, structure: str, owner: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """STOP SMDSCONN: close the data set normally (its space map saved) and keep it
        closed, across restarts, until started; returns the ``display smdsconn`` rows."""
        result: list[dict[str, Any]] = self._do(ops.stop_smdsconn(structure, owner), timeout)
        return result

    def alter_smds(
        self, structure: str, owner: str, *, dsbufs: int | Literal["default"] | None = None,
        dsexpand: SmdsExpand | None = None, timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """ALTER SMDS: the data set's DSBUFS and DSEXPAND overrides (``"default"`` drops
        one); turning expansion on retries it. Returns its ``display smds`` row."""
        result: dict[str, Any] = self._do(
            ops.alter_smds(structure, owner, dsbufs, dsexpand), timeout)
        return result

    def fail_structure(
        self, structure: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """RESET CFSTRUCT ACTION(FAIL), for recovery drills: the structure (with its
        overflow structure) is failed, its requests get STRUCTURE_FAILED, until
        ``recover`` rebuilds it; returns {structure, status, messages}."""
        result: dict[str, Any] = self._do(ops.fail_structure(structure), timeout)
        return result

    def move_structure(
        self, structure: str, to: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """SETXCF START,REBUILD in a group: move the pair *structure* to node *to* by a
        planned move (its clients pause for under a second); returns {structure,
        owner, epoch, seconds} once *to* serves it."""
        result: dict[str, Any] = self._do(ops.move_structure(structure, to), timeout)
        return result

    # --- leaving ---

    def deregister(self) -> None:
        """End the session cleanly (the daemon frees the name and gives back this
        client's locks, unfailed), then close. Raises what the request raises."""
        self._closing = True
        conn = self._conn
        self._retire([c for c in self._links.values() if c is not conn])
        conn.expect_close("deregistered by this client")
        call = ops.deregister()
        try:
            call.finish(conn.roundtrip(call, self.timeout))
        finally:
            conn.close()
            if self._book is not None:
                self._book.clear()

    def close(self, failed: bool = False) -> None:
        """Leave: deregister, as leaving a ``with`` block does, then close.

        With ``failed=True`` (or :meth:`abort`) drop the connection instead, as a
        crash would: the daemon keeps this client's locks for ``resync_grace``
        seconds, then gives them back as failed deliveries (peer recovery).
        Idempotent; requests in flight in other threads get ConnectionLost. A
        connection already lost is only closed.
        """
        self._leave(quiet=False, failed=failed)

    def abort(self) -> None:
        """Drop the connection without deregistering: ``close(failed=True)``."""
        self._leave(quiet=True, failed=True)

    def _leave(self, quiet: bool, failed: bool) -> None:
        self._closing = True
        conn = self._conn
        if failed or conn.lost:
            for link in [*self._links.values(), conn]:
                link.close()
            return
        try:
            self.deregister()
        except (ConnectionLost, ShuttingDown):
            pass  # gone already, or going: the session ends either way
        except CQSError:
            # Deregistering is a courtesy when leaving with an error already,
            # and its failure must not hide the error that ended the block.
            if not quiet:
                raise

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(quiet=exc is not None, failed=False)


class _LinkLost(Exception):
    """A notifications() wait found *conn* lost."""

    def __init__(self, conn: Connection, lost: ConnectionLost) -> None:
        super().__init__(lost.message)
        self.conn = conn
        self.lost = lost


class StructureHandle:
    """The requests on one structure; from :meth:`Client.structure`.

    ``stats`` is the structure's row as it was when the handle was made. Every
    request takes ``timeout``: seconds (beyond a read's ``wait``) before it
    raises RequestTimeout, None for no limit; the client's by default.
    """

    def __init__(self, client: Client, name: str, stats: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self.stats = stats

    def __repr__(self) -> str:
        return f"<StructureHandle {self.name!r} of {self.client!r}>"

    def _do(self, call: Call, timeout: Timeout = CLIENT_TIMEOUT) -> Any:
        return self.client._do(call, timeout)

    def put(
        self,
        queue: str,
        data: Payload,
        qtype: QType = "TRAN",
        recoverable: bool = True,
        *,
        delay: float | None = None,
        not_before: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> int:
        """Put a message; returns its entry id. With *delay* (seconds) or *not_before*
        (epoch seconds) it is invisible to reads until then. Raises MessageTooLarge
        before sending."""
        call = ops.put(self.name, queue, data, qtype, recoverable, self.client.max_message,
                       delay, not_before)
        entry_id: int = self._do(call, timeout)
        return entry_id

    def put_batch(
        self,
        queue: str,
        payloads: Iterable[Payload],
        qtype: QType = "TRAN",
        recoverable: bool = True,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> list[int]:
        """Put several messages in one atomic commit; returns their entry ids in order."""
        max_message = self.client.max_message
        call = ops.put_batch(self.name, queue, payloads, qtype, recoverable, max_message)
        entry_ids: list[int] = self._do(call, timeout)
        return entry_ids

    def read(
        self,
        queue: str,
        qtype: QType = "TRAN",
        wait: float | None = None,
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Message | None:
        """Read and lock the next message, waiting up to *wait* seconds; None if there is
        none. With *lease*, the lock ends that many seconds after the read unless
        renewed (``renew``), and the message goes back as a failed delivery."""
        call = ops.read(self.name, queue, qtype, wait, lease)
        message: Message | None = self._do(call, timeout)
        return message

    def read_batch(
        self,
        queue: str,
        n: int,
        qtype: QType = "TRAN",
        wait: float | None = None,
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> list[Message]:
        """Read and lock up to *n* messages; [] if there is none (after waiting)."""
        call = ops.read_batch(self.name, queue, n, qtype, wait, lease)
        messages: list[Message] = self._do(call, timeout)
        return messages

    def consume(
        self,
        queue: str,
        qtype: QType = "TRAN",
        *,
        prefetch: int = 1,
        wait: float = 30.0,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Consumer:
        """Messages of the queue, one by one, as they come: ``for m in s.consume(q)``.

        Each is a :class:`Delivery` (a Message, locked by this client) to ``ack()``
        (delete) or ``nack()`` (give back; ``failed=True`` by default), or to use as
        ``with m:`` (ack on success, nack on an exception). *prefetch* messages are
        read (and locked) at a time, and an ack with none left read ahead brings the
        next ones back with it; when the queue is empty the consumer waits on
        the daemon, *wait* seconds per read. With *lease*, each is locked on a lease
        of that many seconds from its read (``renew`` it to hold it longer).
        ``stop()`` ends the loop (from another thread or a signal handler too); see
        :class:`Consumer`.
        """
        source = _Source(self, self.name, self.client)
        return Consumer(source, queue, qtype, prefetch, wait, timeout, lease)

    def delete(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Delete a message this client holds locked (LOCK_NOT_HELD otherwise)."""
        self._do(ops.delete(self.name, entry_id), timeout)

    def delete_and_read(
        self,
        entry_id: int,
        queue: str,
        n: int = 1,
        qtype: QType = "TRAN",
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> list[Message]:
        """Delete a message this client holds locked, then read and lock up to *n*
        messages of *queue* (on *lease*, as ``read``'s), in one round trip (AMQP's
        ack and next delivery); [] if the queue has none readable (it does not
        wait: ``read`` with *wait* then). Returns once the delete is durable; if it
        fails (LOCK_NOT_HELD, say) nothing is read."""
        call = ops.delete_and_read(self.name, entry_id, queue, n, qtype, lease)
        messages: list[Message] = self._do(call, timeout)
        return messages

    def renew(self, entry_id: int, lease: float, *,
              timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Renew the lease of a message this client holds: it now ends *lease* seconds
        from now. LOCK_NOT_HELD once it has expired (the message was given back as a
        failed delivery and may be someone else's)."""
        self._do(ops.renew(self.name, entry_id, lease), timeout)

    def unlock(
        self,
        entry_id: int,
        failed: bool = False,
        queue: str | None = None,
        qtype: QType | None = None,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Location:
        """Give back a locked message; ``failed`` counts a failed delivery (and may
        suspend it); *queue*/*qtype* put it on another queue. Returns where it went."""
        call = ops.unlock(self.name, entry_id, failed, queue, qtype)
        location: Location = self._do(call, timeout)
        return location

    def move(
        self, entry_id: int, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Move a message not locked by another client to another queue."""
        self._do(ops.move(self.name, entry_id, queue, qtype), timeout)

    def browse(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int = ops.BROWSE_PAGE,
        cursor: Any = None,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> BrowsePage:
        """One page of messages (nothing locked): a list with a ``cursor`` attribute
        to pass back for the next page (None when done). With *queue* and no
        *qtype* the type is TRAN; with neither, the whole structure is browsed."""
        call = ops.browse(self.name, queue, qtype, limit, cursor)
        page: BrowsePage = self._do(call, timeout)
        return page

    def browse_all(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int | None = None,
        page_size: int = ops.BROWSE_PAGE,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Iterator[Message]:
        """Every message (at most *limit*), following cursors page by page."""
        cursor: Any = None
        count = 0
        while True:
            size = page_size if limit is None else min(page_size, limit - count)
            if size <= 0:
                return
            page = self.browse(queue, qtype, size, cursor, timeout=timeout)
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

    def operator_delete(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Delete any message not locked by another client (operator delete)."""
        self._do(ops.delete(self.name, entry_id, operator=True), timeout)

    def requeue(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> Location:
        """Put a cold or suspended message back on its home queue; returns where."""
        location: Location = self._do(ops.requeue(self.name, entry_id), timeout)
        return location

    def dequeue(
        self, queue: str, qtype: QType = "TRAN", *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> int:
        """Delete every message of the queue; returns how many went."""
        count: int = self._do(ops.dequeue(self.name, queue, qtype), timeout)
        return count

    def query(self, kind: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> list[dict[str, Any]]:
        """The rows of a display, for this structure only."""
        return self.client.query(kind, self.name, timeout=timeout)


class _Source(HandleSource[Client]):
    """A structure handle as its consumer sees it (:class:`cqsclient.source.Source`)."""

    def request(
        self, call: Call, timeout: Timeout, cancelled: Callable[[], bool] | None = None
    ) -> Any:
        return self.client._do(call, timeout, cancelled)

    def give_back(self, entry_id: int) -> None:
        self.client._release(self.name, entry_id)

    def pause(self, seconds: float) -> None:
        self.client._link(self.name).nap(seconds)

    def wake(self) -> None:
        self.client._link(self.name).poke()


class UnitOfWork(UnitOfWorkBase):
    """Reads now, one commit at the end; see :mod:`cqsclient.unitofwork`."""

    def __init__(self, handle: StructureHandle) -> None:
        super().__init__(handle.name, handle.client.max_message)
        self._handle = handle

    def read(
        self,
        queue: str,
        qtype: QType = "TRAN",
        wait: float | None = None,
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Message | None:
        """Read and lock a message now; it is given back if the unit of work fails."""
        self._check_open()
        message = self._handle.read(queue, qtype, wait, lease=lease, timeout=timeout)
        if message is not None:
            self._note_read([message])
        return message

    def read_batch(
        self,
        queue: str,
        n: int,
        qtype: QType = "TRAN",
        wait: float | None = None,
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> list[Message]:
        """Read and lock up to *n* messages now; given back if the unit of work fails."""
        self._check_open()
        messages = self._handle.read_batch(queue, n, qtype, wait, lease=lease,
                                                  timeout=timeout)
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
        except ConnectionLost as lost:
            self._give_back(lost)
            raise
        except CQSError as error:
            # The daemon applied none of it: give the reads back, then report.
            self._give_back(error)
            raise

    def _give_back(self, cause: BaseException) -> None:
        if not self._gives_back(cause, self._handle.client.reconnect is not None):
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
