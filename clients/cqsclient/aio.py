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
        async for m in s.consume("TRANX"):
            async with m:                                # deleted on success
                ...

Design note
-----------
``connect()`` returns an unopened :class:`Client`; ``async with`` opens a task
group and a connection (:mod:`cqsclient.aioconnection`: its reader task runs
in the group) and registers. A request's timeout is a cancel scope around its
round trip, so a timed-out request is abandoned exactly as a cancelled one is.
With ``reconnect`` a lost connection is replaced by a new one, with its own
reader task in the same group, and resynced as in the blocking client
(:mod:`cqsclient.reconnect`).
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, Literal

import anyio
import anyio.abc

from cqsproto import max_frame_for

from . import ops
from .address import Address, parse_address
from .aioconnection import AsyncConnection, Progress
from .aioconsume import Consumer, Delivery
from .client import DEFAULT_TIMEOUT, NOTE_TURN, TRANSIENT, client_name, tls_context
from .credentials import secret_from_env
from .errors import (
    CannotConnect,
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

# How long closing work (deregister, giving back locks) may take when the
# caller is being cancelled: it runs shielded, so it must be bounded.
log = logging.getLogger("cqsclient")

CLEANUP_TIMEOUT: Final = 5.0


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
    """An unopened Client: use ``async with cqsclient.aio.connect(...) as c``.

    Arguments and errors as :func:`cqsclient.connect`; ValueError for a bad
    address or missing client name is raised here, the rest on entering.
    """
    targets = parse_targets(address)
    return Client(
        targets,
        client_name(client),
        secret if secret is not None else secret_from_env(),
        cold,
        timeout,
        ssl_context,
        cafile,
        policy(reconnect),
        operator,
        keepalive_for(targets, keepalive),
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
    """A registered client on one connection, shared by any number of tasks.

    Its attributes are the blocking client's (:class:`cqsclient.Client`).
    """

    def __init__(
        self,
        address: Targets,
        name: str,
        secret: str | None,
        cold: bool,
        timeout: float | None,
        ssl_context: ssl.SSLContext | None,
        cafile: str | None,
        reconnect: Reconnect | None = None,
        operator: bool = False,
        keepalive: float | None = None,
    ) -> None:
        self.name = name
        self._operator = operator
        self.address = address.text
        self.timeout = timeout
        self.reconnect = reconnect
        self.last_resync: Resync | None = None
        self._targets = address
        self._keepalive = keepalive
        self._secret = secret
        self._cold = cold
        self._ssl_context = ssl_context
        self._cafile = cafile
        self._conn: AsyncConnection | None = None  # the home link (cqsclient.routes)
        # one registered connection per node this client needs, and its takeover token
        self._links: dict[str, AsyncConnection] = {}
        self._tokens: dict[str, str] = {}
        self._routes = Routes("")
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._keys = Keys()  # each connect() draws a new incarnation
        self._reconnect_lock = anyio.Lock()
        self._book: LockBook | None = LockBook() if reconnect is not None else None
        self._interests: dict[tuple[str, str, QType], None] = {}
        self.server = ""
        self.server_version = 0
        self.max_message = 0
        self.structures: list[str] = []
        self.resync_locks: list[HeldLock] = []
        # the interests the daemon kept and registered again for this connection
        self.resumed_interests: list[ops.Interest] = []

    def __repr__(self) -> str:
        state = "open" if self._conn is not None and not self._conn.lost else "closed"
        return f"<cqsclient.aio.Client {self.name!r} at {self.address} ({state})>"

    @property
    def closed(self) -> bool:
        """True until opened, and once the connection is closed or lost."""
        return self._conn is None or self._conn.lost

    def _opened(self) -> AsyncConnection:
        if self._conn is None:
            raise RuntimeError("use `async with cqsclient.aio.connect(...) as client`")
        return self._conn

    @property
    def owners(self) -> dict[str, str]:
        """The address of the node each structure's requests go to (see the blocking
        client)."""
        return self._routes.owners()

    def _link(self, structure: str) -> AsyncConnection:
        """The connection a request on *structure* goes on: its owner's, else home."""
        return self._links.get(self._routes.address(structure), self._opened())

    async def _do(self, call: Call, timeout: Timeout = CLIENT_TIMEOUT) -> Any:
        self._opened()
        seconds = ops.seconds(timeout, self.timeout, call)
        deadline = math.inf if seconds is None else seconds + call.wait
        patience: Patience | None = None
        stamped = self._keys.stamp(call)
        structure = call.structure
        while True:
            conn = self._link(structure)
            progress = Progress()
            try:
                with anyio.move_on_after(deadline) as scope:
                    reply = await conn.roundtrip(call, progress)
                if scope.cancelled_caught:
                    raise RequestTimeout(
                        f"no reply to {call.request['op']} within its timeout; "
                        + ("whether the daemon applied it is unknown" if progress.sent
                           else "not sent"),
                        applied=None if progress.sent else False,
                    )
                result = call.finish(reply)
            except (NotOwner, StructureFailed) as refused:
                # nothing was applied: follow the owner, or wait for one (cqsclient.group)
                where = redirect(refused, structure)
                if where is None or self._closing:
                    raise
                patience = patience or Patience(self.reconnect)
                if not (where and patience.quick_hop(refused)):
                    await anyio.sleep(patience.next_delay(refused))
                if where:
                    await self._follow(structure, where)
                continue
            except ConnectionLost as lost:
                if self.reconnect is None or self._closing:
                    raise
                await self._reconnect(conn, lost)
                if lost.applied is False or call.retry or self._keys.may_resend(call, stamped):
                    continue  # a put or commit sent again with its key is applied once
                lost.add_note(
                    "the client has reconnected; whether the daemon applied this request "
                    "is unknown (see Client.last_resync for the locks)"
                )
                raise
            if structure and not self._routes.knows(structure, conn.address):
                await self._served(structure, conn)
            if self._book is not None:
                self._book.note(call, result)
            return result

    # --- opening, reconnecting and closing ---

    async def __aenter__(self) -> Client:
        if self._task_group is not None:
            raise RuntimeError("this client has already been opened")
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            self._conn, session = await self._dial(self._cold, {})
        except BaseException:
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
            raise
        self.address = self._conn.address
        self._links = {self._conn.address: self._conn}
        self._routes = Routes(self._conn.address)
        self._session(self._conn, session)
        if self._book is not None:
            self._book.adopt(session.locks)
        return self

    def _session(self, conn: AsyncConnection, session: ops.Session) -> None:
        if session.token is not None:
            self._tokens[conn.address] = session.token
        if conn is not self._conn:
            return  # another node's link: the client's attributes are the home's
        self.server = session.server
        self.server_version = session.version
        self.max_message = session.max_message
        self.structures = session.structures
        self.resync_locks = session.locks
        self.resumed_interests = session.interests
        self._keys.window = session.dedup_window

    async def _dial(
        self, cold: bool, takeover: Mapping[str, str], only: Address | None = None
    ) -> tuple[AsyncConnection, ops.Session]:
        """A new connection, its reader running, registered, to the first of the
        targets that takes it (cqsclient.group), or to *only*."""
        if only is not None:
            return await self._dial_one(only, cold, takeover)
        error: CannotConnect | None = None
        targets = self._targets
        listed = (targets.candidates() if targets.etcd is None
                  else await anyio.to_thread.run_sync(targets.candidates))
        for address in listed:
            try:
                return await self._dial_one(address, cold, takeover)
            except CannotConnect as failed:
                error = failed
        assert error is not None
        raise error

    async def _dial_one(
        self, parsed: Address, cold: bool, takeover: Mapping[str, str]
    ) -> tuple[AsyncConnection, ops.Session]:
        assert self._task_group is not None
        timeout = math.inf if self.timeout is None else self.timeout
        address = parsed.text
        try:
            with anyio.fail_after(timeout):
                stream = await _open_stream(parsed, self._ssl_context, self._cafile)
        except (OSError, TimeoutError, anyio.BrokenResourceError) as error:
            raise CannotConnect(
                f"cannot connect to {address}: {error or 'timed out'}", address=address
            ) from error
        conn = AsyncConnection(stream, address, self._keepalive)
        self._task_group.start_soon(conn.read_loop, self._task_group)
        call = ops.register(self.name, self._secret, cold, self._operator,
                            takeover.get(address))
        try:
            with anyio.fail_after(timeout):
                session: ops.Session = call.finish(await conn.roundtrip(call))
        except BaseException as error:
            await conn.aclose()
            if isinstance(error, TimeoutError | ConnectionLost) and not isinstance(
                error, CannotConnect
            ):
                detail = error.message if isinstance(error, ConnectionLost) else "timed out"
                raise CannotConnect(
                    f"cannot register with {address}: {detail}", address=address
                ) from error
            raise
        conn.max_frame = max_frame_for(session.max_message)
        return conn, session

    # --- routing (cqsclient.routes; see the blocking client) ---

    async def _served(self, structure: str, conn: AsyncConnection) -> None:
        """A request on *structure* succeeded on *conn*: its node serves it."""
        async with self._reconnect_lock:
            if self._links.get(conn.address) is not conn:
                return
            if self._routes.served(structure, conn.address):
                await self._restore_interests(conn, {structure})

    async def _follow(self, structure: str, owner: str) -> None:
        """Send *structure*'s requests to the node at *owner* a NOT_OWNER named."""
        resync: Resync | None = None
        async with self._reconnect_lock:
            link = self._links.get(owner)
            if link is None or link.lost:
                started = time.monotonic()
                served = self._routes.served_by(owner)
                try:
                    target = parse_address(owner)
                    link, session = await self._dial(False, self._tokens, only=target)
                    resync = await self._resync(link, session, f"moved to the owner at {owner}",
                                                1, started, within=served | {structure},
                                                interests_in=served)
                except (ValueError, *TRANSIENT):
                    return
                self._targets.prefer = target
            restored = await self._restore_interests(link, {structure})
            if resync is not None:
                resync = replace(resync, interests=[*resync.interests, *(restored or [])])
                self._add_link(link, session, resync)
            self._routes.followed(structure, owner, restored is not None)
            retired = self._settle()
        await self._retire(retired)
        if resync is not None and self.reconnect is not None:
            self.reconnect.done(resync)

    def _add_link(self, conn: AsyncConnection, session: ops.Session, resync: Resync) -> None:
        if self._book is not None:
            self._book.lose(resync.lost)
        self._links[conn.address] = conn
        self._session(conn, session)
        self.last_resync = resync

    def _settle(self) -> list[AsyncConnection]:
        retired = self._routes.settle(a for a, c in self._links.items() if not c.lost)
        home = self._links[self._routes.home]
        if home is not self._conn:
            self._conn = home
            self.address = home.address
        return [self._links.pop(address) for address in retired]

    async def _retire(self, links: list[AsyncConnection]) -> None:
        """Deregister from nodes this client no longer needs, then close."""
        for old in links:
            with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                old.expect_close("no structure of this client is served there any more")
                call = ops.deregister()
                try:  # a courtesy: the node frees the name at once
                    call.finish(await old.roundtrip(call))
                except CQSError:
                    pass
            await old.aclose()

    async def _restore_interests(
        self, conn: AsyncConnection, structures: set[str]
    ) -> list[tuple[str, str, QType]] | None:
        """See the blocking client."""
        done: list[tuple[str, str, QType]] = []
        for interest in list(self._interests):
            if interest[0] in structures:
                call = ops.register_interest(*interest)
                try:
                    with anyio.fail_after(math.inf if self.timeout is None else self.timeout):
                        call.finish(await conn.roundtrip(call))
                except (CQSError, TimeoutError):
                    return None
                done.append(interest)
        return done

    # --- reconnecting ---

    async def _reconnect(self, failed: AsyncConnection, lost: ConnectionLost) -> None:
        """Replace *failed* (unless another task did already); see the blocking client."""
        assert self.reconnect is not None and self._book is not None
        async with self._reconnect_lock:
            if self._links.get(failed.address) is not failed:
                return
            self._targets.lost(failed.address)
            if any(not c.lost for c in self._links.values() if c is not failed):
                del self._links[failed.address]
                gone = self._routes.lost(failed.address)
                retired: list[AsyncConnection] | None = [failed, *self._settle()]
            else:
                retired = None
                resync = await self._redial(lost)
                await failed.aclose()
        if retired is None:
            self.reconnect.done(resync)
            return
        await self._retire(retired[1:])
        await failed.aclose()
        for structure in sorted({i[0] for i in self._interests} & gone):
            try:
                await self._do(ops.connect(structure))
            except CQSError as error:
                log.warning("cqsd interests in %s wait for its next owner: %s", structure, error)

    async def _redial(self, lost: ConnectionLost) -> Resync:
        assert self.reconnect is not None
        started = time.monotonic()
        attempts = 0
        for delay in self.reconnect.delays():
            await anyio.sleep(delay)
            if self._closing:
                raise lost
            attempts += 1
            try:
                conn, session = await self._dial(False, self._tokens)
                resync = await self._resync(conn, session, lost.message, attempts, started,
                                            probe=True)
            except TRANSIENT as error:
                self.reconnect.failed(attempts, started, error, lost)
                continue
            await self._install(conn, session, resync)
            return resync
        raise AssertionError("the reconnect policy's delays never end")

    async def _install(self, conn: AsyncConnection, session: ops.Session,
                       resync: Resync) -> None:
        for old in self._links.values():
            await old.aclose()
        self._links = {}
        self._conn = conn
        self.address = conn.address
        self._routes.reset(conn.address)
        self._add_link(conn, session, resync)
        self.resync_locks = resync.kept

    async def _resync(
        self,
        conn: AsyncConnection,
        session: ops.Session,
        cause: str,
        attempts: int,
        started: float,
        probe: bool = False,
        within: set[str] | None = None,
        interests_in: set[str] | None = None,
    ) -> Resync:
        """See the blocking client."""
        kept, gone, orphans = session.locks, list[HeldLock](), list[HeldLock]()
        if self._book is not None:
            kept, gone, orphans = self._book.resync(session.locks, within)
        scope = within if interests_in is None else interests_in
        interests: list[tuple[str, str, QType]] = [
            i for i in self._interests if scope is None or i[0] in scope]
        try:
            with anyio.fail_after(math.inf if self.timeout is None else self.timeout):
                for structure in sorted(self._book.structures()) if probe and self._book else ():
                    call = ops.connect(structure)
                    try:
                        call.finish(await conn.roundtrip(call))
                    except (NotOwner, StructureFailed) as refused:
                        raise misdirection(self._targets, conn.address, refused,
                                           structure) from refused
                    except CQSError:
                        pass  # the resync says what became of its locks
                for lock in orphans:
                    unlock = ops.unlock(lock.structure, lock.entry_id)
                    try:
                        unlock.finish(await conn.roundtrip(unlock))
                    except ConnectionLost:
                        raise
                    except CQSError:
                        pass  # released already, or its structure failed: not ours to hold
                for structure, queue, qtype in interests:
                    if ops.interest(structure, queue, qtype) in session.interests:
                        continue  # the daemon kept it (see the blocking client)
                    call = ops.register_interest(structure, queue, qtype)
                    try:
                        call.finish(await conn.roundtrip(call))
                    except (NotOwner, StructureFailed) as refused:
                        raise misdirection(self._targets, conn.address, refused,
                                           structure) from refused
        except BaseException as error:
            await conn.aclose()
            if isinstance(error, TimeoutError):
                raise RequestTimeout("timed out resyncing after a reconnect") from error
            raise
        return Resync(cause, attempts, time.monotonic() - started, kept, gone, orphans,
                      list(interests))

    async def _release(self, structure: str, entry_id: int) -> None:
        """Give back a lock the application never saw; see the blocking client."""
        if self._book is not None:
            self._book.forget((structure, entry_id))
        call = ops.unlock(structure, entry_id)
        try:
            with anyio.fail_after(math.inf if self.timeout is None else self.timeout):
                call.finish(await self._link(structure).roundtrip(call))
        except (ConnectionLost, TimeoutError, *ALREADY_RELEASED):
            pass

    def holds(self, structure: str, entry_id: int) -> bool | None:
        """Whether the application still holds the lock on *entry_id* as far as this
        client knows (None without ``reconnect``, which keeps no book)."""
        if self._book is None:
            return None
        return (structure, entry_id) in self._book

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._shutdown(deregister=True, quiet=exc is not None)

    async def _shutdown(self, deregister: bool, quiet: bool = True) -> None:
        assert self._task_group is not None
        self._closing = True
        conn = self._opened()
        others = [c for c in self._links.values() if c is not conn]
        try:
            if deregister:
                await self._retire(others)
            for other in others:
                await other.aclose()
            if deregister and not conn.lost:
                # Shielded so that a cancelled caller still deregisters cleanly.
                with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                    try:
                        await self._deregister(conn)
                    except (ConnectionLost, ShuttingDown):
                        pass  # gone already, or going: the session ends either way
                    except CQSError:
                        if not quiet:
                            raise
        finally:
            await self._opened().aclose()
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
            self._opened().close_notifications()

    async def _deregister(self, conn: AsyncConnection) -> None:
        conn.expect_close("deregistered by this client")
        call = ops.deregister()
        try:
            call.finish(await conn.roundtrip(call))
        finally:
            await conn.aclose()
            if self._book is not None:
                self._book.clear()

    async def deregister(self) -> None:
        """End the session cleanly, then close the connection (see the blocking client)."""
        self._closing = True
        await self._retire([c for c in self._links.values() if c is not self._conn])
        await self._deregister(self._opened())

    async def close(self, failed: bool = False) -> None:
        """Leave: deregister, as leaving ``async with`` does; with ``failed=True`` (or
        :meth:`abort`) drop the connection instead. See the blocking client."""
        self._closing = True
        conn = self._opened()
        if failed or conn.lost:
            for link in [*self._links.values(), conn]:
                await link.aclose()
            return
        try:
            await self._retire([c for c in self._links.values() if c is not conn])
            await self._deregister(conn)
        except (ConnectionLost, ShuttingDown):
            pass  # gone already, or going: the session ends either way

    async def abort(self) -> None:
        """Drop the connection without deregistering: ``close(failed=True)``."""
        await self.close(failed=True)

    # --- requests ---

    async def ping(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> float:
        """A round trip to the daemon (the keepalive's ``ping``); the seconds it took."""
        started = time.monotonic()
        await self._do(ops.ping(), timeout)
        return time.monotonic() - started

    async def structure(self, name: str, *, timeout: Timeout = CLIENT_TIMEOUT) -> StructureHandle:
        """A handle on structure *name*; raises UnknownStructure if it is not defined."""
        stats = await self._do(ops.connect(name), timeout)
        return StructureHandle(self, name, stats)

    async def register_interest(
        self, structure: str, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Be notified when the queue goes from empty to non-empty (at once if it has work)."""
        await self._do(ops.register_interest(structure, queue, qtype), timeout)
        self._interests[(structure, queue, qtype)] = None

    async def deregister_interest(
        self, structure: str, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Stop the notifications for the queue."""
        self._interests.pop((structure, queue, qtype), None)
        await self._do(ops.deregister_interest(structure, queue, qtype), timeout)

    def notifications(self, timeout: float = 1.0) -> AsyncIterator[Notification]:
        """An async iterator of notifications as they arrive; it stops once *timeout*
        seconds pass without one, and raises ConnectionLost if the connection drops
        (after what came before), unless the client reconnects (see the blocking client)."""
        self._opened()
        return _Notifications(self, timeout)

    async def query(
        self, kind: str, structure: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """The rows of a display: structures, queues, clients, locks, headers or backups."""
        rows: list[dict[str, Any]] = await self._do(ops.query(kind, structure), timeout)
        return rows

    async def checkpoint(
        self, structure: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """Checkpoint a structure to its SRDS now; waits for the job and returns its report."""
        result: dict[str, Any] = await self._do(ops.checkpoint(structure), timeout)
        return result

    async def alter(
        self, structure: str, size: int, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """SETXCF START,ALTER (see the blocking client); returns the structure's stats."""
        result: dict[str, Any] = await self._do(ops.alter(structure, size), timeout)
        return result

    async def rebuild(
        self, structure: str, size: int | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """Structure copy (see the blocking client); returns the structure's stats."""
        result: dict[str, Any] = await self._do(ops.rebuild(structure, size), timeout)
        return result

    async def delete_structure(
        self, structure: str, *, force: bool = False, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """SETXCF FORCE (see the blocking client)."""
        result: dict[str, Any] = await self._do(ops.delete_structure(structure, force), timeout)
        return result

    async def fail_structure(
        self, structure: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """RESET CFSTRUCT ACTION(FAIL) (see the blocking client)."""
        result: dict[str, Any] = await self._do(ops.fail_structure(structure), timeout)
        return result

    async def move_structure(
        self, structure: str, to: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> dict[str, Any]:
        """A planned move of a group's pair (see the blocking client)."""
        result: dict[str, Any] = await self._do(ops.move_structure(structure, to), timeout)
        return result

    async def recover(
        self, structure: str | Sequence[str], purge: bool = False, *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """RECOVER CFSTRUCT (see the blocking client); returns a report."""
        result: dict[str, Any] = await self._do(ops.recover(structure, purge), timeout)
        return result

    async def reset_smds(
        self, structure: str, owner: str, *, access: SmdsAccess | None = None,
        status: SmdsStatus | None = None, timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """RESET SMDS (see the blocking client); returns the cfstatus row."""
        result: dict[str, Any] = await self._do(
            ops.reset_smds(structure, owner, access, status), timeout)
        return result

    async def start_smdsconn(
        self, structure: str, owner: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """START SMDSCONN (see the blocking client); returns the smdsconn rows."""
        result: list[dict[str, Any]] = await self._do(ops.start_smdsconn(structure, owner),
                                                      timeout)
        return result

    async def stop_smdsconn(
        self, structure: str, owner: str | None = None, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """STOP SMDSCONN (see the blocking client); returns the smdsconn rows."""
        result: list[dict[str, Any]] = await self._do(ops.stop_smdsconn(structure, owner),
                                                      timeout)
        return result

    async def alter_smds(
        self, structure: str, owner: str, *, dsbufs: int | Literal["default"] | None = None,
        dsexpand: SmdsExpand | None = None, timeout: Timeout = CLIENT_TIMEOUT,
    ) -> dict[str, Any]:
        """ALTER SMDS (see the blocking client); returns the smds row."""
        result: dict[str, Any] = await self._do(
            ops.alter_smds(structure, owner, dsbufs, dsexpand), timeout)
        return result


class StructureHandle:
    """The requests on one structure; from ``await client.structure(name)``."""

    def __init__(self, client: Client, name: str, stats: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self.stats = stats

    def __repr__(self) -> str:
        return f"<aio.StructureHandle {self.name!r} of {self.client!r}>"

    async def _do(self, call: Call, timeout: Timeout = CLIENT_TIMEOUT) -> Any:
        return await self.client._do(call, timeout)

    async def put(
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
        entry_id: int = await self._do(call, timeout)
        return entry_id

    async def put_batch(
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
        entry_ids: list[int] = await self._do(call, timeout)
        return entry_ids

    async def read(
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
        message: Message | None = await self._do(call, timeout)
        return message

    async def read_batch(
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
        messages: list[Message] = await self._do(call, timeout)
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
        """Messages of the queue as they come: ``async for m in s.consume(q)``; see
        the blocking client and :mod:`cqsclient.consume`."""
        source = _Source(self, self.name, self.client)
        return Consumer(source, queue, qtype, prefetch, wait, timeout, lease)

    async def delete(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Delete a message this client holds locked (LOCK_NOT_HELD otherwise)."""
        await self._do(ops.delete(self.name, entry_id), timeout)

    async def delete_and_read(
        self,
        entry_id: int,
        queue: str,
        n: int = 1,
        qtype: QType = "TRAN",
        *,
        lease: float | None = None,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> list[Message]:
        """Delete a locked message and read up to *n* of *queue* in one round trip
        (see the blocking client); [] if there is none readable."""
        call = ops.delete_and_read(self.name, entry_id, queue, n, qtype, lease)
        messages: list[Message] = await self._do(call, timeout)
        return messages

    async def renew(self, entry_id: int, lease: float, *,
              timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Renew the lease of a message this client holds: it now ends *lease* seconds
        from now. LOCK_NOT_HELD once it has expired (the message was given back as a
        failed delivery and may be someone else's)."""
        await self._do(ops.renew(self.name, entry_id, lease), timeout)

    async def unlock(
        self,
        entry_id: int,
        failed: bool = False,
        queue: str | None = None,
        qtype: QType | None = None,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> Location:
        """Give back a locked message (see the blocking client); returns where it went."""
        call = ops.unlock(self.name, entry_id, failed, queue, qtype)
        location: Location = await self._do(call, timeout)
        return location

    async def move(
        self, entry_id: int, queue: str, qtype: QType = "TRAN", *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> None:
        """Move a message not locked by another client to another queue."""
        await self._do(ops.move(self.name, entry_id, queue, qtype), timeout)

    async def browse(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int = ops.BROWSE_PAGE,
        cursor: Any = None,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> BrowsePage:
        """One page of messages (nothing locked), with ``cursor`` for the next page."""
        call = ops.browse(self.name, queue, qtype, limit, cursor)
        page: BrowsePage = await self._do(call, timeout)
        return page

    def browse_all(
        self,
        queue: str | None = None,
        qtype: QType | None = None,
        limit: int | None = None,
        page_size: int = ops.BROWSE_PAGE,
        *,
        timeout: Timeout = CLIENT_TIMEOUT,
    ) -> AsyncIterator[Message]:
        """An async iterator of every message (at most *limit*), following cursors."""
        return _BrowseAll(self, queue, qtype, limit, page_size, timeout)

    def unit_of_work(self) -> UnitOfWork:
        """An async context manager gathering puts, deletes, moves and unlocks into one commit."""
        return UnitOfWork(self)

    async def operator_delete(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> None:
        """Delete any message not locked by another client (operator delete)."""
        await self._do(ops.delete(self.name, entry_id, operator=True), timeout)

    async def requeue(self, entry_id: int, *, timeout: Timeout = CLIENT_TIMEOUT) -> Location:
        """Put a cold or suspended message back on its home queue; returns where."""
        location: Location = await self._do(ops.requeue(self.name, entry_id), timeout)
        return location

    async def dequeue(
        self, queue: str, qtype: QType = "TRAN", *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> int:
        """Delete every message of the queue; returns how many went."""
        count: int = await self._do(ops.dequeue(self.name, queue, qtype), timeout)
        return count

    async def query(
        self, kind: str, *, timeout: Timeout = CLIENT_TIMEOUT
    ) -> list[dict[str, Any]]:
        """The rows of a display, for this structure only."""
        return await self.client.query(kind, self.name, timeout=timeout)


# Iterators are classes rather than async generators: a caller that breaks out
# of `async for` early leaves nothing to finalize later (an abandoned async
# generator is closed by the garbage collector, possibly outside its event loop).


class _Notifications:
    def __init__(self, client: Client, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    def __aiter__(self) -> _Notifications:
        return self

    async def __anext__(self) -> Notification:
        client = self._client
        while True:
            links = [c for c in client._links.values() if not c.lost] or [client._opened()]
            deadline = time.monotonic() + self._timeout
            while True:  # with links to several nodes, a turn of NOTE_TURN on each
                remaining = deadline - time.monotonic()
                turn = remaining if len(links) == 1 else min(remaining, NOTE_TURN)
                for conn in links:
                    with anyio.move_on_after(max(turn, 0.0)):
                        try:
                            return await conn.notes.receive()
                        except (anyio.EndOfStream, anyio.ClosedResourceError):
                            if client._closing:
                                raise conn.lost_error() from None
                    if conn.lost:
                        break
                else:
                    if remaining > 0:
                        continue
                    raise StopAsyncIteration
                break
            if client._closing:
                raise conn.lost_error()
            if client._links.get(conn.address) is not conn:
                continue  # closed by a move, or replaced: wait on the links there are
            if client.reconnect is None:
                raise conn.lost_error()
            await client._reconnect(conn, conn.lost_error())


class _BrowseAll:
    def __init__(
        self,
        handle: StructureHandle,
        queue: str | None,
        qtype: QType | None,
        limit: int | None,
        page_size: int,
        timeout: Timeout,
    ) -> None:
        self._handle = handle
        self._timeout = timeout
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
            page = await self._handle.browse(*self._args, size, self._cursor,
                                             timeout=self._timeout)
            self._page, self._index = page, 0
            self._count += len(page)
            self._cursor = page.cursor
            self._done = page.cursor is None or not page
        message = self._page[self._index]
        self._index += 1
        return message


class _Source(HandleSource[Client]):
    """A structure handle as its consumer sees it (:class:`cqsclient.source.AsyncSource`)."""

    async def request(self, call: Call, timeout: Timeout) -> Any:
        return await self.client._do(call, timeout)

    async def give_back(self, entry_id: int) -> None:
        await self.client._release(self.name, entry_id)


class UnitOfWork(UnitOfWorkBase):
    """Reads now (awaited), one commit at the end; ``put``/``delete``/``move``/``unlock``
    only gather, so they are not awaited. See :mod:`cqsclient.unitofwork`."""

    def __init__(self, handle: StructureHandle) -> None:
        super().__init__(handle.name, handle.client.max_message)
        self._handle = handle

    async def read(
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
        message = await self._handle.read(queue, qtype, wait, lease=lease, timeout=timeout)
        if message is not None:
            self._note_read([message])
        return message

    async def read_batch(
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
        messages = await self._handle.read_batch(queue, n, qtype, wait, lease=lease,
                                                  timeout=timeout)
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
        except CQSError as error:
            # A refused commit applied nothing; a lost one maybe (see the module).
            await self._give_back(error)
            raise

    async def _give_back(self, cause: BaseException) -> None:
        if not self._gives_back(cause, self._handle.client.reconnect is not None):
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
