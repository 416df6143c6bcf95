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
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from _procs import ServerFailed, stop_process

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
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp)
    ready = threading.Event()
    tail: deque[str] = deque(maxlen=LOG_TAIL)

    def drain() -> None:
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(line)
            if "ready to accept connections" in line.lower():
                ready.set()
        ready.set()  # it exited; the check below tells the two apart

    threading.Thread(target=drain, daemon=True).start()
    try:
        ready.wait(STARTUP_TIMEOUT)
        if proc.poll() is not None or not ready.is_set():
            raise ServerFailed("redis-server did not start:\n" + "\n".join(tail))
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
    finally:
        stop_process(proc, STARTUP_TIMEOUT)
