"""Takeover after a SIGKILL of the owner (issue 26): cold and warm standbys.

A real etcd and two nodes sharing a data directory (the group tests' harness,
``tests/group``), ``lease`` 5 s. The owner of MSGQ01 is preloaded with
``--messages`` recoverable 1 KiB messages (``put_batch``); then, ``--takeovers``
times, the owner is SIGKILLed while a reconnecting SDK client
(``cqsclient.connect("unix://a,unix://b", reconnect=True, keepalive=...)``)
puts one message at a time. Figures per standby mode:

- ``seconds``: from the kill to the first put acknowledged afterwards (by the
  new owner: the old one is dead), p50 and max;
- each phase of the new owner's ``takeover_done`` event (detect, seal, load for a
  cold standby; tail and restore for a warm one; listen), p50 and max;
- ``standby_cpu_per_s``: the standby's CPU seconds per second (whole process,
  from ``/proc``) while the owner takes the putter's puts before the first kill.

With ``--throughput``: ``--producers`` processes put 1 KiB recoverable messages
(``--batch`` at a time) for ``--seconds`` into a single daemon and into the
owner of a group with a warm standby on the same machine, both up all along,
slice by slice for ``--rounds`` pairs; the median of the pairs' ratios (the
issue: >= 0.9), each daemon's CPU per put and the standby's CPU.

The killed node is started again as the standby (and, warm, waits until it has
loaded the pair) before the next kill.

Run: nice -n 5 .venv/bin/python benchmarks/takeover.py [--messages N]
     [--takeovers N] [--modes cold,warm] [--lease S]
     nice -n 5 .venv/bin/python benchmarks/takeover.py --throughput [--producers N]
     [--batch N] [--seconds S] [--rounds N]
One JSON line per takeover, then a summary per mode (lines starting "# ").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cqsclient  # noqa: E402
from benchmarks._group import etcd as etcd_server  # noqa: E402
from benchmarks._group import group_nodes  # noqa: E402
from tests.group.cluster import Node  # noqa: E402
from tests.group.etcdserver import EtcdServer  # noqa: E402

STRUCTURES = """
[[structure]]
name = "MSGQ01"
size = "{size}"
initsize = "{size}"
overflow_threshold = 100
prefer = ["NODE1", "NODE2"]
"""


def nodes_of(etcd: EtcdServer, group: str, lease: int, standby: str, size: str) -> list[Node]:
    return list(group_nodes(etcd, ("NODE1", "NODE2"), group, STRUCTURES.format(size=size),
                            lease=lease, standby=standby).values())


class Putter(threading.Thread):
    """Puts one message at a time through a reconnecting client; keeps ack times."""

    def __init__(self, addresses: str, lease: int) -> None:
        super().__init__(daemon=True)
        self.addresses, self.lease = addresses, lease
        self.acks: list[float] = []
        self.doubts: list[str] = []  # puts that failed or are in doubt (a takeover)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with cqsclient.connect(self.addresses, client="BENCH", reconnect=True,
                                   keepalive=self.lease / 2, timeout=60) as c:
                s = c.structure("MSGQ01")
                while not self.stop.is_set():
                    try:
                        s.put("TRANB", bytes(1024))
                    except cqsclient.errors.CQSError as err:  # in doubt: the next one
                        self.doubts.append(repr(err))
                        time.sleep(0.01)
                        continue
                    self.acks.append(time.monotonic())
        except BaseException as err:  # reported by the main thread
            self.error = err

    def first_after(self, t: float, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [a for a in self.acks[-50:] if a > t]
            if later:
                return later[0]
            if self.error is not None:
                raise RuntimeError(f"the putter failed: {self.error!r}")
            time.sleep(0.01)
        raise RuntimeError(f"no put acknowledged within {timeout} s of the kill")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ready_standby(n: Node, standby: str, after: int) -> None:
    if standby == "warm":
        n.wait_for("warm_standby_loaded", after=after, structure="MSGQ01", timeout=600)


def run_mode(standby: str, args: argparse.Namespace, etcd: EtcdServer) -> dict:
    size = f"{max(256, args.messages * 3 // 1024 + 256)}MiB"
    nodes = nodes_of(etcd, "B", args.lease, standby, size)
    results: list[dict] = []
    try:
        nodes[0].start()
        nodes[0].wait_for("takeover_done", structure="MSGQ01", timeout=60)
        with cqsclient.connect(nodes[0].address, client="LOAD", timeout=120) as c:
            s = c.structure("MSGQ01")
            for at in range(0, args.messages, 1000):
                s.put_batch("TRANX", [bytes(1024)] * min(1000, args.messages - at))
        nodes[1].start()
        ready_standby(nodes[1], standby, 0)
        putter = Putter(",".join(n.address for n in nodes), args.lease)
        putter.start()
        time.sleep(2)
        before, t0 = cpu_seconds(nodes[1].proc.pid), time.monotonic()
        n0 = len(putter.acks)
        time.sleep(5)
        standby_cpu = (cpu_seconds(nodes[1].proc.pid) - before) / (time.monotonic() - t0)
        rate = (len(putter.acks) - n0) / (time.monotonic() - t0)
        owner = 0
        for i in range(args.takeovers):
            other = nodes[1 - owner]
            mark = len(other.lines)
            time.sleep(1)  # the putter runs against the owner before each kill
            killed = time.monotonic()
            nodes[owner].proc.send_signal(signal.SIGKILL)
            nodes[owner].proc.wait()  # after this, only the new owner acknowledges
            acked = putter.first_after(time.monotonic())
            (done,) = other.wait_for("takeover_done", after=mark, structure="MSGQ01",
                                     timeout=120)
            row = {"mode": standby, "takeover": i, "messages": args.messages,
                   "seconds": round(acked - killed, 3), **done["phases"]}
            print(json.dumps(row), flush=True)
            results.append(row)
            restart_mark = len(nodes[owner].lines)
            nodes[owner].start()
            ready_standby(nodes[owner], standby, restart_mark)
            owner = 1 - owner
        putter.stop.set()
        putter.join(60)
    finally:
        for n in nodes:
            n.cleanup()
    summary: dict = {"mode": standby, "messages": args.messages, "takeovers": len(results),
                     "standby_cpu_per_s": round(standby_cpu, 3), "puts_per_s": round(rate)}
    for k in ("seconds", "detect", "seal", "load", "tail", "restore", "listen"):
        values = [r[k] for r in results if k in r]
        if values:
            summary[k] = {"p50": round(statistics.median(values), 3), "max": max(values)}
    return summary


def _producer(address: str, seconds: float, batch: int, out) -> None:
    """One producer process: recoverable 1 KiB puts, ``batch`` pipelined at a time."""
    with cqsclient.connect(address, client=f"TP{os.getpid()}", timeout=60) as c:
        s = c.structure("MSGQ01")
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            if batch == 1:
                s.put("TRANT", bytes(1024))
            else:
                s.put_batch("TRANT", [bytes(1024)] * batch)
            done += batch
    out.put(done)


def throughput(address: str, args: argparse.Namespace) -> float:
    """Durable puts per second of ``args.producers`` processes against ``address``."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_producer, args=(address, args.seconds, args.batch, out))
             for _ in range(args.producers)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=args.seconds + 120) for _ in procs)
    for p in procs:
        p.join(60)
    return total / args.seconds


def run_throughput(args: argparse.Namespace, etcd: EtcdServer) -> dict:
    """The owner's durable throughput with a warm standby beside it against a single
    daemon's, same run: both stay up the whole time and the producers go to one then
    the other in slices of ``--seconds``, in pairs ordered ABBA, so that the disk's
    and the machine's load (fsync latency sets the pace at batch 1) weigh on both
    alike. Per slice the daemon's CPU per put; the standby's CPU over the run."""
    from tests.daemon.harness import Daemon

    size = "2GiB"
    rows: dict[str, list[float]] = {"single": [], "warm_owner": []}
    cpu_per_put: dict[str, list[float]] = {"single": [], "warm_owner": []}
    single = Daemon(structures=STRUCTURES.format(size=size).replace(
        'prefer = ["NODE1", "NODE2"]', ""))
    nodes = nodes_of(etcd, "T", args.lease, "warm", size)
    try:
        single.start()
        nodes[0].start()
        nodes[0].wait_for("takeover_done", structure="MSGQ01", timeout=60)
        nodes[1].start()
        ready_standby(nodes[1], "warm", 0)
        targets = {"single": single, "warm_owner": nodes[0]}
        before, t0 = cpu_seconds(nodes[1].proc.pid), time.monotonic()
        for r in range(args.rounds):
            for kind in (("single", "warm_owner") if r % 2 == 0 else ("warm_owner", "single")):
                pid = targets[kind].proc.pid
                c0 = cpu_seconds(pid)
                rate = throughput(targets[kind].address, args)
                rows[kind].append(rate)
                cpu_per_put[kind].append((cpu_seconds(pid) - c0) / (rate * args.seconds))
            print(json.dumps({k: round(v[-1]) for k, v in rows.items()}), flush=True)
        standby_cpu = (cpu_seconds(nodes[1].proc.pid) - before) / (time.monotonic() - t0)
    finally:
        single.cleanup()
        for n in nodes:
            n.cleanup()
    ratios = [w / s for s, w in zip(rows["single"], rows["warm_owner"], strict=True)]
    return {"figure": "throughput", "producers": args.producers, "batch": args.batch,
            "slices": args.rounds, "seconds": args.seconds,
            "single_puts_per_s": round(statistics.median(rows["single"])),
            "warm_owner_puts_per_s": round(statistics.median(rows["warm_owner"])),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)],
            "cpu_us_per_put": {k: round(statistics.median(v) * 1e6, 1)
                               for k, v in cpu_per_put.items()},
            "standby_cpu_per_s": round(standby_cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--takeovers", type=int, default=20)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--lease", type=int, default=5)
    parser.add_argument("--throughput", action="store_true",
                        help="instead: the owner's durable throughput with a warm standby "
                             "against a single daemon's")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with etcd_server("cqetcd") as etcd:
        if args.throughput:
            summaries = [run_throughput(args, etcd)]
        else:
            summaries = [run_mode(mode, args, etcd) for mode in args.modes.split(",")]
    for s in summaries:
        print("# " + json.dumps(s))


if __name__ == "__main__":
    main()
