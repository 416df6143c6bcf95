"""What a client addresses: a primary structure and its optional overflow structure.

Design note. IMS overflow processing (seed 004, "Structure Overflow") isolates
the queues that are filling a structure. A put that takes the primary to its
threshold only raises ``pressure``; the daemon then calls ``relieve``, which
grows a structure below its maximum size or, at maximum size, selects the
biggest queue names and puts them in *overflow status* — the one step that
holds up other requests, and it only sorts numbers it already keeps. (A put
that does not fit at all does not wait for that: its structure grows at once,
by the same step, before it would refuse the put; ``Structure.put``.) With an
overflow structure, ``move_some`` then moves those queues' ready messages over
in batches between requests, and their later puts go there; without one, their
puts are refused and the threshold is not checked again until no name is left
in overflow status.

A queue in overflow status may have ready messages in both structures, in the
middle of a move or because a message unlocked in the primary returns to its
place there. It stays one queue: a read takes the lower of the two heads (ids
come from one clock, ``Structure.pair_with``), a SERIAL name has one message in
flight across both (one in-flight set), a browse merges the two. Every other
queue is wholly in the primary, so one invariant keeps the cost of all this off
the common path: **a queue with ready messages in the overflow structure is in
overflow status.** A request on the primary alone, with no name in overflow
status, goes straight through; otherwise only the keys the request touched are
looked at again (``_recheck``): a name leaves overflow status when it has no
ready message in either structure, and a message made ready in the overflow
structure (an unlock, a move, a requeue there) brings its name in.

Messages stay in the structure that holds them: a move, unlock or requeue of a
message in the overflow structure leaves it there, under its new name.
"""

import heapq
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, cast

from ..smds.datamap import DataMap
from .browse import Cursor, position
from .commit import Delete, Move, Op, Put, Unlock
from .entry import Entry, Passed
from .errors import CQSError, Reason
from .events import Altered, Event, ExitFailed, OverflowMode, OverflowStatus, QueueWork
from .overflow import (
    DEFAULT_SHARE,
    DEFAULT_THRESHOLD,
    MAX_CANDIDATES,
    OverflowExit,
    Relief,
    consult,
    describe,
    grown_size,
    select,
    threshold_elements,
)
from .qtypes import QueueKey, QueueType, check_name, in_header_order, parse_qtype, show
from .reports import Row, add_clients, add_headers, add_queue
from .structure import Structure

NEVER = 1 << 62  # a trigger no structure reaches: the threshold is not being checked
MOVE_BATCH = 1000  # messages one move_some call moves by default: a few ms between requests
# Payload bytes after which a move_some call stops: its O and I effects are one
# log record, which must stay under the logstream's 16 MiB (server/limits.py);
# the first message always moves, and a put keeps each message within a record.
MOVE_BYTES = 4 * 1024 * 1024
# queue_space_exit(structure, qtype name, queue, bytes) -> False to refuse (IMS DFSQSPC0)
QueueSpaceExit = Callable[[str, str, str, int], bool]


class StructurePair:
    """A primary structure and its optional overflow structure, with the request API
    of ``Structure``, so the daemon's handlers call either alike."""

    def __init__(
        self,
        primary: Structure,
        overflow: Structure | None = None,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        overflow_exit: OverflowExit | None = None,
        queue_space_exit: QueueSpaceExit | None = None,
        share: int = DEFAULT_SHARE,
        candidates: int = MAX_CANDIDATES,
    ) -> None:
        if type(threshold) is not int or not 1 <= threshold <= 100:
            raise CQSError(Reason.INVALID_REQUEST,
                           f"overflow threshold of {primary.name} must be 1 to 100 percent, "
                           f"got {threshold!r}")
        if overflow is not None:
            primary.pair_with(overflow)
        self.primary = primary
        self.overflow = overflow
        self.name = primary.name
        self.threshold = threshold  # 100: overflow processing is off
        self.share = share  # percent of data elements a selection's candidates cover
        self.candidates = candidates  # names a selection takes at most
        self.overflow_exit = overflow_exit
        self.queue_space_exit = queue_space_exit
        self.watched = primary.watched  # shared with the overflow structure
        self.readable = primary.readable
        self.events = primary.events
        self.pressure = False  # a put reached the threshold: the daemon should call relieve()
        self.offloading = any(s.space.offload_rules is not None for s in self.structures())
        self._status: set[QueueKey] = set()  # the names in overflow status
        self._moving: dict[QueueKey, None] = {}  # selected names whose messages are being moved
        self._trigger = NEVER  # data elements in use at which a put raises pressure
        self._armed_for = primary.space.elements_total  # the primary's size the trigger is for
        self._arm()

    @property
    def last_id(self) -> int:
        return self.primary.last_id

    @last_id.setter
    def last_id(self, value: int) -> None:
        self.primary.last_id = value  # one clock for both

    # -- requests ------------------------------------------------------------

    def put(self, qtype: object, name: object, data: bytes, recoverable: bool = True,
            dmap: DataMap | None = None, not_before: int | None = None) -> Entry:
        """Put a message; a queue in overflow status gets it in the overflow structure.
        Raises STRUCTURE_FULL, or OVERFLOW_REJECTED for a queue in overflow status
        when there is no overflow structure, it is full, or the queue space exit
        says no. ``dmap``: offloaded to the data set of the structure ``target``
        named."""
        if self._status:
            key = (parse_qtype(qtype), check_name(name))
            if key in self._status:
                return self._put_over(key, data, recoverable, dmap, not_before)
        primary = self.primary
        entry = primary.put(qtype, name, data, recoverable, dmap, not_before)
        if primary.space.elements_used >= self._trigger:
            self._press()
        return entry

    def target(self, qtype: object, name: object) -> Structure:
        """The structure a put to this queue goes to now (``put`` routes the same
        way while nothing changes in between). With no name in overflow status it is
        the primary, found without parsing the key: ``put`` parses it anyway."""
        if not self._status or self.overflow is None:
            return self.primary
        key = (parse_qtype(qtype), check_name(name))
        return self.overflow if key in self._status else self.primary

    def read(self, client: str, qtype: object, name: str, lease: float | None = None,
             passed: Passed | None = None) -> Entry:
        """Lock the first message of a queue (that ``passed`` does not pass over), by
        id across both structures."""
        if not self._status:
            return self.primary.read(client, qtype, name, lease, passed)
        key = (parse_qtype(qtype), name)
        if key not in self._status:
            return self.primary.read(client, *key, lease, passed)
        entry = self._first(key, passed).read(client, *key, lease, passed)
        self._recheck(key)
        return entry

    def renew(self, client: str, entry_id: object, lease: float) -> Entry:
        """``Structure.renew``, in whichever structure holds the message."""
        return self._holder(entry_id).renew(client, entry_id, lease)

    def expire(self, now: float | None = None, spared: Collection[str] = ()) -> list[Entry]:
        """``Structure.expire`` in both structures."""
        expired = self.primary.expire(now, spared)
        if self.overflow is not None:
            theirs = self.overflow.expire(now, spared)
            for key in {e.key for e in theirs}:
                self._recheck(key)
            expired += theirs
        return expired

    def ripen(self, now: int | None = None) -> list[Entry]:
        """``Structure.ripen`` in both structures."""
        ripe = self.primary.ripen(now)
        if self.overflow is not None:
            theirs = self.overflow.ripen(now)
            for key in {e.key for e in theirs}:
                self._recheck(key)
            ripe += theirs
        return ripe

    def next_expiry(self) -> float | None:
        """The earlier ``Structure.next_expiry`` of the two."""
        return min((t for s in self.structures() if (t := s.next_expiry()) is not None),
                   default=None)

    def next_due(self) -> int | None:
        """The earlier ``Structure.next_due`` of the two."""
        return min((t for s in self.structures() if (t := s.next_due()) is not None),
                   default=None)

    def take_armed(self) -> bool:
        """Whether a lease or a delay was set since the last call (``Timed.armed``)."""
        primary, overflow = self.primary, self.overflow  # after every request: no list
        armed = primary.timed.armed
        if armed:
            primary.timed.armed = False
        if overflow is not None and overflow.timed.armed:
            overflow.timed.armed, armed = False, True
        return armed

    def delete(self, client: str | None, entry_id: object, operator: bool = False) -> Entry:
        """``Structure.delete``, in whichever structure holds the message."""
        overflow = self.overflow
        if overflow is None or not overflow.holds(entry_id):  # the common path, inlined
            entry = self.primary.delete(client, entry_id, operator)
            if self._status:
                self._recheck(entry.key)
            return entry
        entry = overflow.delete(client, entry_id, operator)
        self._recheck(entry.key)
        return entry

    def move(self, client: str | None, entry_id: object, qtype: object, name: object) -> Entry:
        """``Structure.move``, within whichever structure holds the message."""
        s = self._holder(entry_id)
        if not self._status and s is self.primary:
            return s.move(client, entry_id, qtype, name)
        was = s.entry(entry_id).key
        entry = s.move(client, entry_id, qtype, name)
        self._recheck(was)
        self._recheck(entry.key)
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
        """``Structure.unlock``, within whichever structure holds the message."""
        s = self._holder(entry_id)
        entry = s.unlock(client, entry_id, failed=failed, qtype=qtype, name=name)
        if s is not self.primary:  # in the primary, an unlock only adds a ready message
            self._recheck(entry.key)
        return entry

    def commit(self, client: str, ops: Iterable[Op]) -> list[Entry]:
        """Apply a batch all together or not at all, each operation in the structure
        that holds its entry (a put: where its queue's puts go). Both structures are
        checked before either changes; a put the overflow structure has no room
        for refuses the whole batch with OVERFLOW_REJECTED."""
        ops = list(ops)
        primary, overflow = self.primary, self.overflow
        if not self._status and (overflow is None or not overflow.space.entries_used):
            results = primary.commit(client, ops)  # everything is in the primary
        else:
            routes = [self._route(op) for op in ops]
            both = any(s is not primary for s in routes)
            if not both and not self._status:
                results = primary.commit(client, ops)
            else:
                was = [s.entry(op.entry_id).key for op, s in zip(ops, routes, strict=True)
                       if type(op) is Move and s.holds(op.entry_id)]
                if both:
                    results = self._commit_both(client, ops, routes)
                else:
                    results = primary.commit(client, ops)
                for key in {*was, *(e.key for e in results)}:
                    self._recheck(key)
        if primary.space.elements_used >= self._trigger:
            self._press()
        return results

    def browse(
        self,
        qtype: object = None,
        name: object = None,
        *,
        after: object = None,
        limit: object = 100,
    ) -> tuple[list[Entry], Cursor | None]:
        """Browse both structures as one, in (list header, name, id) order, with the
        cursors ``Structure.browse`` gives."""
        found, more = self.primary.browse(qtype, name, after=after, limit=limit)
        if self.overflow is None:
            return found, more
        theirs, more_there = self.overflow.browse(qtype, name, after=after, limit=limit)
        if not theirs:
            return found, more
        merged = list(heapq.merge(found, theirs, key=position))
        n = cast(int, limit)  # the primary's browse refused anything else
        page = merged[:n]
        if len(merged) > n or more is not None or more_there is not None:
            return page, position(page[-1])
        return page, None

    # -- operator requests -----------------------------------------------------

    def requeue(self, entry_id: object) -> Entry:
        """``Structure.requeue``, within whichever structure holds the message."""
        s = self._holder(entry_id)
        was = s.entry(entry_id).key
        entry = s.requeue(entry_id)
        if self._status or s is not self.primary:
            self._recheck(was)
            self._recheck(entry.key)
        return entry

    def dequeue(self, qtype: object, name: object) -> list[Entry]:
        """Delete every unlocked message of a queue, in both structures."""
        gone = self.primary.dequeue(qtype, name)
        if self.overflow is not None:
            theirs = self.overflow.dequeue(qtype, name)
            if theirs:
                gone = sorted(gone + theirs, key=_entry_id)
        if self._status:
            self._recheck((parse_qtype(qtype), check_name(name)))
        return gone

    def alter(self, size_bytes: int, reason: str = "operator") -> Altered:
        """Alter the primary (``Structure.alter``); the threshold moves with its size."""
        event = self.primary.alter(size_bytes, reason)
        self._arm()
        return event

    # -- clients ---------------------------------------------------------------

    def client_locks(self, client: str) -> list[Entry]:
        return self._both(lambda s: s.client_locks(client))

    def release_client(self, client: str, failed: bool = True) -> list[Entry]:
        released = self.primary.release_client(client, failed)
        if self.overflow is not None:
            theirs = self.overflow.release_client(client, failed)
            if theirs:
                for key in {e.key for e in theirs}:
                    self._recheck(key)
                released = sorted(released + theirs, key=_entry_id)
        return released

    def cold_client(self, client: str) -> list[Entry]:
        return self._both(lambda s: s.cold_client(client))  # locked to cold: no ready change

    # -- overflow processing -----------------------------------------------------

    def relieve(self) -> Relief | None:
        """Overflow processing, when ``pressure`` says a put reached the threshold.

        Below its maximum size the primary is altered to bring use down by 20
        percentage points (capped at its maximum); at maximum size the biggest
        queue names are selected (``overflow.select``), offered to the overflow
        exit, and put in overflow status. Returns what was done, or None when
        nothing was to be done (use back below the threshold, a move still under
        way, or no overflow structure and names already in overflow status).
        """
        self.pressure = False
        primary, space = self.primary, self.primary.space
        if not self._checking() or space.elements_used < threshold_elements(
            self.threshold, space.elements_total
        ):
            return None
        if space.current_size < space.size:
            old = space.current_size
            primary.alter(
                grown_size(space.elements_used, space.elements_total, space.size),
                reason="overflow threshold",
            )
            self._arm()
            return Relief(grew=(old, space.current_size))
        candidates = select(primary.ready_elements(), space.elements_total, self._status,
                            self.share, self.candidates)
        kept, dropped, error = consult(self.overflow_exit, self.name, candidates)
        for key, _ in kept:
            self._enter(key)
        if self.overflow is not None:
            self._moving.update((key, None) for key, _ in kept)
        self._arm(step=True)
        return Relief(
            selected=[describe(*c) for c in kept],
            dropped=[describe(*c) for c in dropped],
            exit_error=error,
        )

    def move_some(self, limit: int = MOVE_BATCH) -> int:
        """Move up to ``limit`` ready messages of the selected queues to the overflow
        structure; returns how many moved, 0 once nothing is left to move (the
        daemon calls it between requests until then). Messages locked meanwhile
        stay in the primary. If the overflow structure fills, the rest stay too."""
        moving, primary, overflow = self._moving, self.primary, self.overflow
        if not moving or overflow is None:  # names are only moving to an overflow structure
            return 0
        moved = nbytes = 0
        while moving and moved < limit:
            key = next(iter(moving))
            batch = primary.movable(key, limit - moved)
            if not batch:
                del moving[key]
                continue
            for entry in batch:
                size = len(entry.data)
                if moved and nbytes + size > MOVE_BYTES:
                    return moved  # the next batch takes it: this one's record stays in bounds
                try:
                    primary.transfer(entry.entry_id, overflow)
                except CQSError as err:
                    if err.reason != Reason.STRUCTURE_FULL:
                        raise
                    moving.clear()
                    break
                nbytes += size
                moved += 1
        if not moving:
            self._arm(step=True)
        return moved

    def derive_status(self) -> None:
        """After a restart, when the daemon has restored both structures directly:
        names with ready messages in the overflow structure are in overflow status
        (without an overflow structure there is nothing to derive it from, and the
        threshold is checked afresh). Raises ``pressure`` if use is at the threshold."""
        if self.overflow is not None:
            for key in list(self.overflow.ready_keys()):
                if key not in self._status:
                    self._enter(key)
        self._arm()
        if self.primary.space.elements_used >= self._trigger:
            self.pressure = True

    @property
    def moving(self) -> bool:
        """Whether ``move_some`` has work left."""
        return bool(self._moving)

    @property
    def overflow_mode(self) -> bool:
        return bool(self._status)

    def overflow_names(self) -> list[Row]:
        """The names in overflow status, in list-header order."""
        return [{"qtype": QueueType(k[0]).name, "queue": k[1]}
                for k in in_header_order(self._status)]

    def take_record(self) -> dict[str, Any] | None:
        """The log record body for what happened to recoverable messages since the
        last call (docs/recovery.md): one record for both structures, so a move to
        the overflow structure is atomic in the log. None when there is nothing."""
        primary, overflow = self.primary, self.overflow
        if overflow is None or not overflow.effects:
            if not primary.effects:
                return None
            effects, primary.effects = primary.effects, []
            return {"s": primary.name, "e": effects}
        effects, primary.effects = primary.effects, []
        theirs, overflow.effects = overflow.effects, []
        return {"s": primary.name, "e": effects, "x": {overflow.name: theirs}}

    # -- queries ---------------------------------------------------------------

    def stats(self) -> Row:
        """The primary's figures (``structure_stats`` gives each structure's own),
        with the overflow state."""
        row = self.primary.stats()
        row["overflow"] = self.overflow.name if self.overflow is not None else None
        row["overflow_mode"] = bool(self._status)
        row["overflow_names"] = len(self._status)
        row["threshold"] = self.threshold
        return row

    def structure_stats(self) -> list[Row]:
        return [s.stats() for s in self.structures()]

    def queue_stats(self, qtype: object, name: object) -> Row:
        """One queue across both structures, and whether it is in overflow status."""
        row = self.primary.queue_stats(qtype, name)
        if self.overflow is not None:
            add_queue(row, self.overflow.queue_stats(qtype, name))
        row["overflow"] = (parse_qtype(qtype), row["queue"]) in self._status  # both checked
        return row

    def has_ready(self, key: QueueKey) -> bool:
        """Whether the queue has a ready message in either structure."""
        return self.primary.has_ready(key) or (
            self.overflow is not None and self.overflow.has_ready(key))

    def queues(self, also: Iterable[QueueKey] = ()) -> list[Row]:
        keys = self.primary.queue_keys(also)
        if self.overflow is not None:
            keys |= self.overflow.queue_keys()
        return [self.queue_stats(*k) for k in in_header_order(keys)]

    def header_stats(self) -> list[Row]:
        """Entries and data elements per list header, both structures added up."""
        return add_headers(s.header_stats() for s in self.structures())

    def client_stats(self) -> dict[str, int]:
        return add_clients(s.client_stats() for s in self.structures())

    def take_events(self) -> list[Event]:
        """Events of both structures; a queue's new work is the primary's, the name
        clients know it by, wherever the message landed."""
        events = self.primary.take_events()  # the overflow structure's are in the same list
        if self.overflow is None:
            return events
        return [QueueWork(self.name, e.qtype, e.name)
                if type(e) is QueueWork and e.structure != self.name else e
                for e in events]

    def __iter__(self) -> Iterator[Entry]:
        """Every message head of both structures, in entry-id order."""
        return heapq.merge(*self.structures(), key=_entry_id)

    # -- internals -------------------------------------------------------------

    def structures(self) -> list[Structure]:
        """The physical structures: the primary, and the overflow structure if any."""
        return [self.primary] if self.overflow is None else [self.primary, self.overflow]

    def _both(self, request: Callable[[Structure], list[Entry]]) -> list[Entry]:
        got = request(self.primary)
        if self.overflow is not None:
            theirs = request(self.overflow)
            if theirs:
                got = sorted(got + theirs, key=_entry_id)
        return got

    def _holder(self, entry_id: object) -> Structure:
        overflow = self.overflow
        return overflow if overflow is not None and overflow.holds(entry_id) else self.primary

    def _first(self, key: QueueKey, passed: Passed | None = None) -> Structure:
        """The structure holding the queue's first ready message (the primary if none)."""
        if self.overflow is None:
            return self.primary
        here, there = self.primary.head_id(key, passed), self.overflow.head_id(key, passed)
        if there is not None and (here is None or there < here):
            return self.overflow
        return self.primary

    def _put_over(self, key: QueueKey, data: bytes, recoverable: bool,
                  dmap: DataMap | None, not_before: int | None) -> Entry:
        overflow = self._overflow_for(key, len(data))
        try:
            return overflow.put(*key, data, recoverable, dmap, not_before)
        except CQSError as err:
            raise _rejected(err, f"{show(key)} is in overflow status") from None

    def _overflow_for(self, key: QueueKey, nbytes: int) -> Structure:
        """Where a put of ``nbytes`` to ``key``, in overflow status, goes: refused
        without an overflow structure, or when the queue space exit says no."""
        if self.overflow is None:
            raise CQSError(Reason.OVERFLOW_REJECTED,
                           f"{show(key)} is in overflow status and structure {self.name} "
                           "has no overflow structure")
        self._ask_space(key, nbytes)
        return self.overflow

    def _ask_space(self, key: QueueKey, nbytes: int) -> None:
        """The queue space exit may refuse a put to a queue in overflow status; an
        exit that fails lets the put through and is reported (``ExitFailed``)."""
        exit_ = self.queue_space_exit
        if exit_ is None:
            return
        try:
            allowed = exit_(self.name, QueueType(key[0]).name, key[1], nbytes)
        except Exception as err:  # user code
            self.events.append(ExitFailed(self.name, "queue_space", f"{type(err).__name__}: {err}"))
            return
        if not allowed:
            raise CQSError(Reason.OVERFLOW_REJECTED,
                           f"the queue space exit refused a put of {nbytes} bytes to {show(key)}, "
                           f"in overflow status on structure {self.name}")

    def _route(self, op: Op) -> Structure:
        """The structure a commit operation applies to; asks the queue space exit
        about puts to queues in overflow status."""
        if type(op) is Put:
            if self._status:
                key = (parse_qtype(op.qtype), check_name(op.name))
                if key in self._status:
                    return self._overflow_for(key, len(op.data))
            return self.primary
        if isinstance(op, (Delete, Move, Unlock)):
            return self._holder(op.entry_id)
        return self.primary  # not an operation: the primary's check refuses it

    def _commit_both(self, client: str, ops: list[Op], routes: list[Structure]) -> list[Entry]:
        primary, overflow = self.primary, self.overflow
        assert overflow is not None  # a route to it exists
        here = primary.check_commit(
            client, [op for op, s in zip(ops, routes, strict=True) if s is primary])
        try:
            there = overflow.check_commit(
                client, [op for op, s in zip(ops, routes, strict=True) if s is overflow])
        except CQSError as err:
            raise _rejected(err, "commit puts to queues in overflow status") from None
        done_here = iter(primary.apply_commit(client, here))
        done_there = iter(overflow.apply_commit(client, there))
        return [next(done_here) if s is primary else next(done_there) for s in routes]

    def _recheck(self, key: QueueKey) -> None:
        """Keep the invariant of the design note for a key a request touched."""
        there = self.overflow is not None and self.overflow.has_ready(key)
        if key in self._status:
            if not there and not self.primary.has_ready(key):
                self._leave(key)
        elif there:
            self._enter(key)

    def _enter(self, key: QueueKey) -> None:
        if not self._status:
            self.events.append(OverflowMode(self.name, True))
        self._status.add(key)
        self.events.append(OverflowStatus(self.name, key[0], key[1], True))

    def _leave(self, key: QueueKey) -> None:
        self._status.discard(key)
        self.events.append(OverflowStatus(self.name, key[0], key[1], False))
        if not self._status:
            self.events.append(OverflowMode(self.name, False))
        was_moving = bool(self._moving)
        self._moving.pop(key, None)
        if (was_moving and not self._moving) or (self.overflow is None and not self._status):
            self._arm(step=True)

    def _checking(self) -> bool:
        """Whether the threshold is being checked: overflow processing is on, no move
        is under way, and without an overflow structure, no name is in overflow
        status (seed 004: "Overflow threshold is not checked again")."""
        return self.threshold < 100 and not self._moving and not (
            self.overflow is None and self._status
        )

    def _press(self) -> None:
        """A request took use to the trigger: raise ``pressure``, unless the trigger was
        set for a smaller size (the request grew the primary to fit) and use is below
        the one for the size now."""
        if self.primary.space.elements_total != self._armed_for:
            self._arm()
            if self.primary.space.elements_used < self._trigger:
                return
        self.pressure = True

    def _arm(self, step: bool = False) -> None:
        """Set the use at which the next put raises ``pressure``: the threshold, or,
        after a selection that left use above it (locked messages, an exit that said
        no, a full overflow structure), one percent more, so that a structure that
        cannot be relieved is not re-sorted on every put."""
        space = self.primary.space
        self._armed_for = space.elements_total
        if not self._checking():
            self._trigger = NEVER
            return
        trigger = threshold_elements(self.threshold, space.elements_total)
        if step and space.elements_used >= trigger:
            trigger = space.elements_used + max(1, space.elements_total // 100)
        self._trigger = trigger


def _entry_id(entry: Entry) -> int:
    return entry.entry_id


def _rejected(err: CQSError, what: str) -> CQSError:
    """A full overflow structure refuses the primary's clients with OVERFLOW_REJECTED
    (the primary itself carries on); any other refusal stands as it is."""
    if err.reason != Reason.STRUCTURE_FULL:
        return err
    return CQSError(Reason.OVERFLOW_REJECTED,
                    f"{what} and its overflow structure is full: {err.message}")
