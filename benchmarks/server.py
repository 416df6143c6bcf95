"""cqsd daemon benchmarks, with Redis 7 measured in the same run for comparison.

Three figures (issue targets in brackets):

1. throughput  - 1 KiB non-recoverable messages, 4 producer and 4 consumer
   processes, end-to-end put + read + delete messages per second. cqsd:
   put_batch of 100; read_batch(100, wait) and one unit_of_work commit deleting
   the batch. Redis: pipelined LPUSH; pipelined BLMOVE/LMOVE into a processing
   list, then pipelined LREM (the reliable-queue pattern). [cqsd >= Redis]
2. roundtrip   - one client, one request at a time: p50/p99 of a small put and
   of a read + delete pair; Redis LPUSH (and LMOVE + LREM) for context.
   [p50 < 150 us, p99 < 1 ms]
3. fanout      - 32 client processes registered for one queue; a put makes it
   non-empty, each client stamps its notification; per round the latency is
   the slowest client's receipt minus the put's start. [p99 < 5 ms]

Run: .venv/bin/python benchmarks/server.py [--quick] [--only throughput ...]
     [--no-redis] [--profile DIR]
One JSON line per figure on stdout, then a summary (lines starting "# ").
Each benchmark gets a fresh daemon (and redis-server) in a temporary directory,
on Unix sockets only; every wait is bounded, and servers, client processes and
the directory are cleaned up whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import queue
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import _clients
import _procs
from _clients import RECEIPT, STRUCTURE, Board, Worker
from _procs import percentile

ROUNDTRIP_QUEUE = "BENCHRT"
SMALL = b"s" * 64  # the "small put" of the round-trip figure
REDIS_RT_LIST = "bench:rt"
JOIN_TIMEOUT = 10.0  # seconds a client process gets to exit once told to stop
WATCHDOG_GRACE = 30.0  # seconds past its time limits before a benchmark's servers are killed
MAX_CLIENTS = 64  # the fan-out's 32 listeners + its producer, with room to spare
BUSY_SHARE = 0.05  # others using more than this share of the CPUs make the figures pessimistic
CALIBRATION_LOOP = 1_000_000  # iterations of the speed check: some 50 ms on a fast core
CALIBRATION_REPEATS = 3


# --- helpers ----------------------------------------------------------------------


def emit(record: dict, lines: list[dict]) -> None:
    lines.append(record)
    print(json.dumps(record), flush=True)



def spread(samples_ns: list[int], unit: float, suffix: str) -> dict:
    """p50/p99/max of *samples_ns*, divided by *unit*, keys ending in *suffix*."""
    ordered = sorted(samples_ns)
    return {
        f"p50_{suffix}": round(percentile(ordered, 50) / unit, 1),
        f"p99_{suffix}": round(percentile(ordered, 99) / unit, 1),
        f"max_{suffix}": round(ordered[-1] / unit, 1) if ordered else math.nan,
    }


@contextlib.contextmanager
def profiling(path: Path | None) -> Iterator[None]:
    """cProfile the block into *path* (nothing without a path)."""
    if path is None:
        yield
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)


@contextlib.contextmanager
def servers(
    tmp: Path, name: str, args, redis: bool = True
) -> Iterator[tuple[_procs.Server, _procs.Server | None]]:
    """A fresh cqsd (and redis-server, if wanted) for benchmark *name*."""
    where = tmp / name
    where.mkdir()
    profile = args.profile / f"cqsd-{name}.prof" if args.profile else None
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(_procs.cqsd(where, MAX_CLIENTS, profile))
        redis_server = None
        if redis and args.redis_binary:
            redis_server = stack.enter_context(_procs.redis(where, args.redis_binary))
        # The SDK waits for a reply as long as it takes: a daemon that hangs would
        # hang this process too. Past the time limit (twice: throughput runs cqsd,
        # then Redis) the servers are killed, which turns every wait into
        # ConnectionLost, so the script always ends.
        watchdog = threading.Timer(2 * args.time_limit + WATCHDOG_GRACE, _kill_all,
                                   ([daemon, redis_server], name))
        watchdog.daemon = True
        watchdog.start()
        stack.callback(watchdog.cancel)
        yield daemon, redis_server
    if profile is not None:
        _procs.summarize_profile(profile, top=25)


def _kill_all(targets: list, name: str) -> None:
    print(f"# {name}: past its time limit, killing its servers", file=sys.stderr, flush=True)
    for target in targets:
        if target is not None:
            target.kill()


def stop_processes(procs: list, stop) -> None:
    """Tell client processes to stop, join them (bounded), kill any that hang."""
    stop.set()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for p in procs:
        if p.pid is not None:
            p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


# --- 1. throughput ----------------------------------------------------------------


def run_throughput(
    server: str, target: _procs.Server, args, lines: list[dict]
) -> float | None:
    """One end-to-end run against *server*; emits its line, returns msgs/s (None if it failed)."""
    address = target.address
    ctx = multiprocessing.get_context("spawn")
    reports, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    consumed = ctx.Value("q", 0)
    total = args.messages
    deadline = time.monotonic() + args.time_limit
    specs = []
    for i in range(args.producers):
        share = total // args.producers + (1 if i < total % args.producers else 0)
        specs.append(Worker(server, address, "producer", i, share, args.batch, deadline))
    for i in range(args.consumers):
        specs.append(Worker(server, address, "consumer", i, total, args.batch, deadline))
    if args.profile:
        specs = [Worker(**{**w.__dict__, "profile": str(
            args.profile / f"throughput-{server}-{w.role}{w.index}.prof")}) for w in specs]
    procs = [ctx.Process(target=_clients.throughput_worker,
                         args=(w, reports, start, stop, consumed),
                         daemon=True) for w in specs]
    done: list[tuple] = []
    error = None
    try:
        for p in procs:
            p.start()
        error = _collect(reports, "ready", len(procs), deadline, [])
        if error is None:
            cpu_before = target.cpu_seconds()
            start.set()
            error = _collect(reports, "done", len(procs), deadline, done)
            server_cpu = target.cpu_seconds() - cpu_before
    finally:
        stop_processes(procs, stop)
    record = {"bench": "throughput", "server": server, "messages": total,
              "producers": args.producers, "consumers": args.consumers, "batch": args.batch,
              "payload": _clients.PAYLOAD_SIZE, "recoverable": False}
    if error is not None:
        emit({**record, "error": error}, lines)
        return None
    firsts = [d[3] for d in done if d[1] == "producer"]
    lasts = [d[4] for d in done if d[1] == "consumer"]
    got = sum(d[5] for d in done if d[1] == "consumer")
    seconds = (max(lasts) - min(firsts)) / 1e9
    rate = got / seconds if seconds > 0 else math.nan
    extra = {} if got == total else {"error": f"only {got} of {total} consumed before the limit"}
    # CPU seconds used during the run: with 2 cores, who is the bottleneck.
    cpu = {"server_cpu_s": round(server_cpu, 2),
           "server_cpu_us_per_msg": round(server_cpu / max(got, 1) * 1e6, 1),
           "producers_cpu_s": round(sum(d[6] for d in done if d[1] == "producer"), 2),
           "consumers_cpu_s": round(sum(d[6] for d in done if d[1] == "consumer"), 2)}
    emit({**record, "consumed": got, "seconds": round(seconds, 3),
          "msgs_per_s": round(rate), **cpu, **extra}, lines)
    return rate if got == total else None


def _collect(reports, kind: str, n: int, deadline: float, into: list) -> str | None:
    """Take *n* reports of *kind* from the workers; an error message if one failed or
    time ran out."""
    seen = 0
    while seen < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"timed out waiting for {n - seen} of {n} '{kind}' reports"
        try:
            report = reports.get(timeout=remaining)
        except queue.Empty:
            continue
        if report[0] == "error":
            return f"{report[1]} {report[2]} failed:\n{report[3]}"
        if report[0] == kind:
            into.append(report)
            seen += 1
    return None


def check_drained_cqsd(address: str) -> str | None:
    """None if the throughput queue is empty (nothing ready, nothing locked)."""
    import cqsclient

    with cqsclient.connect(address, client="CHECK") as c:
        left = c.structure(STRUCTURE).browse(_clients.THROUGHPUT_QUEUE, limit=10)
    return f"{len(left)}+ messages left on the queue" if left else None


def check_drained_redis(sock: str, consumers: int) -> str | None:
    import redis

    r = redis.Redis(unix_socket_path=sock)
    try:
        keys = [_clients.REDIS_SOURCE] + [f"bench:processing:{i}" for i in range(consumers)]
        left = {k: r.llen(k) for k in keys}
    finally:
        r.close()
    left = {k: v for k, v in left.items() if v}
    return f"left in lists: {left}" if left else None


def bench_throughput(tmp: Path, args, lines: list[dict]) -> None:
    with servers(tmp, "throughput", args) as (daemon, redis_server):
        cqsd_rate = run_throughput("cqsd", daemon, args, lines)
        problem = check_drained_cqsd(daemon.address) if cqsd_rate else None
        redis_rate = None
        if redis_server:
            redis_rate = run_throughput("redis", redis_server, args, lines)
            if redis_rate and not problem:
                problem = check_drained_redis(redis_server.address, args.consumers)
    if problem:
        emit({"bench": "throughput", "error": problem}, lines)
    if cqsd_rate and redis_rate:
        ratio = cqsd_rate / redis_rate
        emit({"bench": "throughput_ratio", "cqsd_over_redis": round(ratio, 3),
              "target": "cqsd >= redis", "met": ratio >= 1.0}, lines)


# --- 2. round trip ----------------------------------------------------------------


def bench_roundtrip(tmp: Path, args, lines: list[dict]) -> None:
    with servers(tmp, "roundtrip", args) as (daemon, redis_server):
        prof = args.profile / "roundtrip-client.prof" if args.profile else None
        with profiling(prof):
            put_ns, pair_ns, read_ns, delete_ns = cqsd_roundtrips(daemon.address, args)
        targets = {"target": "p50 < 150 us and p99 < 1000 us"}
        for op, samples in (("put", put_ns), ("read+delete", pair_ns)):
            figures = spread(samples, 1e3, "us")
            met = figures["p50_us"] < 150 and figures["p99_us"] < 1000
            emit({"bench": "roundtrip", "server": "cqsd", "op": op, "samples": len(samples),
                  **figures, **targets, "met": met}, lines)
        for op, samples in (("read", read_ns), ("delete", delete_ns)):
            emit({"bench": "roundtrip", "server": "cqsd", "op": op, "samples": len(samples),
                  **spread(samples, 1e3, "us"), "note": "the halves of read+delete"}, lines)
        if redis_server:
            lpush_ns, reliable_ns = redis_roundtrips(redis_server.address, args)
            emit({"bench": "roundtrip", "server": "redis", "op": "lpush",
                  "samples": len(lpush_ns), **spread(lpush_ns, 1e3, "us")}, lines)
            emit({"bench": "roundtrip", "server": "redis", "op": "lmove+lrem",
                  "samples": len(reliable_ns), **spread(reliable_ns, 1e3, "us")}, lines)


def cqsd_roundtrips(address: str, args):
    """Samples (ns) of put, read+delete, and the read and delete halves."""
    import cqsclient

    clock = time.perf_counter_ns
    n, warm = args.samples, args.warmup
    deadline = time.monotonic() + args.time_limit
    with cqsclient.connect(address, client="RTT") as c:
        s = c.structure(STRUCTURE)
        put_ns, pair_ns, read_ns, delete_ns = [], [], [], []
        for i in range(warm + n):
            t0 = clock()
            s.put(ROUNDTRIP_QUEUE, SMALL, recoverable=False)
            if i >= warm:
                put_ns.append(clock() - t0)
            _check_time(deadline, "put", i)
        for i in range(warm + n):
            t0 = clock()
            m = s.read(ROUNDTRIP_QUEUE)
            t1 = clock()
            s.delete(m.entry_id)
            t2 = clock()
            if i >= warm:
                pair_ns.append(t2 - t0)
                read_ns.append(t1 - t0)
                delete_ns.append(t2 - t1)
            _check_time(deadline, "read+delete", i)
    return put_ns, pair_ns, read_ns, delete_ns


def _check_time(deadline: float, what: str, done: int) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what}: only {done} requests within the time limit")


def redis_roundtrips(sock: str, args):
    """Samples (ns) of LPUSH, and of the reliable pair LMOVE + LREM."""
    import redis

    clock = time.perf_counter_ns
    n, warm = args.samples, args.warmup
    deadline = time.monotonic() + args.time_limit
    r = redis.Redis(unix_socket_path=sock, socket_timeout=30)
    try:
        lpush_ns, pair_ns = [], []
        for i in range(warm + n):
            value = b"%08d" % i + SMALL[8:]
            t0 = clock()
            r.lpush(REDIS_RT_LIST, value)
            if i >= warm:
                lpush_ns.append(clock() - t0)
            _check_time(deadline, "redis lpush", i)
        for i in range(warm + n):
            t0 = clock()
            value = r.lmove(REDIS_RT_LIST, "bench:rt:processing", "RIGHT", "LEFT")
            r.lrem("bench:rt:processing", 1, value)
            if i >= warm:
                pair_ns.append(clock() - t0)
            _check_time(deadline, "redis lmove+lrem", i)
    finally:
        r.close()
    return lpush_ns, pair_ns


# --- 3. notification fan-out ------------------------------------------------------


def bench_fanout(tmp: Path, args, lines: list[dict]) -> None:
    with servers(tmp, "fanout", args, redis=False) as (daemon, _redis):
        rounds, daemon_cpu, error = run_fanout(daemon, args)
    record = {"bench": "fanout", "server": "cqsd", "clients": args.fanout_clients,
              "rounds": len(rounds), "warmup_rounds": args.fanout_warmup}
    if not rounds:
        emit({**record, "error": error or "no round completed"}, lines)
        return
    figures = spread([r[-1] for r in rounds], 1e6, "ms")
    # The k-th receipt of a round, median over rounds: does it grow client by client?
    ranks = {f"receipt{k}_p50_ms": round(percentile(sorted(r[k - 1] for r in rounds), 50) / 1e6, 2)
             for k in sorted({1, len(rounds[0]) // 4, len(rounds[0]) // 2, len(rounds[0])} - {0})}
    emit({**record, **figures, **ranks,
          "daemon_cpu_per_round_us": round(daemon_cpu / max(len(rounds), 1) * 1e6),
          "target": "p99 < 5 ms", "met": figures["p99_ms"] < 5 and error is None,
          **({"error": error} if error else {})}, lines)


def run_fanout(daemon: _procs.Server, args) -> tuple[list[list[int]], float, str | None]:
    """Per completed round, the receipt times minus the put's start (ns, ascending);
    the daemon's CPU seconds over the rounds; an error."""
    import cqsclient

    ctx = multiprocessing.get_context("spawn")
    n = args.fanout_clients
    reader, writer = ctx.Pipe(duplex=False)
    board = Board(n, ctx.Array("q", n, lock=False), ctx.Array("i", n, lock=False),
                  ctx.Value("i", 0), writer)
    stop = ctx.Event()
    deadline = time.monotonic() + args.time_limit
    procs = [
        ctx.Process(target=_clients.fanout_listener, daemon=True, args=(
            daemon.address, i, args.fanout_warmup + args.rounds, deadline, board, stop,
            str(args.profile / f"fanout-listener{i}.prof") if args.profile and i == 0 else None))
        for i in range(n)
    ]
    rounds: list[list[int]] = []
    try:
        for p in procs:
            p.start()
        times, error = _round_done(board, reader, 0, deadline)
        if error:
            return rounds, 0.0, f"listeners not ready: {error}"
        with cqsclient.connect(daemon.address, client="FANPROD") as c:
            s = c.structure(STRUCTURE)
            cpu_before = daemon.cpu_seconds()
            for r in range(1, args.fanout_warmup + args.rounds + 1):
                if r == args.fanout_warmup + 1:
                    cpu_before = daemon.cpu_seconds()
                board.count.value = 0  # every listener reported the last round: none is counting
                t0 = time.monotonic_ns()
                entry_id = s.put(_clients.FANOUT_QUEUE, SMALL, recoverable=False)
                times, error = _round_done(board, reader, r, min(deadline, time.monotonic() + 10))
                if error:
                    break
                if r > args.fanout_warmup:
                    rounds.append(sorted(t - t0 for t in times))
                s.operator_delete(entry_id)  # empty again, so the next put notifies
            cpu = daemon.cpu_seconds() - cpu_before
        return rounds, cpu, None if error is None else f"round {r}: {error}"
    finally:
        stop_processes(procs, stop)
        reader.close()
        writer.close()


def _round_done(board: Board, reader, round_: int, deadline: float) -> tuple[list[int], str | None]:
    """Wait for the last listener's word that *round_* is complete; the receipt times."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not reader.poll(remaining):
        return [], f"{board.count.value} of {board.clients} receipts within the time limit"
    index, got_round, _at = RECEIPT.unpack(reader.recv_bytes())
    if got_round == -1:
        return [], f"listener {index} failed (its error is on stderr)"
    behind = [i for i in range(board.clients) if board.rounds[i] != round_]
    if got_round != round_ or behind:
        return [], (f"listeners out of step: expected round {round_}, got {got_round}, "
                    f"behind {behind}")
    return list(board.times), None


# --- main -------------------------------------------------------------------------


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def calibrate(lines: list[dict]) -> None:
    """Emit how fast this machine runs plain Python right now. Virtual machines
    vary by a factor of 2 or more from hour to hour (the host's other guests),
    so figures from different runs are comparable only next to this one."""
    times = []
    for _ in range(CALIBRATION_REPEATS):
        t0 = time.perf_counter()
        sum(i * i for i in range(CALIBRATION_LOOP))
        times.append(time.perf_counter() - t0)
    emit({"bench": "machine", "during": "calibration", "cpus": os.cpu_count(),
          "python_loop_ms": round(min(times) * 1e3, 1), "loop": CALIBRATION_LOOP}, lines)


@contextlib.contextmanager
def other_cpu(name: str, lines: list[dict]) -> Iterator[None]:
    """Emit how much CPU processes outside the benchmark used while it ran: on a
    2-core machine another job's tests turn every figure pessimistic."""
    t0, busy0, own0 = time.monotonic(), _procs.machine_busy_seconds(), own_cpu_seconds()
    try:
        yield
    finally:
        seconds = time.monotonic() - t0
        others = max(0.0, (_procs.machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0))
        share = others / (seconds * (os.cpu_count() or 1)) if seconds > 0 else 0.0
        emit({"bench": "machine", "during": name, "seconds": round(seconds, 1),
              "other_cpu_s": round(others, 2), "other_share": round(share, 3),
              "quiet": share <= BUSY_SHARE}, lines)


BENCHES = {"throughput": bench_throughput, "roundtrip": bench_roundtrip, "fanout": bench_fanout}


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true",
                   help="small counts: 20,000 messages, 2,000 samples, 50 rounds")
    p.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    p.add_argument("--messages", type=int, help="throughput: messages (default 200000)")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--samples", type=int, help="round trip: samples per op (default 20000)")
    p.add_argument("--warmup", type=int, help="round trip: warm-up requests (default 1000)")
    p.add_argument("--fanout-clients", type=int, default=32)
    p.add_argument("--rounds", type=int, help="fan-out: rounds (default 300)")
    p.add_argument("--fanout-warmup", type=int, default=5,
                   help="fan-out: rounds before the measured ones (first notifications are slow)")
    p.add_argument("--time-limit", type=float, default=120.0,
                   help="seconds each benchmark may run before it is abandoned")
    p.add_argument("--no-redis", action="store_true", help="measure cqsd only")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="cProfile the daemon and the clients into DIR (distorts the figures)")
    args = p.parse_args(argv)
    quick = args.quick
    args.messages = args.messages or (20_000 if quick else 200_000)
    args.samples = args.samples or (2_000 if quick else 20_000)
    args.warmup = args.warmup if args.warmup is not None else (200 if quick else 1_000)
    args.rounds = args.rounds or (50 if quick else 300)
    if args.fanout_clients + 1 > MAX_CLIENTS:
        p.error(f"--fanout-clients must be below {MAX_CLIENTS}")
    return args


def summary(lines: list[dict]) -> list[str]:
    out = []
    for rec in lines:
        bench, server = rec.get("bench"), rec.get("server", "")
        if "error" in rec:
            out.append(f"{bench} {server}: FAILED: {rec['error'].splitlines()[0]}")
        elif bench == "throughput":
            out.append(f"throughput {server}: {rec['msgs_per_s']:,} msgs/s "
                       f"({rec['messages']:,} in {rec['seconds']} s)")
        elif bench == "throughput_ratio":
            out.append(f"throughput cqsd/redis = {rec['cqsd_over_redis']} "
                       f"(target >= 1: {'met' if rec['met'] else 'MISSED'})")
        elif bench == "roundtrip":
            verdict = "" if "met" not in rec else f"  [{'met' if rec['met'] else 'MISSED'}]"
            out.append(f"roundtrip {server} {rec['op']}: p50 {rec['p50_us']} us, "
                       f"p99 {rec['p99_us']} us{verdict}")
        elif bench == "machine" and rec.get("during") == "calibration":
            out.append(f"machine: {rec['cpus']} CPUs, a {rec['loop']:,}-step Python loop "
                       f"takes {rec['python_loop_ms']} ms")
        elif bench == "machine":
            if not rec["quiet"]:
                out.append(f"WARNING: during {rec['during']}, other processes used "
                           f"{rec['other_share']:.0%} of the CPUs: its figures are pessimistic")
        elif bench == "fanout":
            out.append(f"fanout {rec['clients']} clients x {rec['rounds']} rounds: "
                       f"p50 {rec['p50_ms']} ms, p99 {rec['p99_ms']} ms, max {rec['max_ms']} ms"
                       f"  [{'met' if rec['met'] else 'MISSED'}]")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.redis_binary = None if args.no_redis else _procs.redis_server_path()
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    lines: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="cqbench-"))
    try:
        calibrate(lines)
        for name in args.only:
            try:
                with other_cpu(name, lines):
                    BENCHES[name](tmp, args, lines)
            except Exception as err:  # one broken benchmark must not hide the others
                emit({"bench": name, "error": f"{type(err).__name__}: {err}"}, lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.redis_binary is None and not args.no_redis:
        lines.append({"bench": "redis", "error": "redis-server not available; " +
                      _procs.REDIS_INSTALL_HINT})
    print()
    for line in summary(lines):
        print(f"# {line}")
    if args.profile:
        print(f"# profiles (.prof, with .txt summaries for the daemon) in {args.profile}")
    failed = any("error" in rec for rec in lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
