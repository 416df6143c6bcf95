"""cqsd against its peers (issue 18): small messages through cqsd, Redis 7 and
RabbitMQ 3.10 side by side in one run, and the daemon's CPU per message.

Figures (targets in brackets, each a ratio taken in one run):

1. put   - one client, one recoverable put at a time: p50 against the p50 of
           an fsync of the same disk, in alternating blocks (durability.py's
           figure 2, called as it is). [p50 <= 1.5 x fsync p50]
2. peers - ``--size`` (1 KiB) messages, 4 producer and 4 consumer processes,
           each process pipelining ``--batch`` messages and, in a second run,
           one at a time (batch 1), through smds.py's movers (_smds_clients):
           - durable: cqsd (recoverable put; read with lock; delete), Redis
             with ``appendfsync always`` (LPUSH; LMOVE to a processing list;
             LREM), RabbitMQ (durable classic queue, persistent messages,
             publisher confirms, manual acks): every message durable before
             its producer is told, and locked (unacked) until its consumer
             deletes (acks) it;
           - not durable: cqsd non-recoverable, Redis without persistence.
           Messages/s, and the server's CPU per message (utime + stime of the
           whole process, every thread, over the clients' window: cqsd's
           daemon, redis-server, RabbitMQ's beam.smp). Rounds rotate the
           servers, each run on a fresh server and data directory; the
           summary takes each server's median round.
           [durable: cqsd >= 1.5 x Redis, >= 2 x RabbitMQ, CPU per message
           <= Redis's; not durable: cqsd >= 1.5 x Redis]
           At batch 1 cqsd's consumers ack with ``delete_and_read`` (the
           delete carries the next read, as AMQP's ack and next delivery);
           ``cqsd-plain`` (issue 30) is the pattern most applications write:
           a put, a read with a lock, a delete, each its own request.
           [cqsd-plain >= 1.5 x Redis, >= 2 x RabbitMQ, CPU per message <=
           Redis's; cqsd (delete_and_read) >= 2 x Redis]
   cycle - one client, one process, recoverable 1 KiB put / read with a lock /
           delete one request at a time, for ``--cycle-seconds`` on each server
           (Redis: LPUSH, BLMOVE to a processing list, LREM; RabbitMQ: a
           confirmed persistent publish, basic_get, basic_ack), rotating over
           the rounds: cycles/s and server CPU per cycle. [cqsd >= 1.2 x both]
3. profile (with ``--py-spy DIR``, ``--perf-stat`` or ``--perf-record DIR``) -
           more durable cqsd runs, one per batch, on their own daemon so that the
           sampling does not touch the figures above: py-spy's collapsed stacks,
           top functions and flame graph of the daemon in DIR; ``perf stat``
           counts of the daemon (syscalls, context switches) over the clients'
           window, per message; ``perf record`` samples of the daemon over the
           same window (user and kernel stacks, for ``perf report`` and ``perf
           script``) in DIR.

Run: nice -n 5 .venv/bin/python benchmarks/peers.py [--rounds N] [--size BYTES]
     [--batch N] [--messages N] [--batch-messages N] [--only put,peers]
     [--servers cqsd,redis,rabbitmq,cqsd-nd,redis-nd] [--py-spy DIR] [--perf-stat]
     [--perf-record DIR]
One JSON line per run and per figure on stdout, each with the 1-minute load
average, then a summary (lines starting "# "). Everything runs under one
temporary directory in /tmp, on Unix sockets (RabbitMQ on 127.0.0.1: AMQP has
no Unix socket); servers, clients and the directory are cleaned up whatever
happens, and the script exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _durability_servers as servers
import _procs
import _smds_clients as movers
from durability import TARGET_PUT_OVER_FSYNC, Window, emit, environment, put_latency_figure
from smds import IoWindow, move, py_spy

MAX_CLIENTS = 64
STRUCTURE_SIZE = "1GiB"
VARIANTS = {  # name: (server, durable)
    "cqsd": ("cqsd", True), "redis": ("redis", True), "rabbitmq": ("rabbitmq", True),
    "cqsd-nd": ("cqsd", False), "redis-nd": ("redis", False), "cqsd-plain": ("cqsd", True)}
PLAIN = {"cqsd-plain"}  # consumers read, then delete: batch 1 only
CYCLE_SERVERS = ("cqsd", "redis", "rabbitmq")
FIGURES = ("put", "peers", "cycle")
TARGET_OVER_REDIS = 1.5
TARGET_OVER_RABBITMQ = 2.0
TARGET_NONDURABLE_OVER_REDIS = 1.5
TARGET_ACKNEXT_OVER_REDIS = 2.0  # cqsd's delete_and_read consumers, batch 1 (issue 30)
TARGET_CYCLE_OVER_PEERS = 1.2
PERF_EVENTS = ("task-clock", "context-switches", "cpu-migrations", "raw_syscalls:sys_enter",
               "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_recvfrom",
               "syscalls:sys_enter_sendto", "syscalls:sys_enter_write",
               "syscalls:sys_enter_pwrite64", "syscalls:sys_enter_fdatasync",
               "syscalls:sys_enter_futex")
PERF_ACK_TIMEOUT = 10.0  # seconds perf has to acknowledge an enable or disable
# perf record's samples a second, and the stack bytes each copies: DWARF unwinding
# (libpython and the compiled modules have no frame pointers) of Trio's deep stacks
# needs the 32 KiB; 10,000 messages of the plain pattern make ~150 MB
PERF_RECORD_HZ = 1999
PERF_RECORD_STACK = 32768


# --- the servers ------------------------------------------------------------------


@contextlib.contextmanager
def started(variant: str, where: Path, args) -> Iterator[tuple[str, int, dict]]:
    """The server of *variant* running in *where*: yields (address, pid, what to
    add to its records)."""
    if VARIANTS[variant][0] == "cqsd":
        with servers.daemon(_procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE)) as d:
            d.start()
            yield d.address, d.proc.pid, {}
            if not d.alive():
                raise _procs.ServerFailed(f"cqsd died during the run:\n{d.log_text()}")
    elif variant == "redis":
        with servers.redis_aof(where, args.redis_binary) as (sock, pid):
            yield sock, pid, {"version": servers.redis_version(args.redis_binary),
                              "appendfsync": "always"}
    elif variant == "redis-nd":
        with _procs.redis(where, args.redis_binary) as server:
            yield server.address, server.pid, {
                "version": servers.redis_version(args.redis_binary), "persistence": False}
    else:
        with servers.rabbitmq(where) as (port, pid):
            movers.declare_rabbit_queue(port)
            yield str(port), pid, {"version": servers.rabbitmq_version()}


def setting(args, batch: int, durable: bool, plain: bool = False) -> argparse.Namespace:
    """*args* for one run of move(): its batch, its count (a run of batch 1 moves
    fewer: it is several times slower), whether cqsd's puts are recoverable and
    whether its consumers read and delete apart."""
    messages = args.messages if batch == 1 else args.batch_messages
    return argparse.Namespace(**{**vars(args), "batch": batch, "messages": messages,
                                 "recoverable": durable, "plain": plain})


# --- 2. the peers ---------------------------------------------------------------


def peer_figures(tmp: Path, args, lines: list[dict]) -> None:
    """Rounds of every variant once, in an order that rotates, each at every batch."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        k = r % len(args.servers)
        for variant in args.servers[k:] + args.servers[:k]:
            server, durable = VARIANTS[variant]
            place = tmp / f"round-{r}" / variant
            place.mkdir(parents=True)
            try:
                with started(variant, place, args) as (address, pid, info):
                    for batch in [1] if variant in PLAIN else args.batches:
                        record = move(server, address, pid,
                                      setting(args, batch, durable, variant in PLAIN))
                        record |= info | {"variant": variant, "round": r}
                        emit(record, lines)
                        if "error" not in record:
                            runs.setdefault((variant, batch), []).append(record)
            except Exception as err:  # one failed server is a line, not the end of the figure
                emit({"bench": "move", "variant": variant, "round": r,
                      "error": f"{type(err).__name__}: {err}"}, lines)
            shutil.rmtree(place, ignore_errors=True)
    for batch in args.batches:
        emit(peers_summary(batch, {v: rs for (v, b), rs in runs.items() if b == batch}), lines)


def peers_summary(batch: int, runs: dict[str, list[dict]]) -> dict:
    """Each variant's median rate and CPU per message over the rounds, the ratios,
    and the issue's targets judged on them."""
    def median(key: str) -> dict[str, float]:
        return {v: statistics.median(r[key] for r in rs) for v, rs in runs.items()}

    rate, cpu = median("msgs_per_s"), median("server_cpu_us_per_msg")
    record: dict = {"bench": "peers_summary", "batch": batch, "msgs_per_s": rate,
                    "rounds_msgs_per_s": {v: [r["msgs_per_s"] for r in rs]
                                          for v, rs in runs.items()},
                    "server_cpu_us_per_msg": cpu,
                    "loadavg_1m_of_runs": sorted(r["loadavg_1m"] for rs in runs.values()
                                                 for r in rs)}
    targets = {}
    for name, (mine, theirs, target) in {
            "cqsd_over_redis": ("cqsd", "redis", TARGET_OVER_REDIS),
            "cqsd_over_rabbitmq": ("cqsd", "rabbitmq", TARGET_OVER_RABBITMQ),
            "cqsd_nd_over_redis_nd": ("cqsd-nd", "redis-nd", TARGET_NONDURABLE_OVER_REDIS),
            "cqsd_plain_over_redis": ("cqsd-plain", "redis", TARGET_OVER_REDIS),
            "cqsd_plain_over_rabbitmq": ("cqsd-plain", "rabbitmq", TARGET_OVER_RABBITMQ),
            "cqsd_acknext_over_redis": ("cqsd", "redis", TARGET_ACKNEXT_OVER_REDIS),
    }.items():
        if name == "cqsd_acknext_over_redis" and batch != 1:
            continue
        if mine in rate and theirs in rate:
            record[name] = round(rate[mine] / rate[theirs], 2)
            targets[name] = record[name] >= target
    if "cqsd" in cpu and "redis" in cpu:
        record["cpu_cqsd_over_redis"] = round(cpu["cqsd"] / cpu["redis"], 2)
        targets["cpu_at_most_redis"] = cpu["cqsd"] <= cpu["redis"]
    if "cqsd-plain" in cpu and "redis" in cpu:
        record["cpu_cqsd_plain_over_redis"] = round(cpu["cqsd-plain"] / cpu["redis"], 2)
        targets["cpu_plain_at_most_redis"] = cpu["cqsd-plain"] <= cpu["redis"]
    record["targets_met"] = targets
    return record


# --- the single client's cycle ------------------------------------------------------


@contextlib.contextmanager
def cycler(server: str, address: str) -> Iterator:
    """A function doing one durable put / read with a lock / delete of *server*."""
    from _durability_clients import CYCLE_QUEUE, payload

    seq = iter(range(1 << 62))
    if server == "cqsd":
        import cqsclient

        with cqsclient.connect(address, client="CYCLE") as c:
            s = c.structure(movers.STRUCTURE)

            def cycle() -> None:
                s.put(CYCLE_QUEUE, payload(0, next(seq)), recoverable=True)
                s.delete(s.read(CYCLE_QUEUE, wait=1.0).entry_id)

            yield cycle
    elif server == "redis":
        import redis

        r = redis.Redis(unix_socket_path=address, socket_timeout=30)
        try:
            def cycle() -> None:
                r.lpush(movers.QUEUE, payload(0, next(seq)))
                value = r.blmove(movers.QUEUE, "cycle:processing", 1.0, "RIGHT", "LEFT")
                r.lrem("cycle:processing", 1, value)

            yield cycle
        finally:
            r.close()
    else:
        import pika

        persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        with pika.BlockingConnection(pika.ConnectionParameters(
                host="127.0.0.1", port=int(address), heartbeat=0)) as conn:
            channel = conn.channel()
            channel.confirm_delivery()  # basic_publish waits for the broker's confirm

            def cycle() -> None:
                channel.basic_publish("", movers.QUEUE, payload(0, next(seq)), persistent)
                method, _props, _body = channel.basic_get(movers.QUEUE, auto_ack=False)
                channel.basic_ack(method.delivery_tag)

            yield cycle


def cycle_figure(tmp: Path, args, lines: list[dict]) -> None:
    """Each server's single-client cycle rate, rounds rotating the servers."""
    names = [v for v in CYCLE_SERVERS if v in args.servers]
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        k = r % len(names)
        for server in names[k:] + names[:k]:
            place = tmp / f"cycle-{r}" / server
            place.mkdir(parents=True)
            try:
                with started(server, place, args) as (address, pid, _info):
                    with cycler(server, address) as cycle:
                        for _ in range(20):  # warm: connections, the daemon's threads
                            cycle()
                        window = Window(pid)
                        window.start()
                        done, stop = 0, time.monotonic() + args.cycle_seconds
                        while time.monotonic() < stop:
                            cycle()
                            done += 1
                        window.stop()
                record = {"bench": "cycle", "server": server, "round": r, "cycles": done,
                          "cycles_per_s": round(done / window.seconds, 1),
                          "server_cpu_us_per_cycle": round(window.server / done * 1e6, 1),
                          "loadavg_1m": os.getloadavg()[0]}
                emit(record, lines)
                runs.setdefault(server, []).append(record)
            except Exception as err:
                emit({"bench": "cycle", "server": server, "round": r,
                      "error": f"{type(err).__name__}: {err}"}, lines)
            shutil.rmtree(place, ignore_errors=True)
    rate = {v: statistics.median(x["cycles_per_s"] for x in rs) for v, rs in runs.items()}
    cpu = {v: statistics.median(x["server_cpu_us_per_cycle"] for x in rs)
           for v, rs in runs.items()}
    record = {"bench": "cycle_summary", "cycles_per_s": rate, "server_cpu_us_per_cycle": cpu}
    for peer in ("redis", "rabbitmq"):
        if "cqsd" in rate and peer in rate:
            record[f"cqsd_over_{peer}"] = ratio = round(rate["cqsd"] / rate[peer], 2)
            record.setdefault("targets_met", {})[f"cqsd_over_{peer}"] = (
                ratio >= TARGET_CYCLE_OVER_PEERS)
    emit(record, lines)


# --- 3. the profiled run ----------------------------------------------------------


class Perf:
    """``perf stat`` on a process, counting only between enable() and disable()
    (perf's control FIFOs, started with events off): exactly the clients' window;
    with ``record``, ``perf record`` into that file over the same window instead.

    Threads the process starts after perf attaches are not counted, so the
    daemon is warmed first (its journal's flush thread exists by then).
    """

    def __init__(self, pid: int, where: Path, record: Path | None = None) -> None:
        ctl, ack = (where / f"perf-{'record' if record else 'stat'}-{name}"
                    for name in ("ctl", "ack"))
        for fifo in (ctl, ack):
            os.mkfifo(fifo)
        # Both ends opened read-write: never blocks, whether perf has opened them or not.
        self.ctl = os.open(ctl, os.O_RDWR)
        self.ack = os.open(ack, os.O_RDWR)
        self.record = record
        command = (["perf", "record", "-F", str(PERF_RECORD_HZ),
                    "--call-graph", f"dwarf,{PERF_RECORD_STACK}", "-o", str(record)]
                   if record is not None else
                   ["perf", "stat", "-x", ",", "-e", ",".join(PERF_EVENTS)])
        self.proc = subprocess.Popen(
            command + ["--delay=-1", "--control", f"fifo:{ctl},{ack}", "-p", str(pid)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)

    def command(self, word: str) -> None:
        os.write(self.ctl, word.encode() + b"\n")
        ready, _, _ = select.select([self.ack], [], [], PERF_ACK_TIMEOUT)
        if not ready:
            raise RuntimeError(f"perf stat did not acknowledge {word!r}")
        os.read(self.ack, 64)

    def finish(self) -> dict[str, float]:
        """Stop perf; its counts by event name (none for ``perf record``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=120)  # record writes its buildids
        finally:
            os.close(self.ctl)
            os.close(self.ack)
        if self.record is not None:
            if not self.record.exists():
                raise RuntimeError(f"perf record wrote nothing:\n{err[-2000:]}")
            return {}
        counts = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in PERF_EVENTS:
                try:
                    counts[fields[2]] = float(fields[0])
                except ValueError:  # <not counted>, <not supported>
                    continue
        if not counts:
            raise RuntimeError(f"perf stat counted nothing:\n{err[-2000:]}")
        return counts


class PerfWindow(IoWindow):
    """IoWindow that also has perf count or record over the same moments."""

    def __init__(self, pid: int, perfs: list[Perf]) -> None:
        super().__init__(pid)
        self.perfs = perfs

    def start(self) -> None:
        super().start()
        for perf in self.perfs:
            perf.command("enable")

    def stop(self) -> None:
        for perf in self.perfs:
            perf.command("disable")
        super().stop()


def perf_problem(counts: bool = True) -> str | None:
    """Why perf cannot run here (with ``counts``: why ``perf stat`` cannot count
    syscalls), or None if it can."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: linux-perf)"
    if not counts:
        return None
    probe = subprocess.run(["perf", "stat", "-e", "raw_syscalls:sys_enter", "true"],
                           capture_output=True, text=True, timeout=30)
    return None if probe.returncode == 0 else f"perf stat fails: {probe.stderr.strip()[-300:]}"


def warm(address: str) -> None:
    """A few recoverable put + read + delete cycles, so that the daemon's threads exist."""
    import cqsclient

    with cqsclient.connect(address, client="PEERWARM") as c:
        s = c.structure(movers.STRUCTURE)
        for _ in range(20):
            s.put(movers.QUEUE, b"warm", recoverable=True)
            m = s.read(movers.QUEUE)
            s.delete(m.entry_id)


def profile_figure(tmp: Path, args, lines: list[dict]) -> None:
    """Durable cqsd runs, one per batch, under py-spy and/or perf."""
    where = tmp / "profile"
    where.mkdir()
    with servers.daemon(_procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE)) as d:
        d.start()
        warm(d.address)
        for batch, plain in [(b, False) for b in args.batches] + [(1, True)]:
            variant = "cqsd-plain" if plain else "cqsd"
            record: dict = {"bench": "move", "variant": variant, "profiled": True,
                            "py_spy": str(args.py_spy) if args.py_spy else None,
                            "perf_record": str(args.perf_record) if args.perf_record else None}
            try:
                record |= profiled_run(d, where / f"b{batch}{'-plain' * plain}", batch,
                                       plain, args)
            except Exception as err:
                record["error"] = f"{type(err).__name__}: {err}"
            emit(record, lines)


def profiled_run(d: servers.Daemon, where: Path, batch: int, plain: bool, args) -> dict:
    where.mkdir()
    pid = d.proc.pid
    name = f"cqsd-peers-b{batch}{'-plain' * plain}"
    perf = Perf(pid, where) if args.perf_stat else None
    recorder = (Perf(pid, where, args.perf_record / f"{name}.data")
                if args.perf_record else None)
    perfs = [p for p in (perf, recorder) if p is not None]
    try:
        with py_spy(args.py_spy, pid, name):
            record = move("cqsd", d.address, pid, setting(args, batch, True, plain),
                          window=PerfWindow(pid, perfs))
    finally:
        try:
            counts = perf.finish() if perf is not None else {}
        finally:
            if recorder is not None:
                recorder.finish()
    if counts:
        moved = max(record["moved"], 1)
        record["perf"] = {k: round(v) for k, v in counts.items()}
        record["perf_per_msg"] = {k.rpartition(":")[2].removeprefix("sys_enter_"):
                                  round(v / moved, 2) for k, v in counts.items()
                                  if k != "task-clock"}
        record["perf_task_clock_us_per_msg"] = round(
            counts.get("task-clock", 0) * 1e3 / moved, 1)  # perf counts msec
    return record


# --- summary and main -------------------------------------------------------------


def summary(lines: list[dict]) -> list[str]:
    verdict = {True: "MET", False: "MISSED", None: "n/a"}
    out = []
    for r in lines:
        bench = r.get("bench")
        if "error" in r:
            out.append(f"{bench} {r.get('variant', '')}: ERROR {r['error'].splitlines()[0]}")
        elif bench == "environment":
            out.append(f"python {r['python']} ({r['python_binary']}), {r['cpus']} CPUs, "
                       f"data on {r['data_fs']}")
        elif bench == "put_latency":
            out.append(f"recoverable put, 1 client: p50 {r['p50_ms']} ms = "
                       f"{r['p50_over_fsync_p50']} x fsync p50 {r['fsync_p50_ms']} ms "
                       f"[target <= {TARGET_PUT_OVER_FSYNC}x: {verdict[r['target_met']]}]")
        elif bench == "peers_summary":
            rate, cpu, met = r["msgs_per_s"], r["server_cpu_us_per_msg"], r["targets_met"]
            load = r["loadavg_1m_of_runs"]
            out.append(f"batch {r['batch']}, msgs/s (median of rounds): "
                       + ", ".join(f"{v} {round(x)}" for v, x in rate.items())
                       + (f"; load {load[0]:.1f}-{load[-1]:.1f}" if load else ""))
            out.append(f"  durable: cqsd/redis {r.get('cqsd_over_redis')} [target >= "
                       f"{TARGET_OVER_REDIS}: {verdict[met.get('cqsd_over_redis')]}], "
                       f"cqsd/rabbitmq {r.get('cqsd_over_rabbitmq')} [target >= "
                       f"{TARGET_OVER_RABBITMQ}: {verdict[met.get('cqsd_over_rabbitmq')]}]; "
                       f"not durable: cqsd/redis {r.get('cqsd_nd_over_redis_nd')} [target >= "
                       f"{TARGET_NONDURABLE_OVER_REDIS}: "
                       f"{verdict[met.get('cqsd_nd_over_redis_nd')]}]")
            out.append("  server CPU us/msg: " + ", ".join(f"{v} {x}" for v, x in cpu.items())
                       + f" [cqsd <= redis: {verdict[met.get('cpu_at_most_redis')]}]")
            if "cqsd_plain_over_redis" in r or "cqsd_acknext_over_redis" in r:
                out.append(
                    f"  plain: cqsd-plain/redis {r.get('cqsd_plain_over_redis')} [target >= "
                    f"{TARGET_OVER_REDIS}: {verdict[met.get('cqsd_plain_over_redis')]}], "
                    f"cqsd-plain/rabbitmq {r.get('cqsd_plain_over_rabbitmq')} [target >= "
                    f"{TARGET_OVER_RABBITMQ}: {verdict[met.get('cqsd_plain_over_rabbitmq')]}], "
                    f"CPU cqsd-plain/redis {r.get('cpu_cqsd_plain_over_redis')} [<= 1: "
                    f"{verdict[met.get('cpu_plain_at_most_redis')]}]; delete_and_read: "
                    f"cqsd/redis {r.get('cqsd_acknext_over_redis')} [target >= "
                    f"{TARGET_ACKNEXT_OVER_REDIS}: "
                    f"{verdict[met.get('cqsd_acknext_over_redis')]}]")
        elif bench == "cycle_summary":
            met = r.get("targets_met", {})
            out.append("one client's cycle, cycles/s: " + ", ".join(
                f"{v} {round(x)}" for v, x in r["cycles_per_s"].items())
                + "; server CPU us/cycle: " + ", ".join(
                f"{v} {x}" for v, x in r["server_cpu_us_per_cycle"].items())
                + "".join(f"; cqsd/{p} {r.get(f'cqsd_over_{p}')} [target >= "
                          f"{TARGET_CYCLE_OVER_PEERS}: {verdict[met.get(f'cqsd_over_{p}')]}]"
                          for p in ("redis", "rabbitmq")))
        elif r.get("profiled"):
            per = r.get("perf_per_msg")
            out.append(f"profiled {r['variant']} run, batch {r['batch']}: "
                       f"{r['msgs_per_s']} msgs/s, "
                       f"{r['server_cpu_us_per_msg']} us CPU/msg"
                       + (f"; per message: {per}" if per else "")
                       + (f"; py-spy in {r['py_spy']}" if r["py_spy"] else "")
                       + (f"; perf record in {r['perf_record']}" if r["perf_record"] else ""))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(FIGURES),
                   help=f"comma-separated figures, of {','.join(FIGURES)}")
    p.add_argument("--servers", default=",".join(VARIANTS),
                   help="comma-separated servers of figure 2, of " + ",".join(VARIANTS)
                   + " (-nd: not durable)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of figure 2")
    p.add_argument("--size", type=int, default=1024, help="bytes a message")
    p.add_argument("--messages", type=int, default=10_000,
                   help="messages a run of batch 1 moves")
    p.add_argument("--batch-messages", type=int, default=50_000,
                   help="messages a run of --batch moves")
    p.add_argument("--batch", type=int, default=16,
                   help="messages in flight per client (batch 1 is run too)")
    p.add_argument("--put-samples", type=int, default=1000, help="puts of figure 1")
    p.add_argument("--cycle-seconds", type=float, default=5.0,
                   help="seconds of each server's single-client cycle")
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="profile one more durable cqsd run with py-spy into DIR")
    p.add_argument("--perf-stat", action="store_true",
                   help="count the daemon's syscalls and context switches with perf stat "
                        "in that run")
    p.add_argument("--perf-record", type=Path, metavar="DIR",
                   help="record the daemon's stacks in that run with perf record into DIR")
    args = p.parse_args(argv)
    args.only = set(args.only.split(","))
    if unknown := args.only - set(FIGURES):
        p.error(f"unknown figures: {', '.join(sorted(unknown))}")
    args.servers = [v for v in VARIANTS if v in args.servers.split(",")]
    if args.py_spy:
        args.py_spy = args.py_spy.resolve()
        args.py_spy.mkdir(parents=True, exist_ok=True)
    if args.perf_stat and (problem := perf_problem()):
        print(f"# --perf-stat: {problem}; the profiled run goes without it", file=sys.stderr)
        args.perf_stat = False
    if args.perf_record and (problem := perf_problem(counts=False)):
        print(f"# --perf-record: {problem}; the profiled run goes without it", file=sys.stderr)
        args.perf_record = None
    if args.perf_record:
        args.perf_record = args.perf_record.resolve()
        args.perf_record.mkdir(parents=True, exist_ok=True)
    args.batches = sorted({1, args.batch})
    args.producers = args.consumers = 4
    args.time_limit = 120.0  # seconds any one run may take
    args.redis_binary = None
    if any(VARIANTS[v][0] == "redis" for v in args.servers):
        args.redis_binary = _procs.redis_server_path()
        if args.redis_binary is None:
            args.servers = [v for v in args.servers if VARIANTS[v][0] != "redis"]
    if "rabbitmq" in args.servers and _procs.debian_binary("rabbitmq-server",
                                                           "rabbitmq-server") is None:
        args.servers.remove("rabbitmq")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[dict] = []
    # Under /tmp on purpose, as durability.py: the figures are about that disk.
    tmp = Path(tempfile.mkdtemp(prefix="cqpeers-", dir="/tmp"))
    started_at = time.monotonic()
    try:
        emit(environment(tmp) | {"size": args.size, "batches": args.batches,
                                 "rounds": args.rounds}, lines)
        if "put" in args.only:
            try:
                where = tmp / "put"
                where.mkdir()
                config = _procs.cqsd_config(where, MAX_CLIENTS, STRUCTURE_SIZE)
                with servers.daemon(config) as d:
                    d.start()
                    emit(put_latency_figure(d.address, args.put_samples, 60.0,
                                            where / "data"), lines)
            except Exception as err:
                emit({"bench": "put_latency", "error": f"{type(err).__name__}: {err}"}, lines)
        if "peers" in args.only:
            peer_figures(tmp, args, lines)
        if "cycle" in args.only:
            cycle_figure(tmp, args, lines)
        if args.py_spy or args.perf_stat or args.perf_record:
            profile_figure(tmp, args, lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in summary(lines):
        print("# " + line)
    print(f"# total {time.monotonic() - started_at:.0f} s")
    return 1 if any("error" in r for r in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
