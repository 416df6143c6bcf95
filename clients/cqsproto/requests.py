"""The request table of docs/protocol.md: which fields each op takes, and their types.

Checking shapes here, before any handler runs, is what lets the handlers stay
three lines long and lets the daemon answer a wrong type with a message naming
the field instead of a traceback. Semantics (does the queue type exist, is the
name valid) belong to the engine; this module only knows wire types.
"""

from typing import Any, Final

from .codec import INVALID_REQUEST, ProtocolError
from .quote import quote

REQUIRED: Final = object()
# The largest frame a client may send before its register reply: a register request
# is a name, a secret and a version, well under 1 KiB. Without it an unregistered
# peer could make the daemon buffer a frame of max_message bytes.
MAX_REGISTER_FRAME: Final = 64 * 1024
_NUMBER = (int, float)
_SECONDS = ((*_NUMBER, type(None)), None)  # checked further by timing.py

# op -> field -> (accepted types, default)
_QTYPE = ((str, int), "TRAN")
_STRUCTURE = ((str,), REQUIRED)
_ENTRY = ((int,), REQUIRED)
# A put's or a commit's idempotency key, [incarnation, sequence] (docs/protocol.md,
# "Exactly-once puts"); optional, so a client that sends none is served as before.
_KEY = ((list, type(None)), None)
Spec = dict[str, tuple[tuple[type, ...], Any]]  # field -> (accepted types, default)
OPS: Final[dict[str, Spec]] = {
    "register": {
        "client": ((str,), REQUIRED),
        "secret": ((str, type(None)), None),
        "cold": ((bool,), False),
        "version": ((int,), REQUIRED),
        "operator": ((bool,), False),
        "takeover": ((str, type(None)), None),
    },
    "deregister": {},
    "ping": {},  # a sign of life for the client's keepalive, answered at once
    "connect": {"structure": _STRUCTURE},
    "put": {
        "structure": _STRUCTURE,
        "queue": ((str,), REQUIRED),
        "qtype": _QTYPE,
        "data": ((bytes,), REQUIRED),
        "recoverable": ((bool,), True),
        "delay": _SECONDS,
        "not_before": _SECONDS,
        "key": _KEY,
    },
    "read": {
        "structure": _STRUCTURE,
        "queue": ((str,), REQUIRED),
        "qtype": _QTYPE,
        "n": ((int,), 1),
        "wait": ((*_NUMBER, type(None)), None),
        "lease": _SECONDS,
    },
    "renew": {"structure": _STRUCTURE, "entry_id": _ENTRY, "lease": (_NUMBER, REQUIRED)},
    "browse": {
        "structure": _STRUCTURE,
        "queue": ((str, type(None)), None),
        "qtype": ((str, int, type(None)), None),
        "cursor": ((list, type(None)), None),
        "limit": ((int,), 100),
    },
    "delete": {
        "structure": _STRUCTURE,
        "entry_id": _ENTRY,
        "operator": ((bool,), False),
        "next": ((dict, type(None)), None),  # a read in the same request: next_read
    },
    "move": {
        "structure": _STRUCTURE,
        "entry_id": _ENTRY,
        "queue": ((str,), REQUIRED),
        "qtype": _QTYPE,
    },
    "unlock": {
        "structure": _STRUCTURE,
        "entry_id": _ENTRY,
        "failed": ((bool,), False),
        "queue": ((str, type(None)), None),
        "qtype": ((str, int, type(None)), None),
    },
    "commit": {"structure": _STRUCTURE, "ops": ((list,), REQUIRED), "key": _KEY},
    "register_interest": {"structure": _STRUCTURE, "queue": ((str,), REQUIRED), "qtype": _QTYPE},
    "deregister_interest": {"structure": _STRUCTURE, "queue": ((str,), REQUIRED), "qtype": _QTYPE},
    "query": {"kind": ((str,), REQUIRED), "structure": ((str, type(None)), None)},
    "requeue": {"structure": _STRUCTURE, "entry_id": _ENTRY},
    "dequeue": {"structure": _STRUCTURE, "queue": ((str,), REQUIRED), "qtype": _QTYPE},
    "checkpoint": {"structure": _STRUCTURE},
    # one structure, or a list of them recovered together (RECOVER CFSTRUCT of a list)
    "recover": {"structure": ((str, list), REQUIRED), "purge": ((bool,), False)},
    "alter": {"structure": _STRUCTURE, "size": ((int,), REQUIRED)},
    "rebuild": {"structure": _STRUCTURE, "size": ((int, type(None)), None)},
    "delete_structure": {"structure": _STRUCTURE, "force": ((bool,), False)},
    "reset_smds": {
        "structure": _STRUCTURE,
        "owner": ((str,), REQUIRED),
        "access": ((str, type(None)), None),
        "status": ((str, type(None)), None),
    },
    "start_smdsconn": {"structure": _STRUCTURE, "owner": ((str, type(None)), None)},
    "stop_smdsconn": {"structure": _STRUCTURE, "owner": ((str, type(None)), None)},
    "alter_smds": {
        "structure": _STRUCTURE,
        "owner": ((str,), REQUIRED),
        "dsbufs": ((int, str, type(None)), None),
        "dsexpand": ((str, type(None)), None),
    },
    "fail_structure": {"structure": _STRUCTURE},
    "move_structure": {"structure": _STRUCTURE, "to": ((str,), REQUIRED)},
}

# The operations a commit may carry, and their fields (the "op" key aside).
COMMIT_OPS: Final[dict[str, Spec]] = {
    "put": {k: v for k, v in OPS["put"].items() if k not in ("structure", "key")},
    "delete": {"entry_id": _ENTRY},
    "move": {k: v for k, v in OPS["move"].items() if k != "structure"},
    "unlock": {k: v for k, v in OPS["unlock"].items() if k != "structure"},
}
# A delete's ``next``: the read that follows it in the same request (no ``wait``:
# a waiting read's reply could not be sent before the delete's log record is durable).
NEXT_READ: Final[Spec] = {"queue": ((str,), REQUIRED), "qtype": _QTYPE, "n": ((int,), 1),
                          "lease": _SECONDS}
# a bound on one atomic batch, so one request cannot stall the daemon
MAX_COMMIT_OPS: Final = 100_000


def parse(frame: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """(request id, op, fields with defaults filled in) of a request frame.

    Raises ProtocolError(INVALID_REQUEST) naming the op and field at fault.
    """
    request_id = frame.get("id")
    if type(request_id) is not int:
        message = f"request id must be an integer, got {quote(request_id)}"
        raise ProtocolError(INVALID_REQUEST, message)
    op = frame.get("op")
    table = _TABLES.get(op) if isinstance(op, str) else None
    if table is None or not isinstance(op, str):
        raise ProtocolError(INVALID_REQUEST, f"unknown op {quote(op)}")
    size, defaults, checks = table
    # The defaults overlaid with the frame, in one C call: the fields in the spec's
    # order, with id and op after them and any unknown field making it larger.
    out = {**defaults, **frame}
    if len(out) != size:
        _unknown_field(op, defaults, frame)
    del out["id"], out["op"]
    for name, types in checks:
        if type(out[name]) not in types:
            _wrong_field(op, name, types, out[name])
    return request_id, op, out


def fields(where: str, spec: Spec, frame: dict[Any, Any],
           skip: tuple[str, ...] = ("op",)) -> dict[str, Any]:
    """Check ``frame`` against ``spec``; unknown fields are refused, so typos are seen.

    ``frame`` is a map nested in a request (a commit's op, a delete's ``next``), whose
    keys the codec does not check: any msgpack type, so typed Any, not str (compiled,
    a str key type is checked as the keys are taken, and a bytes key would raise
    mypyc's TypeError rather than our INVALID_REQUEST)."""
    for name in frame:
        if name not in spec and name not in skip:
            raise ProtocolError(INVALID_REQUEST, f"{where}: unknown field {quote(name)}")
    out = {}
    for name, (types, default) in spec.items():
        value = frame.get(name, default)
        if type(value) not in types:
            _wrong_field(where, name, types, value)
        out[name] = value
    return out


def _unknown_field(where: str, spec: Any, frame: dict[str, Any]) -> None:
    """Refuse the first field of ``frame`` that is neither in ``spec`` nor id or op."""
    for name in frame:
        if name not in spec and name not in ("id", "op"):
            raise ProtocolError(INVALID_REQUEST, f"{where}: unknown field {quote(name)}")


def _wrong_field(where: str, name: str, types: tuple[type, ...], value: Any) -> None:
    """Refuse a field that is missing (REQUIRED, whose type no spec accepts) or of a
    type the spec does not take."""
    if value is REQUIRED:
        raise ProtocolError(INVALID_REQUEST, f"{where}: field {name!r} is required")
    # exact types: bool is an int in Python, but never a number or an id on the wire
    wanted = " or ".join("nil" if t is type(None) else t.__name__ for t in types)
    raise ProtocolError(
        INVALID_REQUEST,
        f"{where}: field {name!r} must be {wanted}, got {type(value).__name__}",
    )


# OPS as parse checks it, made once: the size of a request of each op with every
# field (with id and op), each field's default, and (name, accepted types) of each.
_Table = tuple[int, dict[str, Any], tuple[tuple[str, tuple[type, ...]], ...]]
_TABLES: Final[dict[str, _Table]] = {
    op: (len(spec) + 2, {name: default for name, (_types, default) in spec.items()},
         tuple((name, types) for name, (types, _default) in spec.items()))
    for op, spec in OPS.items()
}


def next_read(value: dict[Any, Any]) -> dict[str, Any]:
    """A delete's ``next`` map with its defaults filled in; INVALID_REQUEST names
    the field at fault. Checked before the delete is applied, so a bad one leaves
    the message where it was."""
    return fields("delete next", NEXT_READ, value, skip=())


# An incarnation is drawn by the client at each connect: 16 hex digits in the SDK;
# the bound keeps a remembered key small (docs/group.md prices the window by it).
MAX_INCARNATION: Final = 32
MAX_SEQUENCE: Final = 2**63 - 1


def idempotency_key(where: str, value: list[Any] | None) -> tuple[str, int] | None:
    """A request's ``key`` as (incarnation, sequence), or None when it has none.

    Raises ProtocolError(INVALID_REQUEST) naming what is wrong with it."""
    if value is None:
        return None
    if (len(value) != 2 or type(value[0]) is not str or type(value[1]) is not int
            or not 1 <= len(value[0]) <= MAX_INCARNATION or not 0 <= value[1] <= MAX_SEQUENCE):
        raise ProtocolError(
            INVALID_REQUEST,
            f"{where}: key must be [incarnation, sequence]: a string of 1 to "
            f"{MAX_INCARNATION} characters and an integer from 0 to {MAX_SEQUENCE}",
        )
    return value[0], value[1]


def commit_ops(ops: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The operations of a commit request, each checked like a request of its own."""
    if len(ops) > MAX_COMMIT_OPS:
        raise ProtocolError(
            INVALID_REQUEST, f"commit: {len(ops)} operations exceed the limit of {MAX_COMMIT_OPS}"
        )
    out = []
    for i, op in enumerate(ops):
        if type(op) is dict and op.get("op") == "put" and _plain_put(op):
            # the common case of put_batch, checked in one expression (~1 µs a message)
            out.append(("put", {"queue": op["queue"], "qtype": op.get("qtype", "TRAN"),
                                "data": op["data"], "recoverable": op.get("recoverable", True)}))
            continue
        kind = op.get("op") if isinstance(op, dict) else None
        spec = COMMIT_OPS.get(kind) if isinstance(kind, str) else None
        if spec is None or not isinstance(kind, str):
            raise ProtocolError(
                INVALID_REQUEST,
                f"commit: ops[{i}] must be a map with op put, delete, move or unlock"
            )
        if "structure" in op:  # a unit of work is one log record of one pair's owner
            raise ProtocolError(
                INVALID_REQUEST,
                f"commit: ops[{i}] names structure {quote(op['structure'])}: a unit of work "
                f"spans one structure pair, the commit's own (in a group another pair may "
                f"live on another node); commit each pair's work on its own"
            )
        out.append((kind, fields(f"commit ops[{i}] ({kind})", spec, op)))
    return out


# a delayed put takes the full path (the plain one leaves out delay and not_before)
_PUT_KEYS: Final = frozenset(("op", "queue", "qtype", "data", "recoverable"))


def _plain_put(op: dict[Any, Any]) -> bool:
    return (
        op.keys() <= _PUT_KEYS
        and type(op.get("queue")) is str
        and type(op.get("data")) is bytes
        and type(op.get("qtype", "TRAN")) in (str, int)
        and type(op.get("recoverable", True)) is bool
    )
