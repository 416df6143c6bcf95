"""One handler per op of docs/protocol.md; each docstring is the request's wire form.

Each handler checks what only the daemon knows (the structure exists, the
request fits its limits), calls the engine or the room that owns the
operation, and returns the result map; the dispatcher sends it and settles
what the request did. A handler whose reply comes later (a read with
``wait``, a Spark job) defers a task and returns ``DEFERRED``.
"""

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog
import trio

from cqsproto import PROTOCOL_VERSION, requests, timing

from ..engine import (
    CQSError,
    Delete,
    Entry,
    Move,
    Put,
    QueueKey,
    QueueType,
    Reason,
    Unlock,
    parse_qtype,
)
from ..engine.pair import StructurePair
from ..engine.qtypes import check_name
from ..engine.structure import Op, position
from . import queries, wire
from .rooms import Rooms
from .session import Session
from .waiters import Waiter, read_up_to

log = structlog.get_logger()
MAX_READ_BATCH = 10_000  # bounds one reply; read_batch callers loop for more
MAX_BROWSE = 10_000
Result = dict[str, Any]
# told apart by identity: a result map of its own, as what a handler returns is one
# (checked where this module is compiled)
DEFERRED: Final[Result] = {}


def op_register(rooms: Rooms, session: Session, rid: int, client: str, secret: str | None,
                cold: bool, version: int, operator: bool, takeover: str | None) -> Result:
    """register {client, secret?, cold?, version, operator?, takeover?}
    -> {version, server, max_message, structures, locks, client, token, dedup_window}"""
    if version != PROTOCOL_VERSION:
        raise _bad(f"protocol version {version} is not supported; "
                   f"this server speaks {PROTOCOL_VERSION}")
    locks, token = rooms.clients.register(session, client, secret, cold, operator, takeover)
    interests = rooms.clients.resume(session, cold)
    rooms.waiters.drop_client(client)  # reads a connection taken over left waiting
    result = {"version": PROTOCOL_VERSION, "server": "cqsd",
              "max_message": rooms.config.daemon.max_message,
              "structures": list(rooms.registry.pairs), "locks": locks,
              "client": session.client, "token": token, "dedup_window": rooms.dedup.window,
              "interests": [wire.interest(*key) for key in interests]}
    if not interests:  # a registration alone is not waited for: lost, it is made anew
        return result
    session.defer(_registered, rooms, session, rid, result, interests)
    return DEFERRED


async def _registered(rooms: Rooms, session: Session, rid: int, result: Result,
                      interests: list[Any]) -> None:
    """The register reply, then a notification for each interest found again whose
    queue has work, as its register_interest would have sent."""
    session.reply(rid, result)
    rooms.clients.announce_to(session, interests)


def op_deregister(rooms: Rooms, session: Session, rid: int) -> Result:
    """deregister {} -> {}"""
    rooms.clients.deregister(session)
    return {}


def op_ping(rooms: Rooms, session: Session, rid: int) -> Result:
    """ping {} -> {}: a sign of life for a client's keepalive (docs/protocol.md)"""
    return {}


def op_connect(rooms: Rooms, session: Session, rid: int, structure: str) -> Result:
    """connect {structure} -> the structure's figures"""
    return rooms.registry.structure(structure).stats()


def op_put(rooms: Rooms, session: Session, rid: int, structure: str, queue: str,
           qtype: str | int, data: bytes, recoverable: bool, delay: float | None,
           not_before: float | None, key: list[Any] | None) -> Result:
    """put {structure, queue, qtype?, data, recoverable?, delay? | not_before?, key?}
    -> {entry_id}; a key remembered gets its first entry id, and nothing is put"""
    rooms.limits.check_size(len(data))  # and one record, unless offloaded (datasets.put)
    s = rooms.registry.structure(structure)
    k = rooms.dedup.key(session, "put", key)
    if (seen := rooms.dedup.recall(s.name, k)) is not None:
        if not seen[0]:  # a commit's key, and it put nothing: not this request's
            raise _bad(f"put: key {key} was a commit's, which put nothing; a key names "
                       "one request")
        return _again(session, rid, {"entry_id": seen[0][0]}, seen[1])
    later = _not_before("put", delay, not_before)
    entry_id = rooms.datasets.put(s, _owner(session), qtype, queue, data, recoverable,
                                  later).entry_id
    rooms.dedup.note(s.name, k, [entry_id])
    return {"entry_id": entry_id}


def op_read(rooms: Rooms, session: Session, rid: int, structure: str, queue: str,
            qtype: str | int, n: int, wait: float | None, lease: float | None) -> Result:
    """read {structure, queue, qtype?, n?, wait?, lease?} -> {messages}, each locked"""
    s = rooms.registry.structure(structure)
    key = (parse_qtype(qtype), check_name(queue))
    if not 1 <= n <= MAX_READ_BATCH:
        raise _bad(f"read: n must be 1 to {MAX_READ_BATCH}, got {n}")
    if lease is not None:
        lease = timing.lease_seconds("read", lease)
    passed_over: list[Entry] = []
    got = read_up_to(s, _client(session), key, n, rooms.limits.reply_bytes, lease,
                     _passing(rooms, passed_over))
    if got:
        return _messages(rooms, s, _client(session), got)
    if passed_over:  # every message there has its data in a data set unavailable now
        raise rooms.datasets.unavailable(passed_over[0])
    if not wait:
        raise CQSError(Reason.NO_MESSAGE, f"no readable message on {key[0].name}:{queue}")
    if not 0 < wait <= rooms.config.daemon.max_wait:
        raise _bad(f"read: wait must be 0 to {rooms.config.daemon.max_wait} seconds, got {wait}")
    # parked now, with no task: a put pipelined behind it must find it waiting
    rooms.waiters.park(s, key, Waiter(session, rid, _client(session), n, lease, wait))
    return DEFERRED


def answer_waiter(rooms: Rooms, waiter: Waiter) -> None:
    """The reply of a read that waited (waiters.py): its messages, or why none came."""
    session, rid, s, key = waiter.session, waiter.rid, waiter.structure, waiter.key
    if session is None:
        return
    assert isinstance(s, StructurePair) and key is not None  # parked by op_read
    if waiter.messages is not None:
        try:
            session.reply(rid, _messages(rooms, s, waiter.client, waiter.messages))
        except CQSError as err:
            session.fail(rid, err.reason, err.message)
    elif waiter.failed:
        gone = _gone(rooms, s.name)
        session.fail(rid, gone.reason, gone.message, getattr(gone, "details", None))
    elif rooms.life.stopping:
        session.fail(rid, Reason.SHUTTING_DOWN, "the daemon is stopping")
    else:
        session.fail(rid, Reason.NO_MESSAGE,
                     f"no message on {QueueType(key[0]).name}:{key[1]} within {waiter.wait}s")
    waiter.messages = None  # a served waiter lingers in the timer's heap: not its messages


def _passing(rooms: Rooms, passed_over: list[Entry]) -> Callable[[Entry], bool]:
    """The ``passed`` of a read: the messages whose data set is unavailable now
    (``DataSets.undeliverable``), each noted in ``passed_over``."""
    def passed(entry: Entry) -> bool:
        if rooms.datasets.undeliverable(entry):
            passed_over.append(entry)
            return True
        return False
    return passed


def _gone(rooms: Rooms, name: str) -> CQSError:
    """Why a waiting read on ``name`` ended unserved: the pair failed, or (in a group)
    it went to another node, which the refusal names so the client follows it."""
    registry = rooms.registry
    if name in registry.standby and registry.elsewhere is not None:
        return registry.elsewhere(name)
    return CQSError(Reason.STRUCTURE_FAILED, f"structure {name} failed during the wait")


def _messages(rooms: Rooms, s: StructurePair, client: str, got: list[Any]) -> Result:
    """{messages}: the messages a read locked, with their payloads; if one cannot be
    read from its data set, every lock goes back untouched (settled at once: a
    waiting read's reply has no dispatcher after it) and the read fails."""
    try:
        return wire.messages(_payloads(rooms, s, client, got))
    except CQSError:
        rooms.runtime.settle()
        raise


def _payloads(rooms: Rooms, s: StructurePair, client: str, got: list[Any]) -> list[Result]:
    """The payloads of ``_messages`` without the settle, for a handler whose
    dispatcher settles: its reply then waits for the record of everything the
    request did."""
    try:
        return [wire.message(e, rooms.datasets.payload(e)) for e in got]
    except CQSError:
        for e in got:
            with contextlib.suppress(CQSError):  # unless peer recovery gave it back already
                s.unlock(client, e.entry_id)
        raise


def op_browse(rooms: Rooms, session: Session, rid: int, structure: str, queue: str | None,
              qtype: str | int | None, cursor: list[Any] | None, limit: int) -> Result:
    """browse {structure, queue?, qtype?, cursor?, limit?} -> {messages, cursor}"""
    if not 1 <= limit <= MAX_BROWSE:
        raise _bad(f"browse: limit must be 1 to {MAX_BROWSE}, got {limit}")
    s = rooms.registry.structure(structure)
    found, after = s.browse(qtype, queue, after=cursor, limit=limit)
    size = 0
    for i, e in enumerate(found):  # a page carries at most one message past reply_bytes
        if size >= rooms.limits.reply_bytes:
            found, after = found[:i], position(found[i - 1])
            break
        size += e.length
    return wire.messages([rooms.datasets.browsed(e) for e in found],
                         cursor=list(after) if after else None)


def op_delete(rooms: Rooms, session: Session, rid: int, structure: str, entry_id: int,
              operator: bool, next: dict[str, Any] | None) -> Result:
    """delete {structure, entry_id, operator?, next?: {queue, qtype?, n?, lease?}}
    -> {}, or with next {messages}: the delete, then a read of up to n, in one request"""
    s = rooms.registry.structure(structure)
    if next is None:
        s.delete(session.client, entry_id, operator)
        return {}
    key, n, lease = _next_read(next)  # a bad next refuses the request before the delete
    s.delete(session.client, entry_id, operator)
    return wire.messages(_read_after_delete(rooms, s, _client(session), key, n, lease))


def _next_read(value: dict[str, Any]) -> tuple[QueueKey, int, float | None]:
    f = requests.next_read(value)
    key = (parse_qtype(f["qtype"]), check_name(f["queue"]))
    if not 1 <= f["n"] <= MAX_READ_BATCH:
        raise _bad(f"delete next: n must be 1 to {MAX_READ_BATCH}, got {f['n']}")
    lease = f["lease"]
    return key, f["n"], None if lease is None else timing.lease_seconds("delete next", lease)


def _read_after_delete(rooms: Rooms, s: StructurePair, client: str, key: QueueKey,
                       n: int, lease: float | None) -> list[Result]:
    """The read of a delete's ``next``, as a read sent right after the delete would
    find the queue: readers already waiting on it are served first (a delete on a
    SERIAL queue makes its next message readable, and theirs). A payload that
    cannot be read gives every lock back and the reply none: the delete stands,
    and a plain read surfaces the error."""
    if s.readable:
        rooms.waiters.serve(s)
    got = read_up_to(s, client, key, n, rooms.limits.reply_bytes, lease,
                     rooms.datasets.undeliverable)
    try:
        return _payloads(rooms, s, client, got)
    except CQSError as err:
        log.warning("delete_next_unread", client=client, structure=s.name,
                    reason=str(err.reason), message=err.message)
        return []


def op_move(rooms: Rooms, session: Session, rid: int, structure: str, entry_id: int, queue: str,
            qtype: str | int) -> Result:
    """move {structure, entry_id, queue, qtype?} -> {}"""
    rooms.registry.structure(structure).move(session.client, entry_id, qtype, queue)
    return {}


def op_renew(rooms: Rooms, session: Session, rid: int, structure: str, entry_id: int,
             lease: float) -> Result:
    """renew {structure, entry_id, lease} -> {}: the lock's lease runs ``lease`` seconds
    from now"""
    seconds = timing.lease_seconds("renew", lease)
    rooms.registry.structure(structure).renew(_client(session), entry_id, seconds)
    return {}


def op_unlock(rooms: Rooms, session: Session, rid: int, structure: str, entry_id: int,
              failed: bool, queue: str | None, qtype: str | int | None) -> Result:
    """unlock {structure, entry_id, failed?, queue?, qtype?} -> {qtype, queue}"""
    e = rooms.registry.structure(structure).unlock(_client(session), entry_id, failed=failed,
                                               qtype=qtype, name=queue)
    return {"qtype": QueueType(e.qtype).name, "queue": e.name}


def op_commit(rooms: Rooms, session: Session, rid: int, structure: str,
              ops: list[Any], key: list[Any] | None) -> Result:
    """commit {structure, ops: [{op: put|delete|move|unlock, ...}], key?} -> {entry_ids};
    a key remembered gets its first entry ids, and nothing is applied"""
    s = rooms.registry.structure(structure)
    k = rooms.dedup.key(session, "commit", key)
    if (seen := rooms.dedup.recall(s.name, k)) is not None:
        return _again(session, rid, {"entry_ids": seen[0]}, seen[1])
    batch = [_commit_op(kind, f) for kind, f in requests.commit_ops(ops)]
    rooms.limits.check_commit(batch)
    results = rooms.datasets.commit(s, _client(session), _owner(session), batch)
    ids = [e.entry_id for op, e in zip(batch, results, strict=True) if type(op) is Put]
    rooms.dedup.note(s.name, k, ids)
    return {"entry_ids": ids}


def _again(session: Session, rid: int, result: Result, lsn: int) -> Result:
    """The reply to a request sent again (exactly-once puts, docs/group.md): what the
    first one produced, once the record that produced it is durable."""
    log.debug("resend_answered", client=session.client, result=result)
    session.reply(rid, result, lsn)
    return DEFERRED


def _commit_op(kind: str, f: dict[str, Any]) -> Op:
    if kind == "put":  # the plain put of requests.commit_ops has no delay fields
        later = _not_before("commit put", f.get("delay"), f.get("not_before"))
        return Put(f["qtype"], f["queue"], f["data"], f["recoverable"], None, later)
    if kind == "delete":
        return Delete(f["entry_id"])
    if kind == "move":
        return Move(f["entry_id"], f["qtype"], f["queue"])
    return Unlock(f["entry_id"], f["failed"], f["qtype"], f["queue"])


def op_register_interest(rooms: Rooms, session: Session, rid: int, structure: str, queue: str,
                         qtype: str | int) -> Result:
    """register_interest {structure, queue, qtype?} -> {}; a notification now if it has work"""
    s = rooms.registry.structure(structure)
    key = (s.name, parse_qtype(qtype), check_name(queue))
    rooms.clients.add_interest(session, key, bool(s.queue_stats(key[1], queue)["depth"]))
    return _kept(rooms, session, rid)


def op_deregister_interest(rooms: Rooms, session: Session, rid: int, structure: str, queue: str,
                           qtype: str | int) -> Result:
    """deregister_interest {structure, queue, qtype?} -> {}"""
    key = (rooms.registry.structure(structure).name, parse_qtype(qtype), check_name(queue))
    rooms.clients.deregister_interest(session, key)
    return _kept(rooms, session, rid)


def _kept(rooms: Rooms, session: Session, rid: int) -> Result:
    """{} once the system checkpoint holds what the request changed (at once if
    it changed nothing there)."""
    if not rooms.clients.registrations.pending():
        return {}
    return _later(session, rid, _durable_reply, rooms.clients.registrations.durable)


async def _durable_reply(durable: Callable[[], Awaitable[None]]) -> Result:
    await durable()
    return {}


def op_query(rooms: Rooms, session: Session, rid: int, kind: str,
             structure: str | None) -> Result:
    """query {kind, structure?} -> {rows}"""
    return {"rows": queries.rows(rooms, kind, structure)}


def op_requeue(rooms: Rooms, session: Session, rid: int, structure: str, entry_id: int) -> Result:
    """requeue {structure, entry_id} -> {qtype, queue}: from the cold or suspend queue"""
    e = rooms.registry.structure(structure).requeue(entry_id)
    log.info("requeue", client=session.client, structure=structure, entry_id=entry_id)
    return {"qtype": QueueType(e.qtype).name, "queue": e.name}


def op_dequeue(rooms: Rooms, session: Session, rid: int, structure: str, queue: str,
               qtype: str | int) -> Result:
    """dequeue {structure, queue, qtype?} -> {count}: every ready message deleted"""
    gone = rooms.registry.structure(structure).dequeue(qtype, queue)
    log.info("dequeue", client=session.client, structure=structure, queue=queue,
             messages=len(gone))
    return {"count": len(gone)}


def op_alter(rooms: Rooms, session: Session, rid: int, structure: str, size: int) -> Result:
    """alter {structure, size} -> the structure's figures"""
    log.info("alter_requested", client=session.client, structure=structure, size=size)
    return rooms.operations.alter(structure, size)


def op_rebuild(rooms: Rooms, session: Session, rid: int, structure: str,
               size: int | None) -> Result:
    """rebuild {structure, size?} -> the new structure's figures and seconds"""
    log.info("rebuild_requested", client=session.client, structure=structure, size=size)
    return rooms.operations.rebuild(structure, size)


def op_delete_structure(rooms: Rooms, session: Session, rid: int, structure: str,
                        force: bool) -> Result:
    """delete_structure {structure, force?} -> what recover --purge returns, and
    {deleted}: the messages it held (only with force may it hold any)"""
    primary = rooms.registry.overflow_of.get(structure)
    if primary is not None:
        raise _bad(f"{structure} is the overflow structure of {primary}: "
                   f"delete {primary}, which empties both")
    _recoverable(rooms, structure)
    log.warning("delete_structure_requested", client=session.client, structure=structure,
                force=force)
    operations = rooms.operations
    return _later(session, rid, operations.detached, operations.delete, structure, force)


def op_fail_structure(rooms: Rooms, session: Session, rid: int, structure: str) -> Result:
    """fail_structure {structure} -> {structure, status, messages}: failed until recover"""
    log.warning("fail_structure_requested", client=session.client, structure=structure)
    return rooms.operations.fail(structure)


def op_move_structure(rooms: Rooms, session: Session, rid: int, structure: str, to: str
                      ) -> Result:
    """move_structure {structure, to} -> {structure, owner, epoch, seconds}: a planned move
    (SETXCF START,REBUILD), answered once ``to`` serves the pair"""
    if rooms.membership is None:
        raise _bad("move_structure: this daemon is not a node of a group ([group] in its "
                   "config); a structure moves only between the nodes of one")
    log.info("move_structure_requested", client=session.client, structure=structure, to=to)
    return _later(session, rid, rooms.membership.move, structure, to)


def op_checkpoint(rooms: Rooms, session: Session, rid: int, structure: str) -> Result:
    """checkpoint {structure} -> the checkpoint job's result"""
    rooms.registry.pair_of(structure)  # a primary or an overflow structure, if available
    return _later(session, rid, rooms.checkpoints.take, structure, "operator")


def op_recover(rooms: Rooms, session: Session, rid: int, structure: str | list[Any],
               purge: bool) -> Result:
    """recover {structure, purge?} -> {structure, source, messages, records_replayed, seconds};
    recover {structure: [names]} -> {recovered: [those], failed: {name: why}}: one job"""
    log.info("recover_requested", client=session.client, structure=structure, purge=purge)
    operations = rooms.operations
    if isinstance(structure, str):
        _recoverable(rooms, structure)
        return _later(session, rid, operations.detached, operations.recover, structure, purge)
    if not structure or purge or not all(isinstance(s, str) for s in structure):
        raise _bad("recover: a list of structures is one or more names, without purge "
                   "(purge each on its own)")
    for name in structure:
        _recoverable(rooms, name)
    return _later(session, rid, operations.detached, operations.recover_together, structure)


def op_reset_smds(rooms: Rooms, session: Session, rid: int, structure: str, owner: str,
                  access: str | None, status: str | None) -> Result:
    """reset_smds {structure, owner, access?, status?} -> the data set's cfstatus row"""
    log.info("reset_smds_requested", client=session.client, structure=structure, owner=owner,
             access=access, status=status)
    return _later(session, rid, rooms.smds_commands.reset, structure, owner, access, status)


def op_start_smdsconn(rooms: Rooms, session: Session, rid: int, structure: str,
                      owner: str | None) -> Result:
    """start_smdsconn {structure, owner?} -> {rows}: the smdsconn rows after it"""
    log.info("start_smdsconn_requested", client=session.client, structure=structure, owner=owner)
    return _later(session, rid, _rows, rooms.smds_commands.start, structure, owner)


def op_stop_smdsconn(rooms: Rooms, session: Session, rid: int, structure: str,
                     owner: str | None) -> Result:
    """stop_smdsconn {structure, owner?} -> {rows}: the smdsconn rows after it"""
    log.info("stop_smdsconn_requested", client=session.client, structure=structure, owner=owner)
    return _later(session, rid, _rows, rooms.smds_commands.stop, structure, owner)


def op_alter_smds(rooms: Rooms, session: Session, rid: int, structure: str, owner: str,
                  dsbufs: int | str | None, dsexpand: str | None) -> Result:
    """alter_smds {structure, owner, dsbufs?, dsexpand?} -> the data set's smds row"""
    growth = rooms.smds_commands.alter(structure, owner, dsbufs, dsexpand)
    if growth is None:
        return _smds_row(rooms, structure, owner)
    session.defer(_grown, rooms, session, rid, growth, structure, owner, in_order=True)
    return DEFERRED


async def _grown(rooms: Rooms, session: Session, rid: int, growth: trio.Event, structure: str,
                 owner: str) -> None:
    """The alter-smds reply once the growth it started is done: its row shows it."""
    await growth.wait()
    session.reply(rid, _smds_row(rooms, structure, owner))


def _smds_row(rooms: Rooms, structure: str, owner: str) -> Result:
    row = rooms.datasets.displays.row((structure, owner))
    return {c: row[c] for c in queries.SMDS_COLUMNS}


async def _rows(operation: Callable[..., Awaitable[list[Result]]], *args: Any) -> Result:
    return {"rows": await operation(*args)}


def _recoverable(rooms: Rooms, structure: str) -> None:
    """A structure recover may take: a failed one, or one available now."""
    if structure not in rooms.registry.failed:
        rooms.registry.structure(structure)


def _later(session: Session, rid: int, operation: Callable[..., Awaitable[Result]],
           *args: Any) -> Result:
    session.defer(_finish, session, rid, operation, *args)
    return DEFERRED


async def _finish(session: Session, rid: int, operation: Callable[..., Awaitable[Result]],
                  *args: Any) -> None:
    """Reply to an operator request that takes a while (a Spark job): the work itself
    runs in the daemon, and the reply follows when it ends."""
    try:
        result = await operation(*args)
    except CQSError as err:
        session.fail(rid, err.reason, err.message)
    else:
        session.reply(rid, result)


def _client(session: Session) -> str:
    assert session.client is not None  # dispatch refuses every op but register before it
    return session.client


def _owner(session: Session) -> str:
    """The configured client whose data sets hold what the session puts (an
    operator session's own name carries its session number)."""
    assert session.name is not None
    return session.name


def _not_before(where: str, delay: float | None, not_before: float | None) -> int | None:
    """The wall-clock ns a put is delayed until (timing.not_before_ns)."""
    if delay is None and not_before is None:
        return None
    return timing.not_before_ns(where, delay, not_before, time.time_ns())


def _bad(message: str) -> CQSError:
    return CQSError(Reason.INVALID_REQUEST, message)


# The handler of each op, the one table of them (the ops themselves and their
# fields are cqsproto/requests.py's): the dispatcher (dispatch.py) calls
# ``HANDLERS[op](rooms, session, rid, **fields)``.
HANDLERS: dict[str, Callable[..., Any]] = {
    "register": op_register, "deregister": op_deregister, "ping": op_ping,
    "connect": op_connect, "put": op_put,
    "read": op_read, "browse": op_browse, "delete": op_delete, "move": op_move, "renew": op_renew,
    "unlock": op_unlock, "commit": op_commit, "register_interest": op_register_interest,
    "deregister_interest": op_deregister_interest, "query": op_query, "requeue": op_requeue,
    "dequeue": op_dequeue, "alter": op_alter, "rebuild": op_rebuild,
    "delete_structure": op_delete_structure, "fail_structure": op_fail_structure,
    "move_structure": op_move_structure,
    "checkpoint": op_checkpoint, "recover": op_recover, "reset_smds": op_reset_smds,
    "start_smdsconn": op_start_smdsconn, "stop_smdsconn": op_stop_smdsconn,
    "alter_smds": op_alter_smds,
}
assert set(HANDLERS) == set(requests.OPS), "every op of the protocol has one handler"
