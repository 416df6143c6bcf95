"""The daemon: it makes the rooms, runs them, and stops them.

Design note. The daemon is a handful of rooms, each given only what it uses,
and declared once in rooms.py: the structures by name (registry.py),
registered clients with their interests and peer recovery (clients.py),
listeners and connections (connections.py), the log and its group commit
(journal.py), checkpoints (checkpoints.py), operator actions on whole
structures (operations.py), the SMDS data sets (smds/), overflow moves
(overflowmoves.py) and the handlers of the requests (handlers.py). The two
steps of every request, dispatch and settle, are dispatch.py's; what a room
may ask of the running daemon (settle, spawn a supervised task, stop on a
fatal error) is the runtime's (runtime.py), bound here once the nursery is
open. What stays here is the order things are made and started in, and the
stop. docs/architecture.md walks a request through them.

Task tree: run → (signals, flusher, poller, checkpoint triggers, overflow
moves, the timer of leases and delayed puts (timers.py), listeners →
connections, grace timers of dropped clients, the
monitoring listener, the systemd watchdog), every long-lived task supervised
(docs/robustness.md). Operations (docs/operations.md) add who may do what
(access.py, checked by the dispatcher before each handler), sd_notify
(notify.py) and the SIGHUP reload (reload.py).
"""

import os
import signal
from typing import TYPE_CHECKING, Any

import structlog
import trio

from logstream import LogstreamError

from ..config import Config
from ..errors import CannotStart, DaemonError
from ..group import stalls
from ..storage import image
from ..storage.datadir import DataDir
from . import notify, reload
from .checkpoints import Checkpoints
from .clients import Clients
from .connections import Connections
from .dedup import Dedup, window_of
from .definitions import Definitions
from .dispatch import Dispatcher
from .journal import WRITER, Journal, writer_for
from .limits import Limits
from .liveconfig import LiveConfig
from .operations import Operations
from .overflowmoves import OverflowMoves
from .registrations import Registrations
from .registry import Registry
from .rooms import Life, Rooms
from .runtime import InternalError, Runtime
from .session import Session
from .smds.commands import SmdsCommands
from .smds.datasets import DataSets
from .timers import Timers
from .waiters import ReadWaiters

if TYPE_CHECKING:  # imported where used: the default config (no group, no metrics) never needs them
    from .membership import Membership
    from .metrics import Fsyncs

log = structlog.get_logger()

# seconds a node of a group stopped by SIGTERM waits for its planned moves (each waits
# for its target's warm standby, then pauses its pair for well under a second)
HAND_OFF_WAIT = 15.0


class LogFailed(DaemonError):
    """The log could not be written: the daemon stopped so a restart can recover."""

    exit_code = 3
    logged = False  # its critical event is logged already

    def headline(self) -> str:
        return str(self)


class InternalFailure(LogFailed):
    """An internal error left memory that may not match the log, or killed a task
    the daemon cannot run without: it stopped so a restart can recover."""

    exit_code = 4


class Daemon:
    def __init__(self, config: Config, log_sink: Any = None,
                 config_path: str | None = None) -> None:
        """``config_path``: the file SIGHUP re-reads (None: the default)."""
        self.config = LiveConfig(config)
        self.life = Life(config_path=config_path, log_sink=log_sink)
        self.datadir = DataDir(config.daemon.data_dir,
                               config.group.node if config.group is not None else None)
        self.limits = Limits(config.daemon.max_message)
        self.runtime = Runtime()
        self.registry = Registry(self.config, Definitions(config, self.datadir.repository))
        self.clients = Clients(self.config, self.registry, self.runtime,
                               Registrations(self.datadir.registrations))
        self.datasets = DataSets(self.config, self.datadir.root, self.datadir.repository,
                                 self.registry, self.limits, self.runtime)
        self.waiters = ReadWaiters(self.limits.reply_bytes, self.datasets.undeliverable)
        self.stopped = trio.Event()
        self.moves = OverflowMoves(self.registry, self.runtime)
        self.timers = Timers(self.registry, self.runtime, lambda: self.clients.held_over)
        self.fsyncs: Fsyncs | None = None
        if config.daemon.metrics_listen:
            from . import metrics  # prometheus_client and psutil: only with metrics on
            self.fsyncs = metrics.Fsyncs()
        self.dedup = Dedup(window_of(config))  # exactly-once puts (docs/group.md)
        self.journal: Journal | None = None
        self.connections: Connections | None = None
        self.membership: Membership | None = None  # a node of a group (docs/group.md)

    def dispatch(self, session: Session, frame: dict) -> None:
        """Handle one request (dispatch.py): for tests that feed requests directly."""
        self.dispatcher.dispatch(session, frame)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the data directory, rebuild the structures, serve until SIGTERM/SIGINT
        (or a log failure), then write the clean-shutdown images. Raises a
        DaemonError (cqsd/errors.py) if it cannot start or stops on a failure."""
        try:
            await self._run(task_status)
        except (LogstreamError, OSError) as err:
            raise CannotStart(err) from err

    async def _run(self, task_status) -> None:
        self.datadir.open()
        try:
            self.registry.open()
            self.clients.registrations.load()
            group = self.config.group
            writer = WRITER if group is None else writer_for(group.node, self.datadir.logstream)
            self.journal = journal = Journal(
                self.datadir.logstream, self.config.daemon.log_segment, self.datasets, writer,
                on_failure=lambda err: self.stop(f"no more acknowledgements: {err}"),
                observe=self.fsyncs.flushed if self.fsyncs is not None else None)
            self.checkpoints = Checkpoints(self.config, self.datadir, journal,
                                           self.registry.physical, self.runtime)
            journal.on_written = self.checkpoints.note_logged  # the volume trigger
            self.operations = Operations(self.config, self.datadir, self.registry, self.clients,
                                         journal, self.checkpoints, self.waiters, self.datasets,
                                         self.runtime, self.dedup)
            self.smds_commands = SmdsCommands(self.config, self.datasets, self.runtime)
            if group is not None:  # owning nothing until etcd says so
                from .membership import Membership  # etcd's client, h11, the standby: a group's
                self.membership = Membership(self.config.current, self.datadir, self.registry,
                                             journal, self.clients, self.waiters, self.runtime,
                                             self.datasets, self.checkpoints,
                                             self.operations, self.dedup)
                self.datasets.open_sets.writer = lambda: journal.writer_id
                self.checkpoints.sealed = self.membership.node.cuts
                self.checkpoints.live_series = self.membership.node.live_series
            self.rooms = rooms = Rooms(
                config=self.config, life=self.life, datadir=self.datadir, limits=self.limits,
                registry=self.registry, clients=self.clients, waiters=self.waiters,
                datasets=self.datasets, journal=journal, checkpoints=self.checkpoints,
                operations=self.operations, smds_commands=self.smds_commands,
                sessions=set(), runtime=self.runtime, membership=self.membership,
                dedup=self.dedup)
            self.dispatcher = Dispatcher(rooms, self.moves, self.timers)
            self.waiters.answer = self.dispatcher.answer
            self.connections = Connections(self.config, journal, self.limits.max_frame,
                                           self.limits.max_reply, self.clients, self.dispatcher,
                                           rooms.sessions, self.waiters)
            monitor = None
            if self.fsyncs is not None:
                from .metrics import Monitor  # only with metrics on, as Fsyncs
                monitor = Monitor(rooms, self.fsyncs)
            monitoring = await _monitoring(self.config.daemon.metrics_listen)
            notify.status("recovering the structures", extend=True)
            if monitoring and monitor is not None:  # /healthz says "starting" meanwhile
                held, crashed = await monitor.serve_during(monitoring, self.operations.restart)
            else:
                held, crashed = self.operations.restart()
            self.datasets.open_sets.start()
            listeners = await self.connections.listen()
            async with trio.open_nursery() as nursery:
                self.runtime.bind(nursery, self.dispatcher.settle, journal)
                spawn = self.runtime.spawn
                spawn("flusher", journal.run)
                if self.connections.poller is not None:
                    spawn("poller", self.connections.poller.run)
                spawn("checkpoint triggers", self.checkpoints.run)
                spawn("timers", self.timers.run)
                spawn("read waits", self.waiters.run)
                self.runtime.settle()  # overflow processing a restart found due
                self.clients.held_over = held | crashed
                for client in sorted(held | crashed):
                    # their holders outlive the daemon, and may come back to resync; if
                    # not, the daemon's stop is not counted as their failed deliveries
                    self.clients.schedule_peer_recovery(client, failed=False)
                spawn("signals", self._signals)
                if monitoring and monitor is not None:
                    spawn("monitoring", monitor.serve, monitoring)
                serving = await nursery.start(self.connections.serve, listeners, nursery)
                if self.membership is not None:
                    spawn("group", self.membership.node.run)
                    spawn("loop stall watch", stalls.watch)
                self.life.ready = True
                log.info("ready", socket=self.config.daemon.socket, tcp=self.config.daemon.tcp,
                         metrics=self.config.daemon.metrics_listen,
                         structures=list(self.registry.pairs), pid=os.getpid())
                notify.ready(f"serving {len(self.registry.pairs)} structures")
                if (interval := notify.watchdog_interval()) is not None:
                    spawn("watchdog", notify.watchdog, interval)
                task_status.started(self)
                await self.stopped.wait()
                if self.membership is not None and not self.life.stopping:
                    # serving on meanwhile: each pair's clients follow it to its new owner
                    await self.membership.node.hand_off(HAND_OFF_WAIT)
                    self.life.stopping = True
                serving.cancel()
                await self.connections.drain()
                nursery.cancel_scope.cancel()
            journal.finish_held_back()
            self._stopped_without_image(journal.failed)
            self.datasets.durable(journal.acknowledged)
            journal.close()
            self._save_images()
            self.datasets.open_sets.close()
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

    # -- stopping ------------------------------------------------------------------------

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    assert self.connections is not None
                    reload.signalled(self.rooms, self.connections)
                    continue
                self.stop(signal.Signals(signum).name)
                return

    def stop(self, why: str) -> None:
        """Begin a graceful stop: refuse new work, finish what is in flight. A node of a
        group stopped by a signal first hands its pairs over by planned moves, serving
        until each has moved (docs/group.md); stopped on a failure, it does not."""
        if not self.stopped.is_set():
            hand_off = (self.membership is not None and why in ("SIGTERM", "SIGINT")
                        and self.journal is not None and self.journal.ended() is None)
            self.life.stopping = not hand_off
            log.info("stopping", why=why, hand_off=hand_off)
            notify.stopping(why)
            self.stopped.set()

    def _save_images(self) -> None:
        assert self.journal is not None
        position = {self.journal.writer_id: self.journal.position}
        for s in self.registry.structures():
            if self.membership is not None:
                position = self.membership.cut(s.name)
            path = image.path_for(self.datadir.images, s.name)
            count = image.save(path, s, position)
            log.info("image_saved", structure=s.name, messages=count, path=str(path))


async def _monitoring(address: str) -> list[trio.SocketListener]:
    """The monitoring listener's sockets (metrics_listen), none if it is off."""
    if not address:
        return []
    host, _, port = address.rpartition(":")
    return await trio.open_tcp_listeners(int(port), host=host.strip("[]"))
