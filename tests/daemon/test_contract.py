"""The SDK and the server agree (issue 12): every request cqsclient can build passes the
server's request table, and every reply the daemon builds is parsed by the SDK.

Both clients build their requests in cqsclient.ops and read replies with ``Call.finish``
(the blocking client and cqsclient.aio alike), so those are what is checked: the builders
one by one against ``cqsproto.requests``, and every reply read with ``Call.finish`` while
the blocking client drives every op against a real daemon.
"""

import ast
import inspect
from pathlib import Path

import pytest

import cqsclient
from cqsclient import ops
from cqsclient.errors import REASONS, CQSError, ProtocolViolation
from cqsproto import NEED_DATA, FrameDecoder, encode_frame, requests

from .harness import STRUCTURES

SDK = Path(cqsclient.__file__).parent
S = "MSGQ01"

# Every builder of cqsclient.ops with each shape of arguments the SDK passes it.
BUILDS = {
    "register": [("IMS1", None, False), ("IMS1", "secret", True)],
    "deregister": [()],
    "ping": [()],
    "connect": [(S,)],
    "put": [(S, "Q", b"x", "TRAN", True, None), (S, "Q", memoryview(b"x"), 5, False, 10),
            (S, "Q", b"x", "TRAN", True, None, 2.5), (S, "Q", b"x", "TRAN", True, None, None,
                                                      1.7e9)],
    "read": [(S, "Q", "TRAN", None), (S, "Q", 1, 2.5), (S, "Q", "TRAN", None, 30)],
    "read_batch": [(S, "Q", 10, "LTERM", 0), (S, "Q", 10, "LTERM", 0, 0.5)],
    "renew": [(S, 1, 30), (S, 1, 0.25)],
    "browse": [(S, None, None, 100, None), (S, "Q", None, 5, [1, "Q", 7]),
               (S, "Q", "TRAN_SUSPEND", 1, None)],
    "delete": [(S, 1), (S, 1, True)],
    "delete_and_read": [(S, 1, "Q", 1, "TRAN"), (S, 1, "Q", 50, 5)],
    "move": [(S, 1, "Q2", "LTERM")],
    "unlock": [(S, 1), (S, 1, True, "Q2", "TRAN")],
    "commit": [(S, [])],
    "put_batch": [(S, "Q", [b"a", bytearray(b"b")], "TRAN", True, None)],
    "register_interest": [(S, "Q", "TRAN")],
    "deregister_interest": [(S, "Q", 1)],
    "query": [("structures",), ("locks", S)],
    "requeue": [(S, 1)],
    "dequeue": [(S, "Q", "TRAN")],
    "checkpoint": [(S,)],
    "recover": [(S, False), (S, True), ([S, "SMALL"], False)],
    "alter": [(S, 1 << 20)],
    "rebuild": [(S, None), (S, 1 << 20)],
    "delete_structure": [(S,), (S, True)],
    "fail_structure": [(S,)],
    "move_structure": [(S, "NODE2")],
    "reset_smds": [(S, "A", "enabled", None), (S, "A", None, "recovered")],
    "start_smdsconn": [(S, None), (S, "A")],
    "stop_smdsconn": [(S, "A")],
    "alter_smds": [(S, "A", 50, "yes"), (S, "A", "default", None)],
}
# The operations a commit carries, each as the unit of work gathers it.
COMMIT_OPS = [
    ops.put_op("Q", b"x", "TRAN", True, None),
    ops.put_op("Q", bytearray(b"y"), 5, False, 10),
    ops.put_op("Q", b"z", "TRAN", True, None, 1.5),
    ops.put_op("Q", b"z", "TRAN", True, None, None, 1.7e9),
    ops.delete_op(1),
    ops.move_op(1, "Q2", "LTERM"),
    ops.unlock_op(1, False, None, None),
    ops.unlock_op(1, True, "Q2", 1),
]


def as_received(request: dict) -> dict:
    """The frame the daemon decodes when the SDK sends *request* (bytes-likes become bytes)."""
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame({"id": 1, **request}))
    frame = decoder.next_frame()
    assert frame is not NEED_DATA
    return frame


def builders() -> set[str]:
    return {name for name, f in inspect.getmembers(ops, inspect.isfunction)
            if f.__module__ == ops.__name__ and inspect.signature(f).return_annotation == "Call"}


def test_every_builder_is_checked_here():
    """BUILDS names every function of cqsclient.ops that builds a request."""
    assert set(BUILDS) == builders()


def test_only_ops_builds_request_maps():
    """No other SDK module writes a map with an "op" key, so the builders are all there is."""
    for path in sorted(SDK.glob("*.py")):
        if path.name == "ops.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                assert "op" not in keys, f"{path.name}:{node.lineno} builds a request"


@pytest.mark.parametrize(("name", "args"), [
    pytest.param(name, args, id=f"{name}-{i}")
    for name, shapes in BUILDS.items() for i, args in enumerate(shapes)])
def test_every_request_the_sdk_builds_passes_the_request_table(name, args):
    """Each built request, as the daemon receives it, parses with every field known and typed."""
    request = getattr(ops, name)(*args).request
    _, op, fields = requests.parse(as_received(request))
    if op == "commit":
        requests.commit_ops(fields["ops"])


def test_every_commit_operation_passes_the_request_table():
    """A commit of every operation a unit of work gathers parses."""
    _, _, fields = requests.parse(as_received(ops.commit(S, COMMIT_OPS).request))
    kinds = [kind for kind, _ in requests.commit_ops(fields["ops"])]
    assert set(kinds) == set(requests.COMMIT_OPS)


def _other_type(value):
    """A value of another type than ``value``, a str or a number a caller gave."""
    return 7 if isinstance(value, str) else "7"


# Arguments that are not a caller's value as it came: put's max_message is the
# session's, and recover tells one structure (a str) from several by its type.
NOT_A_CALLERS = {("put", 5), ("recover", 0)}


@pytest.mark.parametrize(("name", "args", "i"), [
    pytest.param(name, args, i, id=f"{name}-{n}-{i}")
    for name, shapes in BUILDS.items() for n, args in enumerate(shapes)
    for i, value in enumerate(args)
    if isinstance(value, str | int | float) and not isinstance(value, bool)
    and (name, i) not in NOT_A_CALLERS])
def test_a_builder_sends_a_callers_value_of_the_wrong_type_as_it_came(name, args, i):
    """The daemon judges a request's field types and refuses a wrong one with
    INVALID_REQUEST, so a builder passes it on, on both builds: compiled, a builder
    would refuse it itself with TypeError (docs/native.md), as the fuzz test found."""
    wrong = _other_type(args[i])
    request = getattr(ops, name)(*args[:i], wrong, *args[i + 1:]).request
    assert wrong in _values(request)


def _values(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _values(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _values(v)]
    return [value]


def test_the_daemon_refuses_a_wrong_type_the_sdk_passed_on(make_daemon):
    """Through the SDK to a real daemon: the refusal is a reason code, not a TypeError."""
    d = make_daemon().start()
    with cqsclient.connect(d.address, client="WRONG") as c:
        with pytest.raises(cqsclient.errors.InvalidRequest):
            c.reset_smds(S, "WRONG", access=1)
        with pytest.raises(cqsclient.errors.InvalidRequest):
            c.structure(S).read(7)


def test_the_sdk_builds_every_op_of_the_server():
    """Every op of the request table has a builder in the SDK."""
    built = {getattr(ops, name)(*shapes[0]).request["op"] for name, shapes in BUILDS.items()}
    assert built == set(requests.OPS)


# --- replies: the blocking SDK against a real daemon ------------------------------------


class _Watched:
    """A connection of the blocking client that reads each reply again with its
    call's ``finish``, as the client does next (``finish`` only reads), and notes
    what came of it. It stands where the client makes its connections: the SDK's
    compiled build (docs/native.md) has no method a test can replace."""

    def __init__(self, connection, seen: list) -> None:
        self._connection, self._seen = connection, seen

    def roundtrip(self, call: ops.Call, *args, **kwargs):
        reply = self._connection.roundtrip(call, *args, **kwargs)
        try:
            call.finish(reply)
        except CQSError as error:
            self._seen.append((call.request["op"], error))
        else:
            self._seen.append((call.request["op"], None))
        return reply

    def __getattr__(self, name: str):
        return getattr(self._connection, name)


@pytest.fixture
def finished(monkeypatch):
    """(op, error or None) of every reply the blocking SDK reads, as Call.finish reads it."""
    seen: list[tuple[str, CQSError | None]] = []
    make = cqsclient.client.Connection
    monkeypatch.setattr(cqsclient.client, "Connection",
                        lambda *args, **kwargs: _Watched(make(*args, **kwargs), seen))
    return seen


def drive_every_op(d) -> None:
    """Every op, in the shapes whose replies differ: messages locked, browsed, suspended,
    cold, resynced locks, notifications, operator requests and a few refusals."""
    with cqsclient.connect(d.address, client="CONTRACT") as c:
        c.ping()
        s = c.structure(S)
        eid = s.put("CQ", b"one")
        s.put_batch("CQ", [b"two", b"three"])
        m = s.read("CQ", lease=60)
        s.renew(m.entry_id, 60)
        batch = s.read_batch("CQ", 2)
        assert s.unlock(m.entry_id, failed=True).queue == "CQ"  # max_deliveries 1: suspended
        assert [x.home for x in s.browse("CQ", qtype="TRAN_SUSPEND")] == [("TRAN", "CQ")]
        assert s.requeue(eid).queue == "CQ"
        assert len(list(s.browse_all())) == 3
        s.move(batch[0].entry_id, "CQ2")
        s.delete(batch[1].entry_id)
        s.put_batch("CQ4", [b"six", b"seven"])
        [seven] = s.delete_and_read(s.read("CQ4").entry_id, "CQ4", n=2)
        assert s.delete_and_read(seven.entry_id, "CQ4") == []
        with s.unit_of_work() as uow:
            got = uow.read("CQ")
            uow.put("CQ2", b"four")
            uow.move(got.entry_id, "CQ3")
        with s.unit_of_work() as uow:
            first, second = uow.read_batch("CQ2", 2)
            uow.delete(first.entry_id)
            uow.unlock(second.entry_id, queue="CQ")
        s.operator_delete(s.put("CQ", b"five"))
        assert s.dequeue("CQ") >= 0
        c.register_interest(S, "CQ3")
        assert next(iter(c.notifications(timeout=5.0))).queue == "CQ3"  # it holds work
        c.deregister_interest(S, "CQ3")
        for kind in ("structures", "queues", "clients", "locks", "headers", "backups", "smds",
                     "usage", "cfstatus", "smdsconn"):
            c.query(kind, S)
        s.put("BIG", b"b" * 100_000)  # offloaded: CONTRACT now has a data set
        s.delete(s.read("BIG").entry_id)
        c.stop_smdsconn(S, "CONTRACT")
        c.start_smdsconn(S, "CONTRACT")
        c.alter_smds(S, "CONTRACT", dsbufs=50)
        c.reset_smds(S, "CONTRACT", status="failed")
        c.alter(S, 48 << 20)
        c.rebuild(S)
        c.recover("SMALL", purge=True)  # without purge, and checkpoint, a Spark job runs
        c.fail_structure("SMALL")
        c.delete_structure("SMALL", force=True)  # a purge: it ends the failure too
        assert s.read("NONE") is None  # NO_MESSAGE, read as "nothing there"
        with pytest.raises(cqsclient.errors.EntryNotFound):
            s.delete(10**15)
    held = cqsclient.connect(d.address, client="HOLDER")
    held.structure(S).put("HELD", b"h")
    locked = held.structure(S).read("HELD")
    held.abort()  # a drop, not a deregister: the lock waits out resync_grace
    d.wait_for("connection_lost")
    with cqsclient.connect(d.address, client="HOLDER") as again:
        assert [lk.entry_id for lk in again.resync_locks] == [locked.entry_id]
        again.abort()
    d.wait_for("connection_lost", 2)
    with cqsclient.connect(d.address, client="HOLDER", cold=True) as cold:
        assert [m.owner for m in cold.structure(S).browse() if m.where == "cold"] == ["HOLDER"]


def test_every_reply_the_daemon_builds_is_parsed_by_the_sdk(make_daemon, finished):
    """Driving every op, no reply is a ProtocolViolation, each refusal has its own class,
    and every op of the request table has had a successful reply parsed."""
    d = make_daemon("max_deliveries = 1\nresync_grace = 60", structures=STRUCTURES.replace(
        'overflow = "MSGQ01OV"', 'overflow = "MSGQ01OV"\noffload = "smds"')).start()
    drive_every_op(d)
    assert [(op, e) for op, e in finished if isinstance(e, ProtocolViolation)] == []
    assert [(op, e) for op, e in finished if e and type(e) is not REASONS.get(e.reason)] == []
    # A checkpoint is a Spark job of some 20 s; its result is any map (read by dict), and
    # test_checkpoints.py runs it through the SDK. A planned move needs a group: its
    # refusal here is parsed, its result (a map) in tests/group/test_placement.py.
    assert ops.checkpoint(S).parse is dict and ops.move_structure(S, "N").parse is dict
    assert {op for op, error in finished if error is None} == (
        set(requests.OPS) - {"checkpoint", "move_structure"})
