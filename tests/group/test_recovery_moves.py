"""An operator's failure and recovery of a pair meet planned moves (docs/group.md,
"Planned moves"): a pair failed at its owner moves as a recovery would rebuild it,
and the node it left keeps nothing of it; a pair its owner purged is not served by
a warm standby from the rows it folded before the purge; a pair being recovered
moves once its recovery is over. The first two found by the group fuzz
(tests/group/test_group_fuzz.py). Real etcd, real daemons, a real Spark job."""

import threading
import time

from ..daemon.harness import Raw
from .cluster import Node, shared_data

S = "EMHQ01"
PREFER = 'prefer = ["NODE1", "NODE2"]'


def request(node: Node, op: str, timeout: float = 10, **fields) -> dict:
    raw = Raw(node.socket)
    raw.sock.settimeout(timeout)
    try:
        assert raw.register(f"OPS{time.monotonic_ns() % 10**9}", operator=True)["ok"]
        return raw.request(op, **fields)
    finally:
        raw.close()


def stands_by(owner: Node, standby: str, timeout: float = 30) -> None:
    """Until ``owner`` has read warm ``standby``'s report on S: it sees that node live."""
    deadline = time.monotonic() + timeout
    while True:
        [row] = [r for r in request(owner, "query", kind="owners")["result"]["rows"]
                 if r["structure"] == S]
        if any(s["node"] == standby for s in row["standbys"]):
            return
        assert time.monotonic() < deadline, f"{owner.name} never saw {standby}: {row}"
        time.sleep(0.05)  # no event says so: the report is read in the owner's poll


def move(node: Node, to: str, timeout: float = 10) -> None:
    """``move-structure S --to to``, asked of ``node``: done when it answers."""
    moved = request(node, "move_structure", timeout=timeout, structure=S, to=to)
    assert moved["ok"] and moved["result"]["owner"] == to, moved


def messages(node: Node) -> list[bytes]:
    browsed = request(node, "browse", structure=S)
    assert browsed["ok"], browsed
    return [m["data"] for m in browsed["result"]["messages"]]


def two(etcd_server, group: str) -> tuple[Node, Node]:
    """NODE1 owning S, NODE2 its warm standby, seen by NODE1."""
    data = shared_data()
    a, b = (Node(name, data, etcd_server.endpoint, group=group, prefer=PREFER,
                 standby=standby) for name, standby in (("NODE1", "cold"), ("NODE2", "warm")))
    a.start()
    a.wait_for("takeover_done", structure=S, timeout=30)
    b.start()
    b.wait_for("warm_standby_loaded", structure=S, timeout=60)
    stands_by(a, "NODE2")
    return a, b


def test_a_failed_pair_moves_as_a_recovery_and_its_old_owner_keeps_none_of_it(etcd_server):
    """NODE1 fails S holding a message and moves it to NODE2, which serves it with the
    message. NODE1 then answers S's requests NOT_OWNER, a recover with purge included.
    (It kept S as failed: it answered STRUCTURE_FAILED, and ran that recover, purging
    the checkpoints of the pair NODE2 served; the next takeover of S, by either node,
    then failed for ever on a delete of a message the purge had dropped.)"""
    a, b = two(etcd_server, "FAILMV")
    try:
        assert request(a, "put", structure=S, queue="Q", data=b"kept")["ok"]
        assert request(a, "fail_structure", structure=S)["ok"]
        move(a, "NODE2")
        assert messages(b) == [b"kept"]
        for op, fields in (("recover", {"purge": True}), ("browse", {}),
                           ("put", {"queue": "Q", "data": b"x"})):
            refused = request(a, op, structure=S, **fields)
            assert refused.get("reason") == "NOT_OWNER", (op, refused)
        move(b, "NODE1")
        assert messages(a) == [b"kept"]
    finally:
        a.cleanup()
        b.cleanup()


def test_a_pair_purged_by_its_owner_is_not_served_from_its_standbys_rows(etcd_server):
    """NODE1 purges S (recover --purge) holding a message, then moves it to NODE2, its
    warm standby, which had folded the put: NODE2 serves S empty, and NODE1 takes it
    back. (A purge leaves no record in the log: NODE2 served the purged message again,
    and the effects it then logged on it made every later rebuild of S fail.)"""
    a, b = two(etcd_server, "PURGEMV")
    try:
        assert request(a, "put", structure=S, queue="Q", data=b"purged")["ok"]
        mark, back = b.mark(), a.mark()
        assert request(a, "recover", structure=S, purge=True)["ok"]
        move(a, "NODE2")
        # answered once NODE2 serves S (it answered as soon as NODE2's owner key
        # was made, and under load NODE2's browse then found S still being taken)
        assert b.events("takeover_done", after=mark, structure=S)
        assert messages(b) == []
        assert request(b, "put", structure=S, queue="Q", data=b"after")["ok"]
        assert b.events("warm_image_reloaded", after=mark) or b.events("warm_image_purged",
                                                                      after=mark)
        move(b, "NODE1")
        assert a.events("takeover_done", after=back, structure=S)
        assert messages(a) == [b"after"]
    finally:
        a.cleanup()
        b.cleanup()


def test_a_pair_being_recovered_moves_once_its_recovery_is_over(etcd_server):
    """NODE1 recovers S from its checkpoint and the log (a Spark job: seconds) and is
    asked meanwhile to move S to NODE2: it hands S over once the recovery is done,
    which succeeds, and NODE2 serves the message. (The move went first: the recovery
    then found S gone, and went on writing checkpoints and data sets of a pair
    NODE2 served.)"""
    a, b = two(etcd_server, "RECMV")
    try:
        assert request(a, "put", structure=S, queue="Q", data=b"kept")["ok"]
        mark = a.mark()
        recovered = {}
        job = threading.Thread(target=lambda: recovered.update(
            request(a, "recover", timeout=120, structure=S, purge=False)))
        job.start()
        a.wait_for("structure_failed", structure=S, why="recover", after=mark, timeout=30)
        move(a, "NODE2", timeout=120)  # it waits for the recovery: a Spark job, as above
        job.join(120)
        assert recovered.get("ok"), recovered
        order = [e["event"] for e in a.lines[mark:a.mark()]
                 if e.get("structure") == S and e["event"] in ("structure_recovered",
                                                              "structure_released")]
        assert order == ["structure_recovered", "structure_released"], order
        assert messages(b) == [b"kept"]
    finally:
        a.cleanup()
        b.cleanup()


def sizes(node: Node) -> tuple[int, int]:
    """S's SIZE and current size as ``node`` serves it."""
    [row] = [r for r in request(node, "query", kind="structures")["result"]["rows"]
             if r["name"] == S]
    return row["size"], row["current_size"]


def test_a_pairs_sizes_go_with_it_to_a_warm_and_a_cold_owner(etcd_server):
    """NODE1 rebuilds S to a new SIZE and moves it to NODE2, a warm standby, which
    serves it with that SIZE and alters its current size; moved back to NODE1, cold
    there, S keeps both. (Each node served S as its definitions were when it
    started, or when its tail loaded the pair: an operator's rebuild or alter, or a
    growth, was undone by the next takeover.)"""
    a, b = two(etcd_server, "SIZEMV")
    try:
        assert request(a, "put", structure=S, queue="Q", data=b"kept")["ok"]
        assert request(a, "rebuild", structure=S, size=16 << 20)["ok"]
        move(a, "NODE2")
        assert sizes(b) == (16 << 20, 16 << 20)
        assert request(b, "alter", structure=S, size=12 << 20)["ok"]
        move(b, "NODE1")
        assert sizes(a) == (16 << 20, 12 << 20)
        assert messages(a) == [b"kept"]
    finally:
        a.cleanup()
        b.cleanup()
