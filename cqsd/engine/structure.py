"""A list structure: the coupling-facility analogue that holds the queues.

Design note. Every request is a synchronous method that either applies in full
or raises ``CQSError`` having changed nothing; no method does I/O or awaits, so
the daemon can call them from its event loop and the recovery fold can replay
through them. Costs are independent of queue depth: a queue is a sorted map from
entry id to entry (FIFO by id, O(log n) for a return to the middle), every
message head is indexed by id, and locks are indexed by client.

``Structure`` keeps the messages and their ready queues, and what a request
tells its caller; each other concern is a component of its own, in a module
named for it, which the structure composes:

- ``space`` (capacity.py): data elements and list entries, and growth toward
  the maximum size;
- ``locks`` (locks.py): the lock queue by holder, the cold queue, SERIAL
  queues in flight, and the checks a request makes of a lock;
- ``timed`` (timed.py): leases and delayed puts;
- ``cleanup`` (cleanup.py): deleted offloaded messages waiting for their
  delete to be durable;
- ``browser`` (browse.py): browse pages and their cursors;
- commit.py: the operations of a unit of work and its checks.

Where the seeds put an entry on a private list header we keep it in an index
instead of a queue: the lock queue (LH 2) is the per-client lock maps, the cold
queue (LH 1) a map by id. Browse shows them in entry-id order.

Side effects the daemon needs but the reply does not carry are left in
``events`` (empty→non-empty transitions, fullness changes) and, for keys a
waiter watches, in ``readable``; the caller drains both after each request.

A structure may offload payloads to shared message data sets (docs/smds.md):
``offloads`` says which, and a put given a data map keeps only the map. The
data sets themselves are the daemon's; what the engine adds is the entry's
cost, the ``B``/``P``/``M`` effects, and the clean-up queue (LH 4): a deleted
offloaded message stays there, still charged, until the daemon says its
delete is durable (``stamp_deleted``, ``clean_up``), because until then a
crash could bring it back and its pages must not be reused.

A read may take its lock on a *lease* (a visibility timeout): the lock ends at
a deadline on the daemon's monotonic clock (``ticks``) unless renewed, and
``expire`` releases every lock whose deadline has passed as a failed delivery.
A put may be *delayed* until a wall-clock time (``not_before``, ns like
``put_time``): until then it is on no ready queue, and ``ripen`` places every
message whose time has come at its place by id. Neither keeps a timer per
message: each is a heap of (deadline, id) with lazy deletion (an entry renewed,
unlocked or deleted meanwhile leaves a stale item that is skipped when it
comes up), and the daemon calls both from one timer task that sleeps until
``next_expiry``/``next_due``. Setting either raises ``timed.armed`` for it.

A structure may be paired with an overflow structure (``pair_with``; the
routing between the two is ``pair.py``). The two then share their id clock,
their waiter sets, their events and the SERIAL in-flight set, and each knows the
other's ready queues, so that a queue spread over both is one queue to a reader:
one id order, one message in flight if SERIAL, one empty→non-empty transition.

The hot paths (put, read, delete) call the components' methods directly, one
call deep as the methods they replace were, and reach their figures through
the component (``self.space.elements_used``), not through the properties kept
for callers outside the engine.
"""

import heapq
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

from ..records import (
    BLOCK,
    COLD_BY,
    DELETE,
    LEASED,
    LOCK,
    MAPPED,
    MOVED_IN,
    MOVED_OUT,
    NOT_BEFORE_AT,
    PUT,
    READY_AT,
)
from ..smds.datamap import DataMap
from .browse import Browse, Cursor, position
from .byid import ById
from .capacity import GROWN, Capacity
from .cleanup import CleanUp
from .commit import Checked, Delete, Move, Op, Put, Unlock, check
from .counts import Counts
from .entry import (
    COLD,
    DELAYED,
    ELEMENT,
    ENTRY_CONTROLS,
    LOCKED,
    READY,
    STAGED,
    Entry,
    Passed,
    Queue,
    elements,
)
from .errors import CQSError, Reason
from .events import Altered, Event, QueueWork
from .ids import Ids
from .locks import Locks, check_deletable, check_held, check_movable
from .qtypes import (
    COLD_LH,
    DELAYED_LH,
    DELETE_LH,
    FIRST_CLIENT_LH,
    LIST_HEADERS,
    LOCK_LH,
    STAGING_TYPES,
    QueueKey,
    QueueType,
    check_name,
    in_header_order,
    list_header,
    parse_qtype,
    retarget,
    show,
    staging_type,
)
from .reports import Row
from .timed import Timed

SERIAL = QueueType.TRAN_SERIAL
SUSPEND = QueueType.TRAN_SUSPEND
# payload bytes per list entry: longer ones are segmented or offloaded (docs/smds.md)
DEFAULT_ENTRY_MAX = 32 * 1024
# Emptied ready queues kept for their names' next message: a queue drained to
# empty and put to again (a consumer keeping up) is the common case, and making
# its sorted index anew cost ~2.5% of a message's daemon instructions.
IDLE_QUEUES = 256
DEFAULT_MAX_DELIVERIES = 5  # deliveries after which a failed one suspends a message (docs/sdk.md)

# Kept importable from here, where the server and the tests have taken them.
Key = QueueKey
__all__ = [
    "GROWN", "Checked", "Cursor", "Delete", "Key", "Move", "Op", "Put", "Structure", "Unlock",
    "in_header_order", "position",
]


class Structure:
    """One list structure of 192 list headers (docs/architecture.md)."""

    __slots__ = ("_entries", "_headers", "_idle", "_peer", "_queues", "browser", "cleanup",
                 "counts", "effects", "events", "ids", "locks", "max_deliveries", "name",
                 "readable", "space", "timed", "watched")

    def __init__(
        self,
        name: str,
        size: int,
        *,
        initsize: int | None = None,
        entry_max: int = DEFAULT_ENTRY_MAX,
        max_entries: int | None = None,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        offload_rules: tuple[tuple[int, int], ...] | None = None,
        clock: Callable[[], int] = time.time_ns,
        ticks: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.max_deliveries = max_deliveries
        self.events: list[Event] = []
        self.space = Capacity(name, size, initsize, entry_max, max_entries, offload_rules,
                              self.events)
        self.ids = Ids(clock)
        self.timed = Timed(ticks)  # leases and delayed puts
        self.locks = Locks(self.timed)  # the lock queue and the cold queue
        self.cleanup = CleanUp()  # LH 4: deleted offloaded messages
        self._entries: dict[int, Entry] = {}  # every message head, by id
        self._queues: dict[QueueKey, Queue] = {}  # non-empty ready queues
        self._idle: dict[QueueKey, Queue] = {}  # emptied ones, for reuse (IDLE_QUEUES)
        self._headers: list[dict[str, Queue]] = [{} for _ in range(LIST_HEADERS)]  # name -> Queue
        self._peer: dict[QueueKey, Queue] = {}  # the ready queues of the structure paired with this
        self.browser = Browse(self._headers, self.locks, self.timed)
        # what happened to recoverable messages (records.py, docs/recovery.md)
        self.effects: list[tuple[Any, ...]] = []
        self.watched: set[QueueKey] = set()
        self.readable: set[QueueKey] = set()
        self.counts = Counts()

    @property
    def last_id(self) -> int:
        """The highest entry id handed out (the daemon raises it after recovery)."""
        return self.ids.last

    @last_id.setter
    def last_id(self, value: int) -> None:
        self.ids.last = value

    # The figures of ``space``, as callers outside the engine read them.

    @property
    def size(self) -> int:
        """The maximum size in bytes (SIZE)."""
        return self.space.size

    @property
    def current_size(self) -> int:
        return self.space.current_size

    @property
    def entry_max(self) -> int:
        return self.space.entry_max

    @property
    def offload_rules(self) -> tuple[tuple[int, int], ...] | None:
        return self.space.offload_rules

    @property
    def elements_total(self) -> int:
        return self.space.elements_total

    @property
    def elements_used(self) -> int:
        return self.space.elements_used

    @property
    def entries_total(self) -> int:
        return self.space.entries_total

    @property
    def entries_used(self) -> int:
        return self.space.entries_used

    @property
    def full(self) -> bool:
        return self.space.full

    # -- requests ------------------------------------------------------------
    # What a request names (queue type, queue name, entry id, browse cursor and limit)
    # is typed ``object``: checked here (parse_qtype, check_name, _find, Browse.page),
    # a bad one is refused with its reason code. A narrower type would be checked
    # first where the engine is compiled (mypyc), with a TypeError.

    def put(self, qtype: object, name: object, data: bytes, recoverable: bool = True,
            dmap: DataMap | None = None, not_before: int | None = None) -> Entry:
        """Put a message at the end of its queue, or, with ``not_before`` (wall-clock
        ns) still to come, delayed until then. A structure below its maximum size
        that it does not fit grows first (``Altered``, "put does not fit"); raises
        STRUCTURE_FULL if it does not fit even so.
        With ``dmap`` the payload ``data`` is in a data set already: the entry keeps
        the map, and ``data`` only goes to the log (``B`` effects)."""
        queue_type, queue = parse_qtype(qtype), check_name(name)
        space = self.space
        need_elements, need_entries = space.cost_of(len(data), dmap)
        space.reserve(need_elements, need_entries,
                      lambda: f"put of {len(data)} bytes to {queue_type.name}:{queue}")
        return self._put_effect(self._insert(queue_type, queue, data, recoverable, dmap=dmap,
                                             not_before=not_before), data)

    def offloads(self, nbytes: int) -> bool:
        """Whether a payload of ``nbytes`` put here goes to a data set (docs/smds.md):
        over ``entry_max`` always, smaller ones by the offload rules as the
        structure fills."""
        return self.space.offloads(nbytes)

    def stamp_deleted(self, lsn: int) -> list[Entry]:
        """The offloaded messages deleted since the last call, whose pages the daemon
        now frees pending ``lsn``, the record holding their deletes. The recoverable
        ones wait on the clean-up queue until ``clean_up`` says it is durable; a
        non-recoverable one's delete is never logged, so it goes at once."""
        if not self.cleanup.deleted:
            return []
        deleted, gone = self.cleanup.stamp(lsn)
        for entry in gone:
            self.space.discard(entry)  # an offloaded message has no segments
        return deleted

    def clean_up(self, durable: int) -> int:
        """Drop from the clean-up queue every message whose delete is now durable;
        returns how many went."""
        gone = self.cleanup.durable(durable)
        for entry in gone:
            self.space.discard(entry)  # an offloaded message has no segments
        return len(gone)

    def offloaded(self) -> Iterator[Entry]:
        """Every offloaded message whose pages are in use, the clean-up queue's
        included: what a space map is rebuilt from."""
        for entry in self._entries.values():
            if entry.map is not None:
                yield entry
        yield from self.cleanup

    def read(self, client: str, qtype: object, name: str, lease: float | None = None,
             passed: Passed | None = None) -> Entry:
        """Lock the first message of a queue for ``client``, for ``lease`` seconds if
        given (``expire``), passing over those ``passed`` says cannot be delivered now
        (their data in a data set that is unavailable: MQ skips to what it can
        deliver), which stay where they are; a SERIAL queue is taken in order, so
        never past its first. Raises NO_MESSAGE."""
        key = (parse_qtype(qtype), name)
        queue = self._queues.get(key)
        if queue is None or (key[0] == SERIAL and key in self.locks.serial_busy):
            raise CQSError(Reason.NO_MESSAGE, f"no readable message on {show(key)}")
        if passed is None or not passed(queue.first()):  # the head, as nearly always
            entry = queue.pop_first()
        else:
            entry = self._deliverable(queue, passed, after_first=True)
            queue.remove(entry)
        if not queue.entries:
            self._drop_queue(queue)
        self.locks.lock(entry, client)
        self.counts.reads += 1
        if entry.delivery_count > 1:
            self.counts.redeliveries += 1
        if entry.recoverable:
            self.effects.append((LOCK, entry.entry_id, client))
        if lease is not None:
            self._lease(entry, lease)
        return entry

    def renew(self, client: str, entry_id: object, lease: float) -> Entry:
        """Give a lock ``client`` holds a lease of ``lease`` seconds from now, in place
        of the one it had (if any). Raises ENTRY_NOT_FOUND or LOCK_NOT_HELD: an expired
        lease was a failed delivery, and its holder holds nothing any more."""
        entry = self._find(entry_id)
        check_held(client, entry)
        self._lease(entry, lease)
        return entry

    def expire(self, now: float | None = None, spared: Collection[str] = ()) -> list[Entry]:
        """Release every leased lock whose deadline is ``now`` (monotonic seconds) or
        earlier, as a failed delivery (``unlock(failed=True)``), unless its owner is in
        ``spared``: then it goes back as it was (a lock a restart found, whose holder
        could not renew while the daemon was down). Returns them, in deadline order."""
        heap = self.timed.leases
        expired: list[Entry] = []
        if not heap:
            return expired
        if now is None:
            now = self.timed.ticks()
        while heap and heap[0][0] <= now:
            deadline, entry_id = heapq.heappop(heap)
            entry = self._entries.get(entry_id)
            if entry is None or entry.lease is None or entry.lease[2] != deadline:
                continue  # renewed, released or deleted since
            failed = entry.owner not in spared
            self._release(entry)
            self._return(entry, None, failed)
            self._ready_effect(entry)
            self.counts.expiries += 1
            expired.append(entry)
        return expired

    def ripen(self, now: int | None = None) -> list[Entry]:
        """Place every delayed message whose ``not_before`` is ``now`` (wall-clock ns)
        or earlier on its queue, at its place by id; returns them in time order."""
        timed = self.timed
        heap = timed.due
        ripe: list[Entry] = []
        if not heap:
            return ripe
        if now is None:
            now = self.ids.clock()
        while heap and heap[0][0] <= now:
            not_before, entry_id = heapq.heappop(heap)
            entry = timed.delayed.get(entry_id)
            if entry is None or entry.not_before != not_before:
                continue  # deleted, or moved and pushed again
            timed.undelay(entry)
            self._place(entry)
            ripe.append(entry)
        return ripe

    def next_expiry(self) -> float | None:
        """The monotonic deadline of the next lease to expire, or None (stale heap
        items are dropped first, so the daemon does not wake for nothing)."""
        heap, entries = self.timed.leases, self._entries
        while heap:
            deadline, entry_id = heap[0]
            entry = entries.get(entry_id)
            if entry is not None and entry.lease is not None and entry.lease[2] == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def next_due(self) -> int | None:
        """The wall-clock ns at which the next delayed message becomes readable, or None."""
        return self.timed.next_due()

    def delete(self, client: str | None, entry_id: object, operator: bool = False) -> Entry:
        """Delete a message locked by ``client``. An ``operator`` delete takes any
        message not locked by another client (docs/protocol.md); ``client=None`` is
        the operator with no locks of its own."""
        entry = self._find(entry_id)
        check_deletable(client, entry, operator)
        self._take(entry)
        self._free(entry)
        self.counts.deletes += 1
        if entry.recoverable:
            self.effects.append((DELETE, entry.entry_id))
        return entry

    def move(self, client: str | None, entry_id: object, qtype: object, name: object) -> Entry:
        """Move a message (unlocked, or locked by ``client``) to its place by id in
        another queue; a lock the caller held is released."""
        entry = self._find(entry_id)
        key = (parse_qtype(qtype), check_name(name))
        check_movable(client, entry)
        delayed = entry.where == DELAYED
        self._take(entry)
        entry.qtype, entry.name = key
        entry.home = None
        if delayed:  # it keeps its time
            self.timed.delay(entry)
        else:
            self._place(entry)
        self._ready_effect(entry)
        return entry

    def unlock(
        self,
        client: str,
        entry_id: object,
        *,
        failed: bool = False,
        qtype: object = None,
        name: object = None,
    ) -> Entry:
        """Give back a message ``client`` holds: to its place, or to ``qtype``/``name``.

        With ``failed``, a message already delivered ``max_deliveries`` times goes to
        the suspend queue instead, so a message that keeps failing stops being retried.
        """
        entry = self._find(entry_id)
        target = retarget(entry.qtype, entry.name, qtype, name)
        check_held(client, entry)
        self._release(entry)
        self._return(entry, target, failed)
        self._ready_effect(entry)
        return entry

    def commit(self, client: str, ops: Iterable[Op]) -> list[Entry]:
        """Apply puts, deletes, moves and unlocks all together or not at all."""
        return self.apply_commit(client, self.check_commit(client, ops))

    def check_commit(self, client: str, ops: Iterable[Op]) -> Checked:
        """Everything a commit checks, changing nothing (commit.py): each entry may
        appear once, and the puts must fit in the space free after the batch's deletes.

        Split from ``apply_commit`` so that a commit spanning a primary and its
        overflow structure can check both before applying to either.
        """
        return check(client, ops, self.space, self._find)

    def apply_commit(self, client: str, checked: Checked) -> list[Entry]:
        """Apply a commit ``check_commit`` passed, with nothing changed in between;
        returns each operation's entry, in order."""
        if checked.grow_to is not None:
            self.alter(checked.grow_to, GROWN)
        results: list[Entry | None] = []
        for op in checked.ops:  # the checks guarantee none of these can fail
            if type(op) is Delete:
                results.append(self.delete(client, op.entry_id))
            elif type(op) is Move:
                results.append(self.move(client, op.entry_id, op.qtype, op.name))
            elif type(op) is Unlock:
                results.append(
                    self.unlock(client, op.entry_id, failed=op.failed, qtype=op.qtype, name=op.name)
                )
            else:
                results.append(None)
        puts = checked.puts[::-1]
        return [
            result if result is not None else self._insert_reserved(*puts.pop())
            for result in results
        ]

    def browse(
        self,
        qtype: object = None,
        name: object = None,
        *,
        after: object = None,
        limit: object = 100,
    ) -> tuple[list[Entry], Cursor | None]:
        """Look without locking: one queue (``qtype`` and ``name``), one queue type
        (``qtype``), or everything including the cold and lock queues (neither).

        Returns up to ``limit`` entries in list-header, name, FIFO order and a cursor
        to pass as ``after`` for the next page, or None when there is no more.
        """
        return self.browser.page(qtype, name, after, limit)

    # -- operator requests -----------------------------------------------------

    def requeue(self, entry_id: object) -> Entry:
        """Return a message from the cold queue or a suspend queue to the queue it came
        from, with its delivery count reset: the operator is asking for a fresh try."""
        entry = self._find(entry_id)
        if entry.where == COLD:
            self.locks.thaw(entry)
        elif entry.where == READY and entry.home is not None:
            self._unplace(entry)
            entry.qtype, entry.name = entry.home
            entry.home = None
        else:
            raise CQSError(
                Reason.INVALID_REQUEST,
                f"entry {entry_id} is neither on the cold queue nor suspended",
            )
        entry.delivery_count = 0
        self._place(entry)
        self._ready_effect(entry)
        return entry

    def dequeue(self, qtype: object, name: object) -> list[Entry]:
        """Delete every unlocked message of a queue (IMS /DEQUEUE)."""
        queue = self._queues.get((parse_qtype(qtype), check_name(name)))
        if queue is None:
            return []
        gone = list(queue.entries.values())
        for entry in gone:
            self.delete(None, entry.entry_id)
        return gone

    def alter(self, size_bytes: int, reason: str = "operator") -> Altered:
        """Change the current size (SETXCF START,ALTER), within the configured maximum
        ``size``: overflow processing grows a structure this way before it selects
        queues. Raises INVALID_REQUEST for a size above ``size``, or for shrinking
        below the data elements in use (a structure restored over-full may grow by
        steps). The ``Altered`` event is also left in ``events``."""
        return self.space.alter(size_bytes, reason)

    def load(self, rows: Iterable[list[Any]]) -> int:
        """Bulk restore of image rows (docs/recovery.md) into an empty structure.

        The restart path: a million messages must load in seconds, so ready messages
        are gathered per queue and each queue's sorted map is built in one go
        instead of one insertion at a time. Rows in entry-id order load fastest;
        long, locked and cold messages go through ``restore``.
        """
        if self._entries:
            raise CQSError(Reason.INVALID_REQUEST, f"load into structure {self.name}, not empty")
        step = self.space.entry_max
        per_queue: dict[QueueKey, list[Entry]] = {}
        slow = []
        used_elements = used_entries = count = 0
        for row in rows:
            (eid, qtype, name, data, recoverable, put_time, deliveries, where, owner, home, dm,
             _, not_before) = row
            count += 1
            if where != READY or len(data) > step or dm is not None or not_before is not None:
                slow.append(row)
                continue
            n = (len(data) + ENTRY_CONTROLS + ELEMENT - 1) // ELEMENT
            e = Entry(eid, qtype, name, data, recoverable, put_time, n)
            e.delivery_count = deliveries
            if home:
                e.home = (home[0], home[1])
            used_elements += n
            used_entries += 1
            key = (qtype, name)
            bucket = per_queue.get(key)
            if bucket is None:
                bucket = per_queue[key] = []
            bucket.append(e)
        for (qtype, name), entries in per_queue.items():
            queue = Queue(qtype, name, list_header(qtype, name))
            queue.entries = ById((e.entry_id, e) for e in entries)
            queue.elements = queue.held = sum(e.elements for e in entries)  # no segments
            self._queues[(qtype, name)] = queue
            self._headers[queue.lh][name] = queue
            self._entries.update((e.entry_id, e) for e in entries)
            self.last_id = max(self.last_id, queue.entries.last_id())
        self.space.elements_used += used_elements
        self.space.entries_used += used_entries
        for row in slow:
            self.restore(*row)
        return count

    def restore(
        self,
        entry_id: int,
        qtype: int,
        name: str,
        data: bytes,
        recoverable: bool,
        put_time: int,
        delivery_count: int = 0,
        where: str = READY,
        owner: str | None = None,
        home: Sequence[Any] | None = None,  # a tuple, or a list as an image row holds it
        dmap: DataMap | Sequence[Any] | None = None,
        lease: Sequence[int] | None = None,
        not_before: int | None = None,
    ) -> Entry:
        """Re-create a message as an image or a log fold recorded it. An offloaded
        one (``dmap``, encoded or not) keeps its map only: ``data``, which a
        materialising fold fills, is dropped. A ``lease`` ([ns, wall-clock deadline
        ns]) runs on for the wall-clock time it has left (none: it expires at the
        next ``expire``); a ready message whose ``not_before`` is still to come
        is delayed again.

        Space is taken without the full check: an image is what was there, and a
        structure configured smaller than its content shows as over-full in stats
        rather than losing messages.
        """
        if entry_id in self._entries:
            raise CQSError(Reason.INVALID_REQUEST, f"entry {entry_id} restored twice")
        if dmap is not None and not isinstance(dmap, DataMap):
            dmap = DataMap.decode(dmap)
        space = self.space
        cost_elements, cost_entries = space.cost_of(len(data), dmap)
        space.elements_used += cost_elements
        space.entries_used += cost_entries
        entry = self._insert(QueueType(qtype), name, data, recoverable, entry_id, put_time,
                             dmap, not_before if where == READY else None)
        entry.home = (QueueType(home[0]), home[1]) if home else None
        entry.not_before = not_before  # kept as logged, once due too
        if where == LOCKED:
            assert owner is not None, f"entry {entry_id} locked by nobody"
            self._unplace(entry)
            self.locks.lock(entry, owner)
            if lease is not None:
                left = max(0, lease[1] - self.ids.clock()) / 1e9
                self.timed.arm(entry, (lease[0], lease[1], self.timed.ticks() + left),
                               self.locks.all_locked)
        elif where == COLD:
            self._unplace(entry)
            self.locks.chill(entry, owner)
        entry.delivery_count = delivery_count
        return entry

    def forget(self, entry_id: int) -> None:
        """Drop a message without a trace: no effect, no event. A warm standby mirrors
        the owner's log record by record (docs/group.md): each message a record
        touched is forgotten, then restored as the reference fold left its row.
        Raises ENTRY_NOT_FOUND."""
        entry = self._find(entry_id)
        self._take(entry)
        self._free(entry)
        if entry.map is not None:  # no clean-up owed: its pages are the owner's to free,
            self.cleanup.deleted.remove(entry)  # and a space map rebuilt holds it no more
            self.space.discard(entry)

    # -- overflow: what a primary and its overflow structure need of each other --

    def pair_with(self, overflow: "Structure") -> None:
        """Make ``overflow`` this structure's overflow structure (see the design note).

        The id clock becomes one (continuing above the higher of the two) because
        a moved message keeps its id and FIFO across the two is by id.
        """
        self.ids.last = max(self.ids.last, overflow.ids.last)
        overflow.ids = self.ids
        self.watched |= overflow.watched
        overflow.watched = self.watched
        self.readable |= overflow.readable
        overflow.readable = self.readable
        self.locks.serial_busy |= overflow.locks.serial_busy
        overflow.locks.serial_busy = self.locks.serial_busy
        self.events += overflow.events
        overflow.events = overflow.space.events = self.events
        self._peer, overflow._peer = overflow._queues, self._queues

    def transfer(self, entry_id: int, target: "Structure") -> Entry:
        """Move a ready message into ``target`` (overflow processing), keeping its id,
        put time, delivery count, home, segments and recoverability; the log sees it
        leave here (``O``) and arrive there (``I``).

        Raises INVALID_REQUEST if it is not ready (a locked message stays where it
        is) and STRUCTURE_FULL (of ``target``) if it does not fit, changing nothing.
        """
        entry = self._find(entry_id)
        if entry.where != READY or entry.map is not None:
            what = "offloaded" if entry.map is not None else entry.where
            raise CQSError(
                Reason.INVALID_REQUEST,
                f"entry {entry_id} on {show(entry.key)} is {what}; only ready messages "
                "kept in memory move to the overflow structure",
            )
        target._admit(entry)  # placed there first, so the queue is never seen empty
        self._unplace(entry)
        self._free(entry)
        if entry.recoverable:
            self.effects.append((MOVED_OUT, entry_id))
        return entry

    def _admit(self, e: Entry) -> None:
        self.space.reserve(e.total_elements, e.total_entries,
                           lambda: f"overflow move of entry {e.entry_id}")
        self._entries[e.entry_id] = e
        if e.segments is not None:
            self._headers[e.segments.lh][e.segments.name] = e.segments
        self._place(e)
        if e.recoverable:
            home = (int(e.home[0]), e.home[1]) if e.home else None
            self.effects.append((MOVED_IN, e.entry_id, int(e.qtype), e.name, e.data, e.put_time,
                                 e.delivery_count, home))
            if e.not_before is not None:
                self.effects.append((NOT_BEFORE_AT, e.entry_id, e.not_before))

    def holds_unlogged(self) -> bool:
        """Whether a non-recoverable message is here (never logged: a planned move then
        hands the pair over by a clean image). Unsorted, unlike iterating."""
        return any(not e.recoverable for e in self._entries.values())

    def holds(self, entry_id: object) -> bool:
        """Whether a message with this id is here (ready, locked or cold)."""
        try:
            return entry_id in self._entries
        except TypeError:  # not an id at all: the request will say ENTRY_NOT_FOUND
            return False

    def entry(self, entry_id: object) -> Entry:
        """The message with this id. Raises ENTRY_NOT_FOUND."""
        return self._find(entry_id)

    def head_id(self, key: QueueKey, passed: Passed | None = None) -> int | None:
        """The id of the first ready message of a queue (that ``passed`` does not pass
        over), or None if it has none."""
        queue = self._queues.get(key)
        if queue is None:
            return None
        if passed is None:
            return queue.entries.first_id()
        try:
            return self._deliverable(queue, passed).entry_id
        except CQSError:
            return None

    @staticmethod
    def _deliverable(queue: Queue, passed: Passed, after_first: bool = False) -> Entry:
        """The queue's first message ``passed`` does not pass over (its first, for a
        SERIAL queue); raises NO_MESSAGE. ``after_first``: the caller has passed over
        the first already."""
        entry: Entry
        if queue.qtype != SERIAL or not after_first:
            for entry in islice(queue.entries.values(), int(after_first), None):
                if not passed(entry):
                    return entry
                if queue.qtype == SERIAL:
                    break
        raise CQSError(Reason.NO_MESSAGE, f"no message of {show((queue.qtype, queue.name))} "
                                          f"can be delivered now")

    def movable(self, key: QueueKey, limit: int) -> list[Entry]:
        """Up to ``limit`` ready messages of a queue that overflow processing can
        move, in id order: those kept in memory (an offloaded one costs one
        element, and its data set belongs to this structure)."""
        queue = self._queues.get(key)
        out: list[Entry] = []
        if queue is not None:
            for entry in queue.entries.values():
                if entry.map is None:
                    out.append(entry)
                    if len(out) == limit:
                        break
        return out

    def has_ready(self, key: QueueKey) -> bool:
        return key in self._queues

    def ready_keys(self) -> Iterator[QueueKey]:
        """Every queue holding ready messages (staging queues are not queues here)."""
        return iter(self._queues)

    def ready_elements(self) -> Iterator[tuple[int, QueueKey]]:
        """(data elements, key) of every queue holding ready messages, their staging
        segments included, as ``queue_stats`` counts them."""
        return ((queue.held, key) for key, queue in self._queues.items())

    # -- clients ---------------------------------------------------------------

    def client_locks(self, client: str) -> list[Entry]:
        """The messages ``client`` holds, oldest first (what a warm restart resyncs)."""
        return self.locks.held_by(client)

    def release_client(self, client: str, failed: bool = True) -> list[Entry]:
        """Peer recovery: every lock of a client that died goes back to its place, or to
        the suspend queue once delivered ``max_deliveries`` times. A client that ends
        normally (``failed=False``) just gives its locks back."""
        released = self.client_locks(client)
        for entry in released:
            self._release(entry)
            self._return(entry, None, failed)
            self._ready_effect(entry)
        return released

    def cold_client(self, client: str) -> list[Entry]:
        """Cold start: every lock left by a client's earlier life goes to the cold queue."""
        moved = self.client_locks(client)
        for entry in moved:
            self._release(entry)
            self.locks.chill(entry, client)
            if entry.recoverable:
                self.effects.append((COLD_BY, entry.entry_id, client))
        return moved

    # -- queries ---------------------------------------------------------------

    def stats(self) -> Row:
        """Structure totals as ``cqsctl display structures`` shows them."""
        space = self.space
        return {
            "name": self.name,
            "size": space.size,
            "current_size": space.current_size,
            "elements_used": space.elements_used,
            "elements_total": space.elements_total,
            "entries_used": space.entries_used,
            "entries_total": space.entries_total,
            "percent_full": round(100 * space.elements_used / max(1, space.elements_total), 2),
            "full": space.full,
            "messages": len(self._entries),
            "queues": len(self._queues),
            "locked": self.locks.count(),
            "cold": len(self.locks.cold),
            "delayed": len(self.timed.delayed),
        }

    def queue_stats(self, qtype: object, name: object) -> Row:
        """Depth, data elements (of its ready messages, staging segments included),
        oldest put time and locked count of one queue."""
        key = (parse_qtype(qtype), check_name(name))
        queue = self._queues.get(key)
        return {
            "qtype": QueueType(key[0]).name,
            "queue": key[1],
            "depth": len(queue.entries) if queue else 0,
            "elements": queue.held if queue else 0,
            "oldest_put_time": queue.entries.first().put_time if queue else None,
            "locked": self.locks.per_key.get(key, 0),
            "delayed": self.timed.per_key.get(key, 0),
        }

    def queues(self, also: Iterable[QueueKey] = ()) -> list[Row]:
        """Every queue that holds or has lent out a message (and those in ``also``),
        in list-header order."""
        return [self.queue_stats(*k) for k in in_header_order(self.queue_keys(also))]

    def queue_keys(self, also: Iterable[QueueKey] = ()) -> set[QueueKey]:
        """The keys ``queues`` reports on."""
        keys = {*self._queues, *self.locks.per_key, *self.timed.per_key, *also}
        return {k for k in keys if k[0] not in STAGING_TYPES}

    def header_stats(self) -> list[Row]:
        """Entries and data elements on each list header that holds any."""
        rows = []
        for lh, pool in ((COLD_LH, list(self.locks.cold.values())),
                         (LOCK_LH, list(self.locks.all_locked())),
                         (DELETE_LH, list(self.cleanup)),
                         (DELAYED_LH, list(self.timed.delayed.values()))):
            if pool:  # heads only: a long message's segments stay on its staging queue
                rows.append({"lh": lh, "entries": len(pool),
                             "elements": sum(e.elements for e in pool)})
        for lh in range(FIRST_CLIENT_LH, LIST_HEADERS):
            header = self._headers[lh]
            if header:
                rows.append({"lh": lh, "entries": sum(len(q.entries) for q in header.values()),
                             "elements": sum(q.elements for q in header.values())})
        return rows

    def client_stats(self) -> dict[str, int]:
        """Locks held per client."""
        return self.locks.per_client()

    def take_events(self) -> list[Event]:
        """The events since the last call. The list is emptied in place, not replaced:
        a structure paired with an overflow structure shares it."""
        events = self.events[:]
        self.events.clear()
        return events

    def cost(self, nbytes: int) -> tuple[int, int]:
        """(data elements, list entries) a message of ``nbytes`` occupies, segments included."""
        return self.space.cost(nbytes)

    def message_count(self) -> int:
        """The messages here (heads: ready, locked, cold or delayed)."""
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """Every message head, in entry-id order (for images and checks)."""
        return iter(sorted(self._entries.values(), key=lambda e: e.entry_id))

    # -- internals -------------------------------------------------------------

    def _find(self, entry_id: object) -> Entry:
        try:
            return self._entries[entry_id]  # type: ignore[index]  # else a KeyError
        except (KeyError, TypeError):
            raise CQSError(
                Reason.ENTRY_NOT_FOUND, f"entry {entry_id!r} is not in structure {self.name}"
            ) from None

    def _new_id(self, now: int) -> int:
        ids = self.ids
        ids.last = now if now > ids.last else ids.last + 1
        return ids.last

    def _insert_reserved(self, qtype: QueueType, name: str, data: bytes, recoverable: bool,
                         dmap: DataMap | None, not_before: int | None) -> Entry:
        space = self.space
        need_elements, need_entries = space.cost_of(len(data), dmap)
        space.reserve(need_elements, need_entries, lambda: "commit")
        return self._put_effect(
            self._insert(qtype, name, data, recoverable, dmap=dmap, not_before=not_before), data)

    # Effects are what the log records: the outcome of a request for each recoverable
    # message it touched, never the request itself, so replay needs no configuration.

    def _put_effect(self, e: Entry, payload: bytes) -> Entry:
        self.counts.puts += 1
        if e.recoverable:
            dmap = e.map
            if dmap is None:
                self.effects.append((PUT, e.entry_id, int(e.qtype), e.name, e.data, e.put_time))
                if e.not_before is not None:
                    self.effects.append((NOT_BEFORE_AT, e.entry_id, e.not_before))
                return e
            # recovery logging (seed 000): each block, then the entry with its map
            view = memoryview(payload)
            self.effects += [(BLOCK, e.entry_id, r.page, view[offset:offset + nbytes])
                             for r, offset, nbytes in dmap.pieces()]
            self.effects.append((PUT, e.entry_id, int(e.qtype), e.name, b"", e.put_time))
            self.effects.append((MAPPED, e.entry_id, dmap.encode()))
            if e.not_before is not None:
                self.effects.append((NOT_BEFORE_AT, e.entry_id, e.not_before))
        return e

    def _ready_effect(self, e: Entry) -> None:
        if e.recoverable:
            home = (int(e.home[0]), e.home[1]) if e.home else None
            self.effects.append((READY_AT, e.entry_id, int(e.qtype), e.name, home,
                                 e.delivery_count))

    def _insert(
        self,
        qtype: QueueType,
        name: str,
        data: bytes,
        recoverable: bool,
        entry_id: int | None = None,
        put_time: int | None = None,
        dmap: DataMap | None = None,
        not_before: int | None = None,
    ) -> Entry:
        """Add a message whose space is reserved. Its 2nd..nth segments go to the
        staging queue first and its head last, as IMS puts the first record last;
        an offloaded one (``dmap``) has none and keeps no payload. One whose
        ``not_before`` is still to come is delayed instead of placed."""
        now = self.ids.clock()
        step = self.space.entry_max
        segments = None
        if dmap is not None:
            data = b""
        elif len(data) > step:
            view = memoryview(data)
            first_id = self._new_id(now)
            stype = staging_type(qtype)
            sname = "S" + _base36(first_id)
            segments = Queue(stype, sname, list_header(stype, sname))
            for offset in range(step, len(data), step):
                chunk = view[offset : offset + step]
                seg_id = first_id if offset == step else self._new_id(now)
                seg = Entry(seg_id, stype, sname, chunk, recoverable, now, elements(len(chunk)))
                seg.where = STAGED
                segments.add(seg)
            self._headers[segments.lh][sname] = segments
        if entry_id is None:
            entry_id = self._new_id(now)
        else:
            self.last_id = max(self.last_id, entry_id)
        entry = Entry(
            entry_id, qtype, name, data, recoverable, put_time or now,
            self.space.cost_of(0, dmap)[0] if dmap is not None else elements(min(len(data), step)),
        )
        entry.segments = segments
        if dmap is not None:
            entry.map, entry.store = dmap, self.name
        self._entries[entry_id] = entry
        if not_before is not None and not_before > now:
            entry.not_before = not_before
            self.timed.delay(entry)
        else:
            self._place(entry)
        return entry

    def _place(self, entry: Entry) -> None:
        """Put an entry on its ready queue at its place by id."""
        key = (entry.qtype, entry.name)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._idle.pop(key, None)
            if queue is None:
                queue = Queue(entry.qtype, entry.name, list_header(*key))
            else:
                queue.elements = queue.held = 0
            self._queues[key] = queue
            self._headers[queue.lh][entry.name] = queue
            if key not in self._peer:  # else the queue was not empty: it had messages there
                self.events.append(QueueWork(self.name, entry.qtype, entry.name))
        queue.add(entry)
        entry.where = READY
        if key in self.watched:
            self.readable.add(key)

    def _unplace(self, entry: Entry) -> None:
        queue = self._queues[(entry.qtype, entry.name)]
        queue.remove(entry)
        if not queue.entries:
            self._drop_queue(queue)

    def _drop_queue(self, queue: Queue) -> None:
        key = (queue.qtype, queue.name)
        del self._queues[key]
        del self._headers[queue.lh][queue.name]
        if not queue.entries:
            idle = self._idle
            if len(idle) >= IDLE_QUEUES:
                del idle[next(iter(idle))]  # the longest idle
            idle[key] = queue

    def _take(self, entry: Entry) -> None:
        """Detach an entry from wherever it is (ready, lock or cold queue)."""
        if entry.where == READY:
            self._unplace(entry)
        elif entry.where == LOCKED:  # _release spelt out: this runs on every delete
            if self.locks.release(entry):
                self._serial_free(entry)
        elif entry.where == DELAYED:
            self.timed.undelay(entry)
        else:
            self.locks.thaw(entry)

    def _free(self, entry: Entry) -> None:
        del self._entries[entry.entry_id]
        if entry.map is not None:  # to the clean-up queue, still charged (stamp_deleted)
            self.cleanup.add(entry)
            return
        self.space.discard(entry)
        if entry.segments is not None:
            del self._headers[entry.segments.lh][entry.segments.name]

    def _release(self, entry: Entry) -> None:
        """Take an entry off the lock queue; it is nowhere until placed again."""
        if self.locks.release(entry):
            self._serial_free(entry)

    def _serial_free(self, entry: Entry) -> None:
        """A SERIAL queue's message in flight was released: the queue is readable
        again for its waiters, if it has a message in either structure of a pair."""
        key = (entry.qtype, entry.name)
        if key in self.watched and (key in self._queues or key in self._peer):
            self.readable.add(key)

    def _lease(self, entry: Entry, seconds: float) -> None:
        """Set a lock's lease to ``seconds`` from now, logged as a T effect."""
        lease_ns = int(seconds * 1e9)
        deadline = self.ids.clock() + lease_ns
        self.timed.arm(entry, (lease_ns, deadline, self.timed.ticks() + seconds),
                       self.locks.all_locked)
        if entry.recoverable:
            self.effects.append((LEASED, entry.entry_id, lease_ns, deadline))

    def _return(self, entry: Entry, target: QueueKey | None, failed: bool) -> None:
        if failed and entry.delivery_count >= self.max_deliveries:
            self.counts.suspends += 1
            if entry.home is None:
                entry.home = (entry.qtype, entry.name)
            entry.qtype = SUSPEND
        elif target is not None:
            entry.qtype, entry.name = target
            entry.home = None
        self._place(entry)


def _base36(n: int) -> str:
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    while n:
        n, d = divmod(n, 36)
        out = digits[d] + out
    return out or "0"
