"""Planned moves and placement over two nodes (issue 27).

A real etcd and two warm nodes sharing a data directory (the group tests' harness,
``tests/group``), ``lease`` 5 s.

``pause``: the pair MOVQ01 holds ``--messages`` recoverable 1 KiB messages
(``put_batch``); a reconnecting SDK client given both addresses puts one message
at a time while ``cqsclient``'s ``move_structure`` moves the pair ``--moves``
times between the nodes. Per move, the longest gap between two acknowledged puts
around it (the pause a client sees), and the move's own ``seconds`` (from the
request to the target serving, warm-up of the target included). p50 and max.
Per move too, ``phases``: where the pause went, from the nodes' events, in seconds
after the putter's last acknowledgement before the gap: ``stop`` (the owner stops
serving the pair), ``released`` (its owner key deleted), ``acquired`` (the
target won the key), ``sealed``, ``served`` (``takeover_done``), ``resumed`` (the
putter's next acknowledgement); ``hops``, the SDK's moves between nodes in the
gap; ``takeover_*``, the target's own phases. A phase before 0 belongs to a
move whose own pause was shorter than another gap in the window.

``spread``: ``--producers`` producer and as many consumer processes, durable
1 KiB (put; read then delete), half on each of two structures, for ``--seconds``,
with the structures on two nodes and then both on one (moved there with
``move_structure``), alternating for ``--rounds``: messages consumed per second
and the nodes' CPU µs per message (both processes, from ``/proc``). On this
machine the clients and both nodes share the cores.

Run: nice -n 5 .venv/bin/python benchmarks/moves.py [--only pause|spread]
     [--messages N] [--moves N] [--producers N] [--seconds S] [--rounds N] [--trace]
One JSON line per move or round, then a summary (lines starting "# ").
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cqsclient  # noqa: E402
from benchmarks._group import etcd as etcd_server  # noqa: E402
from benchmarks._group import group_nodes  # noqa: E402
from benchmarks._procs import process_cpu_seconds  # noqa: E402
from tests.group.cluster import Node  # noqa: E402
from tests.group.etcdserver import EtcdServer  # noqa: E402

NAMES = ("NODE1", "NODE2")
STRUCTURES = "".join(f"""
[[structure]]
name = "{name}"
size = "256MiB"
initsize = "256MiB"
overflow_threshold = 100
prefer = ["NODE1", "NODE2"]
""" for name in ("MOVQ01", "MOVQ02"))
PAYLOAD = b"x" * 1024
LEASE = 5


def start_nodes(etcd: EtcdServer) -> dict[str, Node]:
    nodes = group_nodes(etcd, NAMES, "MV", STRUCTURES, lease=LEASE, standby="warm",
                        daemon_keys="resync_grace = 30")
    for node in nodes.values():
        node.start()
    nodes["NODE1"].wait_for("takeover_done", count=2, timeout=60)
    nodes["NODE2"].wait_for("warm_standby_loaded", count=2, timeout=60)
    # a node calls home the pairs that prefer it in its first lease after joining
    # (GroupNode._watch): a move away from it meanwhile would be undone
    joined = max(n.wait_for("node_joined")[0]["seen"] for n in nodes.values())
    time.sleep(max(0.0, joined + LEASE + 1 - time.monotonic()))
    return nodes


def owner(node: Node, structure: str) -> str | None:
    with cqsclient.connect(node.address, client="LOOK", operator=True) as c:
        return {r["structure"]: r["owner"] for r in c.query("owners")}[structure]


def move(node: Node, structure: str, to: str) -> float:
    """The move's seconds; asked again while the asked node does not yet see ``to`` live
    (its view of the group is a poll)."""
    deadline = time.monotonic() + 30
    with cqsclient.connect(node.address, client="MOVER", operator=True, timeout=120) as c:
        while True:
            try:
                return float(c.move_structure(structure, to)["seconds"])
            except cqsclient.errors.InvalidRequest as err:
                if "is not live" not in err.message or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class Hops(logging.Handler):
    """When the SDK moved its connection to another node (its "reconnected" lines)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("cqsd reconnected"):
            self.at.append(record.created)


HOPS = Hops()
logging.getLogger("cqsclient").addHandler(HOPS)
logging.getLogger("cqsclient").setLevel(logging.INFO)


class Putter(threading.Thread):
    """Puts one message at a time; keeps when each was acknowledged."""

    def __init__(self, addresses: str) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.acks: list[float] = []
        self.walls: list[float] = []  # the same acknowledgements by the wall clock (the logs')
        self.stop = threading.Event()

    def run(self) -> None:
        with cqsclient.connect(self.addresses, client="PUTTER", timeout=30,
                               reconnect=True) as c:
            s = c.structure("MOVQ01")
            while not self.stop.is_set():
                s.put("PAUSE", b"p")
                self.acks.append(time.monotonic())
                self.walls.append(time.time())

    def longest_gap(self, start: float, end: float) -> tuple[float, float, float]:
        """The longest gap between two acknowledgements in [start, end]: its seconds and
        its two ends by the wall clock."""
        inside = [i for i, t in enumerate(self.acks) if start <= t <= end]
        if len(inside) < 2:
            return end - start, 0.0, 0.0
        i = max(inside[:-1], key=lambda i: self.acks[i + 1] - self.acks[i])
        return self.acks[i + 1] - self.acks[i], self.walls[i], self.walls[i + 1]


def _wall(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def phases(nodes: dict[str, Node], marks: dict[str, int], gap: tuple[float, float, float],
           trace: bool = False) -> dict[str, float]:
    """Where a move's pause went, from the nodes' events: seconds after the putter's last
    acknowledgement before the gap at which the owner stopped serving the pair, deleted
    its owner key, the target won it (etcd txn), sealed, served (takeover_done), and the
    putter's next acknowledgement; with the takeover's own phases."""
    seen: dict[str, dict] = {}
    for name, node in nodes.items():
        for e in node.lines[marks[name]:]:
            if e.get("event") in ("structure_released", "owner_acquired", "structure_sealed",
                                  "takeover_done") and e.get("structure") == "MOVQ01":
                seen.setdefault(e["event"], e)
    _, last, resumed = gap
    if trace:  # every event of the nodes during the move, by when after the last ack
        for name, node in nodes.items():
            for e in node.lines[marks[name]:]:
                if e.get("event") not in ("text",):
                    print("   ", name, round(_wall(e) - last, 3) if "timestamp" in e else "",
                          json.dumps({k: v for k, v in e.items()
                                      if k not in ("seen",)})[:300])
    out: dict[str, float] = {}
    if "structure_released" in seen:
        e = seen["structure_released"]
        out["stop"] = _wall(e) - e["drain_seconds"] - last
    for event, label in (("structure_released", "released"), ("owner_acquired", "acquired"),
                         ("structure_sealed", "sealed"), ("takeover_done", "served")):
        if event in seen:
            out[label] = _wall(seen[event]) - last
    out["resumed"] = resumed - last
    out["hops"] = len([t for t in HOPS.at if last <= t <= resumed])
    out = {k: round(v, 3) for k, v in out.items()}
    if "takeover_done" in seen:
        out |= {f"takeover_{k}": v for k, v in seen["takeover_done"]["phases"].items()}
    return out


def pause(nodes: dict[str, Node], args: argparse.Namespace) -> dict:
    with cqsclient.connect(nodes["NODE1"].address, client="LOADER", timeout=120) as c:
        s = c.structure("MOVQ01")
        for _ in range(args.messages // 1000):
            s.put_batch("BULK", [PAYLOAD] * 1000)
    putter = Putter(",".join(n.address for n in nodes.values()))
    putter.start()
    pauses, seconds = [], []
    at = "NODE1"
    for i in range(args.moves):
        to = "NODE2" if at == "NODE1" else "NODE1"
        while len(putter.acks) < 20:
            time.sleep(0.01)
        marks = {name: len(node.lines) for name, node in nodes.items()}
        start = time.monotonic()
        took = move(nodes["NODE1"], "MOVQ01", to)
        done = len(putter.acks)
        while len(putter.acks) < done + 20:  # the putter is going again
            time.sleep(0.01)
        gap = putter.longest_gap(start - 0.05, time.monotonic())
        pauses.append(gap[0])
        seconds.append(took)
        print(json.dumps({"bench": "move", "n": i + 1, "to": to, "messages": args.messages,
                          "longest_pause_s": round(gap[0], 3), "move_s": took,
                          "phases": phases(nodes, marks, gap, args.trace)}), flush=True)
        at = to
    putter.stop.set()
    putter.join(30)
    return {"bench": "pause", "moves": args.moves, "messages": args.messages,
            "pause_p50_s": round(statistics.median(pauses), 3),
            "pause_max_s": round(max(pauses), 3),
            "move_p50_s": round(statistics.median(seconds), 3),
            "move_max_s": round(max(seconds), 3)}


def _worker(addresses: str, structure: str, role: str, seconds: float, out) -> None:
    with cqsclient.connect(addresses, client=f"{role}{uuid.uuid4().hex[:6]}",
                           timeout=30) as c:
        s = c.structure(structure)
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            if role == "P":
                s.put("WORK", PAYLOAD)
                n += 1
            else:
                m = s.read("WORK", wait=0.5)
                if m is not None:
                    s.delete(m.entry_id)
                    n += 1
        out.put((role, n))


def one_round(nodes: dict[str, Node], args: argparse.Namespace, layout: str) -> dict:
    addresses = ",".join(n.address for n in nodes.values())
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(addresses, f"MOVQ0{1 + i % 2}", role,
                                               args.seconds, out))
             for i in range(args.producers) for role in ("P", "C")]
    pids = {name: n.proc.pid for name, n in nodes.items()}
    cpu0, t0 = {name: process_cpu_seconds(p) for name, p in pids.items()}, time.monotonic()
    for p in procs:
        p.start()
    counts = [out.get(timeout=args.seconds + 60) for _ in procs]
    wall = time.monotonic() - t0
    cpu = {name: process_cpu_seconds(p) - cpu0[name] for name, p in pids.items()}
    for p in procs:
        p.join(10)
    consumed = sum(n for role, n in counts if role == "C")
    produced = sum(n for role, n in counts if role == "P")
    return {"bench": "spread", "layout": layout, "produced": produced, "consumed": consumed,
            "msgs_per_s": round(consumed / args.seconds), "wall_s": round(wall, 1),
            "server_cpu_us_per_msg": round(sum(cpu.values()) / max(1, produced + consumed) * 2e6),
            # each node's own: with a core each, the busiest bounds the rate
            "node_cpu_us_per_msg": {name: round(seconds / max(1, produced + consumed) * 2e6)
                                    for name, seconds in cpu.items()}}


def spread(nodes: dict[str, Node], args: argparse.Namespace) -> dict:
    for name, to in (("MOVQ01", "NODE1"), ("MOVQ02", "NODE1")):
        if owner(nodes["NODE1"], name) != to:
            move(nodes["NODE1"], name, to)
    rounds: dict[str, list[dict]] = {"two nodes": [], "one node": []}
    for _ in range(args.rounds):
        for layout, to in (("two nodes", "NODE2"), ("one node", "NODE1")):
            # the old owner stands by for the pair again, loaded from the log: not in
            # the round (the moves are the other benchmark's; this one is the layouts')
            old = nodes["NODE1" if to == "NODE2" else "NODE2"]
            after = len(old.lines)
            move(nodes["NODE1"], "MOVQ02", to)
            old.wait_for("warm_standby_loaded", structure="MOVQ02", after=after, timeout=120)
            r = one_round(nodes, args, layout)
            rounds[layout].append(r)
            print(json.dumps(r), flush=True)
    two, one = (statistics.median(r["msgs_per_s"] for r in rounds[k])
                for k in ("two nodes", "one node"))
    return {"bench": "spread_summary", "two_nodes_msgs_per_s": two, "one_node_msgs_per_s": one,
            "ratio": round(two / one, 2),
            "cpu_us_per_msg_two": statistics.median(
                r["server_cpu_us_per_msg"] for r in rounds["two nodes"]),
            "cpu_us_per_msg_one": statistics.median(
                r["server_cpu_us_per_msg"] for r in rounds["one node"]),
            # a core per node: each node's rate bound is 10^6 / its µs a message moved
            "bound_with_a_core_each": {
                layout: round(statistics.median(
                    1e6 / max(r["node_cpu_us_per_msg"].values()) for r in rs))
                for layout, rs in rounds.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("pause", "spread"))
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trace", action="store_true",
                    help="pause: print the nodes' events of each move (seconds after the "
                         "putter's last acknowledgement before its longest gap)")
    args = ap.parse_args()
    summaries = []
    with etcd_server("mvetcd") as etcd:
        for bench in ("pause", "spread"):
            if args.only not in (None, bench):
                continue
            nodes = start_nodes(etcd)
            try:
                summaries.append((pause if bench == "pause" else spread)(nodes, args))
            finally:
                for node in nodes.values():
                    node.cleanup()
    for s in summaries:
        print("# " + json.dumps(s))


if __name__ == "__main__":
    main()
