"""Listeners and connections: each connection's tasks, from its first byte to
its last reply.

Design note. Every request is handled to completion, synchronously, by the
task that read it: the poller for plain sockets (poller.py), a reader task
for each TLS connection. The engine never awaits, so one request's changes
and the notifications and waiter hand-offs they cause happen with no other
request in between. A waiting read is parked with no task (waiters.py); only
requests that reply after an await (jobs) become tasks. Replies go out at once,
or, when they wait for the log, from the flusher after its fsync
(session.py); each connection's writer task sends only what a non-blocking
send could not take, batching what has piled up into one send, which is what
makes pipelining cheap.

A connection's tree: writer, deadlines (liveness.py), the reader (or the
poller's turn), requests replying later. An exception in any of them costs that
connection, never the daemon (docs/robustness.md).
"""

import functools
import grp
import os
import resource
import socket as stdlib_socket
import struct
from pathlib import Path
from typing import Protocol

import structlog
import trio

from cqsproto import CLOSED, NEED_DATA, FrameDecoder, ProtocolError, encode_frame
from cqsproto.requests import MAX_REGISTER_FRAME

from ..engine import Reason
from ..storage.datadir import DataDirError
from . import liveness, tls
from .clients import Clients
from .journal import Journal
from .liveconfig import LiveConfig
from .poller import RECEIVE_SIZE, TLS_TURN_FRAMES, TURN_FRAMES, Poller, Turn
from .session import Session
from .waiters import ReadWaiters

log = structlog.get_logger()
DRAIN_TIMEOUT = 10.0  # seconds connections get to flush their replies at shutdown
# A Unix socket's send buffer: with the default (~200 KiB) a reply of a 1 MiB message
# went out in five sends, four of them left to the writer task after a wait for the
# socket; 2 MiB measured 2.55 -> 2.15 ms of daemon CPU a 1 MiB message moved (4
# producers, 4 consumers), and 8 MiB, which lets a reply of eight go in one send,
# 1.34 -> 1.24 ms. A limit, not an allocation; the kernel caps it at
# net.core.wmem_max (and doubles it for its bookkeeping): docs/operations.md.
SEND_BUFFER = 8 * 1024 * 1024


class Requests(Protocol):
    """What connections hand their requests to (the dispatcher, dispatch.py)."""

    def dispatch(self, session: Session, frame: dict) -> None:
        """Handle one request to completion and send its reply (or start its wait)."""

    def connection_failed(self, session: Session, err: Exception) -> None:
        """Hear of an exception that ended a connection (whether the daemon may go on)."""


class Connections:
    def __init__(self, config: LiveConfig, journal: Journal, max_frame: int, max_reply: int,
                 clients: Clients, requests: Requests, sessions: set[Session],
                 waiters: ReadWaiters) -> None:
        """``requests`` handles each request, and hears of an exception that ended a
        connection; ``sessions`` is where the open connections' sessions are kept
        (the status counts them); ``waiters`` where their reads wait for messages."""
        self.config = config
        self.journal = journal
        self.max_frame = max_frame
        self.max_reply = max_reply
        self.clients = clients
        self.requests = requests
        self.waiters = waiters
        self.poller = Poller(self.handle, max_frame, journal) if Poller.available else None
        self.sessions = sessions
        self.closing = False  # no new connections: the daemon is stopping
        self._gone = trio.Event()
        self._socket_made = False
        self.tls_listeners: list[tls.Listener] = []

    # -- listening ---------------------------------------------------------------

    async def listen(self) -> list[tuple[trio.abc.Listener, bool]]:
        """The Unix socket, and TCP (with TLS) if configured: (listener, over_tcp)."""
        d = self.config.daemon
        _reserve_descriptors(d.max_connections)
        listeners: list[tuple[trio.abc.Listener, bool]] = [
            (_unix_listener(d.socket, d.socket_mode, d.socket_group), False)]
        self._socket_made = True
        if d.tcp_address:
            host, port = d.tcp_address
            tcp = await trio.open_tcp_listeners(port, host=host)
            if d.tls_cert:
                current = tls.context(d)
                self.tls_listeners = [tls.Listener(t, current) for t in tcp]
                listeners += [(t, True) for t in self.tls_listeners]
            else:
                listeners += [(t, True) for t in tcp]
        return listeners

    def reload_tls(self, d) -> None:
        """New connections get ``d``'s certificate and client CA from now on; raises
        OSError or ssl.SSLError (the old ones stay) if they cannot be loaded."""
        if self.tls_listeners:
            current = tls.context(d)
            for listener in self.tls_listeners:
                listener.current = current

    async def serve(self, listeners, nursery: trio.Nursery, *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept until cancelled (``task_status`` gets the scope that cancels it).
        Connections live in ``nursery``, so that closing the listeners at shutdown
        does not cancel requests in flight."""
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as accepting:
                for listener, over_tcp in listeners:
                    accepting.start_soon(functools.partial(
                        trio.serve_listeners, functools.partial(self.serve_connection,
                                                                over_tcp=over_tcp),
                        [listener], handler_nursery=nursery))
                task_status.started(scope)

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()
        if self._socket_made:
            try:
                os.unlink(self.config.daemon.socket)
            except OSError:
                pass

    # -- one connection -------------------------------------------------------------

    async def serve_connection(self, stream: trio.abc.Stream, over_tcp: bool) -> None:
        d = self.config.daemon
        if self.closing:
            await _refuse(stream, Reason.SHUTTING_DOWN, "the daemon is stopping")
            return
        if len(self.sessions) >= d.max_connections:
            await _refuse(stream, Reason.CLIENT_LIMIT,
                          f"{len(self.sessions)} connections open, the maximum is "
                          f"{d.max_connections}")
            return
        session = Session(_peer(stream), over_tcp, d.send_queue, self.max_reply, self.journal,
                          d.send_queue_bytes)
        session.peer_uid = None if over_tcp else _peer_uid(stream)
        try:
            if over_tcp:
                liveness.keep_alive(stream, d.tcp_keepalive)
            if isinstance(stream, trio.SocketStream):
                session.raw = stdlib_socket.socket(fileno=os.dup(stream.socket.fileno()))
                if not over_tcp:  # TCP tunes its own buffer
                    session.raw.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_SNDBUF,
                                           SEND_BUFFER)
        except OSError as err:  # out of descriptors (EMFILE): this connection, not the daemon
            log.warning("connection_refused", peer=session.peer, error=str(err))
            await _refuse(stream, Reason.CLIENT_LIMIT, f"the daemon cannot take it: {err}")
            return
        self.sessions.add(session)
        try:
            if isinstance(stream, trio.SSLStream):
                try:
                    session.cert_cn = await tls.handshake(stream, d.handshake_timeout)
                except (trio.BrokenResourceError, trio.TooSlowError, OSError) as err:
                    log.info("tls_handshake_failed", peer=session.peer,
                             error=str(err.__cause__ or err) or type(err).__name__)
                    return
            await self._run(session, stream)
        except Exception as err:  # a bug costs this connection, not the daemon
            self.requests.connection_failed(session, err)
        finally:
            self.sessions.discard(session)
            self.clients.connection_lost(session, self.closing)
            if not self.sessions:
                self._gone.set()
            session.close()
            await trio.aclose_forcefully(stream)

    async def _run(self, session: Session, stream: trio.abc.Stream) -> None:
        with trio.CancelScope() as session.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, session, stream)
                nursery.start_soon(self._deadlines, session)
                async with trio.open_nursery() as waits:
                    session.waits = waits
                    with trio.CancelScope() as session.reader_scope:
                        if session.raw is not None and self.poller is not None:
                            await self.poller.read(session)
                        else:
                            await self._reader(session, stream)
                    self.waiters.drop_session(session, answer=self.closing)
                    waits.cancel_scope.cancel()
                session.finish_sending()

    async def _reader(self, session: Session, stream: trio.abc.Stream) -> None:
        """A TLS connection's requests (the poller reads plain sockets where there
        is epoll)."""
        decoder = FrameDecoder(self.max_frame)
        turn = Turn.DONE
        while True:
            data = None  # the requests already received
            if session.paused:
                await session.resumed()
            elif turn is Turn.MORE:
                await trio.lowlevel.checkpoint()  # the other connections' turn
            else:
                try:
                    data = await stream.receive_some(RECEIVE_SIZE)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            turn = self.handle(session, decoder, data, TLS_TURN_FRAMES)
            if not turn:
                return

    def handle(self, session: Session, decoder: FrameDecoder, data: bytes | bytearray | None,
               frames: int = TURN_FRAMES) -> Turn:
        """Dispatch up to ``frames`` of the requests ``data`` completes (None: those
        already received), stopping if the session pauses; ENDED when the connection
        has ended (``data`` empty: the peer closed), a protocol error or deregistration."""
        if data is not None:
            decoder.receive_data(data)
        # until the register reply a client sends nothing larger than a register request
        decoder.max_frame = self.max_frame if session.client is not None else MAX_REGISTER_FRAME
        dispatched = False
        for _ in range(frames):
            if session.paused:
                return Turn.DONE
            try:
                frame = decoder.next_frame()
            except ProtocolError as err:
                log.info("protocol_error", client=session.client, peer=session.peer,
                         reason=err.reason, message=err.message)
                session.fail(None, err.reason, err.message)
                return Turn.ENDED
            if frame is NEED_DATA:
                if not decoder.buffered:
                    session.partial_since = None
                elif dispatched or session.partial_since is None:
                    session.partial_since = trio.current_time()  # a frame began (frame_timeout)
                return Turn.DONE
            if frame is CLOSED:
                return Turn.ENDED
            self.requests.dispatch(session, frame)
            dispatched = True
            if session.deregistered:
                return Turn.ENDED
        session.partial_since = None  # requests wait for the daemon, not for the client
        return Turn.MORE

    async def _writer(self, session: Session, stream: trio.abc.Stream) -> None:
        """Send what a non-blocking send could not (TLS, a slow reader), in order,
        batched, each frame only once what it acknowledges is durable: a reply
        never runs ahead of the log."""
        q, journal = session.queue, self.journal
        try:
            while q or not session.closing:
                if q and q[0][0] > journal.acknowledged and session.closing:
                    if not await journal.wait_durable(q[0][0]):
                        session.release(journal.acknowledged, journal.ended())
                    continue
                if not q or q[0][0] > journal.acknowledged:
                    await session.wait_for_work()
                    continue
                session.still_owner()
                session.sending = True
                timeout = self.config.daemon.send_timeout
                if not await liveness.send_or_stall(stream, session.take(journal.acknowledged),
                                                    timeout):
                    session.cut(f"its replies went unread for send_timeout ({timeout} s)")
                    return
                session.sent()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            assert session.scope is not None  # the writer runs inside it (_run)
            session.scope.cancel()

    async def _deadlines(self, session: Session) -> None:
        d = self.config.daemon
        if await liveness.overdue(session, d.handshake_timeout, d.frame_timeout) == "handshake":
            log.info("handshake_timeout", peer=session.peer)
            assert session.scope is not None  # the deadlines run inside it (_run)
            session.scope.cancel()
        else:
            session.cut(f"a request frame took longer than frame_timeout ({d.frame_timeout} s)")

    async def drain(self) -> None:
        """At shutdown: take no more requests, give every connection DRAIN_TIMEOUT
        to send what it owes, then cut what is left."""
        self.closing = True
        for session in list(self.sessions):
            if session.reader_scope is not None:
                session.reader_scope.cancel()
            self.waiters.drop_session(session, answer=True)
            if session.waits is not None:
                session.waits.cancel_scope.cancel()
        if self.sessions:
            with trio.move_on_after(DRAIN_TIMEOUT):
                await self._gone.wait()
        for session in list(self.sessions):
            if session.scope is not None:  # None: a TLS handshake not yet done, ended by
                session.scope.cancel()     # its handshake_timeout or the daemon's end


async def _refuse(stream: trio.abc.Stream, reason: Reason, message: str) -> None:
    """Say why a connection is not served (within a second, if the peer is still
    there: one that has gone already must not stop the daemon), and close it."""
    with trio.move_on_after(1):
        try:
            await stream.send_all(encode_frame({"id": None, "ok": False, "reason": str(reason),
                                                "message": message}))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(stream)


FD_HEADROOM = 256  # open files beyond two a connection: log, data sets, jobs, refusals


def _reserve_descriptors(connections: int) -> None:
    """Raise the soft limit on open files to what ``connections`` take, two each (the
    stream and the poller's duplicate), plus room for the log, data sets, jobs and
    connections being refused; as Redis does for maxclients. Past the limit a new
    connection is refused, not the daemon stopped, but refused it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < wanted:
            log.warning("open_files_limit_low", limit=raised, wanted=wanted,
                        max_connections=connections,
                        action="raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower "
                               "max_connections; connections past it are refused")


def _gid(group: str) -> int:
    """The id of ``group``, a name or a number; DataDirError if there is none."""
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise DataDirError(f"socket_group: no group named {group!r}") from None


def _peer(stream) -> str:
    """Who is at the other end, for the log: ``host:port``, or ``unix:uid=U,pid=P``."""
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    try:
        name = sock.getpeername() if sock is not None else None
    except OSError:
        name = None
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    credentials = _peer_credentials(sock)
    return "unix" if credentials is None else f"unix:uid={credentials[1]},pid={credentials[0]}"


def _peer_uid(stream) -> int | None:
    """The user of the process at the other end of a Unix socket (SO_PEERCRED)."""
    credentials = _peer_credentials(getattr(stream, "socket", None))
    return None if credentials is None else credentials[1]


def _peer_credentials(sock) -> tuple[int, int] | None:
    """(pid, uid) of a Unix socket's peer, as the kernel recorded them at connect."""
    if sock is None or getattr(sock, "family", None) != stdlib_socket.AF_UNIX:
        return None
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
            stdlib_socket.SOL_SOCKET, stdlib_socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return None
    return pid, uid


def _unix_listener(path: str, mode: int = 0o600, group: str = "") -> trio.SocketListener:
    """A Unix socket listener with permission bits ``mode`` and owned by ``group``
    (created 0600, then opened up); a stale socket file is replaced, a live one
    (another daemon answering on it) is refused."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        if not p.is_socket():
            raise DataDirError(f"socket path {path} exists and is not a socket")
        probe = stdlib_socket.socket(stdlib_socket.AF_UNIX)
        try:
            probe.connect(path)
        except OSError:
            p.unlink()
        else:
            raise DataDirError(f"another daemon is listening on {path}")
        finally:
            probe.close()
    p.parent.mkdir(parents=True, exist_ok=True)
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as err:  # ENOSYS, EPERM…: a FUSE or network file system without sockets
        sock.close()
        raise DataDirError(
            f"socket {path}: cannot make a Unix socket there ({err.strerror or err}): its "
            f"file system may not support Unix sockets (some FUSE and network file systems "
            f"do not); set [daemon] socket to a path on a local file system, such as "
            f"/run/cqsd/cqsd.sock") from err
    finally:
        os.umask(old)
    try:
        if group:
            os.chown(path, -1, _gid(group))
        os.chmod(path, mode)
    except OSError as err:
        sock.close()
        raise DataDirError(f"socket {path}: cannot give it group {group!r} and mode "
                           f"{mode:#o}: {err}") from err
    sock.listen(512)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))
