"""SMDS benchmarks: what offloading large messages to shared message data sets
gives and costs (issue 13), against RabbitMQ and Redis in the same run.

Three figures (targets in brackets):

1. move   - recoverable 1 MiB messages, 4 producer and 4 consumer processes
            (put; read with lock, delete), MB/s moved through cqsd (a 64 MiB
            structure offloading to SMDS), RabbitMQ (durable classic queue,
            persistent messages, publisher confirms, manual acks) and Redis
            (appendfsync always; LPUSH, LMOVE, LREM), each pipelining
            ``--batch`` messages (see _smds_clients). Rounds rotate the three
            servers, each run on a fresh server and data directory, and each
            round starts with the disk's sequential write rate (1 MiB writes,
            fdatasync every N MiB) in the same place: the ceiling. With each
            run, the bytes the server wrote (/proc/PID/io write_bytes) per byte
            acknowledged. [cqsd >= RabbitMQ and >= Redis, medians of the rounds]
            With ``--batch 1 --plain`` (issue 30), every client one message per
            request and cqsd's consumers a ``read`` then a ``delete``, each its
            own request, as most applications write them (RabbitMQ and Redis
            clients at batch 1 already work so). [cqsd >= 1.2 x RabbitMQ and
            >= 2 x Redis]
2. memory - the daemon's VmRSS and VmHWM while it holds 4 GiB of offloaded
            recoverable 1 MiB messages in a 64 MiB structure, and after they
            are read and deleted. Checkpoints off: a Spark job folding 4 GiB
            of log is another figure. [VmRSS < 300 MiB]
3. small  - 1 KiB recoverable put + read + delete, one request at a time per
            client, 8 client processes, on a structure with offload = "smds"
            and on one without, in one daemon, every client switching between
            them at the same moments, every 0.5 s: the drifting load of a
            shared machine then weighs on both alike. [smds >= 0.95 x none]

Run: nice -n 5 .venv/bin/python benchmarks/smds.py [--quick] [--only move,memory,small]
     [--servers cqsd,rabbitmq,redis] [--rounds N] [--messages N] [--batch N [--plain]]
     [--checkpoints] [--py-spy DIR]
One JSON line per figure (and per run of the round figures) on stdout, each
with the 1-minute load average, then a summary (lines starting "# "). Everything
runs under one temporary directory in /tmp, on Unix sockets (RabbitMQ: on
127.0.0.1, it has no Unix socket); every wait is bounded, and servers, client
processes and the directory are cleaned up whatever happens. redis-server and
rabbitmq-server are Debian's packages (installed with apt-get if missing and
root), redis-py and pika are in the project's test extra.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import _durability_servers as servers
import _procs
import _smds_clients as movers
from durability import SliceClock, Window, emit, environment, run_processes

MiB = 1 << 20
MAX_CLIENTS = 64
STRUCTURE_SIZE = "64MiB"  # the embedded default's MSGQ01: offloaded entries cost one element
SMALL_SIZE = "1GiB"  # figure 3: room enough that no 1 KiB payload is offloaded
SMALL_OFFLOAD = "SMDS01"  # figure 3's structure with offload = "smds" (MSGQ01 has none)
CHECKPOINTS_OFF = "checkpoint_interval = 0\ncheckpoint_log_volume = 0\n"
TARGET_RSS_MIB = 300
TARGET_SMALL_RATIO = 0.95
SERVERS = ("cqsd", "rabbitmq", "redis")
# Figure 1's targets: cqsd's rate over each peer's, batched (issue 13), and one
# message per request with the plain read-then-delete pattern (issue 30).
TARGETS = {"rabbitmq": 1.0, "redis": 1.0}
PLAIN_TARGETS = {"rabbitmq": 1.2, "redis": 2.0}
FIGURES = ("move", "memory", "small")
RSS_SAMPLE = 0.5  # seconds between the memory figure's RSS samples


# --- the disk ---------------------------------------------------------------------


def disk_figure(directory: Path, sync_every: int, limit_mib: int, seconds: float) -> dict:
    """Sequential 1 MiB writes of random bytes to a new file in *directory*,
    fdatasync every *sync_every* MiB, until *limit_mib* or *seconds*."""
    block = os.urandom(MiB)
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = 0
    try:
        began = time.monotonic()
        while written < limit_mib and time.monotonic() - began < seconds:
            for _ in range(sync_every):
                os.write(fd, block)
            os.fdatasync(fd)
            written += sync_every
        elapsed = time.monotonic() - began
    finally:
        os.close(fd)
        path.unlink()
    return {"bench": "disk", "sync_every_mib": sync_every, "mib": written,
            "mib_per_s": round(written / elapsed, 1)}


# --- 1. moving 1 MiB messages ----------------------------------------------------


class IoWindow(Window):
    """Window, plus the bytes the server process sent to storage meanwhile and the
    CPU the kernel's own threads used (writeback, the file system's journal): work
    the server causes that its own CPU time does not show."""

    def start(self) -> None:
        super().start()
        self.written = -written_bytes(self.pid)
        self.kernel = -kernel_threads_cpu()
        self.queued = -runqueue_seconds(self.pid)

    def stop(self) -> None:
        super().stop()
        self.written += written_bytes(self.pid)
        self.kernel += kernel_threads_cpu()
        self.queued += runqueue_seconds(self.pid)


def runqueue_seconds(pid: int) -> float:
    """Seconds the threads of *pid* have spent runnable but waiting for a CPU
    (/proc/PID/task/TID/schedstat): how much a busy machine held the server back.
    Threads that ended meanwhile drop out, so a window can undercount."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:  # the thread ended
            continue
    return total / 1e9


def kernel_threads_cpu() -> float:
    """CPU seconds used so far by the kernel's threads (the children of kthreadd)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if fields[1] == "2" or entry.name == "2":  # field 4, the parent: kthreadd is pid 2
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def written_bytes(pid: int) -> int:
    """Bytes *pid* has caused to be written to storage (/proc/PID/io write_bytes)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise RuntimeError(f"no write_bytes in /proc/{pid}/io")


def shares(count: int, parts: int) -> list[int]:
    return [count // parts + (1 if i < count % parts else 0) for i in range(parts)]


def move(server: str, address: str, pid: int, args, messages: int | None = None,
         produce: bool = True, consume: bool = True, window: IoWindow | None = None) -> dict:
    """One run of *messages* (``args.size`` bytes each, recoverable or not as
    ``args.recoverable`` says: cqsd's choice) through *server*: ``args.producers``
    and ``args.consumers`` processes, or only the producers (filling), or only the
    consumers (draining what they put); the rate and what it cost the server.
    *window* (an IoWindow on *pid* by default) is open while the clients work."""
    messages = args.messages if messages is None else messages
    size = args.size
    ctx = multiprocessing.get_context("spawn")
    consumed = ctx.Value("q", 0)
    deadline = time.monotonic() + args.time_limit
    counts = shares(messages, args.producers)
    specs = []
    if produce:
        specs += [(movers.Mover(server, address, "producer", i, n, args.batch, deadline, size,
                                args.recoverable), consumed) for i, n in enumerate(counts)]
    if consume:
        specs += [(movers.Mover(server, address, "consumer", args.producers + i, messages,
                                args.batch, deadline, size, args.recoverable,
                                getattr(args, "plain", False)), consumed)
                  for i in range(args.consumers)]
    window = IoWindow(pid) if window is None else window
    done = run_processes(movers.mover, specs, args.time_limit + 60, window)
    put = sum(d[5] for d in done if d[2] == "producer")
    got = sum(d[5] for d in done if d[2] == "consumer")
    began = min(d[3] for d in done)  # the producers', if any: they start the flow
    ended = max(d[4] for d in done if d[2] == ("consumer" if consume else "producer"))
    seconds = (ended - began) / 1e9
    moved = got if consume else put
    clients_cpu = sum(d[7] for d in done)
    record = {"bench": "move", "server": server, "message": size,
              "recoverable": args.recoverable,
              "producers": args.producers if produce else 0,
              "consumers": args.consumers if consume else 0, "batch": args.batch,
              "plain": getattr(args, "plain", False),
              "messages": messages, "moved": moved, "seconds": round(seconds, 2),
              "msgs_per_s": round(moved / seconds, 1),
              "mib_per_s": round(moved * size / MiB / seconds, 1),
              "mb_per_s": round(moved * size / seconds / 1e6, 1),
              "server_cpu_s": round(window.server, 2),
              "server_cpu_ms_per_msg": round(window.server / max(moved, 1) * 1e3, 2),
              "server_cpu_us_per_msg": round(window.server / max(moved, 1) * 1e6, 1),
              "clients_cpu_s": round(clients_cpu, 2),
              "server_runqueue_wait_s": round(window.queued, 2),
              "kernel_threads_cpu_s": round(window.kernel, 2),
              "other_cpu_s": round(window.machine - window.server - clients_cpu - window.kernel,
                                   2),
              "written_mib": round(window.written / MiB, 1)}
    if produce:
        record["written_per_acked"] = round(window.written / max(put * size, 1), 3)
    if (produce and put != messages) or (consume and got != messages):
        record["error"] = f"{put} put and {got} consumed of {messages} before the time limit"
    elif consume and sum(d[6] for d in done) != movers.expected_sum(counts):
        record["error"] = "the consumers' checksum differs: a message lost or delivered twice"
    return record


def cqsd_move(where: Path, args) -> dict:
    config = _procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE,
                                "" if args.checkpoints else CHECKPOINTS_OFF,
                                'offload = "smds"\n')
    with servers.daemon(config) as d:
        d.start()
        with py_spy(args.py_spy, d.proc.pid, f"cqsd-{where.parent.name}"):
            record = move("cqsd", d.address, d.proc.pid, args)
        record["checkpoints_started"] = len(d.logged("checkpoint_started"))
        record["checkpoints_taken"] = len(d.logged("checkpoint_taken"))
        with _sdk(d.address) as c:
            rows = c.query("smds", "MSGQ01")
        record["data_sets_mib"] = round(sum(r["size"] for r in rows) / MiB, 1)
    return record


@contextlib.contextmanager
def py_spy(directory: Path | None, pid: int, name: str) -> Iterator[None]:
    """Sample *pid* with py-spy while the block runs (nothing without a directory):
    DIR/NAME.txt, collapsed stacks of the time on a CPU (py-spy's raw format, which
    flamegraph.pl draws), its functions by share of the samples in DIR/NAME.top.txt,
    and py-spy's own flame graph of another recorder, side by side, in DIR/NAME.svg."""
    if directory is None:
        yield
        return
    out = directory / f"{name}.txt"
    recorders = [subprocess.Popen([py_spy_binary(), "record", "--pid", str(pid), "--format",
                                   form, "--threads", "--output", str(path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for form, path in (("raw", out), ("flamegraph", out.with_suffix(".svg")))]
    try:
        yield
    finally:
        for proc in recorders:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        for proc in recorders:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    if out.exists():
        out.with_suffix(".top.txt").write_text(profile_top(out.read_text()))


def py_spy_binary() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(found, os.X_OK):
        raise RuntimeError("--py-spy needs py-spy (in the test extra)")
    return found


def profile_top(collapsed: str, top: int = 40) -> str:
    """The functions of collapsed stacks ("frame;frame;... count" lines) by their
    share of all samples: on the stack at all (inclusive), and at its top (own)."""
    total = 0
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    lines = [f"{total} samples"]
    for title, table in (("own", own), ("inclusive", inclusive)):
        lines.append(f"-- by {title} samples")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{100 * n / total:6.1f}%  {frame}")
    return "\n".join(lines) + "\n"


def rabbitmq_move(where: Path, args) -> dict:
    with servers.rabbitmq(where) as (port, pid):
        movers.declare_rabbit_queue(port)
        record = move("rabbitmq", str(port), pid, args)
    return record | {"version": servers.rabbitmq_version()}


def redis_move(where: Path, args) -> dict:
    with servers.redis_aof(where, args.redis_binary) as (sock, pid):
        record = move("redis", sock, pid, args)
    return record | {"version": servers.redis_version(args.redis_binary),
                     "appendfsync": "always"}


RUNS = {"cqsd": cqsd_move, "rabbitmq": rabbitmq_move, "redis": redis_move}


def move_figures(tmp: Path, args, lines: list[dict]) -> None:
    """Rounds of: the disk probe, then each server once, in an order that rotates."""
    runs: dict[str, list[dict]] = {s: [] for s in args.servers}
    disks: dict[int, list[dict]] = {k: [] for k in args.sync_every}
    for r in range(args.rounds):
        where = tmp / f"move-{r}"
        where.mkdir()
        for k in args.sync_every:
            probe = disk_figure(where, k, args.disk_mib, args.disk_seconds) | {"round": r}
            emit(probe, lines)
            disks[k].append(probe)
        order = args.servers[r % len(args.servers):] + args.servers[:r % len(args.servers)]
        for server in order:
            place = where / server
            place.mkdir()
            try:
                record = RUNS[server](place, args)
            except Exception as err:  # one failed run is a line, not the end of the figure
                record = {"bench": "move", "server": server,
                          "error": f"{type(err).__name__}: {err}"}
            emit(record | {"round": r}, lines)
            if "error" not in record:
                runs[server].append(record)
            shutil.rmtree(place, ignore_errors=True)
    emit(move_summary(runs, disks, PLAIN_TARGETS if args.plain else TARGETS), lines)


def move_summary(runs: dict[str, list[dict]], disks: dict[int, list[dict]],
                 targets: dict[str, float]) -> dict:
    """Each server's median round, the ratios of cqsd to the others, the disk."""
    median = {s: statistics.median(r["mib_per_s"] for r in rs) for s, rs in runs.items() if rs}
    record: dict = {"bench": "move_summary",
                    "median_mib_per_s": median,
                    "rounds_mib_per_s": {s: [r["mib_per_s"] for r in rs] for s, rs in runs.items()},
                    "written_per_acked": {s: statistics.median(r["written_per_acked"] for r in rs)
                                          for s, rs in runs.items() if rs},
                    "disk_mib_per_s": {f"sync_every_{k}_mib": statistics.median(
                        d["mib_per_s"] for d in ds) for k, ds in disks.items() if ds}}
    verdicts = {}
    for other, target in targets.items():
        if "cqsd" in median and other in median:
            ratio = median["cqsd"] / median[other]
            record[f"cqsd_over_{other}"] = round(ratio, 2)
            record[f"target_over_{other}"] = target
            verdicts[other] = ratio >= target
    if verdicts:
        record["target_met"] = all(verdicts.values())
    return record


# --- 2. memory while holding 4 GiB -----------------------------------------------


class RssSampler:
    """The daemon's largest VmRSS seen, sampled on a thread while a block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            self.most = max(self.most, servers.process_rss(self.pid)["rss_mib"])
            if self._stop.wait(RSS_SAMPLE):
                return


def memory_figure(tmp: Path, args, lines: list[dict]) -> None:
    """Fill a 64 MiB structure with 4 GiB of offloaded messages, hold, then drain."""
    where = tmp / "memory"
    where.mkdir()
    config = _procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE, CHECKPOINTS_OFF,
                                'offload = "smds"\n')
    record: dict = {"bench": "memory", "structure_size": STRUCTURE_SIZE,
                    "messages": args.memory_messages, "message": movers.MESSAGE,
                    "recoverable": True, "checkpoints": False}
    try:
        with servers.daemon(config) as d:
            d.start()
            record["rss_mib_empty"] = d.memory()["rss_mib"]
            with RssSampler(d.proc.pid) as filling:
                load = move("cqsd", d.address, d.proc.pid, args, args.memory_messages,
                            consume=False)
            record |= {"fill_s": load["seconds"], "fill_mib_per_s": load["mib_per_s"],
                       "rss_mib_most_while_filling": filling.most}
            with _sdk(d.address) as c:
                row = c.query("structures", "MSGQ01")[0]
                smds = c.query("smds", "MSGQ01")
            held = d.memory()
            record |= {"held_messages": row["messages"], "elements_used": row["elements_used"],
                       "data_sets": len(smds),
                       "data_sets_mib": round(sum(r["size"] for r in smds) / MiB),
                       "rss_mib_holding": held["rss_mib"], "hwm_mib_holding": held["peak_rss_mib"]}
            with RssSampler(d.proc.pid) as draining:
                drain = move("cqsd", d.address, d.proc.pid, args, args.memory_messages,
                             produce=False)
            after = d.memory()
            record |= {"drain_mib_per_s": drain["mib_per_s"],
                       "rss_mib_most_while_draining": draining.most,
                       "rss_mib_drained": after["rss_mib"], "hwm_mib": after["peak_rss_mib"]}
            for part in (load, drain):
                if "error" in part:
                    record["error"] = part["error"]
        record["target_met"] = record["rss_mib_holding"] < TARGET_RSS_MIB
        record["hwm_under_target"] = record["hwm_mib"] < TARGET_RSS_MIB
    except Exception as err:  # report what was measured before the failure
        record["error"] = f"{type(err).__name__}: {err}"
    emit(record, lines)


def _sdk(address: str):
    import cqsclient

    return cqsclient.connect(address, client="SMDSBENCH")


# --- 3. 1 KiB with and without offload configured --------------------------------


def small_figure(tmp: Path, args, lines: list[dict]) -> None:
    """One daemon, two structures alike but for ``offload``; every client switches
    between them at the same moments, slice after slice."""
    where = tmp / "small"
    where.mkdir()
    config = _procs.cqsd_config(where, MAX_CLIENTS, SMALL_SIZE, structure_keys=(
        f'[[structure]]\nname = "{SMALL_OFFLOAD}"\nsize = "{SMALL_SIZE}"\noffload = "smds"\n'))
    slice_ns, slices = int(args.slice_seconds * 1e9), 2 * args.small_pairs
    ctx = multiprocessing.get_context("spawn")
    grid = ctx.Value("q", 0)
    with servers.daemon(config) as d:
        d.start()
        specs = [(movers.Alternating(d.address, i, ("MSGQ01", SMALL_OFFLOAD), slice_ns, slices),
                  grid) for i in range(args.small_clients)]
        clock = SliceClock(d.proc.pid, grid, slice_ns, slices)
        done = run_processes(movers.alternating_cycles, specs,
                             slices * args.slice_seconds + 120, clock)
    cycles = [sum(d[2][k] for d in done) for k in range(slices)]
    cpu = [b - a for a, b in itertools.pairwise(clock.cpu)]
    sides = {"none": range(0, slices, 2), "smds": range(1, slices, 2)}
    rate = {side: sum(cycles[k] for k in ks) / (len(ks) * args.slice_seconds)
            for side, ks in sides.items()}
    cpu_us = {side: sum(cpu[k] for k in ks) / max(sum(cycles[k] for k in ks), 1) * 1e6
              for side, ks in sides.items()} if len(cpu) == slices else {}
    pairs = [cycles[k + 1] / cycles[k] for k in range(0, slices, 2) if cycles[k]]
    ratio = rate["smds"] / rate["none"]
    emit({"bench": "small", "clients": args.small_clients, "payload": 1024,
          "slice_s": args.slice_seconds, "pairs": args.small_pairs,
          "msgs_per_s": {k: round(v, 1) for k, v in rate.items()},
          "smds_over_none": round(ratio, 3),
          "pair_ratios_median": round(statistics.median(pairs), 3),
          "pair_ratios_quartiles": [round(q, 3) for q in statistics.quantiles(pairs, n=4)],
          "server_cpu_us_per_msg": {k: round(v, 1) for k, v in cpu_us.items()},
          "clients_cpu_s": round(sum(d[3] for d in done), 2),
          "server_cpu_s": round(clock.server, 2),
          "other_cpu_s": round(clock.machine - clock.server - sum(d[3] for d in done), 2),
          "target_met": ratio >= TARGET_SMALL_RATIO}, lines)


# --- summary and main -------------------------------------------------------------


def summary(lines: list[dict]) -> list[str]:
    verdict = {True: "MET", False: "MISSED", None: "n/a"}
    out = []
    for r in lines:
        bench, target = r.get("bench"), verdict[r.get("target_met")]
        if "error" in r:
            out.append(f"{bench} {r.get('server', '')}: ERROR {r['error'].splitlines()[0]}")
        elif bench == "move_summary":
            m = r["median_mib_per_s"]
            out.append("1 MiB recoverable, 4+4 processes, MiB/s (median of rounds): "
                       + ", ".join(f"{s} {v}" for s, v in m.items())
                       + f"; cqsd/rabbitmq {r.get('cqsd_over_rabbitmq')} [target >= "
                       f"{r.get('target_over_rabbitmq')}], cqsd/redis "
                       f"{r.get('cqsd_over_redis')} [target >= {r.get('target_over_redis')}]: "
                       f"{target}; disk "
                       f"{r['disk_mib_per_s']}; written per acked byte "
                       f"{r['written_per_acked']}")
        elif bench == "memory":
            out.append(f"holding {r['held_messages']} x 1 MiB offloaded in {STRUCTURE_SIZE}: "
                       f"VmRSS {r['rss_mib_holding']} MiB, VmHWM {r['hwm_mib_holding']} MiB "
                       f"[target < {TARGET_RSS_MIB}: {target}]; after the drain VmRSS "
                       f"{r['rss_mib_drained']}, VmHWM {r['hwm_mib']}")
        elif bench == "small":
            m, cpu = r["msgs_per_s"], r["server_cpu_us_per_msg"]
            out.append(f"1 KiB put+read+delete, {r['clients']} clients: offload smds "
                       f"{m['smds']} msgs/s, none {m['none']} = {r['smds_over_none']} "
                       f"[target >= {TARGET_SMALL_RATIO}: {target}] (median of the "
                       f"{r['pairs']} slice pairs {r['pair_ratios_median']}); daemon CPU "
                       f"{cpu.get('smds')} vs {cpu.get('none')} us per message")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller counts (a few minutes)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help=f"comma-separated figures, of {','.join(FIGURES)}")
    p.add_argument("--servers", default=",".join(SERVERS),
                   help="comma-separated servers of figure 1, of " + ",".join(SERVERS))
    p.add_argument("--rounds", type=int, help="rounds of figure 1 (default 3, --quick 1)")
    p.add_argument("--messages", type=int, help="1 MiB messages a run of figure 1 moves "
                                                "(default 2048, --quick 512)")
    p.add_argument("--batch", type=int, default=8, help="messages in flight per client")
    p.add_argument("--plain", action="store_true",
                   help="figure 1 at --batch 1: cqsd's consumers read, then delete, each "
                        "its own request (issue 30's pattern), not delete_and_read")
    p.add_argument("--checkpoints", action="store_true",
                   help="figure 1: leave cqsd's checkpoints on (a Spark job every 256 MiB "
                        "of log); off by default, as in figure 2")
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="sample the daemon of each cqsd run of figure 1 with py-spy into DIR")
    args = p.parse_args(argv)
    if args.py_spy:
        args.py_spy = args.py_spy.resolve()
        args.py_spy.mkdir(parents=True, exist_ok=True)
    if args.plain and args.batch != 1:
        p.error("--plain is the one-message-per-request pattern: it needs --batch 1")
    args.only = set(args.only.split(","))
    args.servers = [s for s in SERVERS if s in args.servers.split(",")]
    if unknown := args.only - set(FIGURES):
        p.error(f"unknown figures: {', '.join(sorted(unknown))}")
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.messages = args.messages or (512 if quick else 2048)
    args.producers = args.consumers = 4
    args.size, args.recoverable = MiB, True
    args.time_limit = 300.0  # seconds any one run may take
    args.sync_every = [1, 16]
    args.disk_mib, args.disk_seconds = 1024, 5.0
    args.memory_messages = 1024 if quick else 4096
    args.small_pairs = 10 if quick else 40
    args.small_clients = 8
    args.slice_seconds = 0.5
    args.redis_binary = None
    if "move" in args.only and "redis" in args.servers:
        args.redis_binary = _procs.redis_server_path()
        if args.redis_binary is None:
            args.servers.remove("redis")
    if "move" in args.only and "rabbitmq" in args.servers:
        if _procs.debian_binary("rabbitmq-server", "rabbitmq-server") is None:
            args.servers.remove("rabbitmq")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[dict] = []
    # Under /tmp on purpose, as durability.py: the figures are about that disk.
    tmp = Path(tempfile.mkdtemp(prefix="cqsmds-", dir="/tmp"))
    started = time.monotonic()
    try:
        usage = shutil.disk_usage(tmp)
        emit(environment(tmp) | {"disk_free_gib": round(usage.free / 2**30, 1)}, lines)
        for name, figure in (("move", move_figures), ("memory", memory_figure),
                             ("small", small_figure)):
            if name in args.only:
                try:
                    figure(tmp, args, lines)
                except Exception as err:
                    emit({"bench": name, "error": f"{type(err).__name__}: {err}"}, lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in summary(lines):
        print("# " + line)
    print(f"# total {time.monotonic() - started:.0f} s")
    return 1 if any("error" in r for r in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
