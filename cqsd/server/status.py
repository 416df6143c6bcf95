"""What ``cqsctl status`` shows (like ``redis-cli INFO``) and the monitoring
listener exports: one snapshot of the daemon, taken on the event loop.

Times are epoch seconds and durations seconds, sizes bytes: one unit each, so
the JSON is for programs; cqsctl makes them human.
"""

import os
import time
from typing import Any

from .. import __version__
from ..engine.entry import ELEMENT
from .rooms import Rooms


def snapshot(d: Rooms) -> dict[str, Any]:
    """The daemon as a whole: process, clients, structures, log, checkpoints, jobs."""
    now = time.time()
    clients = d.clients
    operators = clients.operators
    return {
        "version": __version__,
        "pid": os.getpid(),
        "started": d.life.started,
        "uptime_seconds": round(now - d.life.started, 3),
        "state": state(d),
        "clients": len(clients.sessions) - operators,
        "max_clients": d.config.daemon.max_clients,
        "operator_sessions": operators,
        "connections": len(d.sessions),
        "structures": [_structure(d, name, now) for name in d.registry.names()],
        "recovering": sorted(d.operations.recovering),
        "log": _log(d),
        "jobs_running": len(d.checkpoints.jobs.running),
        "group": d.membership.role() if d.membership is not None else None,
    }


def state(d: Rooms) -> str:
    """starting, ready, stopping, or log_failed (nothing more is acknowledged)."""
    if d.journal.failed is not None:
        return "log_failed"
    if d.life.stopping:
        return "stopping"
    return "ready" if d.life.ready else "starting"


def _structure(d: Rooms, name: str, now: float) -> dict[str, Any]:
    registry, checkpoints = d.registry, d.checkpoints
    primary = registry.overflow_of.get(name)
    row: dict[str, Any] = {"name": name, "overflow_of": primary}
    s = registry.physical(name)
    if s is None:
        row["status"] = "failed"
    else:
        stats = s.stats()
        row.update(status="available", size=stats["size"], current_size=stats["current_size"],
                   used_bytes=stats["elements_used"] * ELEMENT,
                   percent_full=stats["percent_full"], full=stats["full"],
                   messages=stats["messages"], locked=stats["locked"], cold=stats["cold"])
        pair = registry.pairs.get(primary or name)
        if pair is not None and primary is None:
            row["overflow_mode"] = pair.stats()["overflow_mode"]
    last = checkpoints.last_time.get(name)
    # with none yet the age runs from the log's oldest record: what a crash would fold
    row["last_checkpoint"] = None if name in checkpoints.none_yet else last
    row["checkpoint_age_seconds"] = round(now - last, 3) if last is not None else None
    row["checkpoint_seconds"] = checkpoints.last_seconds.get(name)
    row["checkpoint_log_bytes"] = checkpoints.owed(name)
    return row


def _log(d: Rooms) -> dict[str, Any]:
    journal = d.journal
    size = segments = 0
    try:
        with os.scandir(d.datadir.logstream) as files:
            for f in files:
                if f.is_file():
                    size += f.stat().st_size
                    segments += 1
    except OSError:
        pass
    return {"bytes": size, "segments": segments,
            "appended_lsn": journal.position, "durable_lsn": journal.durable,
            "fsync_seconds": round(journal.fsync_average, 6),
            "failed": None if journal.failed is None else str(journal.failed)}
