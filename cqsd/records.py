"""The two formats recovery rests on: the log record and the image row
(docs/recovery.md). Everything that writes or reads them — the engine's
effects, the daemon's journal, the reference fold, the Spark fold, images and
SRDS slots — takes their names and field positions from here, and nothing
else spells them out.

A record body is a msgpack map::

    {"s": structure, "e": [effect, ...], "x": {overflow structure: [effect, ...]}}

``x`` is present only when one operation touched both structures of a pair
(an overflow move, a put routed to the overflow structure), so that the two
halves are one record: atomic in the log as in memory. An effect is a list
whose first field is its kind and second the entry id it concerns.

Effects and rows are plain tuples and lists, not objects: the engine makes
one per recoverable change on its hottest path, and an image holds a million
rows that must load in one C call. The names below are positions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .errors import DaemonError

Body = dict[str, Any]
Effect = list[Any] | tuple[Any, ...]

# -- the record ------------------------------------------------------------------

STRUCTURE, EFFECTS, OTHERS = "s", "e", "x"
# The first record of a group owner's epoch (docs/group.md) has no effects, and says
# which epoch it starts and the cut it put on the earlier owners' series: {writer: LSN}.
EPOCH, SEALED = "n", "z"
# The idempotency key of the put or commit that made the record, and the entry ids it
# produced: [client, incarnation, sequence, [entry id, ...]] (docs/group.md, "Exactly-once
# puts"); only in a record of a request that carried one. The folds ignore it.
KEY = "k"

# Effect kinds, each with its fields after the kind:
PUT = "P"  # entry_id, qtype, name, data, put_time: a new recoverable message
LOCK = "L"  # entry_id, owner: read with a lock (counts a delivery)
DELETE = "D"  # entry_id
READY_AT = "R"  # entry_id, qtype, name, home, delivery_count: back on a ready queue
COLD_BY = "C"  # entry_id, owner: to the cold queue (its owner cold-started)
MOVED_OUT = "O"  # entry_id: left for the overflow structure (its I is in the same record)
MOVED_IN = "I"  # entry_id, qtype, name, data, put_time, delivery_count, home
# An offloaded recoverable put (docs/smds.md): its B effects, then P with empty data, then M.
BLOCK = "B"  # entry_id, page, data: the payload bytes of the message block at data-set page
MAPPED = "M"  # entry_id, map: the payload is offloaded; map is DataMap.encode()
# Leases and delays (docs/recovery.md): T follows the L of a leased read, or stands
# alone for a renew; an expiry is the R of a failed unlock. N follows a delayed P (or
# the I of a message once delayed).
LEASED = "T"  # entry_id, lease ns, deadline: the lock expires at wall-clock ns deadline
NOT_BEFORE_AT = "N"  # entry_id, not_before: invisible to reads before wall-clock ns
ARITY = {PUT: 6, LOCK: 3, DELETE: 2, READY_AT: 6, COLD_BY: 3, MOVED_OUT: 2, MOVED_IN: 8,
         BLOCK: 4, MAPPED: 3, LEASED: 4, NOT_BEFORE_AT: 3}
ADDS = (PUT, MOVED_IN)  # an entry appears
REMOVES = (DELETE, MOVED_OUT)  # an entry goes

# Field positions within an effect.
KIND, ENTRY = 0, 1
E_QTYPE, E_NAME = 2, 3  # P, R, I
E_DATA, E_PUT_TIME = 4, 5  # P, I
E_OWNER = 2  # L, C
R_HOME, R_COUNT = 4, 5  # R
I_COUNT, I_HOME = 6, 7  # I
B_PAGE, B_DATA = 2, 3  # B
M_MAP = 2  # M
T_LEASE, T_DEADLINE = 2, 3  # T
N_AT = 2  # N


def effect_lists(body: Body) -> list[tuple[str, list[Effect]]]:
    """(structure, effects) for each structure a record holds effects of."""
    return [(body[STRUCTURE], body[EFFECTS]), *body.get(OTHERS, {}).items()]


def waits_for_log(body: Body) -> bool:
    """Whether a reply to the request that made this record waits until it is
    durable: anything but locks and their leases does. A lock lost in a crash
    only means the message is read again, as if its reader had died; a renew
    lost falls back to the lease before it. (Once per record: no list of the
    record's halves is built.)"""
    for e in body[EFFECTS]:
        if e[KIND] != LOCK and e[KIND] != LEASED:
            return True
    others = body.get(OTHERS)
    if not others:
        return False
    return any(e[KIND] != LOCK and e[KIND] != LEASED
               for effects in others.values() for e in effects)


# -- the image row -----------------------------------------------------------------

# A message as an image, a slot and both folds hold it. MAP is the data map of an
# offloaded payload (DataMap.encode()), else None; DATA is then empty where only the
# map is kept (the daemon's images, the restart fold) and the payload where the
# bytes are materialised (what the Spark jobs write). LEASE is a locked message's
# [lease ns, wall-clock deadline ns] or None; NOT_BEFORE the wall-clock ns a delayed
# put was invisible until (kept once due), or None. A delayed message is "ready".
(ID, QTYPE, NAME, DATA, RECOVERABLE, PUT_TIME, COUNT, WHERE, OWNER, HOME, MAP, LEASE,
 NOT_BEFORE) = range(13)
ROW_FIELDS = 13


class Entry(Protocol):
    """The fields of an engine entry a row is made of."""

    entry_id: int
    qtype: int
    name: str
    data: bytes | memoryview
    recoverable: bool
    put_time: int
    delivery_count: int
    where: str
    owner: str | None
    home: tuple[int, str] | None
    map: Any  # a cqsd.smds DataMap, or None for a payload kept in memory
    lease: tuple[int, int, float] | None  # lease ns, wall deadline ns, monotonic deadline
    not_before: int | None


def row_of(entry: Entry) -> list[Any]:
    """An engine entry as an image row."""
    home = [int(entry.home[0]), entry.home[1]] if entry.home else None
    datamap = entry.map.encode() if entry.map is not None else None
    lease = [entry.lease[0], entry.lease[1]] if entry.lease is not None else None
    where = "ready" if entry.where == "delayed" else entry.where
    return [entry.entry_id, int(entry.qtype), entry.name, bytes(entry.data), entry.recoverable,
            entry.put_time, entry.delivery_count, where, entry.owner, home, datamap, lease,
            entry.not_before]


def rows_of(entries: Iterable[Entry]) -> dict[int, list[Any]]:
    """Engine entries (a structure iterates its own) as image rows by entry id."""
    return {e.entry_id: row_of(e) for e in entries}


class FoldError(DaemonError):
    """A record that does not fit the image it is applied to."""
