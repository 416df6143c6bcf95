"""cqsd durability benchmarks: what it costs that every acknowledged recoverable
message is on disk, measured against the disk itself and against Redis 7.

Five figures (targets in brackets), all 1 KiB recoverable messages:

1. fsync       - the data disk: 4 KiB write + fsync, repeated, in the data dir.
2. put_latency - one client, one recoverable put at a time: p50/p99, in
                 blocks alternating with blocks of figure 1's probe.
                 [p50 <= 1.5 x the fsync p50 of those blocks]
3. cycle       - put, read, delete, one request at a time per client, 1 client
                 and 8 client processes; a cycle counts as one message.
                 [8 clients >= 5 x 1 client: group commit shares fsyncs]
                 With it, the machine's ceiling: the rate at which the
                 measured server + client CPU per message fills every core.
4. cycle/redis - the same loop against redis-server with appendfsync always:
                 LPUSH, LMOVE to a processing list, LREM. [cqsd >= Redis]
5. restart     - 1,000,000 messages (put_batch), clean stop (image), start,
                 a 100,000-record tail of single puts, SIGKILL, restart: the
                 time to "ready" and the image/replay split. [< 10 s]

Run: .venv/bin/python benchmarks/durability.py [--quick] [--only fsync,put,cycle,redis,restart]
     [--no-redis] [--profile DIR]
Figures 3 and 4 are taken in rounds (3, or 1 with --quick), cqsd and Redis
alternating, and each line gives its median round: other work on the machine
then weighs on both alike. Every line carries the 1-minute load average, and
the loop figures the CPU used by the server, the clients and anything else.

One JSON line per figure on stdout, then a summary (lines starting "# ").
Everything runs in one temporary directory under /tmp (the disk measured by
figure 1), on Unix sockets only; every wait is bounded, and daemons,
redis-server, client processes and the directory are cleaned up whatever
happens.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import _durability_clients as clients
import _durability_servers as servers
import _procs
from _procs import percentile

FSYNC_BLOCK = 4096
PUT_QUEUE = "DURPUT"
STRUCTURE_SIZE = "4GiB"  # room for 1.1M x 1 KiB (3 data elements each) with space to spare
MAX_CLIENTS = 64
SLICE_LEAD_NS = 200_000_000  # slice 0 starts this long after the start signal
JOIN_TIMEOUT = 15.0  # seconds a client process gets to exit after its work
TARGET_PUT_OVER_FSYNC = 1.5
PUT_BLOCKS = 10  # figure 2 alternates this many blocks of puts with blocks of fsyncs
TARGET_SCALING = 5.0
TARGET_RESTART_SECONDS = 10.0
FIGURES = ("fsync", "put", "cycle", "redis", "restart")


# --- helpers ----------------------------------------------------------------------


def emit(record: dict, lines: list[dict]) -> None:
    # Other work on this 2-core machine moves every figure: say how busy it was.
    record["loadavg_1m"] = os.getloadavg()[0]
    lines.append(record)
    print(json.dumps(record), flush=True)



def spread_ms(samples_ns: list[int]) -> dict:
    """mean/p50/p99/max of nanosecond samples, in milliseconds."""
    ordered = sorted(samples_ns)
    if not ordered:
        return {}
    return {"mean_ms": round(sum(ordered) / len(ordered) / 1e6, 3),
            "p50_ms": round(percentile(ordered, 50) / 1e6, 3),
            "p99_ms": round(percentile(ordered, 99) / 1e6, 3),
            "max_ms": round(ordered[-1] / 1e6, 3)}


class Window:
    """CPU used while the clients of a figure work: by the server, by the whole machine."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid
        self.server = self.machine = self.seconds = 0.0

    def start(self) -> None:
        self.server = -_procs.process_cpu_seconds(self.pid)
        self.machine = -_procs.machine_busy_seconds()
        self.seconds = -time.monotonic()

    def stop(self) -> None:
        self.seconds += time.monotonic()
        self.server += _procs.process_cpu_seconds(self.pid)
        self.machine += _procs.machine_busy_seconds()


class SliceClock(Window):
    """Window whose start fixes slice 0 in *grid* (a shared monotonic ns, a little
    ahead, so every process has the time before it begins) and samples the
    daemon's CPU at each slice boundary, on a thread: for figures whose clients
    switch between variants slice after slice (smds.py, exactlyonce.py)."""

    def __init__(self, pid: int, grid, slice_ns: int, slices: int) -> None:
        super().__init__(pid)
        self.grid, self.slice_ns, self.slices = grid, slice_ns, slices
        self.cpu: list[float] = []  # the daemon's CPU seconds at each boundary
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        super().start()
        self.grid.value = time.monotonic_ns() + SLICE_LEAD_NS
        self._thread.start()

    def stop(self) -> None:
        super().stop()
        self._thread.join(5)

    def _sample(self) -> None:
        for k in range(self.slices + 1):
            wait = (self.grid.value + k * self.slice_ns - time.monotonic_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)  # a sampling moment, not a hand-off between processes
            self.cpu.append(_procs.process_cpu_seconds(self.pid))


def run_processes(target, arg_tuples: list[tuple], timeout: float,
                  window: Window | None = None) -> list[tuple]:
    """Run one spawned process per argument tuple: each gets (*args, reports, start),
    says ready, waits for start, says done. Returns the "done" reports, by index.
    A *window* is started with the clients and stopped when the last is done.

    Raises RuntimeError (with the child's traceback) if one fails, or if the
    whole thing takes longer than *timeout* seconds.
    """
    ctx = multiprocessing.get_context("spawn")  # the parent has threads: no fork
    reports, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*a, reports, start), daemon=True)
             for a in arg_tuples]
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        _collect(reports, "ready", len(procs), deadline)
        if window is not None:
            window.start()
        start.set()
        done = _collect(reports, "done", len(procs), deadline)
        if window is not None:
            window.stop()
    finally:
        for p in procs:
            if p.pid is not None:
                p.join(JOIN_TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join(5)
    return sorted(done, key=lambda d: d[1])


def _collect(reports, kind: str, n: int, deadline: float) -> list[tuple]:
    got: list[tuple] = []
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"timed out waiting for {n - len(got)} of {n} {kind!r} reports")
        try:
            report = reports.get(timeout=min(left, 1.0))
        except Exception:  # queue.Empty: look at the clock again
            continue
        if report[0] == "error":
            raise RuntimeError(f"client process {report[1]} failed:\n{report[2]}")
        if report[0] == kind:
            got.append(report)
    return got


# --- 1. the disk ------------------------------------------------------------------


def fsync_figure(directory: Path, count: int, seconds: float) -> dict:
    """Append 4 KiB and fsync, *count* times (or until *seconds* pass), in *directory*."""
    samples = fsync_samples(directory, count, seconds)
    total = sum(samples) / 1e9
    return {"bench": "fsync", "block": FSYNC_BLOCK, "samples": len(samples),
            "fsyncs_per_s": round(len(samples) / total, 1), **spread_ms(samples)}


def fsync_samples(directory: Path, count: int, seconds: float) -> list[int]:
    """Nanoseconds of *count* 4 KiB appends, each fsynced, to a new file in *directory*."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe"
    block = b"f" * FSYNC_BLOCK
    samples: list[int] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        stop = time.monotonic() + seconds
        while len(samples) < count and time.monotonic() < stop:
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fsync(fd)
            samples.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return samples


# --- 2. one client's put latency ------------------------------------------------


def put_latency_figure(address: str, count: int, seconds: float, probe: Path) -> dict:
    """One client, one recoverable 1 KiB put at a time: each reply waits for its fsync.

    The disk's fsync time drifts by tens of percent within a minute on a shared
    VM, so the puts are measured in blocks alternating with blocks of the fsync
    probe (figure 1, in the data directory *probe*), and the ratio is of those.
    """
    import cqsclient

    samples: list[int] = []
    fsyncs: list[int] = []
    block = max(1, count // PUT_BLOCKS)
    with cqsclient.connect(address, client="DURPUT") as c:
        s = c.structure(clients.STRUCTURE)
        for _ in range(PUT_BLOCKS):
            fsyncs += fsync_samples(probe, block, seconds / PUT_BLOCKS)
            samples += _put_samples(s, True, block, seconds / PUT_BLOCKS)
        # The same request without the log: what the request path costs by itself.
        plain = sorted(_put_samples(s, False, count, seconds))
    fsync_p50_ms = round(percentile(sorted(fsyncs), 50) / 1e6, 3)
    record = {"bench": "put_latency", "server": "cqsd", "payload": clients.PAYLOAD_SIZE,
              "samples": len(samples), **spread_ms(samples),
              "nonrecoverable_p50_ms": round(percentile(plain, 50) / 1e6, 3)}
    ratio = record["p50_ms"] / fsync_p50_ms
    # What durability costs beyond the fsync itself (thread hand-offs, wake-ups).
    extra = record["p50_ms"] - record["nonrecoverable_p50_ms"] - fsync_p50_ms
    return record | {"fsync_p50_ms": fsync_p50_ms, "p50_over_fsync_p50": round(ratio, 2),
                     "beyond_request_and_fsync_ms": round(extra, 3),
                     "target_met": ratio <= TARGET_PUT_OVER_FSYNC}


def _put_samples(s, recoverable: bool, count: int, seconds: float) -> list[int]:
    """Nanoseconds of *count* single puts (after a warm-up), bounded by *seconds*."""
    for seq in range(clients.WARMUP):
        s.put(PUT_QUEUE, clients.payload(999, seq), recoverable=recoverable)
    samples: list[int] = []
    stop = time.monotonic() + seconds
    while len(samples) < count and time.monotonic() < stop:
        body = clients.payload(999, len(samples))
        t0 = time.perf_counter_ns()
        s.put(PUT_QUEUE, body, recoverable=recoverable)
        samples.append(time.perf_counter_ns() - t0)
    return samples


# --- 3 and 4. the put + read + delete loop ---------------------------------------


def cycle_figure(server: str, address: str, pid: int, n_clients: int, seconds: float,
                 max_cycles: int) -> dict:
    """*n_clients* processes looping put, read, delete for *seconds*; total cycles/s."""
    specs = [(clients.CycleSpec(server, address, i, seconds, max_cycles),)
             for i in range(n_clients)]
    window = Window(pid)
    done = run_processes(clients.cycle_worker, specs, seconds + 120, window)
    # The processes ran side by side over (almost) the same window: add their rates.
    rate = sum(d[2] / d[3] for d in done if d[3] > 0)
    cycles = sum(d[2] for d in done)
    latencies = [ns for d in done for ns in d[4]]
    clients_cpu = sum(d[6] for d in done)
    return {"bench": "cycle", "server": server, "clients": n_clients,
            "payload": clients.PAYLOAD_SIZE, "cycles": cycles,
            "seconds": round(max(d[3] for d in done), 2), "msgs_per_s": round(rate, 1),
            "empty_reads": sum(d[5] for d in done),
            **{f"cycle_{k}": v for k, v in spread_ms(latencies).items()},
            # Where the CPU went (2 cores): a CPU-bound server shows here, and so
            # does anything else running on the machine at the same time.
            "server_cpu_s": round(window.server, 2),
            "server_cpu_us_per_msg": round(window.server / max(cycles, 1) * 1e6),
            "clients_cpu_s": round(clients_cpu, 2),
            "other_cpu_s": round(window.machine - window.server - clients_cpu, 2)}


def live_figures(tmp: Path, args, disk: dict | None, lines: list[dict]) -> None:
    """Figures 2, 3 and 4: one daemon, and a fresh redis-server for each Redis run.

    The loop figures are taken in rounds, cqsd and Redis alternating inside
    each, and each reports its median round: whatever else the machine does
    meanwhile then weighs on both servers alike. *disk* is figure 1 (or None).
    """
    where = tmp / "live"
    where.mkdir(exist_ok=True)
    config = _procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE)
    profile = args.profile / "cqsd-live.prof" if args.profile else None
    binary = _procs.redis_server_path() if "redis" in args.only else None
    if "redis" in args.only and binary is None:
        emit({"bench": "cycle", "server": "redis", "error": _procs.REDIS_INSTALL_HINT}, lines)
    runs: dict[tuple[str, int], list[dict]] = {}
    with servers.daemon(config, profile) as d:
        d.start()
        if "put" in args.only:
            emit(put_latency_figure(d.address, args.put_samples, args.time_cap,
                                    where / "data"), lines)
        for r in range(args.rounds):
            for n_clients in (1, args.clients):
                if "cycle" in args.only:
                    runs.setdefault(("cqsd", n_clients), []).append(cycle_figure(
                        "cqsd", d.address, d.proc.pid, n_clients, args.cycle_seconds,
                        args.max_cycles))
                if binary is not None:
                    runs.setdefault(("redis", n_clients), []).append(
                        redis_run(where / f"redis-{r}-{n_clients}", binary, n_clients, args))
        if profile is not None:
            d.terminate()  # cProfile writes its file only at a normal exit
    if profile is not None:
        _procs.summarize_profile(profile)
    for record in compare({key: median_run(records) for key, records in runs.items()},
                          args.clients, disk and disk["fsyncs_per_s"]):
        emit(record, lines)


def redis_run(where: Path, binary: str, n_clients: int, args) -> dict:
    """One loop run on a fresh redis-server (so no run starts on another's grown AOF)."""
    where.mkdir()
    with servers.redis_aof(where, binary) as (sock, pid):
        record = cycle_figure("redis", sock, pid, n_clients, args.cycle_seconds,
                              args.max_cycles)
    return record | {"version": servers.redis_version(binary), "appendfsync": "always"}


def median_run(records: list[dict]) -> dict:
    """The run with the median rate (the lower middle one of an even number), with
    every round's rate alongside."""
    ordered = sorted(records, key=lambda r: r["msgs_per_s"])
    return ordered[(len(ordered) - 1) // 2] | {
        "rounds_msgs_per_s": [r["msgs_per_s"] for r in records]}


def compare(medians: dict[tuple[str, int], dict], n: int, fsyncs_per_s: float | None
            ) -> list[dict]:
    """The loop figures in order, with the scaling and cqsd/Redis targets judged."""
    one, many = medians.get(("cqsd", 1)), medians.get(("cqsd", n))
    if many and fsyncs_per_s:
        # Each cycle's put and delete wait for an fsync: acknowledging more of them
        # per second than the disk does fsyncs means they share fsyncs.
        many["acks_per_s_over_fsyncs_per_s"] = round(2 * many["msgs_per_s"] / fsyncs_per_s, 2)
    if one and many:
        scaling = many["msgs_per_s"] / one["msgs_per_s"] if one["msgs_per_s"] else math.nan
        many |= {"one_client_msgs_per_s": one["msgs_per_s"], "scaling": round(scaling, 2),
                 "target_met": scaling >= TARGET_SCALING}
        # A bound on any scaling here: the rate at which the server's and the clients'
        # CPU per message would keep every core busy, with no wait for the disk.
        cpu_per_msg = (many["server_cpu_s"] + many["clients_cpu_s"]) / max(many["cycles"], 1)
        if cpu_per_msg > 0 and one["msgs_per_s"]:
            ceiling = (os.cpu_count() or 1) / cpu_per_msg
            many |= {"cpu_ceiling_msgs_per_s": round(ceiling, 1),
                     "cpu_ceiling_scaling": round(ceiling / one["msgs_per_s"], 2)}
    redis_many = medians.get(("redis", n))
    if many and redis_many:
        ratio = many["msgs_per_s"] / redis_many["msgs_per_s"] if redis_many["msgs_per_s"] \
            else math.nan
        redis_many |= {"cqsd_msgs_per_s": many["msgs_per_s"], "cqsd_over_redis": round(ratio, 2),
                       "target_met": ratio >= 1.0}
    order = [("cqsd", 1), ("cqsd", n), ("redis", 1), ("redis", n)]
    return [medians[key] for key in order if key in medians]


# --- 5. restart -------------------------------------------------------------------


def load(d: servers.Daemon, count: int, processes: int, batch: int, seconds: float) -> dict:
    """Put *count* messages with put_batch from several processes."""
    deadline = time.monotonic() + seconds
    window = Window(d.proc.pid)
    done = run_processes(clients.load_worker,
                         [(d.address, i, share, batch, deadline)
                          for i, share in enumerate(_shares(count, processes))],
                         seconds + 180, window)
    built = sum(r[2] for r in done)
    return {"built": built, "build_s": round(window.seconds, 2),
            "build_msgs_per_s": round(built / window.seconds),
            "build_server_cpu_s": round(window.server, 2)}


def tail(d: servers.Daemon, count: int, processes: int, threads: int, seconds: float) -> dict:
    """*count* single recoverable puts, many in flight."""
    deadline = time.monotonic() + seconds
    window = Window(d.proc.pid)
    done = run_processes(clients.tail_worker,
                         [(d.address, i, share, threads, deadline)
                          for i, share in enumerate(_shares(count, processes))],
                         seconds + 120, window)
    added = sum(r[2] for r in done)
    return {"tail": added, "tail_s": round(window.seconds, 2),
            "tail_puts_per_s": round(added / window.seconds),
            "tail_server_cpu_s": round(window.server, 2)}


def _shares(count: int, parts: int) -> list[int]:
    return [count // parts + (1 if i < count % parts else 0) for i in range(parts)]


def rebuilt(d: servers.Daemon) -> dict:
    """The structure_rebuilt line of the benchmark's structure, from the last start."""
    for event in d.logged("structure_rebuilt"):
        if event.get("structure") == clients.STRUCTURE:
            return event
    raise servers.ServerFailed(f"no structure_rebuilt line for {clients.STRUCTURE}:\n"
                               f"{d.log_text()}")


def restart_figure(tmp: Path, args, lines: list[dict]) -> None:
    """Build, stop cleanly, start from the image, add a tail, crash, time the restart."""
    where = tmp / "restart"
    where.mkdir(exist_ok=True)
    config = _procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE)
    record: dict = {"bench": "restart", "payload": clients.PAYLOAD_SIZE}
    try:
        with servers.daemon(config) as d:
            record["empty_start_s"] = round(d.start(), 3)
            record |= load(d, args.messages, args.load_processes, args.load_batch,
                           args.time_cap * 2)
            record |= _mem(d, "after_build")
            record["clean_stop_s"] = round(d.terminate(), 2)
            image = where / "data" / "images" / f"{clients.STRUCTURE}.img"
            record["image_mib"] = round(image.stat().st_size / 2**20, 1)
            record["clean_start_s"] = round(d.start(), 3)
            clean = rebuilt(d)
            record |= {"clean_image_s": clean["image_seconds"],
                       "clean_replay_s": clean["replay_seconds"]}
            record |= tail(d, args.tail, args.tail_processes, args.tail_threads, args.time_cap)
            d.kill()
            # the segment files as they lie: the active one is preallocated whole
            record["log_files_mib"] = round(_du(where / "data" / "logstream") / 2**20, 1)
            wall = d.start()
            crash = rebuilt(d)
            record |= {"messages": crash["messages"],
                       "records_replayed": crash["records_replayed"],
                       "image_s": crash["image_seconds"], "replay_s": crash["replay_seconds"],
                       "restart_s": round(wall, 3), **_mem(d, "after_restart"),
                       "target_met": wall < TARGET_RESTART_SECONDS}
            if crash["messages"] != record["built"] + record["tail"]:
                record["error"] = (f"{crash['messages']} messages after the restart, "
                                   f"{record['built'] + record['tail']} acknowledged")
            if args.profile:
                _profile_restart(config, args.profile, d)
    except Exception as err:  # report what was measured before the failure
        record["error"] = f"{type(err).__name__}: {err}"
    emit(record, lines)


def _profile_restart(config: Path, directory: Path, d: servers.Daemon) -> None:
    """Crash again and restart under cProfile (the same rebuild: a crash restart
    renames nothing), then stop cleanly so that the profile is written."""
    d.kill()
    path = directory / "cqsd-restart.prof"
    profiled = servers.Daemon(config, path)
    try:
        profiled.start()
        profiled.terminate()
    finally:
        profiled.kill()
    _procs.summarize_profile(path)


def _mem(d: servers.Daemon, when: str) -> dict:
    m = d.memory()
    return {f"rss_mib_{when}": m["rss_mib"], f"peak_rss_mib_{when}": m["peak_rss_mib"]}


def _du(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


# --- summary ----------------------------------------------------------------------


def summary(lines: list[dict]) -> list[str]:
    """A few human lines, one per figure, saying whether its target was met."""
    out = []
    verdict = {True: "MET", False: "MISSED", None: "n/a"}
    for r in lines:
        bench, target = r.get("bench"), verdict[r.get("target_met")]
        if "error" in r:
            out.append(f"{bench} {r.get('server', '')}: ERROR {r['error'].splitlines()[0]}")
        elif bench == "fsync":
            out.append(f"disk: {r['fsyncs_per_s']} fsyncs/s, p50 {r['p50_ms']} ms "
                       f"(mean {r['mean_ms']} ms)")
        elif bench == "put_latency":
            out.append(f"recoverable put, 1 client: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms"
                       f" = {r.get('p50_over_fsync_p50')} x fsync p50 "
                       f"[target <= {TARGET_PUT_OVER_FSYNC}x: {target}]")
        elif bench == "cycle" and "scaling" in r:
            out.append(f"cqsd put+read+delete: {r['clients']} clients {r['msgs_per_s']} msgs/s,"
                       f" 1 client {r['one_client_msgs_per_s']} = {r['scaling']}x "
                       f"[target >= {TARGET_SCALING}x: {target}]; all cores busy at this CPU "
                       f"per message: {r.get('cpu_ceiling_msgs_per_s')} msgs/s = "
                       f"{r.get('cpu_ceiling_scaling')}x")
        elif bench == "cycle" and r["server"] == "redis":
            ratio = f" = cqsd {r['cqsd_over_redis']}x [target >= 1x: {target}]" \
                if "cqsd_over_redis" in r else ""
            out.append(f"redis {r.get('version')} AOF always: {r['clients']} clients "
                       f"{r['msgs_per_s']} msgs/s{ratio}")
        elif bench == "restart":
            out.append(f"crash restart with {r['messages']} messages "
                       f"({r['records_replayed']} records replayed): {r['restart_s']} s to "
                       f"ready (image {r['image_s']} s, replay {r['replay_s']} s) "
                       f"[target < {TARGET_RESTART_SECONDS} s: {target}]; built at "
                       f"{r['build_msgs_per_s']} msgs/s")
    return out


# --- main -------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller counts (about a minute)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help=f"comma-separated figures to run, of {','.join(FIGURES)}")
    p.add_argument("--no-redis", action="store_true", help="skip figure 4")
    p.add_argument("--clients", type=int, default=8, help="client processes of figures 3-4")
    p.add_argument("--profile", type=Path, help="cProfile the daemons into this directory")
    args = p.parse_args(argv)
    args.only = set(args.only.split(","))
    if unknown := args.only - set(FIGURES):
        p.error(f"unknown figures: {', '.join(sorted(unknown))}")
    if args.no_redis:
        args.only.discard("redis")
    quick = args.quick
    args.fsync_samples = 500 if quick else 2000
    args.put_samples = 500 if quick else 2000
    args.cycle_seconds = 4.0 if quick else 10.0
    args.rounds = 1 if quick else 3
    args.max_cycles = 1_000_000  # per process; the clock ends the loop long before
    args.messages = 100_000 if quick else 1_000_000
    args.tail = 10_000 if quick else 100_000
    args.load_processes, args.load_batch = 3, 5000
    args.tail_processes, args.tail_threads = 4, 16
    args.time_cap = 60.0 if quick else 240.0  # seconds any one measuring loop may run
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[dict] = []
    # Under /tmp on purpose: the figures are about the disk the data dir is on.
    tmp = Path(tempfile.mkdtemp(prefix="cqdur-", dir="/tmp"))
    started = time.monotonic()
    try:
        emit(environment(tmp), lines)
        disk = None
        if "fsync" in args.only:
            disk = fsync_figure(tmp / "live" / "data", args.fsync_samples, args.time_cap)
            emit(disk, lines)
        if args.only & {"put", "cycle", "redis"}:
            _guarded("cycle", lambda: live_figures(tmp, args, disk, lines), lines)
        if "restart" in args.only:
            restart_figure(tmp, args, lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in summary(lines):
        print("# " + line)
    print(f"# total {time.monotonic() - started:.0f} s")
    return 1 if any("error" in r for r in lines) else 0


def environment(tmp: Path) -> dict:
    """What the figures depend on: cores, the file system of the data dir, versions."""
    mounts = []
    with open("/proc/mounts") as f:
        for line in f:
            device, point, fstype = line.split()[:3]
            if str(tmp).startswith(point.rstrip("/") + "/") or point == "/":
                mounts.append((len(point), device, fstype))
    _, device, fstype = max(mounts)
    # the interpreter itself, not only its version: a build without PGO and LTO (pyenv's
    # default) costs cqsd's daemon a fifth more CPU a message (benchmarks/README.md)
    return {"bench": "environment", "cpus": os.cpu_count(), "data_device": device,
            "data_fs": fstype, "python": sys.version.split()[0],
            "python_binary": os.path.realpath(sys.executable)}


def _guarded(bench: str, run, lines: list[dict]):
    """Run one group of figures; a failure becomes an error line, not the end of the run."""
    try:
        return run()
    except Exception as err:
        emit({"bench": bench, "error": f"{type(err).__name__}: {err}"}, lines)
        return None


if __name__ == "__main__":
    sys.exit(main())
