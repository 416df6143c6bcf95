"""The rows of a ``query`` (``cqsctl display``): what the daemon knows about
its structures, queues, list headers, locks, clients and checkpoints."""

from collections.abc import Callable
from typing import Any

from ..engine import CQSError, QueueType, Reason, StructurePair
from ..engine.reports import Row
from ..storage import repository
from . import status, wire
from .rooms import Rooms

# docs/smds.md: the columns of display smds and display usage --type smds
SMDS_COLUMNS = ("structure", "owner", "size", "used_percent", "dsblock", "dsbufs", "dsexpand",
                "status", "access")
USAGE_COLUMNS = ("structure", "owner", "size", "used_percent", "buffers", "lru_hit_percent",
                 "waits", "lowest_free")
Rows = Callable[[Rooms, str | None], list[Row]]


def rows(rooms: Rooms, kind: str, structure: str | None) -> list[Row]:
    """The rows of ``kind`` for one structure, or all; INVALID_REQUEST for an
    unknown kind, UNKNOWN_STRUCTURE or STRUCTURE_FAILED for the structure."""
    query = KINDS.get(kind)
    if query is None:
        raise CQSError(Reason.INVALID_REQUEST,
                       f"query: unknown kind {kind!r} ({', '.join(KINDS)})")
    return query(rooms, structure)


def _chosen(rooms: Rooms, structure: str | None) -> list[StructurePair]:
    """The available pair named ``structure`` (raising if there is none), or all."""
    registry = rooms.registry
    return [registry.structure(structure)] if structure is not None else list(
        registry.pairs.values())


def _structures(rooms: Rooms, structure: str | None) -> list[Row]:
    registry = rooms.registry
    described = registry.definitions.describe
    if structure in registry.failed:
        return [_failed(structure, described)]
    return [{**row, "status": "available", **described(row["name"])}
            for s in _chosen(rooms, structure) for row in _structure_rows(s)] + (
        [_failed(name, described) for name in registry.failed] if structure is None else [])


def _queues(rooms: Rooms, structure: str | None) -> list[Row]:
    return [{"structure": s.name, **q,
             "waiting": rooms.waiters.count(s.name, (QueueType[q["qtype"]], q["queue"]))}
            for s in _chosen(rooms, structure) for q in s.queues(also=s.watched)]


def _headers(rooms: Rooms, structure: str | None) -> list[Row]:
    return [{"structure": s.name, **h} for s in _chosen(rooms, structure)
            for h in s.header_stats()]


def _locks(rooms: Rooms, structure: str | None) -> list[Row]:
    return [{**wire.lock(s.name, e), "owner": e.owner,
             "lease_expires": e.lease[1] / 1e9 if e.lease is not None else None}
            for s in _chosen(rooms, structure) for client in sorted(s.client_stats())
            for e in s.client_locks(client)]


def _clients(rooms: Rooms, structure: str | None) -> list[Row]:
    chosen = _chosen(rooms, structure)
    return [{"client": name, "operator": session.operator, "peer": session.peer,
             "tcp": session.over_tcp,
             "interests": len(session.interests),
             "locks": sum(s.client_stats().get(name, 0) for s in chosen)}
            for name, session in sorted(rooms.clients.sessions.items())]


def _backups(rooms: Rooms, structure: str | None) -> list[Row]:
    return repository.backups(rooms.datadir.repository, structure)


def _smds_structure(rooms: Rooms, structure: str | None) -> None:
    """UNKNOWN_STRUCTURE for a name the daemon does not have (a failed one is shown)."""
    if structure is not None and structure not in rooms.registry.names():
        rooms.registry.pair_of(structure)


def _smds(rooms: Rooms, structure: str | None) -> list[Row]:
    _smds_structure(rooms, structure)
    return [{c: row[c] for c in SMDS_COLUMNS} for row in rooms.datasets.rows(structure)]


def _usage(rooms: Rooms, structure: str | None) -> list[Row]:
    _smds_structure(rooms, structure)
    return [{c: row[c] for c in USAGE_COLUMNS} for row in rooms.datasets.rows(structure)]


def _cfstatus(rooms: Rooms, structure: str | None) -> list[Row]:
    _smds_structure(rooms, structure)
    return rooms.datasets.displays.cfstatus(structure)


def _smdsconn(rooms: Rooms, structure: str | None) -> list[Row]:
    _smds_structure(rooms, structure)
    return rooms.datasets.displays.smdsconn(structure)


def _status(rooms: Rooms, structure: str | None) -> list[Row]:
    return [status.snapshot(rooms)]


def _jobs(rooms: Rooms, structure: str | None) -> list[Row]:
    return [j for j in rooms.checkpoints.jobs.rows() if structure in (None, j["structure"])]


# Every kind a query may ask for, and the rows it gets: the one list of them on the
# daemon's side (cqsctl's ``display`` offers these but ``status``, its own command).
def _owners(rooms: Rooms, structure: str | None) -> list[Row]:
    """A group's pairs and their owners (docs/group.md); none for a daemon alone."""
    membership = rooms.membership
    return membership.node.describe() if membership is not None else []


KINDS: dict[str, Rows] = {
    "structures": _structures, "queues": _queues, "clients": _clients, "locks": _locks,
    "headers": _headers, "backups": _backups, "smds": _smds, "usage": _usage,
    "cfstatus": _cfstatus, "smdsconn": _smdsconn, "status": _status, "jobs": _jobs,
    "owners": _owners,
}


def _structure_rows(s: StructurePair) -> list[dict[str, Any]]:
    """A pair's primary, then its overflow structure marked as such."""
    return [s.stats()] + [{**o, "overflow_of": s.name} for o in s.structure_stats()[1:]]


def _failed(name: str, described: Callable[[str], Row]) -> Row:
    return {"name": name, "status": "failed", **described(name)}
