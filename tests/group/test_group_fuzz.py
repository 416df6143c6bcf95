"""Generated requests against a group (docs/group.md): a request that kills one
node kills the next that takes its pairs over, and then the whole group, so a
group node must survive anything a client can send at least as well as a lone
daemon does (tests/daemon/test_fuzz.py, which also checks what is stored).

The requests are drawn from the request table itself (``cqsproto.requests.OPS``):
every op, mostly well formed, else with fields missing, of another type, or one
too many, among values that matter in a group (pairs owned here, there and
nowhere, an overflow structure, nodes of the group and others, entry ids the
nodes gave and impossible ones, planned moves of every structure to every node),
and garbage frames. Operators registered at both nodes send them; a NOT_OWNER is
followed to the other node, as the SDK follows it. NODE2 is a warm standby, so
every record the requests make is tailed and folded as it is logged.

After each sequence both nodes are running and answer on fresh connections,
every refusal carries a reason code of docs/protocol.md, and neither node logged
a traceback, an internal error, or a fold of the log that met an effect on a
message not there. ``checkpoint``, and ``recover`` without ``purge``, run a
Spark job each (seconds): they are drawn only with ``CQSD_GROUP_FUZZ_SPARK=1``,
for long runs, where they meet planned moves, purges and takeovers.

Budgets: the suite runs the sequences of seeds 0 to SEQUENCES - 1 on one group;
``CQSD_GROUP_FUZZ_SECONDS=N`` runs them for N seconds from a random seed, one
after another, and ``CQSD_GROUP_FUZZ_SEED=S`` starts from S (alone: that one
sequence). A failure names its seed and shows both nodes' last log lines: 40 in
the suite; in a long run 3,000, and the group's data directory is kept (its path
is in the failure) for the records to be read with their series.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shutil
import socket
import time
from collections.abc import Iterator

import pytest

from cqsclient.errors import REASONS
from cqsproto import encode_frame, requests

from ..daemon.fuzz_checks import BAD_EVENTS
from ..daemon.harness import Raw
from .cluster import Node, shared_data

PREFER = 'prefer = ["NODE1", "NODE2"]'
KEYS = "max_wait = 0.2\nresync_grace = 1\nsend_queue = 64\ncheckpoint_interval = 0"
SEQUENCES = 40
STEPS = 25  # at most, a sequence
SECONDS = float(os.environ.get("CQSD_GROUP_FUZZ_SECONDS") or 0)
SEED = os.environ.get("CQSD_GROUP_FUZZ_SEED")
SHOWN = 3000 if SECONDS else 40  # log lines of each node a failure shows
OTHER_NODE = {"NODE1": "NODE2", "NODE2": "NODE1"}
# checkpoint and recover without purge run a Spark job each: drawn only if asked
SPARK = os.environ.get("CQSD_GROUP_FUZZ_SPARK", "") not in ("", "0")
SPARK_WAIT = 180  # seconds a step with a Spark job may take to be answered

# values that mean something here, the group's own drawn most often
STRUCTURES = ["MSGQ01"] * 4 + ["EMHQ01"] * 3 + ["MSGQ01OV", "NOPE", "", "S" * 300]
NODES = ["NODE1", "NODE2"] * 3 + ["NODE9", "", "node1"]
QUEUES = ["Q1", "Q1", "Q2", "", "Q" * 300]
QTYPES = ["TRAN"] * 4 + ["LTERM", "TRAN_SUSPEND", "NOPE", 0, 1, 99, -1]
KINDS = ["structures", "queues", "clients", "locks", "headers", "backups", "smds", "usage",
         "cfstatus", "smdsconn", "owners", "nope"]
BAD_IDS = [0, -1, 1, 2**63 - 1, 2**64 - 1, -(2**63)]
TIMES = [None, None, 0, 0.01, 0.1, 1, -1, math.nan, math.inf, -math.inf, 1e300, 2**63]
SIZES = [0, 1 << 20, 64 << 20, 1 << 40, 2**64 - 1, -1]
DATA = [b"", b"x", b"y" * 100, bytes(3000)]
NAMES = ["OPS1", "FUZZ", "", "x" * 20, "NOBODY"]
GARBAGE = [b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", b"\x00\x00\x00\x01\x90", b"\xff\xff\xff\xff",
           b"\x00\x00\x00\x03\x81\xa2op", b"\x00\x00\x00\x02\x81\xc0"]


class Draws:
    """One sequence's requests, from its seed."""

    def __init__(self, seed: int, ids: list[int]) -> None:
        self.rng = random.Random(seed)
        self.ids = ids  # entry ids the nodes gave puts

    def other(self, depth: int = 0):
        """A value of any wire type."""
        r = self.rng
        kinds = ["none", "bool", "int", "float", "str", "bytes"] + (["list", "map"] * (depth < 2))
        kind = r.choice(kinds)
        if kind == "list":
            return [self.other(depth + 1) for _ in range(r.randrange(3))]
        if kind == "map":
            return {r.choice(["a", "op", "queue", ""]): self.other(depth + 1)
                    for _ in range(r.randrange(3))}
        return {"none": None, "bool": r.random() < 0.5,
                "int": r.choice([0, 1, -1, 2**64 - 1, -(2**63), r.randrange(-9, 10**6)]),
                "float": r.choice([0.5, -2.0, math.nan, math.inf]),
                "str": r.choice(["", "x", "MSGQ01", "é" * 3]),
                "bytes": r.choice([b"", b"\x00", b"zz"])}[kind]

    def accepted(self, name: str, types: tuple[type, ...]):
        """A value of one of ``types`` for field ``name``."""
        r = self.rng
        named = {"structure": STRUCTURES, "to": NODES, "queue": QUEUES, "qtype": QTYPES,
                 "kind": KINDS, "data": DATA, "size": SIZES, "owner": NAMES, "client": NAMES,
                 "wait": TIMES, "lease": TIMES, "delay": TIMES, "not_before": TIMES,
                 "n": [1, 1, 2, 0, -1, 10_001], "limit": [1, 5, 100, 0, -1],
                 "version": [1, 2, 3, 0, 99, -1]}
        if name in named:
            return r.choice(named[name])
        if name == "entry_id":
            return r.choice(self.ids[-20:]) if self.ids and r.random() < 0.8 else r.choice(BAD_IDS)
        t = r.choice(types)
        if t is bool:
            return r.random() < 0.5
        if t is int:
            return r.choice([0, 1, 7, -1, 2**63])
        if t is float:
            return r.choice([0.5, 30.0, math.nan])
        if t is str:
            return r.choice(["OPS1", "", "enabled", "failed", "x" * 100])
        if t is list:
            return (self.commit_ops() if name == "ops"
                    else [r.choice(["inc", "i2"]), r.choice([1, 2, 2**63, -1])]
                    if name == "key" else [r.randrange(100), r.choice(QUEUES), 7])
        if t is dict:
            return {"queue": r.choice(QUEUES), "n": r.choice([1, 2])}
        return None

    def fields(self, spec: requests.Spec) -> dict:
        """The fields of ``spec``: mostly well formed (each required one, optional ones
        or not, of an accepted type), else each missing, accepted or of another type,
        and sometimes one more."""
        r = self.rng
        fields, mangled = {}, r.random() < 0.25
        for name, (types, default) in spec.items():
            if mangled:
                how = r.choice(["accepted"] * 4 + ["other", "missing"])
            else:
                how = "accepted" if default is requests.REQUIRED or r.random() < 0.5 else ""
            if how == "accepted":
                fields[name] = self.accepted(name, types)
            elif how == "other":
                fields[name] = self.other()
        if mangled and r.random() < 0.5:
            fields[r.choice(["extra", "op", "id", "structure"])] = self.other()
        return fields

    def commit_ops(self) -> list:
        r = self.rng
        ops = []
        for _ in range(r.randrange(5)):
            op = r.choice(list(requests.COMMIT_OPS))
            ops.append({"op": op, **self.fields(requests.COMMIT_OPS[op])}
                       if r.random() < 0.9 else self.other())
        return ops

    def step(self) -> tuple[str, bytes | dict]:
        """The node a step goes to, and the request (or garbage) it sends."""
        r = self.rng
        node = r.choice(list(OTHER_NODE))
        if r.random() < 0.03:
            return node, r.choice(GARBAGE)
        op = r.choice([op for op in requests.OPS if SPARK or op != "checkpoint"]
                      + ["put", "read", "delete", "move_structure"] * 3)
        fields = self.fields(requests.OPS[op])
        if op == "recover" and not SPARK:  # without purge it runs a Spark job
            fields["purge"] = True
        return node, {"op": op, **fields}


@pytest.fixture(scope="module")
def group(etcd_server):
    data = shared_data(keep=bool(SECONDS))  # a long run's, removed here if it passed
    nodes = {name: Node(name, data, etcd_server.endpoint, group="FUZZG", prefer=PREFER,
                        daemon_keys=KEYS, standby=standby)
             for name, standby in (("NODE1", "cold"), ("NODE2", "warm"))}
    try:
        nodes["NODE1"].start()
        nodes["NODE1"].wait_for("takeover_done", structure="MSGQ01", timeout=30)
        nodes["NODE2"].start()
        nodes["NODE2"].wait_for("warm_standby_loaded", structure="MSGQ01", timeout=60)
        yield nodes
    finally:
        for node in nodes.values():
            node.cleanup()
        if not FAILED:
            shutil.rmtree(data.parent, ignore_errors=True)


FAILED: list[int] = []  # the seed a sequence failed at
CLIENTS = (f"OPS{n}" for n in itertools.count())


def operator(node: Node) -> Raw:
    """A fresh operator connection to ``node`` (a new name: an old one may still be held)."""
    raw = Raw(node.socket)
    assert raw.register(next(CLIENTS), operator=True)["ok"]
    return raw


def reply_to(raw: Raw, step: bytes | dict, ids: list[int]) -> dict | None:
    """Send one step; its reply, checked, or None if the node closed the connection
    (a protocol error may)."""
    raw.next_id += 1
    raw.sock.settimeout(SPARK_WAIT if SPARK and isinstance(step, dict)
                        and step.get("op") in ("recover", "checkpoint") else 10)
    try:
        if isinstance(step, bytes):
            raw.send(step)
            return None
        raw.send(encode_frame({"id": raw.next_id, **step}))
        reply = raw.receive()
        while reply is not None and "id" not in reply:  # notifications come first
            reply = raw.receive()
    except (BrokenPipeError, ConnectionResetError):
        return None
    if reply is None:
        return None
    if reply.get("ok"):
        result = reply.get("result")
        if isinstance(result, dict) and isinstance(result.get("entry_id"), int):
            ids.append(result["entry_id"])
    else:
        assert reply.get("reason") in REASONS, f"{step} got {reply}"
    return reply


def run_sequence(group: dict[str, Node], seed: int, ids: list[int]) -> None:
    draws = Draws(seed, ids)
    marks = {name: node.mark() for name, node in group.items()}
    raws = {name: operator(node) for name, node in group.items()}
    step = None
    try:
        for _ in range(draws.rng.randrange(1, STEPS + 1)):
            first, step = draws.step()
            for name in (first, OTHER_NODE[first]):
                reply = reply_to(raws[name], step, ids)
                if reply is None:
                    raws[name].close()
                    raws[name] = operator(group[name])
                if reply is None or reply.get("reason") != "NOT_OWNER":
                    break
    except socket.timeout as err:
        raise AssertionError(f"seed {seed}: no answer to {step!r} in time") from err
    finally:
        for raw in raws.values():
            raw.close()
    for name, node in group.items():
        assert node.alive, f"seed {seed}: {name} died: {node.lines[-5:]}"
        pinger = operator(node)
        assert pinger.request("ping")["ok"], f"seed {seed}: {name} does not answer"
        pinger.close()
        lines = node.lines[marks[name]:node.mark()]
        bad = [e for e in lines if e.get("event") in BAD_EVENTS or "exception" in e
               or e.get("level") in ("error", "critical") or folds_apart(e)]
        assert not bad, f"seed {seed}: {name} logged {bad[:5]}"


def folds_apart(event: dict) -> bool:
    """A warm standby whose fold of the log met an effect on a message its rows do
    not hold: the log and what the owner served disagree, whatever the level."""
    return event.get("event") == "warm_standby_failed" and "FoldError" in event.get("error", "")


def seeds() -> Iterator[int]:
    """The suite's fixed seeds; with CQSD_GROUP_FUZZ_SEED its one; with
    CQSD_GROUP_FUZZ_SECONDS as many as fit, from that seed or a random one."""
    if not SECONDS:
        yield from [int(SEED)] if SEED is not None else range(SEQUENCES)
        return
    end = time.monotonic() + SECONDS
    for seed in itertools.count(int(SEED) if SEED is not None else random.randrange(1 << 30)):
        if time.monotonic() > end:
            return
        print(f"group fuzz seed {seed}", flush=True)
        yield seed


@pytest.mark.timeout(300 + SECONDS + (1200 if SPARK else 0))
def test_a_group_answers_whatever_it_is_sent(group):
    ids: list[int] = []
    for seed in seeds():
        try:
            run_sequence(group, seed, ids)
        except AssertionError as failed:
            FAILED.append(seed)
            raise AssertionError(f"{failed}\nthe group's data: {group['NODE1'].data}\n"
                                 + "\n".join(f"{name}'s last lines: {node.lines[-SHOWN:]}"
                                              for name, node in group.items())) from failed
