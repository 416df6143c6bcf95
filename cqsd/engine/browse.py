"""Browse: looking at a structure's entries without locking them, a page at a time.

Entries are shown in (list header, queue name, entry id) order, the private
queues a structure keeps as indexes (the cold queue LH 1, the lock queue LH 2,
the delayed puts LH 6) in entry-id order alone. A page ends with a *cursor*,
the position of its last entry, and the next page starts strictly after it:
a cursor is a place in that order, not a pointer into the structure, so it
stays valid whatever the requests between two pages change, and the structure
keeps nothing for a browse in progress.
"""

from collections.abc import Iterable, Iterator
from typing import Any

from .entry import COLD, DELAYED, LOCKED, Entry, Queue
from .errors import CQSError, Reason
from .locks import Locks
from .qtypes import (
    COLD_LH,
    DELAYED_LH,
    LOCK_LH,
    STAGING_TYPES,
    QueueType,
    check_name,
    headers_of,
    list_header,
    parse_qtype,
)
from .timed import Timed

Cursor = tuple[int, str, int]  # (list header, queue name, entry id) of the last entry seen
# a cursor as ``after``: as given, or as a request carries it back (a decoded frame's
# list); check_cursor refuses anything that is not one this server gave
CursorIn = Cursor | list[Any]
INDEXED_LHS = (COLD_LH, LOCK_LH, DELAYED_LH)  # kept as indexes by id, not as queues
BROWSE_ALL_LHS = INDEXED_LHS + tuple(
    lh
    for t in QueueType
    if t not in STAGING_TYPES
    for lh in headers_of(t)
)


class Browse:
    """Pages of a structure's entries: what ``Structure.browse`` answers from."""

    __slots__ = ("headers", "locks", "timed")

    def __init__(self, headers: list[dict[str, Queue]], locks: Locks, timed: Timed) -> None:
        self.headers = headers  # the structure's list headers: name -> Queue
        self.locks = locks  # the lock and cold queues
        self.timed = timed  # the delayed puts

    def page(
        self, qtype: object, name: object, after: object, limit: object,
    ) -> tuple[list[Entry], Cursor | None]:
        """Up to ``limit`` entries of one queue (``qtype`` and ``name``), one queue
        type (``qtype``) or everything (neither), after the cursor ``after``; and
        the cursor for the next page, or None when there is no more. Each argument
        as a request gave it: checked here (typed ``object``, Structure.browse)."""
        if name is not None and qtype is None:
            raise CQSError(Reason.INVALID_REQUEST, "browse of a queue name needs its queue type")
        if type(limit) is not int or limit < 1:
            raise CQSError(Reason.INVALID_REQUEST,
                           f"browse limit must be a positive integer, got {limit!r}")
        only = None
        if qtype is None:
            lhs: Iterable[int] = BROWSE_ALL_LHS
        elif name is None:
            lhs = headers_of(parse_qtype(qtype))
        else:
            queue_type, only = parse_qtype(qtype), check_name(name)
            lhs = [list_header(queue_type, only)]
        walk = self.walk(lhs, only, after)
        found = [entry for _, entry in zip(range(limit), walk, strict=False)]
        last = found[-1] if len(found) == limit else None
        if last is None or next(walk, None) is None:
            return found, None
        return found, position(last)

    def walk(self, lhs: Iterable[int], only: str | None, after: object) -> Iterator[Entry]:
        """Entries strictly after the cursor, in (list header, name, entry id) order."""
        a_lh, a_name, a_id = check_cursor(after)
        for lh in lhs:
            if lh < a_lh:
                continue
            if lh in INDEXED_LHS:
                pool = (self.locks.cold.values() if lh == COLD_LH else
                        self.locks.all_locked() if lh == LOCK_LH else self.timed.delayed.values())
                for entry in sorted(pool, key=lambda e: e.entry_id):
                    if lh > a_lh or entry.entry_id > a_id:
                        yield entry
                continue
            header = self.headers[lh]
            if only is not None:
                names: Iterable[str] = [only] if only in header else []
            else:
                names = sorted(header)
            for name in names:
                if lh == a_lh and name == a_name:
                    yield from header[name].entries.values(after=a_id)
                elif lh > a_lh or name > a_name:
                    yield from header[name].entries.values()


def position(entry: Entry) -> Cursor:
    """Where browse shows an entry, as a cursor: the cold and lock queues are in id
    order alone, a ready entry in (list header, queue name, id) order."""
    if entry.where == LOCKED:
        return (LOCK_LH, "", entry.entry_id)
    if entry.where == COLD:
        return (COLD_LH, "", entry.entry_id)
    if entry.where == DELAYED:
        return (DELAYED_LH, "", entry.entry_id)
    return (list_header(entry.qtype, entry.name), entry.name, entry.entry_id)


def check_cursor(after: object) -> Cursor:
    """A cursor as this server gives them, or the start for None; raises
    INVALID_REQUEST for anything else."""
    if after is None:
        return (-1, "", -1)
    if (
        isinstance(after, (tuple, list))
        and len(after) == 3
        and type(after[0]) is int
        and type(after[1]) is str
        and type(after[2]) is int
    ):
        return (after[0], after[1], after[2])
    raise CQSError(Reason.INVALID_REQUEST, f"browse cursor {after!r} is not one this server gave")
