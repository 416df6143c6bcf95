"""The daemon: its run, and the two steps of every request, dispatch and settle.

Design note. The daemon is a handful of rooms, each given only what it uses:
the structures by name (registry.py), registered clients with their interests
and peer recovery (clients.py), listeners and connections (connections.py),
the log and its group commit (journal.py), checkpoints (checkpoints.py),
operator actions on whole structures (operations.py), overflow moves
(relief.py) and the handlers of the requests (handlers.py). What stays here
is what ties them together: a request is parsed and handed to its handler
(``dispatch``), then what it did is turned into notifications, waiter
hand-offs and log records (``settle``) — only the dispatcher writes the log,
and it logs effects (STYLE §4). A message a waiting reader takes in ``settle``
goes to its lock as if put there (seed 004: "placed on LOCKQ instead of Ready
Queue"): a queue it left empty again tells no interested client of work.

Task tree: run → (signals, flusher, poller, checkpoint triggers, overflow
moves, the timer of leases and delayed puts (timers.py), listeners →
connections, grace timers of dropped clients, the
monitoring listener, the systemd watchdog), every long-lived task supervised
(docs/robustness.md). Operations (docs/operations.md) add who may do what
(access.py, checked here before each handler), sd_notify (notify.py) and the
SIGHUP reload (reload.py).
"""

import os
import signal
import time
from typing import Any

import structlog
import trio

from cqsproto import ProtocolError, requests

from .. import engine
from ..config import Config
from ..engine import Altered, CQSError, QueueWork, Reason
from ..group.node import writer_for
from ..records import waits_for_log
from ..storage import image
from ..storage.datadir import DataDir
from . import notify, reload
from .checkpoints import Checkpoints
from .clients import Clients
from .connections import Connections
from .datasets import DataSets
from .definitions import Definitions
from .eventlog import log_event
from .handlers import DEFERRED, HANDLERS
from .journal import WRITER, Journal
from .limits import Limits, RecordTooLarge, split
from .membership import Membership
from .metrics import Monitor
from .operations import Operations
from .registry import Registry
from .relief import Relief
from .session import Session
from .smdscommands import SmdsCommands
from .timers import Timers
from .waiters import ReadWaiters

log = structlog.get_logger()
NEVER = 1 << 62  # the LSN a reply waits for when its record could not be logged


class LogFailed(Exception):
    """The log could not be written: the daemon stopped so a restart can recover."""

    exit_code = 3


class InternalFailure(LogFailed):
    """An internal error left memory that may not match the log, or killed a task
    the daemon cannot run without: it stopped so a restart can recover."""

    exit_code = 4


class InternalError(Exception):
    """What ``Daemon.fatal`` hands the journal: the named event and its cause."""


class Daemon:
    def __init__(self, config: Config, log_sink: Any = None) -> None:
        self.config = config
        self.log_sink = log_sink
        self.datadir = DataDir(config.daemon.data_dir,
                               config.group.node if config.group is not None else None)
        self.limits = Limits(config.daemon.max_message)
        self.registry = Registry(config, Definitions(config, self.datadir.repository))
        self.clients = Clients(config, self.registry, self.settle, self.spawn)
        self.waiters = ReadWaiters(self.limits.reply_bytes)
        self.shutting_down = False
        self.stopped = trio.Event()
        self.relief = Relief(self.registry, self.settle, self.spawn)
        self.timers = Timers(self.registry, self.settle, lambda: self.clients.held_over)
        self.datasets = DataSets(config, self.datadir.root, self.datadir.repository,
                                 self.registry, self.limits)
        self.nursery: trio.Nursery | None = None
        self.journal: Journal | None = None
        self.connections: Connections | None = None
        self.config_path: str | None = None  # the file SIGHUP re-reads (None: the default)
        self.started = time.time()
        self.ready = False  # recovered and listening (READY=1)
        self.monitor = Monitor(self) if config.daemon.metrics_listen else None
        self.membership: Membership | None = None  # a node of a group (docs/group.md)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the data directory, rebuild the structures, serve until SIGTERM/SIGINT
        (or a log failure), then write the clean-shutdown images."""
        self.datadir.open()
        try:
            self.registry.open()
            group = self.config.group
            writer = WRITER if group is None else writer_for(group.node, self.datadir.logstream)
            self.journal = journal = Journal(self.datadir.logstream,
                                             self.config.daemon.log_segment, writer)
            journal.on_failure = lambda err: self.stop(f"no more acknowledgements: {err}")
            journal.sync_data = self.datasets.sync
            journal.on_durable = self.datasets.durable
            self.checkpoints = Checkpoints(self.config, self.datadir, journal,
                                           self.registry.physical, self.spawn)
            self.operations = Operations(self.config, self.datadir, self.registry, self.clients,
                                         journal, self.checkpoints, self.waiters, self.datasets,
                                         self.settle, self.spawn)
            self.smds_commands = SmdsCommands(self.config, self.datasets, self.settle)
            self.connections = Connections(self.config, journal, self.limits.max_frame,
                                           self.limits.max_reply, self.clients, self.dispatch,
                                           self._connection_failed)
            if self.monitor is not None:
                journal.observe = self.monitor.flushed
            if group is not None:  # owning nothing until etcd says so
                self.membership = Membership(self.config, self.datadir, self.registry, journal,
                                             self.clients, self.waiters, self.settle)
                self.checkpoints.sealed = self.membership.node.cuts
            monitoring = await _monitoring(self.config.daemon.metrics_listen)
            notify.status("recovering the structures", extend=True)
            if monitoring:  # /healthz says "starting" while recovery runs (a thread)
                held, crashed = await self.monitor.serve_during(monitoring,
                                                                self.operations.restart)
            else:
                held, crashed = self.operations.restart()
            self.datasets.start()
            listeners = await self.connections.listen()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.spawn("flusher", journal.run)
                if self.connections.poller is not None:
                    self.spawn("poller", self.connections.poller.run)
                self.spawn("checkpoint triggers", self.checkpoints.run)
                self.spawn("timers", self.timers.run)
                self.settle()  # overflow processing a restart found due
                self.clients.held_over = held | crashed
                for client in sorted(held | crashed):
                    # their holders outlive the daemon, and may come back to resync; if
                    # not, the daemon's stop is not counted as their failed deliveries
                    self.clients.schedule_peer_recovery(client, failed=False)
                self.spawn("signals", self._signals)
                if monitoring:
                    self.spawn("monitoring", self.monitor.serve, monitoring)
                serving = await nursery.start(self.connections.serve, listeners, nursery)
                if self.membership is not None:
                    self.spawn("group", self.membership.node.run)
                self.ready = True
                log.info("ready", socket=self.config.daemon.socket, tcp=self.config.daemon.tcp,
                         metrics=self.config.daemon.metrics_listen,
                         structures=list(self.registry.pairs), pid=os.getpid())
                notify.ready(f"serving {len(self.registry.pairs)} structures")
                if (interval := notify.watchdog_interval()) is not None:
                    self.spawn("watchdog", notify.watchdog, interval)
                task_status.started(self)
                await self.stopped.wait()
                serving.cancel()
                await self.connections.drain()
                nursery.cancel_scope.cancel()
            journal.finish_held_back(self.datasets.sync_now)
            self._stopped_without_image(journal.failed)
            self.datasets.durable(journal.durable)
            journal.close()
            self._save_images()
            self.datasets.close()
            if self.membership is not None:  # the images first: the next owner starts from them
                await self.membership.node.leave()
            log.info("stopped")
        finally:
            if self.journal is not None:
                self.journal.close()  # done already after a clean stop
            if self.connections is not None:
                self.connections.close()
            self.datadir.close()

    def _stopped_without_image(self, failed: BaseException | None) -> None:
        if isinstance(failed, InternalError):
            raise InternalFailure(f"stopped without an image after an internal error "
                                  f"({failed}); restart to recover from the log")
        if failed is not None:
            raise LogFailed(f"stopped without an image: the log write failed "
                            f"({failed}); restart to recover from the log")

    # -- requests ------------------------------------------------------------

    def dispatch(self, session: Session, frame: dict) -> None:
        """Handle one request to completion and send its reply (or start its wait)."""
        try:
            rid, op, args = requests.parse(frame)
        except Exception as err:  # nothing has run yet: only this request fails
            if not isinstance(err, ProtocolError):
                log.exception("request_internal_error", client=session.client)
                err = ProtocolError(Reason.INVALID_REQUEST, "request not understood")
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
            if session.rights is not None:  # a listed client with restricted rights
                self.clients.access.check(session, op, args, self.registry.queue_of)
            result = HANDLERS[op](self, session, rid, **args)
        except (CQSError, ProtocolError) as err:
            log.debug("request_failed", client=session.client, op=op, reason=str(err.reason),
                      message=err.message)
            session.fail(rid, err.reason, err.message, getattr(err, "details", None))
        except Exception as err:
            if _raised_in_engine(err):  # the engine may have applied part of it
                self.fatal("internal_error", err, client=session.client, op=op)
            else:  # the engine was not reached, or changed nothing: one request fails
                log.exception("request_internal_error", client=session.client, op=op)
            session.fail(rid, Reason.INVALID_REQUEST, f"{op}: internal error, see the daemon log")
        # even a refused request settles: a refused put may have changed the fullness state
        lsn = self.settle()
        if result is not DEFERRED:
            session.reply(rid, result, lsn)

    def settle(self) -> int:
        """Turn what the last request did into notifications, waiter hand-offs and log
        records; returns the LSN a reply must wait for (0: none; past the log's end
        if the daemon is stopping on an error, so that nothing more is acknowledged)."""
        try:
            return self._settle()
        except Exception as err:  # the request is applied in memory but maybe not logged
            self.fatal("settle_failed", err)
            return NEVER

    def _settle(self) -> int:
        wait_for = 0
        for s in self.registry.pairs.values():
            if s.pressure and self.nursery is not None:
                self.relief.relieve(s)
            if s.readable:  # waiting readers first: what they take was never work for others
                self.waiters.serve(s)
            if s.take_armed():  # a lease or a delay may end before the timer wakes
                self.timers.poke()
            if s.events:
                for event in s.take_events():
                    if type(event) is QueueWork:
                        if s.has_ready((event.qtype, event.name)):
                            self.clients.notify((s.name, event.qtype, event.name))
                        continue
                    log_event(event)
                    if type(event) is Altered:  # kept: a restart finds the size it left
                        self.registry.definitions.resized(event.structure, event.new_size,
                                                          event.reason)
            record = s.take_record()
            lsn = 0
            if record is not None:
                urgent = waits_for_log(record)
                lsn = self._log(record, urgent)
                if urgent:
                    wait_for = lsn or NEVER
            if s.offloading:
                for structure in s.structures():
                    self.datasets.freed(structure, lsn)
        return wait_for

    def _log(self, record: dict, urgent: bool) -> int:
        """Append a record (split if it must be); the last LSN, 0 if not logged."""
        journal, lsn = self.journal, 0
        try:
            parts = split(record)
        except RecordTooLarge as err:
            journal.fail(err, "log_record_refused")
            return 0
        after_data = self.datasets.take_unsynced()
        for part in parts:
            lsn = journal.append(part, urgent, after_data)
        self.checkpoints.note_logged()
        return lsn

    # -- supervision and stopping ------------------------------------------------------

    def spawn(self, name: str, task, *args) -> None:
        """Start ``task`` in the daemon's nursery, supervised: if it raises, the
        daemon says which task and why, and stops rather than half-runs."""
        self.nursery.start_soon(self._supervise, name, task, *args, name=name)

    async def _supervise(self, name: str, task, *args) -> None:
        try:
            await task(*args)
        except Exception as err:
            self.fatal("task_died", err, task=name)

    def _connection_failed(self, session: Session, err: Exception) -> None:
        """A connection's task raised: it is gone; the daemon goes on unless the
        exception came out of the engine."""
        if _raised_in_engine(err):
            self.fatal("internal_error", err, client=session.client, peer=session.peer)
        else:
            log.exception("connection_failed", client=session.client, peer=session.peer)

    def fatal(self, event: str, err: BaseException, **fields) -> None:
        """Stop without acknowledging anything more, as after a log write failure:
        memory may no longer match the log, or the daemon lost a task it needs, so
        the restart recovers from the log (docs/robustness.md)."""
        log.critical(event, error=f"{type(err).__name__}: {err}", **fields, exc_info=err,
                     action="no more acknowledgements; stopping for restart and recovery")
        self.journal.fail(InternalError(f"{event}: {type(err).__name__}: {err}"), event=None)

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reload.signalled(self)
                    continue
                self.stop(signal.Signals(signum).name)
                return

    def stop(self, why: str) -> None:
        """Begin a graceful stop: refuse new work, finish what is in flight."""
        if not self.shutting_down:
            self.shutting_down = True
            log.info("stopping", why=why)
            notify.stopping(why)
            self.stopped.set()

    def _save_images(self) -> None:
        position = {self.journal.writer_id: self.journal.position}
        for s in self.registry.structures():
            if self.membership is not None:
                position = self.membership.cut(s.name)
            path = image.path_for(self.datadir.images, s.name)
            count = image.save(path, s, position)
            log.info("image_saved", structure=s.name, messages=count, path=str(path))


ENGINE_FILES = os.path.dirname(engine.__file__) + os.sep


async def _monitoring(address: str) -> list[trio.SocketListener]:
    """The monitoring listener's sockets (metrics_listen), none if it is off."""
    if not address:
        return []
    host, _, port = address.rpartition(":")
    return await trio.open_tcp_listeners(int(port), host=host.strip("[]"))


def _raised_in_engine(err: BaseException) -> bool:
    """Whether ``err`` came out of the engine, which may then have applied part of
    a change: everywhere else an exception leaves the structures as they were."""
    if isinstance(err, BaseExceptionGroup):
        return any(_raised_in_engine(e) for e in err.exceptions)
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(ENGINE_FILES):
            return True
        tb = tb.tb_next
    return False
