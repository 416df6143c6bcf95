"""Every request the SDK can make, built once for both the blocking and async clients.

Design note
-----------
A request is a :class:`Call` (replies.py): the map to send (without its ``id``,
which the connection assigns) and how to turn the reply into a Python value. The
blocking client does ``call.finish(connection.roundtrip(call.request))`` and
the async client ``call.finish(await connection.roundtrip(call.request))``;
neither knows a field name of any op. That keeps the two clients from
drifting apart, and it is why the client-side checks (payload size against the
server's ``max_message``, str payloads refused) live here: both clients get
them, and an oversized message is refused before a byte of it is buffered by
the daemon.

``Call.empty`` says what a ``NO_MESSAGE`` reply means for this call: for a
read it is an ordinary outcome (``None`` or ``[]``), for anything else it is an
error like any other. Defaults are sent explicitly, so a request on the wire
reads the same whatever the server's defaults.

A Call also says what the clients need to know of it without knowing its
fields: ``locks`` (a successful reply locks messages for this client),
``releases`` (the entries whose locks it gives up), ``retry`` (it may be sent
again after a reconnect even if the lost connection may have carried it: it
changes nothing, or a read, whose lost locks the resync gives back), ``job``
(it runs a job that takes as long as it takes, so the client's default
timeout does not apply) and ``wait`` (seconds the server may hold it before
replying, which a timeout adds to).

The builders take what their callers pass as it is, and stay interpreted on
the compiled build (docs/native.md): a value of the wrong type reaches the
daemon, which refuses it with a reason code, on both builds.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, get_args

from cqsproto import LARGE, PROTOCOL_VERSION

from .errors import MessageTooLarge
from .model import (
    BrowsePage,
    Message,
    QType,
    QueueTypeName,
    SmdsAccess,
    SmdsExpand,
    SmdsStatus,
)
from .replies import (
    Call,
    Interest,
    Session,
    location,
    message_from_wire,
    nothing,
    rows,
    session_from_wire,
)

__all__ = ["CLIENT_TIMEOUT", "Call", "Interest", "QType", "Session", "Timeout",
           "message_from_wire"]

Payload = bytes | bytearray | memoryview

# The largest page a browse asks for when following cursors on its own; the
# daemon's default page is 100, and bigger pages mean fewer round trips.
BROWSE_PAGE: Final = 100


class _ClientTimeout(enum.Enum):
    CLIENT_TIMEOUT = "the client's timeout"

    def __repr__(self) -> str:
        return "CLIENT_TIMEOUT"


CLIENT_TIMEOUT: Final = _ClientTimeout.CLIENT_TIMEOUT
"""A request's ``timeout`` default: the client's (``connect(timeout=...)``); jobs have none."""

Timeout = float | None | _ClientTimeout
"""A request's ``timeout``: seconds, None for none, or CLIENT_TIMEOUT."""


def seconds(timeout: Timeout, default: float | None, call: Call) -> float | None:
    """The timeout *call* runs with, given its caller's *timeout* and the client's."""
    if isinstance(timeout, _ClientTimeout):
        return None if call.job else default
    return timeout


def _messages(structure: str) -> Callable[[dict[str, Any]], list[Message]]:
    def parse(result: dict[str, Any]) -> list[Message]:
        return [message_from_wire(m, structure) for m in result["messages"]]

    return parse


def _first_message(structure: str) -> Callable[[dict[str, Any]], Message | None]:
    def parse(result: dict[str, Any]) -> Message | None:
        messages = result["messages"]
        return message_from_wire(messages[0], structure) if messages else None

    return parse


def _page(structure: str) -> Callable[[dict[str, Any]], BrowsePage]:
    def parse(result: dict[str, Any]) -> BrowsePage:
        messages = [message_from_wire(m, structure) for m in result["messages"]]
        return BrowsePage(messages, result.get("cursor"))

    return parse


def _large(data: bytes | bytearray | memoryview) -> bool:
    return (data.nbytes if isinstance(data, memoryview) else len(data)) >= LARGE


def check_payload(data: Payload, max_message: int | None) -> bytes | bytearray | memoryview:
    """*data* if it may be put; raises TypeError for str, MessageTooLarge past *max_message*."""
    if isinstance(data, str):
        raise TypeError("message data must be bytes, not str: encode it first")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"message data must be bytes, not {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if max_message is not None and size > max_message:
        raise MessageTooLarge(
            f"message of {size} bytes exceeds the server's max_message of {max_message} bytes"
        )
    return data


# --- session ----------------------------------------------------------------


QUEUE_TYPE_NAMES: Final[tuple[QueueTypeName, ...]] = get_args(QueueTypeName)


def interest(structure: str, queue: str, qtype: QType) -> Interest:
    """An interest as the daemon names it, its queue type given by name or number."""
    if isinstance(qtype, int):
        return structure, queue, QUEUE_TYPE_NAMES[qtype - 1]
    return structure, queue, qtype


def register(client: str, secret: str | None, cold: bool, operator: bool = False,
             takeover: str | None = None) -> Call:
    """``register``: log in as *client* (an *operator* session: cqsctl, no client
    slot, locks of its own; or taking the name over from a connection still
    holding it, given that registration's *takeover* token); the result is a
    :class:`Session`."""
    request: dict[str, Any] = {
        "op": "register",
        "client": client,
        "secret": secret,
        "cold": cold,
        "version": PROTOCOL_VERSION,
    }
    if operator:
        request["operator"] = True
    if takeover is not None:
        request["takeover"] = takeover
    return Call(request, session_from_wire)


def deregister() -> Call:
    """``deregister``: end the session cleanly; the server then closes the connection."""
    return Call({"op": "deregister"}, nothing)


def ping() -> Call:
    """``ping``: a sign of life, answered at once (the keepalive's, cqsclient.keepalive)."""
    return Call({"op": "ping"}, nothing, retry=True)


def connect(structure: str) -> Call:
    """``connect``: check the structure exists; the result is its stats row."""
    return Call({"op": "connect", "structure": structure}, dict, retry=True)


# --- messages ---------------------------------------------------------------


def put(
    structure: str,
    queue: str,
    data: Payload,
    qtype: QType,
    recoverable: bool,
    max_message: int | None,
    delay: float | None = None,
    not_before: float | None = None,
) -> Call:
    """``put``: the result is the new entry id."""
    payload = check_payload(data, max_message)
    request = {
        "op": "put",
        "structure": structure,
        "queue": queue,
        "qtype": qtype,
        "data": payload,
        "recoverable": recoverable,
    }
    return Call(_timed(request, delay=delay, not_before=not_before),
                lambda result: int(result["entry_id"]), large=_large(payload), keyed=True)


def read(structure: str, queue: str, qtype: QType, wait: float | None,
         lease: float | None = None) -> Call:
    """``read`` of one message: a locked Message, or None when there is none."""
    request = {
        "op": "read",
        "structure": structure,
        "queue": queue,
        "qtype": qtype,
        "n": 1,
        "wait": wait,
    }
    return Call(_timed(request, lease=lease), _first_message(structure), empty=None,
                locks=True, retry=True)


def read_batch(structure: str, queue: str, n: int, qtype: QType, wait: float | None,
               lease: float | None = None) -> Call:
    """``read`` of up to *n* messages: a list of locked Messages, [] when there is none."""
    request = {
        "op": "read",
        "structure": structure,
        "queue": queue,
        "qtype": qtype,
        "n": n,
        "wait": wait,
    }
    return Call(_timed(request, lease=lease), _messages(structure), empty=[], locks=True,
                retry=True)


def renew(structure: str, entry_id: int, lease: float) -> Call:
    """``renew``: the lock's lease runs *lease* seconds from now (LOCK_NOT_HELD once it
    has expired). Sent again after a reconnect: a second renew only moves it again."""
    request = {"op": "renew", "structure": structure, "entry_id": entry_id, "lease": lease}
    return Call(request, nothing, retry=True)


def _timed(request: dict[str, Any], **fields: float | None) -> dict[str, Any]:
    """*request* with the lease or delay fields that were given. Unlike other
    defaults these are left out when None: a request without them is what a
    daemon from before leases and delayed puts understands."""
    for field, value in fields.items():
        if value is not None:
            request[field] = value
    return request


def browse(
    structure: str,
    queue: str | None,
    qtype: QType | None,
    limit: int,
    cursor: Any,
) -> Call:
    """``browse``: one :class:`BrowsePage`, nothing locked.

    With a queue and no qtype the qtype is TRAN, as for every other
    queue-naming request; with neither, the whole structure is browsed.
    """
    if queue is not None and qtype is None:
        qtype = "TRAN"
    request = {
        "op": "browse",
        "structure": structure,
        "queue": queue,
        "qtype": qtype,
        "cursor": cursor,
        "limit": limit,
    }
    return Call(request, _page(structure), retry=True)


def delete(structure: str, entry_id: int, operator: bool = False) -> Call:
    """``delete``: of an entry this client holds locked, or any unlocked one as operator."""
    request = {"op": "delete", "structure": structure, "entry_id": entry_id, "operator": operator}
    return Call(request, nothing, releases=() if operator else (entry_id,))


def delete_and_read(structure: str, entry_id: int, queue: str, n: int, qtype: QType,
                    lease: float | None = None) -> Call:
    """``delete`` with ``next``: the entry deleted, then up to *n* messages of the queue
    read and locked (on *lease*, if given) in the same request; a list of Messages,
    [] when there is none."""
    request = {
        "op": "delete",
        "structure": structure,
        "entry_id": entry_id,
        "next": _timed({"queue": queue, "qtype": qtype, "n": n}, lease=lease),
    }
    return Call(request, _messages(structure), locks=True, releases=(entry_id,))


def move(structure: str, entry_id: int, queue: str, qtype: QType) -> Call:
    """``move``: an entry not locked by another client to another queue."""
    request = {
        "op": "move",
        "structure": structure,
        "entry_id": entry_id,
        "queue": queue,
        "qtype": qtype,
    }
    return Call(request, nothing, releases=(entry_id,))


def unlock(
    structure: str,
    entry_id: int,
    failed: bool = False,
    queue: str | None = None,
    qtype: QType | None = None,
) -> Call:
    """``unlock``: return a locked entry (or move it; ``failed`` counts a failed delivery)."""
    request = {
        "op": "unlock",
        "structure": structure,
        "entry_id": entry_id,
        "failed": failed,
        "queue": queue,
        "qtype": qtype,
    }
    return Call(request, location, releases=(entry_id,))


def commit(structure: str, ops: list[dict[str, Any]]) -> Call:
    """``commit``: apply *ops* atomically; the result is the entry ids of its puts."""
    request = {"op": "commit", "structure": structure, "ops": ops}
    released = tuple(op["entry_id"] for op in ops if op["op"] in ("delete", "move", "unlock"))
    return Call(request, lambda result: [int(e) for e in result["entry_ids"]], releases=released,
                large=any(op["op"] == "put" and _large(op["data"]) for op in ops), keyed=True)


def put_batch(
    structure: str,
    queue: str,
    payloads: Iterable[Payload],
    qtype: QType,
    recoverable: bool,
    max_message: int | None,
) -> Call:
    """One ``commit`` of a put per payload; the result is their entry ids, in order."""
    ops = [put_op(queue, data, qtype, recoverable, max_message) for data in payloads]
    return commit(structure, ops)


# Commit ops: the same checks and spellings as the single requests.


def put_op(
    queue: str, data: Payload, qtype: QType, recoverable: bool, max_message: int | None,
    delay: float | None = None, not_before: float | None = None,
) -> dict[str, Any]:
    return _timed({
        "op": "put",
        "queue": queue,
        "qtype": qtype,
        "data": check_payload(data, max_message),
        "recoverable": recoverable,
    }, delay=delay, not_before=not_before)


def delete_op(entry_id: int) -> dict[str, Any]:
    return {"op": "delete", "entry_id": entry_id}


def move_op(entry_id: int, queue: str, qtype: QType) -> dict[str, Any]:
    return {"op": "move", "entry_id": entry_id, "queue": queue, "qtype": qtype}


def unlock_op(
    entry_id: int, failed: bool, queue: str | None, qtype: QType | None
) -> dict[str, Any]:
    return {"op": "unlock", "entry_id": entry_id, "failed": failed, "queue": queue, "qtype": qtype}


# --- interest and operator requests -------------------------------------------


def register_interest(structure: str, queue: str, qtype: QType) -> Call:
    """``register_interest``: be notified when the queue gets work."""
    request = {"op": "register_interest", "structure": structure, "queue": queue, "qtype": qtype}
    return Call(request, nothing, retry=True)


def deregister_interest(structure: str, queue: str, qtype: QType) -> Call:
    """``deregister_interest``: stop the notifications for the queue."""
    request = {"op": "deregister_interest", "structure": structure, "queue": queue, "qtype": qtype}
    return Call(request, nothing, retry=True)


def query(kind: str, structure: str | None = None) -> Call:
    """``query``: the rows of a display (structures, queues, clients, locks, headers, backups,
    jobs, smds, usage, cfstatus, smdsconn, status)."""
    return Call({"op": "query", "kind": kind, "structure": structure}, rows, retry=True)


def requeue(structure: str, entry_id: int) -> Call:
    """``requeue``: a cold or suspended message back to its home queue."""
    return Call({"op": "requeue", "structure": structure, "entry_id": entry_id}, location)


def dequeue(structure: str, queue: str, qtype: QType) -> Call:
    """``dequeue``: delete every message of the queue; the result is how many."""
    request = {"op": "dequeue", "structure": structure, "queue": queue, "qtype": qtype}
    return Call(request, lambda result: int(result["count"]))


def checkpoint(structure: str) -> Call:
    """``checkpoint``: take a structure checkpoint now; the job's report when it ends."""
    return Call({"op": "checkpoint", "structure": structure}, dict, job=True)


def recover(structure: str | Sequence[str], purge: bool) -> Call:
    """``recover``: rebuild a structure from its checkpoint and the log (or empty it);
    several given as a list, together in one job."""
    named = structure if isinstance(structure, str) else list(structure)
    return Call({"op": "recover", "structure": named, "purge": purge}, dict, job=True)


def alter(structure: str, size: int) -> Call:
    """``alter``: change a structure's current size (SETXCF START,ALTER)."""
    return Call({"op": "alter", "structure": structure, "size": size}, dict)


def rebuild(structure: str, size: int | None) -> Call:
    """``rebuild``: copy a structure to a new instance, optionally with a new size."""
    return Call({"op": "rebuild", "structure": structure, "size": size}, dict, job=True)


def delete_structure(structure: str, force: bool = False) -> Call:
    """``delete_structure``: empty a structure and its checkpoints (a cold start); one
    holding messages only with ``force``."""
    return Call({"op": "delete_structure", "structure": structure, "force": force}, dict,
                job=True)


def reset_smds(structure: str, owner: str, access: SmdsAccess | None,
               status: SmdsStatus | None) -> Call:
    """``reset_smds``: RESET SMDS ACCESS / STATUS; the data set's cfstatus row after it."""
    request = {"op": "reset_smds", "structure": structure, "owner": owner, "access": access,
               "status": status}
    return Call(request, dict)


def start_smdsconn(structure: str, owner: str | None) -> Call:
    """``start_smdsconn``: START SMDSCONN; the smdsconn rows after it."""
    return Call({"op": "start_smdsconn", "structure": structure, "owner": owner}, rows)


def stop_smdsconn(structure: str, owner: str | None) -> Call:
    """``stop_smdsconn``: STOP SMDSCONN; the smdsconn rows after it."""
    return Call({"op": "stop_smdsconn", "structure": structure, "owner": owner}, rows)


def alter_smds(structure: str, owner: str, dsbufs: int | Literal["default"] | None,
               dsexpand: SmdsExpand | None) -> Call:
    """``alter_smds``: ALTER SMDS DSBUFS / DSEXPAND; the data set's smds row after it."""
    request = {"op": "alter_smds", "structure": structure, "owner": owner, "dsbufs": dsbufs,
               "dsexpand": dsexpand}
    return Call(request, dict)


def fail_structure(structure: str) -> Call:
    """``fail_structure``: mark a structure failed, for a recovery drill, until ``recover``."""
    return Call({"op": "fail_structure", "structure": structure}, dict)


def move_structure(structure: str, to: str) -> Call:
    """``move_structure``: a planned move of a group's pair to node *to* (SETXCF REBUILD)."""
    return Call({"op": "move_structure", "structure": structure, "to": to}, dict, job=True)
