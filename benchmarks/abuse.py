"""Other clients' request latency while the daemon is abused (issue 11).

Two probe processes put, read and delete one small non-recoverable message, one
request at a time, for the whole run, against one daemon. The run goes through
these phases, each measuring the probes' requests for --seconds, and all of
them --rounds times over, interleaved, so that the machine's own drift (other
jobs on a shared 2-core VM) falls on every phase alike:

  quiet         no abuse
  slow_readers  4 connections that pipeline browses of a 10 KB message and read
                none of the replies, and 4 that keep pipelining and read at ~0.8 MB/s
  slow_writers  50 registered connections, each writing a put a byte a second
  pipeline10k   one connection writing 10,000 browses, then reading the 10,000
                replies, again and again
  flood         one process connecting as fast as it can: it holds every free
                slot up to max_connections, the rest are refused with CLIENT_LIMIT

Per phase: p50/p99/max of the probes' round trips (and the p99 of each round),
p99 over the quiet phase's, round by round and pooled (target: the median of
the rounds' ratios <= 2), the daemon's largest RSS and how much the abuse
added to it, its CPU seconds, and the abuser's own figures (bursts, refusals).

Run: .venv/bin/python benchmarks/abuse.py [--seconds 5] [--rounds 3] [--only flood]
One JSON line per figure on stdout, then a summary (lines starting "# ").
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import _abusers
import _procs
from _durability_servers import process_rss
from server import calibrate, emit, other_cpu, spread, stop_processes

MAX_CLIENTS = 100  # the probes, 8 slow readers, 50 slow writers, a pipeliner
MAX_CONNECTIONS = 128
PROBES = 2
SETTLE = 1.0  # seconds an abuse runs before the probes' requests count (the flood fills up)
READY_TIMEOUT = 60.0  # seconds a process has to connect and say ready
DONE_TIMEOUT = 30.0  # seconds a stopped process has to report
RSS_EVERY = 0.05  # seconds between samples of the daemon's RSS
TARGET = 2.0  # p99 under abuse over quiet p99

ABUSES = {
    "quiet": None,
    "slow_readers": (_abusers.slow_readers, (4, 4)),
    "slow_writers": (_abusers.slow_writers, (50,)),
    "pipeline10k": (_abusers.pipeliner, ()),
    "flood": (_abusers.flood, ()),
}


class Reports:
    """The processes' reports, taken by name and kind; the others wait their turn."""

    def __init__(self, ctx) -> None:
        self.queue = ctx.Queue()
        self.kept: list[tuple] = []

    def take(self, kind: str, name: str, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            for report in self.kept:
                if report[1] == name and report[0] in (kind, "error"):
                    self.kept.remove(report)
                    if report[0] == "error":
                        raise RuntimeError(f"{name} failed:\n{report[2]}")
                    return report
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind!r} report from {name} within {timeout} s")
            try:
                self.kept.append(self.queue.get(timeout=remaining))
            except queue.Empty:
                pass


def largest_rss(pid: int, done: threading.Event, into: list[int]) -> None:
    while not done.wait(RSS_EVERY):
        into.append(process_rss(pid)["rss_mib"])


def run_phases(daemon: _procs.Server, args, lines: list[dict]) -> None:
    ctx = multiprocessing.get_context("spawn")
    reports = Reports(ctx)
    phase, probes_stop = ctx.Value("i", -1), ctx.Event()
    probes = [ctx.Process(target=_abusers.probe, daemon=True, args=(
        f"PROBE{i}", reports.queue, daemon.address, f"PROBEQ{i}", phase, probes_stop))
        for i in range(PROBES)]
    for p in probes:
        p.start()
    windows = []  # (phase, round, largest RSS, its growth, daemon CPU s, abuser's figures)
    try:
        for p in range(PROBES):
            reports.take("ready", f"PROBE{p}", READY_TIMEOUT)
        for round_ in range(args.rounds):
            for name in args.only:
                windows.append((name, round_, *abused_window(
                    daemon, ctx, reports, phase, len(windows), name, args.seconds)))
    finally:
        probes_stop.set()
    samples: dict[int, list[int]] = {}
    for p in range(PROBES):
        for k, values in reports.take("done", f"PROBE{p}", DONE_TIMEOUT)[2].items():
            samples.setdefault(k, []).extend(values)
    stop_processes(probes, probes_stop)
    emit_phases(windows, samples, lines)


def abused_window(daemon, ctx, reports: Reports, phase, k: int, name: str, seconds: float):
    """Run abuse ``name`` while the probes' requests count as window ``k``; returns the
    daemon's largest RSS (MiB), how much of it the abuse added, its CPU seconds over the
    window, and the abuser's figures."""
    stop, abuser, stats = ctx.Event(), None, None
    who = name.upper()[:6]
    before = process_rss(daemon.pid)["rss_mib"]
    try:
        if ABUSES[name] is not None:
            target, extra = ABUSES[name]
            abuser = ctx.Process(target=target, daemon=True,
                                 args=(who, reports.queue, daemon.address, *extra, stop))
            abuser.start()
            reports.take("ready", who, READY_TIMEOUT)
        time.sleep(SETTLE)  # a measurement window, not a synchronisation
        rss, sampled = [], threading.Event()
        sampler = threading.Thread(target=largest_rss, args=(daemon.pid, sampled, rss))
        sampler.start()
        cpu0 = daemon.cpu_seconds()
        phase.value = k
        time.sleep(seconds)  # the measuring window
        phase.value = -1
        cpu = daemon.cpu_seconds() - cpu0
        sampled.set()
        sampler.join()
        if abuser is not None:
            stop_processes([abuser], stop)
            stats = reports.take("done", who, DONE_TIMEOUT)[2]
            abuser = None
        return max(rss, default=0), max(rss, default=before) - before, cpu, stats
    finally:
        if abuser is not None:
            abuser.kill()


def emit_phases(windows: list[tuple], samples: dict[int, list[int]], lines: list[dict]) -> None:
    """One line per phase, its windows of every round together. Its p99 is set
    against the quiet phase's twice: pooled over the run, and round by round (the
    median of each round's ratio to the quiet window just before it), which is
    what the target is judged on, since the machine's load drifts between rounds."""
    def p99(k: int) -> float:
        return spread(samples.get(k, []), 1e3, "us")["p99_us"]

    quiet = [k for k, w in enumerate(windows) if w[0] == "quiet"]
    for name in dict.fromkeys(w[0] for w in windows):
        ks = [k for k, w in enumerate(windows) if w[0] == name]
        mine = [v for k in ks for v in samples.get(k, [])]
        figures = spread(mine, 1e3, "us")
        record = {"bench": "abuse", "phase": name, "samples": len(mine), **figures,
                  "p99_us_by_round": [p99(k) for k in ks],
                  "daemon_rss_max_mib": max(windows[k][2] for k in ks),
                  "daemon_rss_growth_mib": max(windows[k][3] for k in ks),
                  "daemon_cpu_s": round(sum(windows[k][4] for k in ks), 2)}
        if name != "quiet":
            pooled = figures["p99_us"] / spread([v for k in quiet for v in samples.get(k, [])],
                                                1e3, "us")["p99_us"]
            by_round = [round(p99(k) / p99(q), 2) for k, q in zip(ks, quiet, strict=True)]
            paired = statistics.median(by_round)
            record |= {"p99_vs_quiet": round(paired, 2), "p99_vs_quiet_by_round": by_round,
                       "p99_vs_quiet_pooled": round(pooled, 2),
                       "target": f"<= {TARGET}x quiet p99 (median of rounds)",
                       "met": paired <= TARGET}
        stats = [windows[k][5] for k in ks if windows[k][5] is not None]
        if stats:
            record["abuser"] = stats
        emit(record, lines)


def summary(lines: list[dict]) -> list[str]:
    out = []
    for rec in lines:
        if "error" in rec:
            out.append(f"{rec['bench']}: FAILED: {rec['error'].splitlines()[0]}")
        elif rec["bench"] == "abuse":
            verdict = "" if "met" not in rec else f"  [{'met' if rec['met'] else 'MISSED'}]"
            ratio = (f" ({rec['p99_vs_quiet']}x quiet by round, {rec['p99_vs_quiet_pooled']}x "
                     "pooled)" if "p99_vs_quiet" in rec else "")
            out.append(f"{rec['phase']}: p50 {rec['p50_us']} us, p99 {rec['p99_us']} us{ratio}, "
                       f"daemon RSS +{rec['daemon_rss_growth_mib']} MiB "
                       f"(<= {rec['daemon_rss_max_mib']}){verdict}")
        elif rec["bench"] == "machine" and rec.get("during") == "calibration":
            out.append(f"machine: {rec['cpus']} CPUs, a {rec['loop']:,}-step Python loop "
                       f"takes {rec['python_loop_ms']} ms")
        elif rec["bench"] == "machine" and not rec["quiet"]:
            out.append(f"WARNING: other processes used {rec['other_share']:.0%} of the CPUs "
                       "during the run: its figures are pessimistic")
    return out


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--seconds", type=float, default=3.0, help="measuring window of a phase")
    p.add_argument("--rounds", type=int, default=5,
                   help="times every phase runs, interleaved (the machine's load drifts)")
    p.add_argument("--only", nargs="+", choices=list(ABUSES)[1:], default=list(ABUSES)[1:],
                   help="abuses to run (the quiet phase always runs)")
    args = p.parse_args(argv)
    args.only = ["quiet", *args.only]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="cqabuse-"))
    try:
        calibrate(lines)
        with other_cpu("abuse", lines):
            try:
                with _procs.cqsd(tmp, MAX_CLIENTS,
                                 daemon_keys=f"max_connections = {MAX_CONNECTIONS}\n") as daemon:
                    run_phases(daemon, args, lines)
            except Exception as err:  # one line saying why; the run exits 1
                emit({"bench": "abuse", "error": f"{type(err).__name__}: {err}"}, lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    for line in summary(lines):
        print(f"# {line}")
    return 1 if any("error" in rec for rec in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
