"""The rows of a ``query`` (``cqsctl display``): what the daemon knows about
its structures, queues, list headers, locks, clients and checkpoints."""

from collections.abc import Callable
from typing import Any

from ..engine import CQSError, QueueType, Reason, StructurePair
from ..engine.reports import Row
from ..storage import repository
from . import status, wire
from .rooms import Rooms

KINDS = ("structures", "queues", "clients", "locks", "headers", "backups", "smds", "usage",
         "cfstatus", "smdsconn", "status", "jobs")
# DESIGN §11: the columns of display smds and display usage --type smds
SMDS_COLUMNS = ("structure", "owner", "size", "used_percent", "dsblock", "dsbufs", "dsexpand",
                "status", "access")
USAGE_COLUMNS = ("structure", "owner", "size", "used_percent", "buffers", "lru_hit_percent",
                 "waits", "lowest_free")


def rows(rooms: Rooms, kind: str, structure: str | None) -> list[Row]:
    """The rows of ``kind`` for one structure, or all; INVALID_REQUEST for an
    unknown kind, UNKNOWN_STRUCTURE or STRUCTURE_FAILED for the structure."""
    if kind == "backups":
        return repository.backups(rooms.datadir.repository, structure)
    if kind in ("smds", "usage", "cfstatus", "smdsconn"):
        if structure is not None and structure not in rooms.registry.names():
            rooms.registry.pair_of(structure)  # UNKNOWN_STRUCTURE (a failed one is shown)
        if kind == "cfstatus":
            return rooms.datasets.cfstatus(structure)
        if kind == "smdsconn":
            return rooms.datasets.smdsconn(structure)
        columns = SMDS_COLUMNS if kind == "smds" else USAGE_COLUMNS
        return [{c: row[c] for c in columns} for row in rooms.datasets.rows(structure)]
    if kind == "status":
        return [status.snapshot(rooms)]
    if kind == "jobs":
        return [j for j in rooms.checkpoints.jobs.rows() if structure in (None, j["structure"])]
    registry = rooms.registry
    described = registry.definitions.describe
    if kind == "structures" and structure in registry.failed:
        return [_failed(structure, described)]
    chosen = [registry.structure(structure)] if structure is not None else list(
        registry.pairs.values())
    if kind == "structures":
        return [{**row, "status": "available", **described(row["name"])}
                for s in chosen for row in _structure_rows(s)] + (
            [_failed(name, described) for name in registry.failed] if structure is None else [])
    if kind == "queues":
        return [{"structure": s.name, **q,
                 "waiting": rooms.waiters.count(s.name, (QueueType[q["qtype"]], q["queue"]))}
                for s in chosen for q in s.queues(also=s.watched)]
    if kind == "headers":
        return [{"structure": s.name, **h} for s in chosen for h in s.header_stats()]
    if kind == "locks":
        return [{**wire.lock(s.name, e), "owner": e.owner,
                 "lease_expires": e.lease[1] / 1e9 if e.lease is not None else None}
                for s in chosen for client in sorted(s.client_stats())
                for e in s.client_locks(client)]
    if kind == "clients":
        return [{"client": name, "operator": session.operator, "peer": session.peer,
                 "tcp": session.over_tcp,
                 "interests": len(session.interests),
                 "locks": sum(s.client_stats().get(name, 0) for s in chosen)}
                for name, session in sorted(rooms.clients.sessions.items())]
    raise CQSError(Reason.INVALID_REQUEST, f"query: unknown kind {kind!r} ({', '.join(KINDS)})")


def _structure_rows(s: StructurePair) -> list[dict[str, Any]]:
    """A pair's primary, then its overflow structure marked as such."""
    return [s.stats()] + [{**o, "overflow_of": s.name} for o in s.structure_stats()[1:]]


def _failed(name: str, described: Callable[[str], Row]) -> Row:
    return {"name": name, "status": "failed", **described(name)}
