"""The servers of the durability benchmarks: a cqsd daemon that can be stopped,
crashed and restarted on one data directory, and Redis with an fsync-always AOF.

Design note. benchmarks/_procs.py starts a daemon once per benchmark and
stops it cleanly; the restart figure needs more: the same data directory
started several times, a SIGKILL in the middle, and every JSON log line the
daemon writes (its ``structure_rebuilt`` line carries the recovery timings),
each stamped with the moment it was read. So the daemon here is a small
object with explicit start / terminate / kill, and a thread that drains its
stderr and keeps the events. Readiness is always the daemon's own ``ready``
line (or Redis's "Ready to accept connections" and a PING), never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from _procs import LineWatcher, ServerFailed, stop_process

STARTUP_TIMEOUT = 120.0  # seconds: a daemon rebuilding ~1M messages from an image is slow to start
STOP_TIMEOUT = 180.0  # seconds a clean stop may take: it writes the image (~1 GiB at 1M messages)
KILL_TIMEOUT = 10.0  # seconds to reap a SIGKILLed process
LOG_TAIL = 40  # lines of a server's output kept for error messages


def process_rss(pid: int) -> dict[str, int]:
    """Resident and peak resident memory of *pid* in MiB (from /proc/PID/status)."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) // 1024  # the kernel reports kB
    return {"rss_mib": found.get("VmRSS", 0), "peak_rss_mib": found.get("VmHWM", 0)}


class Daemon:
    """One cqsd run on a config; ``start`` may be called again after a stop or kill."""

    def __init__(self, config: Path, profile: Path | None = None,
                 program: tuple[str, ...] = ("-m", "cqsd")) -> None:
        self.config = config
        self.program = program  # what the interpreter runs: the cqsd module, or a script
        self.profile = profile  # cProfile output of the daemon (written at a clean stop only)
        self.address = ""
        self.proc: subprocess.Popen | None = None
        self.events: list[tuple[float, dict]] = []  # (time.monotonic() when read, log line)
        self.tail: deque[str] = deque(maxlen=LOG_TAIL)
        self._changed = threading.Condition()
        self._drainer: threading.Thread | None = None

    def start(self) -> float:
        """Start the daemon and wait for its ready line; returns seconds from spawn to ready."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the daemon is already running")
        cmd = [sys.executable]
        if self.profile is not None:
            cmd += ["-m", "cProfile", "-o", str(self.profile)]
        cmd += [*self.program, "run", "--config", str(self.config)]
        with self._changed:
            self.events = []
        spawned = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, cwd=self.config.parent)
        self._drainer = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._drainer.start()
        ready = self.wait_event("ready", STARTUP_TIMEOUT)
        self.address = f"unix://{self.config.parent / 's'}"
        return ready[0] - spawned

    def _drain(self, proc: subprocess.Popen) -> None:
        # Read on a thread so the pipe never fills and blocks the daemon's logging.
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.monotonic()
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            with self._changed:
                self.tail.append(line)
                if isinstance(event, dict):
                    self.events.append((now, event))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()  # the stream ended: the daemon is gone

    def wait_event(self, name: str, timeout: float) -> tuple[float, dict]:
        """The first logged event called *name* (waiting up to *timeout*); raises
        ServerFailed if the daemon exits or the time passes first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for stamp, event in self.events:
                    if event.get("event") == name:
                        return stamp, event
                if self.proc.poll() is not None and not self._drainer.is_alive():
                    raise ServerFailed(f"cqsd exited ({self.proc.returncode}) before "
                                       f"logging {name!r}:\n{self.log_text()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerFailed(f"cqsd did not log {name!r} in {timeout} s:\n"
                                       f"{self.log_text()}")
                self._changed.wait(min(left, 1.0))

    def logged(self, name: str) -> list[dict]:
        """Every event called *name* logged by the current (or last) run."""
        with self._changed:
            return [event for _, event in self.events if event.get("event") == name]

    def log_text(self) -> str:
        return "\n".join(self.tail)

    def memory(self) -> dict[str, int]:
        return process_rss(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = STOP_TIMEOUT) -> float:
        """Clean stop (SIGTERM: the daemon writes its images); returns the seconds it took.

        Raises ServerFailed if it does not exit with status 0 within *timeout*.
        """
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServerFailed(f"cqsd did not stop in {timeout} s:\n{self.log_text()}") from None
        self._drainer.join(KILL_TIMEOUT)
        if code != 0:
            raise ServerFailed(f"cqsd stopped with status {code}:\n{self.log_text()}")
        return time.monotonic() - start

    def kill(self) -> None:
        """Crash the daemon (SIGKILL: no image, no flush) and reap it."""
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(KILL_TIMEOUT)
            if self._drainer is not None:
                self._drainer.join(KILL_TIMEOUT)


@contextlib.contextmanager
def daemon(config: Path, profile: Path | None = None,
           program: tuple[str, ...] = ("-m", "cqsd")) -> Iterator[Daemon]:
    """A Daemon (not yet started) that is killed on the way out if still running.

    A kill, not a clean stop: the data directory is thrown away afterwards, and
    writing a gigabyte image nobody reads would only cost time. Blocks that
    want a clean stop (or a profile, which cProfile writes at a normal exit)
    call ``terminate`` themselves.
    """
    d = Daemon(config, profile, program)
    try:
        yield d
    finally:
        d.kill()


def redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())


@contextlib.contextmanager
def redis_aof(tmp: Path, binary: str) -> Iterator[tuple[str, int]]:
    """redis-server on a Unix socket in *tmp*, no TCP, every write fsynced to its AOF
    before the reply (``appendfsync always``), no RDB snapshots; yields (socket, pid)."""
    import redis as redis_py

    sock = tmp / "redis.sock"
    cmd = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
           "--appendonly", "yes", "--appendfsync", "always", "--save", "",
           "--dir", str(tmp), "--daemonize", "no", "--loglevel", "notice"]
    with contextlib.ExitStack() as stack:
        proc = _child(stack, cmd, tmp, None, "ready to accept connections", "redis-server")
        client = redis_py.Redis(unix_socket_path=str(sock), socket_timeout=STARTUP_TIMEOUT)
        try:
            if not client.ping():
                raise ServerFailed("redis-server does not answer PING")
            aof = client.config_get("appendfsync").get("appendfsync")
            if aof != "always":
                raise ServerFailed(f"redis-server runs with appendfsync {aof!r}")
        finally:
            client.close()
        yield str(sock), proc.pid


RABBITMQ_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; /usr/sbin's su's to its user


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rabbitmq_version() -> str:
    return Path(RABBITMQ_SCRIPT).resolve().parent.parent.name  # .../rabbitmq_server-3.10.8


@contextlib.contextmanager
def rabbitmq(tmp: Path) -> Iterator[tuple[int, int]]:
    """Debian's RabbitMQ as our child, in *tmp*, listening on 127.0.0.1 only (AMQP
    has no Unix socket); yields (AMQP port, pid of the Erlang VM).

    Nothing outside *tmp* is touched: its own epmd (our child too, on a free port),
    node name, cookie (HOME), database, logs (to stdout) and no plugins. Ready is
    the broker's "Server startup complete" line; on the way out the broker gets
    SIGTERM (its script stops the node cleanly), then epmd.
    """
    ports = {"epmd": free_port(), "amqp": free_port(), "dist": free_port()}
    (tmp / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{ports['amqp']}\n"
        "loopback_users = none\n")
    (tmp / "enabled_plugins").write_text("[].\n")
    env = dict(os.environ, HOME=str(tmp), RABBITMQ_CONF_ENV_FILE="/dev/null",
               RABBITMQ_NODENAME="cqsbench@localhost", RABBITMQ_DIST_PORT=str(ports["dist"]),
               ERL_EPMD_PORT=str(ports["epmd"]), ERL_EPMD_ADDRESS="127.0.0.1",
               RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"), RABBITMQ_LOG_BASE=str(tmp / "log"),
               RABBITMQ_LOGS="-", RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
               RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq"),
               RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
    with contextlib.ExitStack() as stack:
        # -d: epmd says "epmd running" once it listens, so the broker never starts one
        epmd = _child(stack, ["epmd", "-d", "-port", str(ports["epmd"]), "-address",
                              "127.0.0.1"], tmp, env, "epmd running", "epmd")
        broker = _child(stack, [RABBITMQ_SCRIPT], tmp, env, "Server startup complete",
                        "rabbitmq-server")
        vm = _children(broker.pid)
        if len(vm) != 1:
            raise ServerFailed(f"rabbitmq-server: expected one Erlang VM, found {vm}")
        yield ports["amqp"], vm[0]
        for proc, name in ((broker, "rabbitmq-server"), (epmd, "epmd")):
            if proc.poll() is not None:
                raise ServerFailed(f"{name} died during the run (exit {proc.returncode})")


def _child(stack: contextlib.ExitStack, cmd: list[str], cwd: Path, env: dict | None, ready: str,
           name: str) -> subprocess.Popen:
    """Start *cmd*, stopped when *stack* closes; return once it prints a line holding
    *ready* (in any case)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=cwd, env=env)
    stack.callback(stop_process, proc, STARTUP_TIMEOUT)
    watcher = LineWatcher(proc.stdout, lambda line: ready.lower() in line.lower())
    if not watcher.wait(STARTUP_TIMEOUT):
        raise ServerFailed(f"{name} did not start (exit {proc.poll()}):\n{watcher.text()}")
    return proc


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]
