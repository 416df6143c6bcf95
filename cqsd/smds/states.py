"""The states of a shared message data set and of the daemon's connection to it
(seed 000, "Status and availability information"; docs/smds.md, "States").

Design note. IBM MQ keeps two pairs of states, and so does cqsd. The data
set's shared ``STATUS`` and ``ACCESS`` say whether it may be used at all; they
live in the repository and outlive the daemon. The connection's ``SMDSCONN``
``STATUS`` and ``AVAIL`` say whether the daemon has it open and, if not, why;
they are re-created at each start, except that a connection an operator
stopped stays stopped (a flag in the repository). In cqsd one daemon does
every client's I/O, so it is the owning queue manager of every data set and
there is one connection per data set.

Each pair is a table from (state, event) to state, as h11 keeps a connection's
states: an event the table has no entry for is refused (``IllegalTransition``),
so no bug can invent a state the seed does not have. Some events trigger others
across the pairs, as the seed says they do:

- a connection that cannot allocate, open or get storage for its data set
  suspends the data set's ACCESS ("Owned data set cannot be opened");
- a connection that finds the data damaged makes it FAILED + SUSPENDED;
- a successful open is the end of restart processing: the data set becomes
  ACTIVE, and a SUSPENDED ACCESS ENABLED again;
- a data set recovered, purged or enabled again lets a connection in ERROR try
  again ("If the SMDSCONN is marked as AVAIL(ERROR), it will automatically be
  changed back to AVAIL(NORMAL)").

Events that end the use of a data set (FAILED by command, recovery, purge,
ACCESS(DISABLED), a stop) need its connection closed first: the daemon
closes it — normally, saving the space map, or abandoning it — and then
fires the event, so that "open" always means ACTIVE, ENABLED and NORMAL
(``check`` says what always holds).

Pure: no I/O. ``cqsd/server/smds/availability.py`` keeps, persists and logs them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar


class Status(StrEnum):
    """The data set's shared status (DISPLAY CFSTATUS TYPE(SMDS))."""

    NOTFOUND = "NOTFOUND"  # not activated yet
    NEW = "NEW"  # being opened and formatted for the first time
    ACTIVE = "ACTIVE"  # in normal use
    FAILED = "FAILED"  # unusable except by recovery
    INRECOVER = "INRECOVER"  # media recovery (cqsctl recover) in progress
    RECOVERED = "RECOVERED"  # usable once restart processing has run
    EMPTY = "EMPTY"  # holds no messages; the next open resets its space map


class Access(StrEnum):
    """The data set's availability (RESET SMDS ACCESS)."""

    ENABLED = "ENABLED"
    SUSPENDED = "SUSPENDED"  # unavailable because of an error
    DISABLED = "DISABLED"  # unavailable by operator command


class Conn(StrEnum):
    """The connection's status (DISPLAY SMDSCONN STATUS)."""

    CLOSED = "CLOSED"
    CLOSING = "CLOSING"
    OPENING = "OPENING"
    OPEN = "OPEN"
    ALLOCFAIL = "ALLOCFAIL"  # the file could not be found or made
    OPENFAIL = "OPENFAIL"  # the file is there but could not be opened
    STGFAIL = "STGFAIL"  # no memory for its space map or buffers
    DATAFAIL = "DATAFAIL"  # opened, but its contents are wrong


class Avail(StrEnum):
    """The connection's availability (START/STOP SMDSCONN)."""

    NORMAL = "NORMAL"
    ERROR = "ERROR"  # unavailable because of an error
    STOPPED = "STOPPED"  # unavailable by operator command


class Event(StrEnum):
    """What happens to a data set or its connection; each named after the seed's case."""

    # the data set's STATUS and ACCESS
    ACTIVATE = "activate"  # first use by its owner: NOTFOUND -> NEW
    RESTART_DONE = "restart-done"  # triggered by OPENED: restart processing completed
    DAMAGE = "damage"  # triggered by DATA_FAIL: header, empty, I/O error, prefix, down-level
    FOUND_INVALID = "found-invalid"  # recovery found it invalid (or gone) when it opened it
    OPEN_FAILURE = "open-failure"  # triggered by ALLOC_FAIL, OPEN_FAIL, STORAGE_FAIL
    CLOSE_EMPTY = "close-empty"  # closed normally at a time it holds no messages
    RESET_FAILED = "reset-failed"  # reset-smds --status failed
    RESET_RECOVERED = "reset-recovered"  # reset-smds --status recovered
    RECOVERY_START = "recovery-start"  # cqsctl recover selected it
    RECOVERY_DONE = "recovery-done"  # its blocks are back and fsynced
    RECOVERY_FAIL = "recovery-fail"  # recovery could not finish (or the daemon stopped)
    PURGE = "purge"  # recover --purge, or its non-recoverable structure deleted
    ENABLE = "enable"  # reset-smds --access enabled
    DISABLE = "disable"  # reset-smds --access disabled
    # the connection's STATUS and AVAIL
    OPEN = "open"  # an attempt to open begins
    OPENED = "opened"  # open and restart processing succeeded
    ALLOC_FAIL = "alloc-fail"
    OPEN_FAIL = "open-fail"
    STORAGE_FAIL = "storage-fail"
    DATA_FAIL = "data-fail"
    CLOSE = "close"  # a close begins
    CLOSED = "closed"
    STOP = "stop"  # stop-smdsconn
    START = "start"  # start-smdsconn
    RETRY = "retry"  # triggered: the data set may be usable again


class IllegalTransition(Exception):
    """An event the tables have no entry for in the current state: a bug in the
    caller, or an operator command the state does not allow (the message says
    which state refuses which event)."""


S, A, C, V, E = Status, Access, Conn, Avail, Event
OWNER_OPENS = frozenset({S.NEW, S.ACTIVE, S.RECOVERED, S.EMPTY})  # restart processing opens these
UNUSABLE = frozenset({S.FAILED, S.INRECOVER})  # never with ACCESS(ENABLED)
FAILURES = frozenset({C.ALLOCFAIL, C.OPENFAIL, C.STGFAIL, C.DATAFAIL})
IN_USE = frozenset({C.OPENING, C.OPEN, C.CLOSING})
CLOSED_STATES = frozenset({C.CLOSED}) | FAILURES


T = TypeVar("T", Status, Conn)


def _each(states: frozenset[T], to: T) -> dict[T, T]:
    return dict.fromkeys(states, to)


# event -> {status before: status after}; an event absent here leaves STATUS alone
STATUS: dict[Event, dict[Status, Status]] = {
    E.ACTIVATE: {S.NOTFOUND: S.NEW},
    E.RESTART_DONE: _each(OWNER_OPENS, S.ACTIVE),
    E.DAMAGE: _each(OWNER_OPENS | {S.FAILED}, S.FAILED),
    E.FOUND_INVALID: _each(OWNER_OPENS | {S.FAILED}, S.FAILED),
    E.OPEN_FAILURE: {s: s for s in OWNER_OPENS},
    E.CLOSE_EMPTY: {S.ACTIVE: S.EMPTY},
    E.RESET_FAILED: _each(OWNER_OPENS | {S.FAILED}, S.FAILED),
    E.RESET_RECOVERED: {S.FAILED: S.RECOVERED},
    E.RECOVERY_START: {S.FAILED: S.INRECOVER},
    E.RECOVERY_DONE: {S.INRECOVER: S.RECOVERED},
    E.RECOVERY_FAIL: {S.INRECOVER: S.FAILED},
    E.PURGE: _each(OWNER_OPENS | {S.FAILED}, S.EMPTY),
    E.ENABLE: {s: s for s in S},
    E.DISABLE: {s: s for s in S},
}

# event -> {access before: access after} (missing: unchanged); applied after STATUS
ACCESS: dict[Event, dict[Access, Access]] = {
    E.RESTART_DONE: {A.SUSPENDED: A.ENABLED},  # the attempt the seed permits succeeded
    E.DAMAGE: {A.ENABLED: A.SUSPENDED},
    E.FOUND_INVALID: {A.ENABLED: A.SUSPENDED},
    E.OPEN_FAILURE: {A.ENABLED: A.SUSPENDED},
    E.RESET_FAILED: {A.ENABLED: A.SUSPENDED},
    E.RESET_RECOVERED: {A.SUSPENDED: A.ENABLED},
    E.RECOVERY_START: {A.ENABLED: A.SUSPENDED},
    E.RECOVERY_DONE: {A.SUSPENDED: A.ENABLED},
    E.PURGE: {A.SUSPENDED: A.ENABLED},
    E.ENABLE: {A.SUSPENDED: A.ENABLED, A.DISABLED: A.ENABLED},
    E.DISABLE: {A.ENABLED: A.DISABLED, A.SUSPENDED: A.DISABLED},
}

# event -> {connection status before: after}
CONN: dict[Event, dict[Conn, Conn]] = {
    E.OPEN: _each(CLOSED_STATES, C.OPENING),
    E.OPENED: {C.OPENING: C.OPEN},
    E.ALLOC_FAIL: {C.OPENING: C.ALLOCFAIL},
    E.OPEN_FAIL: {C.OPENING: C.OPENFAIL},
    E.STORAGE_FAIL: {C.OPENING: C.STGFAIL},
    E.DATA_FAIL: {C.OPENING: C.DATAFAIL, C.OPEN: C.DATAFAIL},
    E.CLOSE: {C.OPEN: C.CLOSING},
    E.CLOSED: {C.CLOSING: C.CLOSED},
}

# event -> {avail before: after} (missing: unchanged)
AVAIL: dict[Event, dict[Avail, Avail]] = {
    E.ALLOC_FAIL: {V.NORMAL: V.ERROR},
    E.OPEN_FAIL: {V.NORMAL: V.ERROR},
    E.STORAGE_FAIL: {V.NORMAL: V.ERROR},
    E.DATA_FAIL: {V.NORMAL: V.ERROR},
    E.STOP: {V.NORMAL: V.STOPPED, V.ERROR: V.STOPPED},
    E.START: {V.STOPPED: V.NORMAL, V.ERROR: V.NORMAL},
    E.RETRY: {V.ERROR: V.NORMAL},
}

# events that need the connection closed first (the daemon closes it, then fires them)
NEEDS_CLOSED = frozenset({E.ACTIVATE, E.DAMAGE, E.FOUND_INVALID, E.OPEN_FAILURE, E.CLOSE_EMPTY,
                          E.RESET_FAILED, E.RESET_RECOVERED, E.RECOVERY_START,
                          E.RECOVERY_DONE, E.RECOVERY_FAIL, E.PURGE, E.DISABLE, E.STOP})
# what each event triggers next, as the seed has one state follow another
TRIGGERS: dict[Event, Event] = {
    E.OPENED: E.RESTART_DONE,
    E.ALLOC_FAIL: E.OPEN_FAILURE,
    E.OPEN_FAIL: E.OPEN_FAILURE,
    E.STORAGE_FAIL: E.OPEN_FAILURE,
    E.DATA_FAIL: E.DAMAGE,
    E.RESET_RECOVERED: E.RETRY,
    E.RECOVERY_DONE: E.RETRY,
    E.PURGE: E.RETRY,
    E.ENABLE: E.RETRY,
}
# triggered only: an operator or the daemon never fires them directly
TRIGGERED = frozenset(TRIGGERS.values())


@dataclass(frozen=True)
class Change:
    """One state moved: which of the four (``status``, ``access``, ``conn``,
    ``avail``), from what to what, and the event that moved it."""

    state: str
    old: str
    new: str
    event: Event


@dataclass(frozen=True)
class SmdsState:
    """A data set's STATUS and ACCESS and its connection's STATUS and AVAIL."""

    status: Status = S.NOTFOUND
    access: Access = A.ENABLED
    conn: Conn = C.CLOSED
    avail: Avail = V.NORMAL

    def process(self, event: Event) -> tuple[SmdsState, list[Change]]:
        """The state after ``event`` and what it triggers, and every change made, in
        order. Raises IllegalTransition (nothing changed) when a table has no
        entry for the event in the state it finds."""
        if event in TRIGGERED:
            raise IllegalTransition(f"{event} is triggered by the tables, never fired")
        state, changes = self, list[Change]()
        while True:
            state = state._one(event, changes)
            follow = TRIGGERS.get(event)
            if follow is None:
                break
            event = follow
        state.check()
        return state, changes

    def _one(self, event: Event, changes: list[Change]) -> SmdsState:
        if event in NEEDS_CLOSED and self.conn in IN_USE:
            raise IllegalTransition(f"{event} needs the connection closed; it is {self.conn}")
        updates: dict[str, Any] = {}
        for name, table in (("status", STATUS), ("access", ACCESS), ("conn", CONN),
                            ("avail", AVAIL)):
            rule = table.get(event)
            if rule is None:
                continue
            old = getattr(self, name)
            new = rule.get(old)
            if new is None:
                if name in ("access", "avail"):
                    continue  # availability rules change some values and keep the rest
                raise IllegalTransition(f"{event} is not allowed in {name} {old}")
            if name == "access" and new == A.ENABLED and updates.get("status", self.status) \
                    in UNUSABLE:
                new = A.SUSPENDED  # the error is still present (seed: back to SUSPENDED)
            updates[name] = new
        if event == E.OPEN and not self.may_open():
            raise IllegalTransition(f"open is not allowed: {self.why_unavailable()}")
        after = replace(self, **updates)
        changes += [Change(name, getattr(self, name), getattr(after, name), event)
                    for name in ("status", "access", "conn", "avail")
                    if getattr(self, name) != getattr(after, name)]
        return after

    # -- what the states allow ---------------------------------------------------------

    def may_open(self) -> bool:
        """Whether the daemon may try to open the data set now (restart processing
        included): a status its owner opens, not DISABLED, the connection NORMAL
        and not open. A SUSPENDED data set may be tried: a success enables it."""
        return (self.status in OWNER_OPENS and self.access != A.DISABLED
                and self.avail == V.NORMAL and self.conn in CLOSED_STATES)

    @property
    def usable(self) -> bool:
        """Whether requests may read and write the data set now."""
        return self.conn == C.OPEN

    def why_unavailable(self) -> str:
        """Words for a request refused SMDS_UNAVAILABLE: what state refuses it and
        the command that ends it."""
        if self.avail == V.STOPPED:
            return "its connection is STOPPED (start-smdsconn starts it)"
        if self.access == A.DISABLED:
            return "it is ACCESS(DISABLED) (reset-smds --access enabled ends it)"
        if self.status == S.FAILED:
            return ("it is FAILED (cqsctl recover restores it; reset-smds --status recovered "
                    "if no data was lost)")
        if self.status == S.INRECOVER:
            return "it is being recovered (INRECOVER)"
        if self.status == S.NOTFOUND:
            return "it has not been activated (NOTFOUND)"
        if self.avail == V.ERROR:
            return (f"its connection is {self.conn}, AVAIL(ERROR) (start-smdsconn or "
                    "reset-smds --access enabled retries)")
        if self.conn == C.OPEN:
            return "it is available"
        return f"it is {self.status}, its connection {self.conn}"

    def check(self) -> None:
        """Raise AssertionError if a pair of states the seed never allows is held."""
        assert not (self.status in UNUSABLE and self.access == A.ENABLED), self
        assert self.conn != C.OPEN or (self.status == S.ACTIVE and self.access == A.ENABLED
                                       and self.avail == V.NORMAL), self
        assert self.avail != V.ERROR or self.conn in FAILURES, self
        assert self.conn not in IN_USE or self.avail == V.NORMAL, self
