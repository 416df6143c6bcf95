"""One handler per op of docs/protocol.md.

Each handler checks what only the daemon knows (the structure exists, the
caller may do this), calls the engine, and returns the result map; the
dispatcher sends it and settles the structure's events. A handler that must
wait (a read with ``wait``) starts a task and returns ``DEFERRED``.
"""

import hashlib
import hmac

import structlog
import trio

from cqsproto import CLIENT_NAME, CLIENT_NAME_RULE, PROTOCOL_VERSION, requests

from ..engine import CQSError, Delete, Move, Put, Reason, Unlock, parse_qtype
from ..engine.qtypes import QueueType, check_name
from ..engine.structure import position
from ..storage import repository
from . import wire
from .waiters import Waiter, read_up_to

log = structlog.get_logger()
DEFERRED = object()
MAX_READ_BATCH = 10_000  # bounds one reply; read_batch callers loop for more
MAX_BROWSE = 10_000


def _bad(message: str) -> CQSError:
    return CQSError(Reason.INVALID_REQUEST, message)


def op_register(d, session, rid, client, secret, cold, version):
    if session.client is not None:
        raise _bad(f"this connection is already registered as {session.client}")
    if version != PROTOCOL_VERSION:
        raise _bad(f"protocol version {version} is not supported; this server speaks {PROTOCOL_VERSION}")
    if not CLIENT_NAME.fullmatch(client):
        raise _bad(f"client name {client!r} must be {CLIENT_NAME_RULE}")
    _authorize(d, session, client, secret)
    if client in d.clients:
        raise CQSError(Reason.CLIENT_ACTIVE, f"client {client} is already registered")
    if len(d.clients) >= d.config.daemon.max_clients:
        raise CQSError(
            Reason.CLIENT_LIMIT, f"{len(d.clients)} clients are registered, the maximum"
        )
    session.client = client
    d.clients[client] = session
    pending = d.pending_recovery.pop(client, None)
    if pending is not None:
        pending.cancel()
    locks = []
    for s in d.structures.values():
        if cold:
            moved = s.cold_client(client)
            if moved:
                log.info("cold_start_locks", client=client, structure=s.name, messages=len(moved))
        else:
            locks += [wire.lock(s.name, e) for e in s.client_locks(client)]
    log.info("register", client=client, peer=session.peer, cold=cold, resync_locks=len(locks))
    return {
        "version": PROTOCOL_VERSION,
        "server": "cqsd",
        "max_message": d.config.daemon.max_message,
        "structures": list(d.structures),
        "locks": locks,
    }


def _authorize(d, session, client, secret):
    known = {c.name: c.secret_sha256 for c in d.config.clients}
    if not known:
        if session.over_tcp:
            raise CQSError(Reason.NOT_AUTHORIZED, "registration over TCP needs a configured client")
        return
    digest = hashlib.sha256(secret.encode()).hexdigest() if secret is not None else ""
    if client not in known or not hmac.compare_digest(digest, known[client]):
        raise CQSError(Reason.NOT_AUTHORIZED, f"client {client} is not authorized with that secret")


def op_deregister(d, session, rid):
    session.deregistered = True
    del d.clients[session.client]  # before the reply: its name is free to register again at once
    for s in d.structures.values():
        s.release_client(session.client, failed=False)
    log.info("deregister", client=session.client)
    return {}


def op_connect(d, session, rid, structure):
    return d.structure(structure).stats()


def op_put(d, session, rid, structure, queue, qtype, data, recoverable):
    d.limits.check_message(data, recoverable)
    return {"entry_id": d.structure(structure).put(qtype, queue, data, recoverable).entry_id}


def op_read(d, session, rid, structure, queue, qtype, n, wait):
    s = d.structure(structure)
    key = (parse_qtype(qtype), check_name(queue))
    if not 1 <= n <= MAX_READ_BATCH:
        raise _bad(f"read: n must be 1 to {MAX_READ_BATCH}, got {n}")
    got = read_up_to(s, session.client, key, n, d.limits.reply_bytes)
    if got:
        return {"messages": [wire.message(e) for e in got]}
    if not wait:
        raise CQSError(Reason.NO_MESSAGE, f"no readable message on {key[0].name}:{queue}")
    if not 0 < wait <= d.config.daemon.max_wait:
        raise _bad(f"read: wait must be 0 to {d.config.daemon.max_wait} seconds, got {wait}")
    session.defer(_wait_read, d, session, rid, s, key, n, wait)
    return DEFERRED


async def _wait_read(d, session, rid, s, key, n, wait):
    waiter = Waiter(session.client, n)
    d.waiters.add(s, key, waiter)
    try:
        with trio.move_on_after(wait):
            await waiter.event.wait()
    finally:
        if waiter.messages is None:
            d.waiters.remove(s, key, waiter)
            if d.shutting_down:
                session.fail(rid, Reason.SHUTTING_DOWN, "the daemon is stopping")
        else:
            session.reply(rid, {"messages": [wire.message(e) for e in waiter.messages]})
    if waiter.failed:
        session.fail(rid, Reason.STRUCTURE_FAILED, f"structure {s.name} failed during the wait")
    elif waiter.messages is None and not d.shutting_down:
        session.fail(rid, Reason.NO_MESSAGE, f"no message on {key[0].name}:{key[1]} within {wait}s")


def op_browse(d, session, rid, structure, queue, qtype, cursor, limit):
    if not 1 <= limit <= MAX_BROWSE:
        raise _bad(f"browse: limit must be 1 to {MAX_BROWSE}, got {limit}")
    found, after = d.structure(structure).browse(qtype, queue, after=cursor, limit=limit)
    size = 0
    for i, e in enumerate(found):  # a page carries at most one message past reply_bytes
        if size >= d.limits.reply_bytes:
            found, after = found[:i], position(found[i - 1])
            break
        size += len(e.data)
    return {"messages": [wire.browsed(e) for e in found], "cursor": list(after) if after else None}


def op_delete(d, session, rid, structure, entry_id, operator):
    d.structure(structure).delete(None if operator else session.client, entry_id)
    return {}


def op_move(d, session, rid, structure, entry_id, queue, qtype):
    d.structure(structure).move(session.client, entry_id, qtype, queue)
    return {}


def op_unlock(d, session, rid, structure, entry_id, failed, queue, qtype):
    e = d.structure(structure).unlock(session.client, entry_id, failed=failed, qtype=qtype, name=queue)
    return {"qtype": QueueType(e.qtype).name, "queue": e.name}


def op_commit(d, session, rid, structure, ops):
    s = d.structure(structure)
    batch = []
    for kind, f in requests.commit_ops(ops):
        if kind == "put":
            batch.append(Put(f["qtype"], f["queue"], f["data"], f["recoverable"]))
        elif kind == "delete":
            batch.append(Delete(f["entry_id"]))
        elif kind == "move":
            batch.append(Move(f["entry_id"], f["qtype"], f["queue"]))
        else:
            batch.append(Unlock(f["entry_id"], f["failed"], f["qtype"], f["queue"]))
    d.limits.check_commit(batch)
    results = s.commit(session.client, batch)
    return {"entry_ids": [e.entry_id for op, e in zip(batch, results) if type(op) is Put]}


def op_register_interest(d, session, rid, structure, queue, qtype):
    s = d.structure(structure)
    key = (s.name, parse_qtype(qtype), check_name(queue))
    d.interest.setdefault(key, set()).add(session)
    session.interests.add(key)
    if s.queue_stats(key[1], queue)["depth"]:
        session.send(d.notification(*key))
    return {}


def op_deregister_interest(d, session, rid, structure, queue, qtype):
    key = (d.structure(structure).name, parse_qtype(qtype), check_name(queue))
    d.drop_interest(session, key)
    return {}


def op_query(d, session, rid, kind, structure):
    if kind == "backups":
        return {"rows": repository.backups(d.datadir.repository, structure)}
    if kind == "structures" and structure in d.failed:
        return {"rows": [_failed_row(structure)]}
    chosen = [d.structure(structure)] if structure is not None else list(d.structures.values())
    if kind == "structures":
        rows = [
            {**row, "status": "available"}
            for s in chosen
            for row in [s.stats()] + [{**o, "overflow_of": s.name} for o in s.structure_stats()[1:]]
        ]
        if structure is None:
            rows += [_failed_row(name) for name in d.failed]
    elif kind == "queues":
        rows = [
            {"structure": s.name, **q,
             "waiting": d.waiters.count(s.name, (QueueType[q["qtype"]], q["queue"]))}
            for s in chosen
            for q in s.queues(also=s.watched)
        ]
    elif kind == "headers":
        rows = [{"structure": s.name, **h} for s in chosen for h in s.header_stats()]
    elif kind == "locks":
        rows = [
            {**wire.lock(s.name, e), "owner": e.owner}
            for s in chosen
            for client in sorted(s.client_stats())
            for e in s.client_locks(client)
        ]
    elif kind == "clients":
        rows = [
            {
                "client": name,
                "peer": sess.peer,
                "tcp": sess.over_tcp,
                "interests": len(sess.interests),
                "locks": sum(s.client_stats().get(name, 0) for s in chosen),
            }
            for name, sess in sorted(d.clients.items())
        ]
    else:
        raise _bad(f"query: unknown kind {kind!r} "
                   "(structures, queues, clients, locks, headers, backups)")
    return {"rows": rows}


def _failed_row(name):
    return {"name": name, "status": "failed"}


def op_requeue(d, session, rid, structure, entry_id):
    e = d.structure(structure).requeue(entry_id)
    log.info("requeue", client=session.client, structure=structure, entry_id=entry_id)
    return {"qtype": QueueType(e.qtype).name, "queue": e.name}


def op_dequeue(d, session, rid, structure, queue, qtype):
    gone = d.structure(structure).dequeue(qtype, queue)
    log.info("dequeue", client=session.client, structure=structure, queue=queue, messages=len(gone))
    return {"count": len(gone)}


def op_alter(d, session, rid, structure, size):
    log.info("alter_requested", client=session.client, structure=structure, size=size)
    return d.alter_structure(structure, size)


def op_rebuild(d, session, rid, structure, size):
    log.info("rebuild_requested", client=session.client, structure=structure, size=size)
    return d.rebuild_structure(structure, size)


def op_delete_structure(d, session, rid, structure):
    if structure in d.overflow_of:
        raise _bad(f"{structure} is the overflow structure of {d.overflow_of[structure]}: "
                   f"delete {d.overflow_of[structure]}, which empties both")
    if structure not in d.failed:
        d.structure(structure)
    log.warning("delete_structure_requested", client=session.client, structure=structure)
    session.defer(_finish, session, rid, d.detached, d.recover_structure, structure,
                  True, "delete structure")
    return DEFERRED


def op_checkpoint(d, session, rid, structure):
    d.pair_of(structure)  # a primary or an overflow structure, if available
    session.defer(_finish, session, rid, d.checkpoints.take, structure, "operator")
    return DEFERRED


def op_recover(d, session, rid, structure, purge):
    if structure not in d.failed:
        d.structure(structure)
    log.info("recover_requested", client=session.client, structure=structure, purge=purge)
    session.defer(_finish, session, rid, d.detached, d.recover_structure, structure, purge)
    return DEFERRED


async def _finish(session, rid, operation, *args):
    """Reply to an operator request that takes a while (a Spark job): the work itself
    runs in the daemon, and the reply follows when it ends."""
    try:
        result = await operation(*args)
    except CQSError as err:
        session.fail(rid, err.reason, err.message)
    else:
        session.reply(rid, result)


HANDLERS = {name.removeprefix("op_"): fn for name, fn in dict(globals()).items()
            if name.startswith("op_")}
assert set(HANDLERS) == set(requests.OPS), "every op of the protocol has one handler"
