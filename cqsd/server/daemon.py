"""The daemon: listeners, connections, registration, peer recovery, and shutdown.

Design note. Every request is handled to completion, synchronously, by the
task that read it: the poller for plain sockets (poller.py), a reader task
for each TLS connection. The engine never awaits, so one request's changes
and the notifications and waiter hand-offs they cause happen with no other
request in between. Only waiting reads become tasks. Replies go out at once,
or, when they wait for the log, from the flusher after its fsync
(session.py); each connection's writer task sends only what a non-blocking
send could not take, batching what has piled up into one send, which is what
makes pipelining cheap.

Task tree: run → (signals, flusher, poller, checkpoints, listeners →
connection → (writer, deadlines, TLS reader, waiting reads), grace
timers of dropped clients).
"""

import functools
import os
import resource
import signal
import subprocess
import time
import socket as stdlib_socket
import ssl
from pathlib import Path

import structlog
import trio

from .. import exits
from ..config import Config
from ..engine import (
    Altered, CQSError, ExitFailed, FullnessChanged, OverflowMode, OverflowStatus, QueueType,
    QueueWork, Reason, Structure, StructurePair,
)
from ..engine.entry import ELEMENT
from ..engine.structure import LOCK
from ..protocol import requests
from ..protocol.codec import CLOSED, NEED_DATA, FrameDecoder, ProtocolError, encode_frame
from ..protocol.requests import MAX_REGISTER_FRAME
from ..recovery.fold import rows_of
from ..recovery.restart import load_recovered, rebuild_all
from ..srds import slots
from ..storage import image
from ..storage.datadir import DataDir, DataDirError
from . import liveness
from .checkpoints import Checkpoints, JobFailed, job_command, job_outcome, run_job
from .handlers import DEFERRED, HANDLERS
from .journal import WRITER, Journal
from .poller import RECEIVE_SIZE, TLS_TURN_FRAMES, TURN_FRAMES, Poller, Turn
from .session import Session
from .waiters import ReadWaiters

log = structlog.get_logger()
FRAME_HEADROOM = 1024 * 1024  # room for a request's other fields around a max_message payload
DRAIN_TIMEOUT = 10.0  # seconds connections get to flush their replies at shutdown
NEVER = 1 << 62  # the LSN a reply waits for when its record could not be logged


class LogFailed(Exception):
    """The log could not be written: the daemon stopped so a restart can recover."""


class Daemon:
    def __init__(self, config: Config, log_sink=None) -> None:
        self.config = config
        self.log_sink = log_sink
        d = config.daemon
        self.overflow_of = {sc.overflow: sc.name for sc in config.structures if sc.overflow}
        self.exits = {
            sc.name: (exits.resolve(sc.overflow_exit, f"structure {sc.name}: overflow_exit"),
                      exits.resolve(sc.queue_space_exit, f"structure {sc.name}: queue_space_exit"))
            for sc in config.structures
        }
        # what clients address: each primary structure with its overflow structure
        self.structures = {name: self._new_pair(name) for name in self.config_names()
                           if name not in self.overflow_of}
        self.failed: dict[str, StructurePair] = {}  # marked failed by the operator's recover
        self._movers: set[str] = set()  # pairs whose overflow moves are under way
        self._recovering: set[str] = set()
        self.datadir = DataDir(d.data_dir)
        self.max_frame = d.max_message + FRAME_HEADROOM
        self.clients: dict[str, Session] = {}
        self.sessions: set[Session] = set()
        self.pending_recovery: dict[str, trio.CancelScope] = {}
        self.interest: dict[tuple[str, int, str], set[Session]] = {}
        self.waiters = ReadWaiters()
        self.shutting_down = False
        self.stopped = trio.Event()
        self._sessions_gone = trio.Event()
        self.nursery: trio.Nursery | None = None
        self.poller: Poller | None = None
        self._socket_made = False

    def _new_structure(self, name: str, size: int | None = None) -> Structure:
        sc = self.config.structure(name)
        return Structure(sc.name, size or sc.size, initsize=size or sc.initsize,
                         entry_max=sc.entry_max, max_entries=sc.max_entries,
                         max_deliveries=self.config.daemon.max_deliveries)

    def _new_pair(self, name: str, sizes: dict[str, int] | None = None) -> StructurePair:
        sc, sizes = self.config.structure(name), sizes or {}
        overflow = self._new_structure(sc.overflow, sizes.get(sc.overflow)) if sc.overflow else None
        overflow_exit, space_exit = self.exits[name]
        return StructurePair(self._new_structure(name, sizes.get(name)), overflow,
                             threshold=sc.overflow_threshold, overflow_exit=overflow_exit,
                             queue_space_exit=space_exit)

    # -- used by handlers ------------------------------------------------------

    def structure(self, name: str) -> StructurePair:
        s = self.structures.get(name)
        if s is None:
            if name in self.failed:
                raise CQSError(Reason.STRUCTURE_FAILED,
                               f"structure {name} has failed and is being recovered")
            if name in self.overflow_of:
                raise CQSError(Reason.UNKNOWN_STRUCTURE,
                               f"{name} is the overflow structure of {self.overflow_of[name]}; "
                               f"requests go to {self.overflow_of[name]}")
            raise CQSError(
                Reason.UNKNOWN_STRUCTURE,
                f"no structure named {name!r}; this daemon has {', '.join(self.structures)}",
            )
        return s

    def check_size(self, data: bytes) -> None:
        if len(data) > self.config.daemon.max_message:
            raise CQSError(
                Reason.MESSAGE_TOO_LARGE,
                f"message of {len(data)} bytes exceeds max_message {self.config.daemon.max_message}",
            )

    def notification(self, structure: str, qtype: int, queue: str) -> dict:
        return {"notify": "work", "structure": structure, "qtype": QueueType(qtype).name,
                "queue": queue}

    def drop_interest(self, session: Session, key: tuple[str, int, str]) -> None:
        session.interests.discard(key)
        sessions = self.interest.get(key)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.interest[key]

    # -- requests ------------------------------------------------------------

    def dispatch(self, session: Session, frame: dict) -> None:
        """Handle one request to completion and send its reply (or start its wait)."""
        try:
            rid, op, args = requests.parse(frame)
        except ProtocolError as err:
            rid = frame.get("id")
            session.fail(rid if type(rid) is int else None, err.reason, err.message)
            return
        if session.client is None and op != "register":
            session.fail(rid, Reason.NOT_REGISTERED, f"{op}: register first")
            return
        if self.shutting_down:
            session.fail(rid, Reason.SHUTTING_DOWN, "the daemon is stopping")
            return
        result = DEFERRED
        try:
            result = HANDLERS[op](self, session, rid, **args)
        except (CQSError, ProtocolError) as err:
            log.debug("request_failed", client=session.client, op=op, reason=str(err.reason),
                      message=err.message)
            session.fail(rid, err.reason, err.message)
        except Exception:  # a bug must cost one request, not the daemon
            log.exception("internal_error", client=session.client, op=op)
            session.fail(rid, Reason.INVALID_REQUEST, f"{op}: internal error, see the daemon log")
        # even a refused request settles: a refused put may have changed the fullness state
        lsn = self.settle()
        if result is not DEFERRED:
            session.reply(rid, result, lsn)

    def settle(self) -> int:
        """Turn what the last request did into notifications, waiter hand-offs and log
        records; returns the LSN a reply must wait for (0: none)."""
        wait_for = 0
        for s in self.structures.values():
            if s.pressure and self.nursery is not None:
                self._relieve(s)
            if s.events:
                for event in s.take_events():
                    if type(event) is QueueWork:
                        sessions = self.interest.get((s.name, event.qtype, event.name))
                        if sessions:
                            frame = encode_frame(self.notification(*event))
                            for session in list(sessions):
                                session.send_bytes(frame)
                    else:
                        _log_event(event)
            if s.readable:
                self.waiters.serve(s)
            record = s.take_record()
            if record is not None:
                urgent = _urgent(record)
                before = self.journal.writer.bytes_written
                lsn = self.journal.append(record, urgent)
                self.checkpoints.note_logged(record, self.journal.writer.bytes_written - before)
                if urgent:
                    wait_for = lsn or NEVER
        return wait_for

    def _relieve(self, s: StructurePair) -> None:
        """Overflow processing (seed 004): grow, or select queues; their messages then
        move to the overflow structure in batches between other requests."""
        started = time.perf_counter()
        try:
            relief = s.relieve()
        except CQSError as err:  # settle must still log what the request did
            log.error("overflow_relief_failed", structure=s.name, error=err.message)
            return
        if relief is None:
            return
        if relief.selected or relief.dropped:
            log.warning("overflow_selected", structure=s.name, queues=relief.selected,
                        dropped_by_exit=relief.dropped, exit_error=relief.exit_error,
                        pause_ms=round(1000 * (time.perf_counter() - started), 3))
        if s.moving and s.name not in self._movers:
            self._movers.add(s.name)
            self.nursery.start_soon(self._move_to_overflow, s)

    async def _move_to_overflow(self, s: StructurePair) -> None:
        moved = 0
        try:
            while s.moving and self.structures.get(s.name) is s:
                moved += s.move_some()
                self.settle()
                await trio.sleep(0)  # the requests waiting meanwhile go first
        finally:
            self._movers.discard(s.name)
        log.info("overflow_moved", structure=s.name, overflow=s.overflow.name, messages=moved)

    # -- connections -----------------------------------------------------------

    async def serve_connection(self, stream: trio.abc.Stream, over_tcp: bool) -> None:
        limit = self.config.daemon.max_connections
        if self.shutting_down:
            await _refuse(stream, Reason.SHUTTING_DOWN, "the daemon is stopping")
            return
        if len(self.sessions) >= limit:
            await _refuse(stream, Reason.CLIENT_LIMIT,
                          f"{len(self.sessions)} connections open, the maximum is {limit}")
            return
        d = self.config.daemon
        session = Session(_peer(stream), over_tcp, d.send_queue, self.max_frame, self.journal,
                          d.send_queue_bytes)
        try:
            if over_tcp:
                liveness.keep_alive(stream, d.tcp_keepalive)
            if isinstance(stream, trio.SocketStream):
                session.raw = stdlib_socket.socket(fileno=os.dup(stream.socket.fileno()))
        except OSError as err:  # out of descriptors (EMFILE): this connection, not the daemon
            log.warning("connection_refused", peer=session.peer, error=str(err))
            await _refuse(stream, Reason.CLIENT_LIMIT, f"the daemon cannot take it: {err}")
            return
        self.sessions.add(session)
        try:
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
                        waits.cancel_scope.cancel()
                    session.finish_sending()
        finally:
            self.sessions.discard(session)
            self._connection_lost(session)
            if not self.sessions:
                self._sessions_gone.set()
            session.close()
            await trio.aclose_forcefully(stream)

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

    def handle(self, session: Session, decoder: FrameDecoder, data: bytes | None,
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
            self.dispatch(session, frame)
            dispatched = True
            if session.deregistered:
                return Turn.ENDED
        session.partial_since = None  # requests wait for the daemon, not for the client
        return Turn.MORE

    async def _writer(self, session: Session, stream: trio.abc.Stream) -> None:
        """Send what a non-blocking send could not (TLS, a slow reader), in order,
        batched, each frame only once what it acknowledges is durable: a reply
        never runs ahead of the log."""
        q = session.queue
        try:
            while q or not session.closing:
                if q and q[0][0] > self.journal.durable and session.closing:
                    if not await self.journal.wait_durable(q[0][0]):
                        session.release(self.journal.durable, self.journal.failed)
                    continue
                if not q or q[0][0] > self.journal.durable:
                    await session.wait_for_work()
                    continue
                session.sending = True
                timeout = self.config.daemon.send_timeout
                if not await liveness.send_or_stall(stream, session.take(self.journal.durable),
                                                    timeout):
                    session.cut(f"its replies went unread for send_timeout ({timeout} s)")
                    return
                session.sent()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            session.scope.cancel()

    async def _deadlines(self, session: Session) -> None:
        d = self.config.daemon
        if await liveness.overdue(session, d.handshake_timeout, d.frame_timeout) == "handshake":
            log.info("handshake_timeout", peer=session.peer)
            session.scope.cancel()
        else:
            session.cut(f"a request frame took longer than frame_timeout ({d.frame_timeout} s)")

    def _connection_lost(self, session: Session) -> None:
        for key in list(session.interests):
            self.drop_interest(session, key)
        client = session.client
        if client is None or self.clients.get(client) is not session:
            return
        del self.clients[client]
        if self.shutting_down:
            return  # locks stay in the image for the client to resync
        log.info("connection_lost", client=client, peer=session.peer,
                 cut_off=session.cut_off)
        self.schedule_peer_recovery(client)

    # -- peer recovery ---------------------------------------------------------

    def schedule_peer_recovery(self, client: str) -> None:
        """Release a dropped client's locks after ``resync_grace`` unless it comes back."""
        grace = self.config.daemon.resync_grace
        if grace == 0:
            self._recover_peer(client)
            return
        scope = trio.CancelScope()
        self.pending_recovery[client] = scope
        self.nursery.start_soon(self._grace, client, scope, grace)

    async def _grace(self, client: str, scope: trio.CancelScope, grace: float) -> None:
        with scope:
            await trio.sleep(grace)
            if self.pending_recovery.get(client) is scope:
                del self.pending_recovery[client]
                self._recover_peer(client)

    def _recover_peer(self, client: str) -> None:
        for s in self.structures.values():
            released = s.release_client(client)
            if released:
                suspended = sum(1 for e in released if e.qtype == QueueType.TRAN_SUSPEND)
                log.info("peer_recovery", client=client, structure=s.name,
                         returned=len(released) - suspended, suspended=suspended)
        self.settle()

    # -- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the data directory, rebuild the structures, serve until SIGTERM/SIGINT
        (or a log failure), then write the clean-shutdown images."""
        self.datadir.open()
        try:
            self.journal = Journal(self.datadir.logstream, self.config.daemon.log_segment)
            self.journal.on_failure = lambda err: self.stop(f"log write failed: {err}")
            self.checkpoints = Checkpoints(self)
            self.poller = Poller(self.handle, self.max_frame) if Poller.available else None
            held, crashed = self._rebuild()
            listeners = await self._listen()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.journal.run)
                if self.poller is not None:
                    nursery.start_soon(self.poller.run)
                nursery.start_soon(self.checkpoints.run)
                self.settle()  # overflow processing a restart found due
                for client in sorted(crashed):
                    self._recover_peer(client)  # their holder died with the daemon
                for client in sorted(held):
                    self.schedule_peer_recovery(client)  # they may come back and resync
                nursery.start_soon(self._signals)
                serving = await nursery.start(self._serve, listeners)
                log.info("ready", socket=self.config.daemon.socket, tcp=self.config.daemon.tcp,
                         structures=list(self.structures), pid=os.getpid())
                task_status.started(self)
                await self.stopped.wait()
                serving.cancel()
                await self._drain()
                nursery.cancel_scope.cancel()
            if self.journal.failed is not None:
                raise LogFailed(f"stopped without an image: the log write failed "
                                f"({self.journal.failed}); restart to recover from the log")
            self.journal.close()
            self._save_images()
            log.info("stopped")
        finally:
            if self.poller is not None:
                self.poller.close()
            if self._socket_made:
                _remove_socket(self.config.daemon.socket)
            self.datadir.close()

    async def _serve(self, listeners, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                for listener, over_tcp in listeners:
                    # connections live in the daemon's nursery, so that closing the
                    # listeners at shutdown does not cancel requests in flight
                    nursery.start_soon(functools.partial(
                        trio.serve_listeners, _handler(self, over_tcp), [listener],
                        handler_nursery=self.nursery,
                    ))
                task_status.started(scope)

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    if self.log_sink is not None:
                        self.log_sink.reopen()
                    log.info("logs_reopened")
                    continue
                self.stop(signal.Signals(signum).name)
                return

    def stop(self, why: str) -> None:
        """Begin a graceful stop: refuse new work, finish what is in flight."""
        if not self.shutting_down:
            self.shutting_down = True
            log.info("stopping", why=why)
            self.stopped.set()

    async def _drain(self) -> None:
        for session in list(self.sessions):
            if session.reader_scope is not None:
                session.reader_scope.cancel()
            if session.waits is not None:
                session.waits.cancel_scope.cancel()
        if self.sessions:
            with trio.move_on_after(DRAIN_TIMEOUT):
                await self._sessions_gone.wait()
        for session in list(self.sessions):
            session.scope.cancel()

    def _rebuild(self) -> tuple[set[str], set[str]]:
        """Rebuild every structure from its image and the log; returns the clients whose
        locks survived a clean stop, and those whose locks a crash left behind."""
        held, crashed = set(), set()
        for r in rebuild_all([s for p in self.structures.values() for s in p.structures()],
                             self.datadir.images,
                             self.datadir.logstream, WRITER, self.journal.position,
                             self.datadir.srds, self._spark_recover,
                             self.config.daemon.spark_recovery_records):
            log.info("structure_rebuilt", structure=r.structure, clean=r.clean, source=r.source,
                     messages=r.messages, records_replayed=r.replayed,
                     image_seconds=round(r.image_seconds, 3),
                     replay_seconds=round(r.replay_seconds, 3))
            if r.clean and r.replayed:
                log.warning("image_behind_log", structure=r.structure, records=r.replayed,
                            action="folded the records logged after the clean-stop image")
            (held if r.clean else crashed).update(r.lock_owners)
        for pair in self.structures.values():
            pair.derive_status()
        return held, crashed - held

    def _spark_recover(self, name: str) -> Path | None:
        """At start, before serving: the Spark recovery job folds a long log tail. On
        failure the daemon folds it itself (slower, but it starts)."""
        path = self.datadir.images / f"{name}.recovered"
        args = ["recover", "--structure", name, "--to-image", str(path)]
        log.info("spark_recovery_started", structure=name)
        try:
            done = subprocess.run(job_command(self.config, args), capture_output=True,
                                  timeout=self.config.daemon.job_timeout, check=False)
            result = job_outcome(args, done)
        except subprocess.TimeoutExpired:
            log.error("spark_recovery_failed", structure=name, error="job_timeout")
            return None
        except JobFailed as err:
            log.error("spark_recovery_failed", structure=name, error=err.message)
            return None
        log.info("spark_recovery_done", structure=name, result=result)
        return path

    async def recover_structure(self, name: str, purge: bool, why: str = "recover") -> dict:
        """RECOVER CFSTRUCT: mark ``name`` failed (its requests get STRUCTURE_FAILED, the
        others carry on), rebuild it — with its overflow structure, as IMS recovers
        the pair — from the newest checkpoint and the log with the recovery job, or,
        with ``purge``, empty it and make sure nothing older is ever recovered, and
        make it available again. Locks of clients still registered stay theirs; the
        others' go back as in peer recovery."""
        if name in self._recovering:
            raise CQSError(Reason.INVALID_REQUEST, f"structure {name} is already being recovered")
        old = self.failed.get(name)
        if old is None:  # else a retry after a failed recovery
            old = self.structure(name)
            del self.structures[name]
            self.failed[name] = old
            self.waiters.fail(old)
            log.warning("structure_failed", structure=name, why=why, purge=purge,
                        messages=old.stats()["messages"])
        self._recovering.add(name)
        started = time.monotonic()
        new = self._new_pair(name)
        new.last_id = old.last_id
        replayed = 0
        try:
            for s in new.structures():
                await self.checkpoints.finished(s.name)  # none starts while it is failed
            position = self.journal.position  # the structure is failed: none of it comes later
            if not await self.journal.wait_durable(position):
                raise CQSError(Reason.SHUTTING_DOWN, "the log failed")
            for s in new.structures():
                if purge:
                    slots.purge(self.datadir.srds, s.name, {WRITER: position}, old.last_id)
                    (self.datadir.images / f"{s.name}.base").unlink(missing_ok=True)
                    continue
                path = self.datadir.images / f"{s.name}.recovered"
                await run_job(self.config, ["recover", "--structure", s.name,
                                            "--to-image", str(path)])
                r = await trio.to_thread.run_sync(
                    load_recovered, s, path, self.datadir.logstream, {WRITER: self.journal.durable})
                path.unlink()
                replayed += r.replayed
        except Exception as err:
            reason = err.message if isinstance(err, CQSError) else f"{type(err).__name__}: {err}"
            log.error("structure_recovery_failed", structure=name, error=reason,
                      action="the structure stays failed; retry cqsctl recover, or --purge")
            raise CQSError(Reason.STRUCTURE_FAILED, f"recovery of {name} failed, it stays "
                           f"failed: {reason}") from err
        finally:
            self._recovering.discard(name)
        del self.failed[name]
        self._install(new)
        for owner in sorted(set(new.client_stats()) - set(self.clients)):
            new.release_client(owner)
        self.settle()
        stats = new.stats()
        source = "purge" if purge else "checkpoint and log"
        seconds = round(time.monotonic() - started, 3)
        log.info("structure_recovered", structure=name, source=source, messages=stats["messages"],
                 records_replayed=replayed, seconds=seconds)
        return {"structure": name, "source": source, "messages": stats["messages"],
                "records_replayed": replayed, "seconds": seconds}

    def _install(self, new: StructurePair) -> None:
        """Make a rebuilt or recovered pair the one clients reach, in config order, and
        tell interested clients about the queues it holds work on."""
        new.derive_status()
        self.structures = {n: new if n == new.name else self.structures[n]
                           for n in self.config_names() if n == new.name or n in self.structures}
        for sname, qtype, queue in list(self.interest):
            if sname == new.name and new.queue_stats(qtype, queue)["depth"]:
                for session in list(self.interest.get((sname, qtype, queue), ())):
                    session.send(self.notification(sname, qtype, queue))

    def rebuild_structure(self, name: str, size: int | None) -> dict:
        """Structure copy (SETXCF START,REBUILD): every message, recoverable or not,
        locks and cold queue included, copied to a new instance — with ``size`` as
        its new SIZE if given — while requests wait; nothing changes in the log."""
        pair = self.pair_of(name)
        target = self.physical(name)
        if size is not None and size < target.elements_used * ELEMENT:
            raise CQSError(Reason.INVALID_REQUEST,
                           f"rebuild of {name}: {size} bytes is less than the "
                           f"{target.elements_used * ELEMENT} in use")
        started = time.perf_counter()
        new = self._new_pair(pair.name, {name: size} if size else None)
        for old_s, new_s in zip(pair.structures(), new.structures()):
            image.restore(new_s, rows_of(old_s))
        new.last_id = pair.last_id
        new.watched.update(pair.watched)
        self._install(new)
        seconds = round(time.perf_counter() - started, 3)
        row = self.physical(name).stats()
        log.info("structure_rebuilt_copy", structure=name, size=row["size"],
                 messages=row["messages"], seconds=seconds)
        return {**row, "seconds": seconds}

    def alter_structure(self, name: str, size: int) -> dict:
        """SETXCF START,ALTER: change a structure's current size, up to its SIZE and
        never below what is in use."""
        pair = self.pair_of(name)
        (pair if name == pair.name else self.physical(name)).alter(size)
        self.settle()
        return self.physical(name).stats()

    def pair_of(self, name: str) -> StructurePair:
        """The pair a structure belongs to, primary or overflow, if it is available."""
        return self.structure(self.overflow_of.get(name, name))

    async def detached(self, operation, *args):
        """Await ``operation`` run in the daemon's nursery rather than the caller's, so an
        operator's connection dropping does not cancel a recovery half-way."""
        done, outcome = trio.Event(), []

        async def run():
            try:
                outcome.append(await operation(*args))
            except CQSError as err:
                outcome.append(err)
            except Exception as err:  # a bug must cost one request, not the daemon
                log.exception("internal_error", operation=operation.__name__)
                outcome.append(CQSError(Reason.INVALID_REQUEST, f"internal error: {err}"))
            finally:
                done.set()

        self.nursery.start_soon(run)
        await done.wait()
        if not outcome:
            raise CQSError(Reason.SHUTTING_DOWN, "the daemon stopped before it finished")
        if isinstance(outcome[0], CQSError):
            raise outcome[0]
        return outcome[0]

    def physical(self, name: str) -> Structure | None:
        """The live structure called ``name`` (primary or overflow), None if failed."""
        pair = self.structures.get(self.overflow_of.get(name, name))
        if pair is None:
            return None
        return pair.primary if pair.primary.name == name else pair.overflow

    def config_names(self) -> list[str]:
        return [sc.name for sc in self.config.structures]

    def _save_images(self) -> None:
        position = {WRITER: self.journal.position}
        for s in (s for p in self.structures.values() for s in p.structures()):
            path = image.path_for(self.datadir.images, s.name)
            count = image.save(path, s, position)
            log.info("image_saved", structure=s.name, messages=count, path=str(path))

    async def _listen(self) -> list[tuple[trio.abc.Listener, bool]]:
        d = self.config.daemon
        _reserve_descriptors(d.max_connections)
        listeners: list[tuple[trio.abc.Listener, bool]] = [(_unix_listener(d.socket), False)]
        self._socket_made = True
        if d.tcp_address:
            host, port = d.tcp_address
            tcp = await trio.open_tcp_listeners(port, host=host)
            if d.tls_cert:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(d.tls_cert, d.tls_key)
                tcp = [trio.SSLListener(t, context) for t in tcp]
            listeners += [(t, True) for t in tcp]
        return listeners


def _handler(daemon: Daemon, over_tcp: bool):
    async def handle(stream):
        await daemon.serve_connection(stream, over_tcp)
    return handle


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


def _peer(stream) -> str:
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    try:
        name = sock.getpeername() if sock is not None else None
    except OSError:
        name = None
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    return "unix"


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


def _unix_listener(path: str) -> trio.SocketListener:
    """A Unix socket listener created mode 0600; a stale socket file is replaced,
    a live one (another daemon answering on it) is refused."""
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
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(512)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


def _remove_socket(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _urgent(record: dict) -> bool:
    """Whether a reply waits for this record: anything but locks does."""
    if any(e[0] != LOCK for e in record["e"]):
        return True
    return any(e[0] != LOCK for effects in record.get("x", {}).values() for e in effects)


def _log_event(event) -> None:
    kind = type(event)
    if kind is FullnessChanged:
        log.warning("structure_full" if event.full else "structure_not_full",
                    structure=event.structure, elements_used=event.elements_used,
                    elements_total=event.elements_total)
    elif kind is Altered:
        log.info("structure_altered", structure=event.structure, old_size=event.old_size,
                 new_size=event.new_size, reason=event.reason)
    elif kind is OverflowStatus:
        log.info("overflow_status", structure=event.structure, qtype=QueueType(event.qtype).name,
                 queue=event.name, on=event.on)
    elif kind is OverflowMode:
        log.warning("overflow_mode", structure=event.structure, on=event.on)
    elif kind is ExitFailed:
        log.error("exit_failed", structure=event.structure, exit=event.exit, error=event.error)
