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
2. memory - the daemon's VmRSS and VmHWM while it holds 4 GiB of offloaded
            recoverable 1 MiB messages in a 64 MiB structure, and after they
            are read and deleted. Checkpoints off: a Spark job folding 4 GiB
            of log is another figure. [VmRSS < 300 MiB]
3. small  - 1 KiB recoverable put + read + delete, one request at a time per
            client, 8 client processes, on a structure with offload = "smds"
            and on one without, in one daemon, alternating rounds.
            [offload >= 0.95 x without]

Run: nice -n 5 .venv/bin/python benchmarks/smds.py [--quick] [--only move,memory,small]
     [--servers cqsd,rabbitmq,redis] [--rounds N] [--messages N] [--batch N]
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
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import _durability_servers as servers
import _procs
import _smds_clients as movers
from durability import Window, cycle_figure, emit, environment, run_processes

MiB = 1 << 20
MAX_CLIENTS = 64
STRUCTURE_SIZE = "64MiB"  # the embedded default's MSGQ01: offloaded entries cost one element
SMALL_SIZE = "1GiB"  # figure 3: room enough that no 1 KiB payload is offloaded
SMALL_OFFLOAD = "SMDS01"  # figure 3's structure with offload = "smds" (MSGQ01 has none)
CHECKPOINTS_OFF = "checkpoint_interval = 0\ncheckpoint_log_volume = 0\n"
TARGET_RSS_MIB = 300
TARGET_SMALL_RATIO = 0.95
SERVERS = ("cqsd", "rabbitmq", "redis")
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
    """Window, plus the bytes the server process sent to storage meanwhile."""

    def start(self) -> None:
        super().start()
        self.written = -written_bytes(self.pid)

    def stop(self) -> None:
        super().stop()
        self.written += written_bytes(self.pid)


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
         produce: bool = True, consume: bool = True) -> dict:
    """One run of *messages* through *server*: 4 producers and 4 consumers, or only
    the producers (filling), or only the consumers (draining what they put);
    MiB/s and what it cost the server."""
    messages = args.messages if messages is None else messages
    ctx = multiprocessing.get_context("spawn")
    consumed = ctx.Value("q", 0)
    deadline = time.monotonic() + args.time_limit
    counts = shares(messages, args.producers)
    specs = []
    if produce:
        specs += [(movers.Mover(server, address, "producer", i, n, args.batch, deadline),
                   consumed) for i, n in enumerate(counts)]
    if consume:
        specs += [(movers.Mover(server, address, "consumer", args.producers + i, messages,
                                args.batch, deadline), consumed)
                  for i in range(args.consumers)]
    window = IoWindow(pid)
    done = run_processes(movers.mover, specs, args.time_limit + 60, window)
    put = sum(d[5] for d in done if d[2] == "producer")
    got = sum(d[5] for d in done if d[2] == "consumer")
    began = min(d[3] for d in done)  # the producers', if any: they start the flow
    ended = max(d[4] for d in done if d[2] == ("consumer" if consume else "producer"))
    seconds = (ended - began) / 1e9
    moved = got if consume else put
    clients_cpu = sum(d[7] for d in done)
    record = {"bench": "move", "server": server, "message": movers.MESSAGE,
              "producers": args.producers if produce else 0,
              "consumers": args.consumers if consume else 0, "batch": args.batch,
              "messages": messages, "moved": moved, "seconds": round(seconds, 2),
              "mib_per_s": round(moved / seconds, 1),
              "mb_per_s": round(moved * MiB / seconds / 1e6, 1),
              "server_cpu_s": round(window.server, 2),
              "server_cpu_ms_per_msg": round(window.server / max(moved, 1) * 1e3, 2),
              "clients_cpu_s": round(clients_cpu, 2),
              "other_cpu_s": round(window.machine - window.server - clients_cpu, 2),
              "written_mib": round(window.written / MiB, 1)}
    if produce:
        record["written_per_acked"] = round(window.written / max(put * MiB, 1), 3)
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
        record = move("cqsd", d.address, d.proc.pid, args)
        record["checkpoints_started"] = len(d.logged("checkpoint_started"))
        record["checkpoints_taken"] = len(d.logged("checkpoint_taken"))
        with _sdk(d.address) as c:
            rows = c.query("smds", "MSGQ01")
        record["data_sets_mib"] = round(sum(r["size"] for r in rows) / MiB, 1)
    return record


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
    emit(move_summary(runs, disks), lines)


def move_summary(runs: dict[str, list[dict]], disks: dict[int, list[dict]]) -> dict:
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
    for other in ("rabbitmq", "redis"):
        if "cqsd" in median and other in median:
            ratio = median["cqsd"] / median[other]
            record[f"cqsd_over_{other}"] = round(ratio, 2)
            verdicts[other] = ratio >= 1.0
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
    """One daemon, two structures alike but for ``offload``; alternating rounds of
    the 1 KiB put + read + delete loop on each."""
    where = tmp / "small"
    where.mkdir()
    config = _procs.cqsd_config(where, MAX_CLIENTS, SMALL_SIZE, structure_keys=(
        f'[[structure]]\nname = "{SMALL_OFFLOAD}"\nsize = "{SMALL_SIZE}"\noffload = "smds"\n'))
    rates: dict[str, list[float]] = {"none": [], "smds": []}
    pairs: list[float] = []
    with servers.daemon(config) as d:
        d.start()
        for r in range(args.small_rounds):
            order = ("none", "smds") if r % 2 == 0 else ("smds", "none")
            got = {}
            for offload in order:
                structure = "MSGQ01" if offload == "none" else SMALL_OFFLOAD
                run = cycle_figure("cqsd", d.address, d.proc.pid, args.small_clients,
                                   args.small_seconds, 1_000_000, structure)
                emit(run | {"bench": "small", "offload": offload, "round": r}, lines)
                got[offload] = run["msgs_per_s"]
                rates[offload].append(run["msgs_per_s"])
            pairs.append(got["smds"] / got["none"])
    median = {k: statistics.median(v) for k, v in rates.items()}
    ratio = median["smds"] / median["none"]
    emit({"bench": "small_summary", "clients": args.small_clients, "payload": 1024,
          "median_msgs_per_s": median, "smds_over_none": round(ratio, 3),
          "round_ratios": [round(p, 3) for p in pairs],
          "median_round_ratio": round(statistics.median(pairs), 3),
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
                       + f"; cqsd/rabbitmq {r.get('cqsd_over_rabbitmq')}, cqsd/redis "
                       f"{r.get('cqsd_over_redis')} [target >= 1: {target}]; disk "
                       f"{r['disk_mib_per_s']}; written per acked byte "
                       f"{r['written_per_acked']}")
        elif bench == "memory":
            out.append(f"holding {r['held_messages']} x 1 MiB offloaded in {STRUCTURE_SIZE}: "
                       f"VmRSS {r['rss_mib_holding']} MiB, VmHWM {r['hwm_mib_holding']} MiB "
                       f"[target < {TARGET_RSS_MIB}: {target}]; after the drain VmRSS "
                       f"{r['rss_mib_drained']}, VmHWM {r['hwm_mib']}")
        elif bench == "small_summary":
            m = r["median_msgs_per_s"]
            out.append(f"1 KiB put+read+delete, {r['clients']} clients: offload smds "
                       f"{m['smds']} msgs/s, none {m['none']} = {r['smds_over_none']} "
                       f"[target >= {TARGET_SMALL_RATIO}: {target}]; per round "
                       f"{r['round_ratios']}")
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
    p.add_argument("--checkpoints", action="store_true",
                   help="figure 1: leave cqsd's checkpoints on (a Spark job every 256 MiB "
                        "of log); off by default, as in figure 2")
    args = p.parse_args(argv)
    args.only = set(args.only.split(","))
    args.servers = [s for s in SERVERS if s in args.servers.split(",")]
    if unknown := args.only - set(FIGURES):
        p.error(f"unknown figures: {', '.join(sorted(unknown))}")
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.messages = args.messages or (512 if quick else 2048)
    args.producers = args.consumers = 4
    args.time_limit = 300.0  # seconds any one run may take
    args.sync_every = [1, 16]
    args.disk_mib, args.disk_seconds = 1024, 5.0
    args.memory_messages = 1024 if quick else 4096
    args.small_rounds = 2 if quick else 6
    args.small_clients = 8
    args.small_seconds = 3.0 if quick else 5.0
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
