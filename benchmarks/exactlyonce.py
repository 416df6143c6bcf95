"""What exactly-once puts cost (issue 27): W1, 1 KiB recoverable puts one at a
time per client (every put waits for its fsync), by 4 producer processes on one
daemon, with idempotency keys (the SDK's default against a daemon whose
``dedup_window`` is on) and without (the same SDK told to send none).

Method. A shared 2-core machine's rate drifts by more than the cost sought over
the seconds of one phase, so the modes alternate in short phases (``--seconds``,
2 by default) in ABBA order (keys, none, none, keys, ...) while the same four
producers stay connected: each pair of adjacent phases gives a ratio, and the
figure is the median of ``--pairs`` such ratios, with their spread (the
interquartile range) as its noise. Each phase also gives the daemon's CPU per
put (/proc/PID/stat, sampled at the phase's edges) and the producers' own CPU
per put (the SDK's side: the clients share the cores, so their cost lowers the
rate too): both less load-bound than the rate. Others on the cores only ever
slow a phase down, so the figures are also given over each mode's best quarter
of phases (the highest rates, the least CPU a put): the least disturbed.

Then, in process and in CPU time, what a key adds to a put on the daemon's path
(checking it, looking it up, writing it into the record and remembering it, and
packing the longer record) and on the SDK's (stamping the request and packing the
longer frame), and the memory a remembered key takes: tracemalloc over 100,000
keys remembered through the daemon's ``Dedup`` (cqsd/server/dedup.py), each from
an incarnation string decoded anew as msgpack decodes it; per client, the
window costs that times its put rate times ``dedup_window``.

Run: .venv/bin/python benchmarks/exactlyonce.py [--pairs 30] [--seconds 2]
One JSON line per phase on stdout, then the medians (lines starting "# ").
With ``--instructions PUTS``, the daemon's instructions a put in each mode instead,
counted under callgrind (``instructions``): the load cannot reach them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import traceback
import tracemalloc
from pathlib import Path
from typing import Any

import _durability_clients as clients
import _procs
from durability import SliceClock, run_processes

PRODUCERS = 4
MODES = ("keys", "no keys")
WINDOW = 120  # seconds: the default dedup_window
SIZE = "4GiB"  # nobody consumes: a quiet machine puts ~600,000 messages in 30 pairs


def schedule(pairs: int) -> list[str]:
    """The modes of the phases, ABBA: a drift in the rate falls on both alike."""
    return [MODES[(i // 2 + i) % 2] for i in range(2 * pairs)]


def producer(address: str, index: int, modes: list[str], seconds: float, grid: Any,
             reports: Any, start: Any) -> None:
    """Put 1 KiB recoverable messages one at a time, phase by phase (a put is
    counted in the phase it starts in); report the puts and CPU seconds of each."""
    import cqsclient

    with cqsclient.connect(address, client=f"PROD{index}") as c:
        assert c._keys.window == WINDOW  # the daemon takes keys
        s = c.structure(clients.STRUCTURE)
        reports.put(("ready", index))
        start.wait(clients.START_TIMEOUT)
        edge, done, phases = grid.value / 1e9, 0, []  # the first phase's start
        while time.monotonic() < edge:
            time.sleep(0.001)
        for mode in modes:
            c._keys.window = WINDOW if mode == "keys" else 0  # 0: as to a daemon taking none
            queue, puts, cpu = f"ONCE{MODES.index(mode)}", 0, time.process_time()
            edge += seconds
            while time.monotonic() < edge:
                s.put(queue, clients.payload(index, done))
                puts += 1
                done += 1
            phases.append((puts, time.process_time() - cpu))
    reports.put(("done", index, "put", phases))


def run(address: str, pid: int, pairs: int, seconds: float, only: str | None = None
        ) -> list[dict]:
    """The phases, one record each; all in mode ``only`` if given (to profile one)."""
    import multiprocessing

    modes = schedule(pairs) if only is None else [only] * (2 * pairs)
    grid = multiprocessing.get_context("spawn").Value("q", 0)
    clock = SliceClock(pid, grid, int(seconds * 1e9), len(modes))
    done = run_processes(_run, [(address, i, modes, seconds, grid) for i in range(PRODUCERS)],
                         len(modes) * seconds + 120, clock)
    out = []
    for i, mode in enumerate(modes):
        puts = sum(d[3][i][0] for d in done)
        client_cpu = sum(d[3][i][1] for d in done)
        server_cpu = clock.cpu[i + 1] - clock.cpu[i]
        out.append({"bench": "exactlyonce", "phase": i + 1, "mode": mode,
                    "puts_per_s": round(puts / seconds, 1),
                    "server_cpu_us_per_put": round(server_cpu / max(puts, 1) * 1e6, 1),
                    "client_cpu_us_per_put": round(client_cpu / max(puts, 1) * 1e6, 1)})
    return out


def _run(*args: Any) -> None:
    reports = args[-2]
    try:
        producer(*args)
    except BaseException:
        reports.put(("error", args[1], traceback.format_exc()))


def _session():
    """A registered client's session, as ``Dedup.key`` takes it: a real one (compiled,
    it refuses anything else), on a journal of its own that it never writes to."""
    from cqsd.server.journal import Journal
    from cqsd.server.session import Session

    journal = Journal(Path(tempfile.mkdtemp(prefix="cqeo")), 1 << 20)
    session = Session("bench", False, 1, 1 << 20, journal, 1 << 20)
    session.client = "PROD1"
    return session


def bytes_per_key(n: int = 100_000) -> float:
    """Bytes of memory one remembered key holds, as the daemon keeps it: through
    ``Dedup``, from an incarnation string decoded anew per request."""
    from cqsd.server.dedup import Dedup

    dedup, session = Dedup(WINDOW), _session()
    incarnation = secrets.token_hex(8)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for seq in range(n):
        fresh = "".join(incarnation)  # a new str per request, as msgpack decodes it
        key = dedup.key(session, "put", [fresh, seq + 1_000_000])
        dedup.note("MSGQ01", key, [seq + 10**18])
        dedup.remember("MSGQ01", dedup.stamp("MSGQ01", None), seq)  # type: ignore[arg-type]
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(dedup.memories["MSGQ01"]) == n
    return used / n


class _Message:
    """What a put leaves on the daemon's heap in W1 (nothing consumes): an object
    the garbage collector tracks, as the structure's entries are."""

    __slots__ = ("entry_id", "where", "data")

    def __init__(self, entry_id: int) -> None:
        self.entry_id, self.where, self.data = entry_id, ["ONCE0"], {"qtype": "TRAN"}


def hot_path_us(n: int = 150_000) -> tuple[float, float]:
    """Microseconds a key adds to one put in the daemon: the dedup room's calls
    (their garbage collection included, while each put leaves a message on the heap
    as W1's do), and packing the record's key field (logstream packs every record
    body)."""
    import gc

    import msgpack

    from cqsd.server.dedup import Dedup

    record = {"s": "MSGQ01", "e": [["P", 10**18, 1, "ONCE0", b"x" * 1024, time.time_ns()]]}
    incarnation = secrets.token_hex(8)

    def puts(keyed: bool) -> float:
        dedup, session = Dedup(WINDOW), _session()
        heap = []
        gc.collect()
        t0 = time.process_time()
        for seq in range(n):
            heap.append(_Message(10**18 + seq))
            if keyed:
                fresh = "".join(incarnation)  # a new str per request, as msgpack decodes it
                key = dedup.key(session, "put", [fresh, seq])
                dedup.recall("MSGQ01", key)
                dedup.note("MSGQ01", key, [10**18 + seq])
                noted = dedup.stamp("MSGQ01", dict(record))
                dedup.remember("MSGQ01", noted, seq)  # type: ignore[arg-type]
        return time.process_time() - t0

    calls = (puts(True) - puts(False)) / n * 1e6
    keyed = dict(record, k=["PROD1", incarnation, 12345, [10**18]])
    t0 = time.process_time()
    for _ in range(n):
        msgpack.packb(record, use_bin_type=True)
    plain = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(n):
        msgpack.packb(keyed, use_bin_type=True)
    packing = (time.process_time() - t0 - plain) / n * 1e6
    return calls, packing


def sdk_key_us(n: int = 200_000) -> float:
    """Microseconds a key adds to one put in the SDK: stamping the request and
    packing the longer frame."""
    from cqsclient import ops
    from cqsclient.keys import Keys
    from cqsproto.codec import encode_frame

    keys, data = Keys(), b"x" * 1024
    keys.window = WINDOW
    timings = {}
    for window in (0, WINDOW):
        keys.window = window
        t0 = time.process_time()
        for _ in range(n):
            call = ops.put("MSGQ01", "ONCE0", data, "fifo", True, None)
            keys.stamp(call)
            encode_frame(call.request)
        timings[window] = time.process_time() - t0
    return (timings[WINDOW] - timings[0]) / n * 1e6


def instructions(puts: int, phases: int = 6) -> dict[str, float]:
    """Instructions the daemon spends a put in each mode, counted by valgrind's
    callgrind, which the machine's load does not change (the rate's noise on a
    shared machine is larger than the cost sought): one producer puts ``puts``
    messages a phase, ABBA, and ``callgrind_control`` zeroes the daemon's counts
    before a phase and dumps them after it. Per mode, the median of its phases. The
    data directory is on /dev/shm: a disk's fsyncs vary in time, and with them the
    journal's choice between an fsync inline and one in its thread, which moves the
    count by more than keys do."""
    import subprocess

    import cqsclient

    valgrind = _procs.debian_binary("valgrind", "valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind")
    counts: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="cqsonce", dir="/dev/shm") as tmp:
        out = Path(tmp) / "callgrind"
        under = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
        with _procs.cqsd(Path(tmp), 2, daemon_keys=f"dedup_window = {WINDOW}\n",
                         structure_size=SIZE, under=under) as d, \
                cqsclient.connect(d.address, client="PROD1") as c:
            s = c.structure(clients.STRUCTURE)
            for n in range(300):  # the daemon's first puts warm its caches and code paths
                s.put("WARM", clients.payload(0, n))

            def control(*args: str) -> None:
                subprocess.run(["callgrind_control", *args, str(d.pid)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            for phase, mode in enumerate(schedule(phases // 2)):
                c._keys.window = WINDOW if mode == "keys" else 0
                control("--zero")
                for n in range(puts):
                    s.put(f"ONCE{MODES.index(mode)}", clients.payload(0, n))
                control(f"--dump=phase{phase}")
                total = _procs.callgrind_total(Path(f"{out}.{d.pid}.{phase + 1}"))
                counts[mode].append(total / puts)
                print(json.dumps({"bench": "exactlyonce", "phase": phase + 1, "mode": mode,
                                  "instructions_per_put": round(total / puts)}), flush=True)
    return {mode: statistics.median(values) for mode, values in counts.items()}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], statistics.median(values), q[2]


def top_quarter(values: list[float], high: bool = False) -> float:
    """The mean of the best quarter of ``values`` (the highest, or the lowest)."""
    ranked = sorted(values, reverse=high)
    return statistics.fmean(ranked[:max(1, len(ranked) // 4)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30, help="phases of each mode (30)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds a phase (2)")
    parser.add_argument("--instructions", type=int, metavar="PUTS",
                        help="count the daemon's instructions a put under callgrind instead, "
                        "PUTS puts a phase (2000 takes about 2 minutes)")
    parser.add_argument("--only", choices=MODES, help="every phase in this mode, the "
                        "daemon's pid on stderr: to profile one mode (py-spy record -p PID)")
    args = parser.parse_args()
    if args.instructions:
        per_put = instructions(args.instructions)
        cost = 100 * (per_put["keys"] / per_put["no keys"] - 1)
        print(json.dumps({"bench": "exactlyonce", "instructions_per_put": per_put,
                          "instructions_cost_pct": round(cost, 1)}))
        print(f"# the daemon's instructions a put: {per_put['keys']:,.0f} with keys, "
              f"{per_put['no keys']:,.0f} without: keys cost {cost:.1f}% "
              f"({per_put['keys'] - per_put['no keys']:,.0f} a put)")
        return 0
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cqsonce") as tmp, \
            _procs.cqsd(Path(tmp), PRODUCERS + 2, daemon_keys=f"dedup_window = {WINDOW}\n",
                        structure_size=SIZE) as d:
        if args.only:
            print(f"daemon pid {d.pid}", file=sys.stderr, flush=True)
        lines = run(d.address, d.pid, args.pairs, args.seconds, args.only)
    for line in lines:
        print(json.dumps(line))
    if args.only:
        return 0
    by_mode = {mode: [x for x in lines if x["mode"] == mode] for mode in MODES}
    for mode, mine in by_mode.items():
        print(f"# {mode}: median {statistics.median(x['puts_per_s'] for x in mine):.0f} puts/s, "
              f"{statistics.median(x['server_cpu_us_per_put'] for x in mine):.0f} µs daemon CPU "
              f"and {statistics.median(x['client_cpu_us_per_put'] for x in mine):.0f} µs "
              f"producer CPU a put, over {len(mine)} phases of {args.seconds:g} s")
    # each pair of adjacent phases (one of each mode, ABBA): what keys cost in it
    cost: dict[str, list[float]] = {"rate": [], "server": [], "client": []}
    for a, b in zip(lines[::2], lines[1::2], strict=True):
        k, n = (a, b) if a["mode"] == "keys" else (b, a)
        cost["rate"].append(100 * (1 - k["puts_per_s"] / n["puts_per_s"]))
        cost["server"].append(100 * (k["server_cpu_us_per_put"] / n["server_cpu_us_per_put"] - 1))
        cost["client"].append(100 * (k["client_cpu_us_per_put"] / n["client_cpu_us_per_put"] - 1))
    summary: dict[str, Any] = {
        "bench": "exactlyonce", "pairs": len(cost["rate"]), "seconds": args.seconds,
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    for what, values in cost.items():
        q1, med, q3 = quartiles(values)
        summary[f"{what}_cost_pct"] = {"q1": round(q1, 1), "median": round(med, 1),
                                       "q3": round(q3, 1)}
    # Others on the cores only ever slow a phase down: the best quarter of each
    # mode's phases (highest rate, least CPU a put) is the least disturbed.
    best = {mode: {"puts_per_s": top_quarter([x["puts_per_s"] for x in mine], high=True),
                   "server": top_quarter([x["server_cpu_us_per_put"] for x in mine]),
                   "client": top_quarter([x["client_cpu_us_per_put"] for x in mine])}
            for mode, mine in by_mode.items()}
    k, n = best["keys"], best["no keys"]
    summary["best_quarter"] = {
        "rate_cost_pct": round(100 * (1 - k["puts_per_s"] / n["puts_per_s"]), 1),
        "server_cost_pct": round(100 * (k["server"] / n["server"] - 1), 1),
        "client_cost_pct": round(100 * (k["client"] / n["client"] - 1), 1),
        **{f"{m}_{f}": round(v, 1) for m, fs in (("keys", k), ("none", n)) for f, v in fs.items()}}
    print(json.dumps(summary))
    bq = summary["best_quarter"]
    print(f"# keys cost {summary['rate_cost_pct']['median']:.1f}% of W1 throughput (median of "
          f"{len(cost['rate'])} pairs, quartiles {summary['rate_cost_pct']['q1']:.1f} to "
          f"{summary['rate_cost_pct']['q3']:.1f}; target: at most 5%), "
          f"{summary['server_cost_pct']['median']:+.1f}% daemon CPU and "
          f"{summary['client_cost_pct']['median']:+.1f}% producer CPU a put")
    print(f"# best quarter of each mode's phases: keys cost {bq['rate_cost_pct']:.1f}% "
          f"({k['puts_per_s']:.0f} against {n['puts_per_s']:.0f} puts/s), "
          f"{bq['server_cost_pct']:+.1f}% daemon CPU ({k['server']:.0f} against "
          f"{n['server']:.0f} µs) and {bq['client_cost_pct']:+.1f}% producer CPU a put")
    calls, packing = hot_path_us()
    sdk = sdk_key_us()
    cpu = statistics.median(x["server_cpu_us_per_put"] for x in by_mode["no keys"])
    ccpu = statistics.median(x["client_cpu_us_per_put"] for x in by_mode["no keys"])
    print(json.dumps({"bench": "exactlyonce", "key_calls_us": round(calls, 2),
                      "key_packing_us": round(packing, 2), "sdk_key_us": round(sdk, 2)}))
    print(f"# a key adds {calls + packing:.1f} µs to a put in the daemon ({calls:.1f} dedup, "
          f"{packing:.1f} packing): {100 * (calls + packing) / cpu:.1f}% of its {cpu:.0f} µs; "
          f"{sdk:.1f} µs in the SDK: {100 * sdk / ccpu:.1f}% of a producer's {ccpu:.0f} µs")
    per_key = bytes_per_key()
    print(json.dumps({"bench": "exactlyonce", "bytes_per_key": round(per_key)}))
    print(f"# a remembered key: {per_key:.0f} bytes; a client putting 100/s holds "
          f"{per_key * 100 * WINDOW / 2**20:.1f} MiB over a {WINDOW} s window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
