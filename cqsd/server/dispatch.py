"""The two steps of every request: dispatch and settle.

Design note. A request is parsed and handed to its handler (``dispatch``,
after the checks every op shares: registered, not stopping, allowed), then
what it did is turned into notifications, waiter hand-offs and log records
(``settle``) — only this room writes the log, and it logs effects
(docs/architecture.md, "The rules"). Everything that changes structures outside a request
(peer recovery, an overflow move, an expired lease, an operator's recovery)
settles through here too, by the runtime (runtime.py). A message a waiting
reader takes in ``settle`` goes to its lock as if put there (seed 004:
"placed on LOCKQ instead of Ready Queue"): a queue it left empty again tells
no interested client of work.

A handler that cannot run yet (a put waiting for its data set to grow) raises
``RunAgain`` before it changes anything, and the request is dispatched again
whole once it can (runagain.py).

An exception out of a handler fails that request alone, unless it came out of
the engine, which may then have applied part of a change: memory may no longer
match the log, and the daemon stops for a restart (``fatal``,
docs/robustness.md).
"""

import os

import structlog
import trio

from cqsproto import ProtocolError, requests

from .. import engine
from ..engine import Altered, CQSError, QueueWork, Reason
from ..records import waits_for_log
from .eventlog import log_event
from .handlers import DEFERRED, HANDLERS, answer_waiter
from .limits import RecordTooLarge, split
from .overflowmoves import OverflowMoves
from .rooms import Rooms
from .runagain import RunAgain
from .session import Session
from .timers import Timers
from .waiters import Waiter

log = structlog.get_logger()
NEVER = 1 << 62  # the LSN a reply waits for when its record could not be logged
# the engine's directory, as its frames name its files: by their paths (the source),
# or, compiled by mypyc, as the build named them (relative to the tree it ran in)
ENGINE_FILES = os.path.join(*engine.__name__.split("."), "")  # cqsd/engine/


class Dispatcher:
    def __init__(self, rooms: Rooms, moves: OverflowMoves, timers: Timers) -> None:
        self.rooms = rooms
        self.moves = moves
        self.timers = timers

    def dispatch(self, session: Session, frame: dict) -> None:
        """Handle one request to completion and send its reply (or start its wait)."""
        rooms = self.rooms
        try:
            rid, op, args = requests.parse(frame)
        except Exception as err:  # nothing has run yet: only this request fails
            if not isinstance(err, ProtocolError):
                log.exception("request_internal_error", client=session.client)
                err = ProtocolError(Reason.INVALID_REQUEST, "request not understood")
            bad_id = frame.get("id")
            session.fail(bad_id if type(bad_id) is int else None, err.reason, err.message)
            return
        if session.client is None and op != "register":
            session.fail(rid, Reason.NOT_REGISTERED, f"{op}: register first")
            return
        if rooms.life.stopping:
            session.fail(rid, Reason.SHUTTING_DOWN, "the daemon is stopping")
            return
        result = DEFERRED
        try:
            if session.rights is not None:  # a listed client with restricted rights
                rooms.clients.access.check(session, op, args, rooms.registry.queue_of)
            result = HANDLERS[op](rooms, session, rid, **args)
        except RunAgain as wait:  # nothing done yet: the whole request, once it can run
            log.debug("request_waits", client=session.client, op=op, why=str(wait))
            session.defer(self._again, session, frame, wait.ready, in_order=True)
        except (CQSError, ProtocolError) as err:
            log.debug("request_failed", client=session.client, op=op, reason=str(err.reason),
                      message=err.message)
            # only the engine's errors carry details (NOT_OWNER's); a handler's bad
            # field raises the codec's ProtocolError, which has none
            session.fail(rid, err.reason, err.message, getattr(err, "details", None))
        except Exception as err:
            if raised_in_engine(err):  # the engine may have applied part of it
                rooms.runtime.fatal("internal_error", err, client=session.client, op=op)
            else:  # the engine was not reached, or changed nothing: one request fails
                log.exception("request_internal_error", client=session.client, op=op)
            session.fail(rid, Reason.INVALID_REQUEST, f"{op}: internal error, see the daemon log")
        # even a refused request settles: a refused put may have changed the fullness state
        lsn = self._settle_or_stop()
        if result is not DEFERRED:
            session.reply(rid, result, lsn)
        if rooms.waiters.served:  # after the reply, as when each waiting read was a task
            rooms.waiters.answer_served()

    async def _again(self, session: Session, frame: dict, ready: trio.Event) -> None:
        """Dispatch a request again once what it waited for is there (runagain.py)."""
        try:
            await ready.wait()
        finally:
            if not ready.is_set() and self.rooms.life.stopping:
                session.fail(frame.get("id"), Reason.SHUTTING_DOWN, "the daemon is stopping")
        self.dispatch(session, frame)

    def answer(self, waiter: Waiter) -> None:
        """Reply to a read that waited (waiters.py). It has no task of its own, so an
        exception here would land in whatever ended the wait (a settle, the timer):
        it costs the reader's connection instead, as it did when the wait was a task."""
        try:
            answer_waiter(self.rooms, waiter)
        except Exception as err:
            assert waiter.session is not None  # answer_waiter sends nothing without one
            self.connection_failed(waiter.session, err)
            waiter.session.cut(f"its waiting read's reply failed: {type(err).__name__}")

    def connection_failed(self, session: Session, err: Exception) -> None:
        """A connection's task raised: it is gone; the daemon goes on unless the
        exception came out of the engine."""
        if raised_in_engine(err):
            self.rooms.runtime.fatal("internal_error", err, client=session.client,
                                     peer=session.peer)
        else:
            log.exception("connection_failed", client=session.client, peer=session.peer)

    def settle(self) -> int:
        """Turn what the last change did into notifications, waiter hand-offs and log
        records, and answer the waiters it served; returns the LSN a reply must wait
        for (0: none; past the log's end if the daemon is stopping on an error, so
        that nothing more is acknowledged)."""
        lsn = self._settle_or_stop()
        if self.rooms.waiters.served:  # their locks are logged: the waiters hear now
            self.rooms.waiters.answer_served()
        return lsn

    def _settle_or_stop(self) -> int:
        try:
            return self._settle()
        except Exception as err:  # the request is applied in memory but maybe not logged
            self.rooms.runtime.fatal("settle_failed", err)
            return NEVER

    def _settle(self) -> int:
        rooms = self.rooms
        wait_for = 0
        for s in rooms.registry.pairs.values():
            if s.pressure and rooms.runtime.running:
                self.moves.relieve(s)
            if s.readable:  # waiting readers first: what they take was never work for others
                rooms.waiters.serve(s)
            if s.take_armed():  # a lease or a delay may end before the timer wakes
                self.timers.poke()
            if s.events:
                for event in s.take_events():
                    if type(event) is QueueWork:
                        if s.has_ready((event.qtype, event.name)):
                            rooms.clients.notify((s.name, event.qtype, event.name))
                        continue
                    log_event(event)
                    if type(event) is Altered:  # kept: a restart finds the size it left
                        rooms.registry.definitions.resized(event.structure, event.new_size,
                                                           event.reason)
            record = s.take_record()
            noted = rooms.dedup.stamp(s.name, record)  # a key goes into the record of its put
            lsn = 0
            if record is not None:
                urgent = waits_for_log(record)
                lsn = self._log(record, urgent)
                if urgent:
                    wait_for = lsn or NEVER
            if noted is not None:
                rooms.dedup.remember(s.name, noted, lsn)
            if s.offloading:
                for structure in s.structures():
                    rooms.datasets.freed(structure, lsn)
        return wait_for

    def _log(self, record: dict, urgent: bool) -> int:
        """Append a record (split if it must be); the last LSN, 0 if not logged."""
        journal = self.rooms.journal
        try:
            parts = split(record)
        except RecordTooLarge as err:
            journal.fail(err, "log_record_refused")
            return 0
        return journal.log(parts, urgent)


def raised_in_engine(err: BaseException) -> bool:
    """Whether ``err`` came out of the engine, which may then have applied part of
    a change: everywhere else an exception leaves the structures as they were."""
    if isinstance(err, BaseExceptionGroup):
        return any(raised_in_engine(e) for e in err.exceptions)
    tb = err.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(ENGINE_FILES) or os.sep + ENGINE_FILES in filename:
            return True
        tb = tb.tb_next
    return False
