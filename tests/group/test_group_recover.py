"""An operator's fail and recover in a group (docs/group.md, "Operators"): the owner
rebuilds the pair with the Spark recovery job given the seals' cuts, so what it
serves afterwards is the reference fold of the multi-node, multi-epoch sealed
log, with a deposed owner's late writes left out. Real etcd, real daemons,
real SIGKILLs, the real job."""

import json
import subprocess
import sys
import uuid

import cqsclient
import logstream
from cqsd.records import EFFECTS, PUT, STRUCTURE

from .checker import QUEUE, owner_messages, reference_messages
from .cluster import Node, shared_data

S = "MSGQ01"
LATE = 1 << 60  # the entry id of a deposed owner's late put: never one the owners gave


def cqsctl(node, *args):
    done = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", node.address,
                           "--json", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def work(node, tag: bytes, puts: int, deletes: int) -> None:
    """``puts`` recoverable messages on the owner ``node``, the first ``deletes`` of
    them read and deleted."""
    with cqsclient.connect(node.address, client="WORK", timeout=10) as c:
        s = c.structure(S)
        s.put_batch(QUEUE, [tag + b"%d" % i for i in range(puts)])
        for _ in range(deletes):
            s.delete(s.read(QUEUE).entry_id)


def take_over(dead, heir) -> None:
    """SIGKILL ``dead``, the owner; ``heir`` takes the pair over."""
    mark = len(heir.lines)
    dead.kill()
    heir.wait_for("takeover_done", after=mark, structure=S, timeout=30)


def test_recover_on_the_owner_after_two_takeovers_equals_the_sealed_logs_fold(etcd_server):
    """Three epochs (NODE1-1, NODE2-1, NODE1-2) and a late put the deposed NODE2-1
    appends after its seal; then cqsctl fail and recover on the owner: it serves
    exactly what it served before, the reference fold of the sealed log, and not
    the late put."""
    data, group = shared_data(), "R" + uuid.uuid4().hex[:6].upper()
    keys = 'spark_master = "local[2]"'
    a = Node("NODE1", data, etcd_server.endpoint, group=group, daemon_keys=keys)
    b = Node("NODE2", data, etcd_server.endpoint, group=group, daemon_keys=keys)
    try:
        a.start().wait_for("takeover_done", structure=S, timeout=30)
        b.start()
        work(a, b"one-", 30, 5)
        take_over(a, b)
        a.start()
        work(b, b"two-", 20, 10)
        take_over(b, a)
        with logstream.Writer.open(data / "logstream", "NODE2-1") as late:  # NODE2 resumed
            late.append({STRUCTURE: S, EFFECTS: [[PUT, LATE, "TRAN", QUEUE, b"late", 0]]})
            late.flush()
        work(a, b"three-", 10, 3)
        before = owner_messages(a.address)
        assert len(before) == 30 + 20 + 10 - 5 - 10 - 3 and LATE not in before
        assert before == reference_messages(data)

        assert cqsctl(a, "fail", S) == {"structure": S, "status": "failed",
                                        "messages": len(before)}
        recovered = cqsctl(a, "recover", S)
        assert (recovered["source"], recovered["messages"]) == ("checkpoint and log", len(before))
        assert owner_messages(a.address) == before
        work(a, b"four-", 1, 0)  # and it serves on
    finally:
        a.cleanup()
        b.cleanup()
