"""The rooms of the daemon, declared once: what a request, a query, the status
snapshot, the metrics collector and a reload may use.

Design note. A handler (handlers.py) gets this record, not the daemon: what it
can touch is the list below, each room owning its part of the state and
changing it only through its own methods. The daemon (daemon.py) makes the
rooms, in the order their collaborators allow, and the record once it runs;
nothing in it is replaced afterwards (a reload changes the config inside
``config``, not the field). The listeners (connections.py) are not a room of a
request's: they hand requests to the dispatcher (dispatch.py), which is made
from this record, and share with it only the set of open sessions. Which
module uses which room is in docs/architecture.md, "The rooms".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..storage.datadir import DataDir
from .checkpoints import Checkpoints
from .clients import Clients
from .dedup import Dedup
from .journal import Journal
from .limits import Limits
from .liveconfig import LiveConfig
from .operations import Operations
from .registry import Registry
from .runtime import Runtime
from .session import Session
from .smds.commands import SmdsCommands
from .smds.datasets import DataSets
from .waiters import ReadWaiters

if TYPE_CHECKING:  # imported by the daemon only when a group is configured (its etcd client)
    from .membership import Membership


@dataclass
class Life:
    """The daemon as a whole: when it started, whether it serves, whether it is
    stopping; and what a SIGHUP re-reads (the config file) and reopens (the log
    sink)."""

    started: float = field(default_factory=time.time)
    ready: bool = False  # recovered and listening (READY=1)
    stopping: bool = False  # no new requests: a graceful stop has begun
    config_path: str | None = None  # the file SIGHUP re-reads (None: the default)
    log_sink: Any = None  # logs.configure's sink, reopened by SIGHUP


@dataclass(frozen=True)
class Rooms:
    config: LiveConfig  # the running config: read it here, a reload changes it here
    life: Life
    datadir: DataDir  # the data directory's paths (the log's, the repository's)
    limits: Limits  # message, frame and record sizes
    registry: Registry  # the structures by name, and the failed ones
    clients: Clients  # registered clients, interests, peer recovery, access rights
    waiters: ReadWaiters  # reads waiting for a message
    datasets: DataSets  # the SMDS data sets: payloads, space, their states
    journal: Journal  # the log: append, group commit, durable LSN
    checkpoints: Checkpoints  # SRDS checkpoints, their jobs and log trimming
    operations: Operations  # recover, fail, rebuild, alter of whole structures
    smds_commands: SmdsCommands  # reset-smds, start/stop-smdsconn, alter-smds
    sessions: set[Session]  # every open connection's (connections.py adds and drops them)
    runtime: Runtime  # settle, spawn a supervised task, stop on a fatal error
    # a node of a group (docs/group.md): what it owns, its takeovers; None alone
    membership: Membership | None = None
    # each owned pair's idempotency keys (exactly-once puts, docs/group.md)
    dedup: Dedup = field(default_factory=lambda: Dedup(0))
