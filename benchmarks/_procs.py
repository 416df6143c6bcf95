"""The servers under test, started and stopped by the benchmarks: cqsd and Redis.

Both are started in the foreground as child processes in a temporary
directory, listen only on a Unix socket there, and are waited for by reading
their own "ready" log line (never by sleeping). Both context managers stop
their server (SIGTERM, then SIGKILL after a bound) on the way out, whatever
happened inside, and the caller removes the temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pstats
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

STARTUP_TIMEOUT = 30.0  # seconds a server has to say it is ready
STOP_TIMEOUT = 20.0  # seconds a server has to exit after SIGTERM before SIGKILL
LOG_TAIL = 40  # lines of a server's log kept for error messages

# How the daemon is started after the interpreter (and cProfile): an experiment
# can point this at a wrapper script that patches the daemon before running it.
DAEMON_ENTRY: list[str] = ["-m", "cqsd"]

REDIS_INSTALL_HINT = (
    "redis-server is not installed; as root: apt-get update && apt-get install -y redis-server"
)


@dataclass(frozen=True)
class Server:
    """A running server: where to connect, and its process (for its CPU time)."""

    address: str  # cqsd: unix://PATH; Redis: the socket path
    proc: subprocess.Popen = field(repr=False, compare=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far (from /proc)."""
        return process_cpu_seconds(self.pid)

    def kill(self) -> None:
        """SIGKILL the server if it still runs: its clients then see the connection drop."""
        if self.proc.poll() is None:
            self.proc.kill()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process *pid* (Linux /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot, from /proc/stat: user, nice,
    system, irq, softirq and steal (a hypervisor running others on our cores)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]  # guest time is inside user
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def summarize_profile(path: Path, top: int = 30) -> None:
    """Write the top functions by own and by cumulative time next to a .prof file."""
    if not path.exists():
        print(f"# no profile at {path}", file=sys.stderr)
        return
    with open(path.with_suffix(".txt"), "w") as out:
        stats = pstats.Stats(str(path), stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    print(f"# profile: {path.with_suffix('.txt')}", file=sys.stderr)


class ServerFailed(RuntimeError):
    """A server did not start, stop or stay up; the message carries the tail of its log."""


class LineWatcher:
    """Drains a child's output stream on a thread (so the pipe never fills),
    keeps its last lines, and sets ``matched`` at the first line *match* accepts."""

    def __init__(self, stream: IO[bytes], match: Callable[[str], bool]) -> None:
        self.tail: deque[str] = deque(maxlen=LOG_TAIL)
        self.matched = False
        # Set at the matching line or at the end of the stream (the child died).
        self._settled = threading.Event()
        self._match = match
        self._stream = stream
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for raw in self._stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.tail.append(line)
                if not self.matched and self._match(line):
                    self.matched = True
                    self._settled.set()
        finally:
            self._settled.set()

    def wait(self, timeout: float) -> bool:
        """True once the line came; False if the stream ended or *timeout* passed first."""
        self._settled.wait(timeout)
        return self.matched

    def text(self) -> str:
        return "\n".join(self.tail)


def stop_process(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGTERM *proc* (one we started), wait up to *timeout*, SIGKILL if still alive."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def _is_ready_event(line: str) -> bool:
    if '"ready"' not in line:
        return False
    try:
        return json.loads(line).get("event") == "ready"
    except ValueError:
        return False


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def cqsd_config(tmp: Path, max_clients: int, structure_size: str = "1GiB",
                daemon_keys: str = "", structure_keys: str = "") -> Path:
    """Write the daemon's config into *tmp* (*daemon_keys*: more [daemon] lines;
    *structure_keys*: TOML after MSGQ01's size, its further keys and then other
    [[structure]] tables); returns its path."""
    path = tmp / "cqsd.toml"
    path.write_text(
        "[daemon]\n"
        f'data_dir = "{tmp / "data"}"\n'
        f'socket = "{tmp / "s"}"\n'
        f"max_clients = {max_clients}\n"
        'log_level = "info"\n'
        f"{daemon_keys}"
        "[[structure]]\n"
        'name = "MSGQ01"\n'
        f'size = "{structure_size}"\n'
        f"{structure_keys}"
    )
    return path


@contextlib.contextmanager
def cqsd(tmp: Path, max_clients: int, profile: Path | None = None,
         daemon_keys: str = "", structure_size: str = "1GiB",
         under: Sequence[str] = ()) -> Iterator[Server]:
    """A running daemon; yields it (its address is ``unix://...``).

    With *profile*, the daemon runs under cProfile and writes its stats there
    when it stops (cProfile dumps on a normal exit, which SIGTERM gives). *under*
    is a command the daemon runs under (valgrind's, say: it gets 20 times the
    start-up time).
    """
    config = cqsd_config(tmp, max_clients, structure_size, daemon_keys=daemon_keys)
    cmd = [*under, sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += [*DAEMON_ENTRY, "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=tmp)
    try:
        watcher = LineWatcher(proc.stderr, _is_ready_event)
        if not watcher.wait(STARTUP_TIMEOUT * (20 if under else 1)):
            raise ServerFailed(f"cqsd did not become ready (exit {proc.poll()}):\n{watcher.text()}")
        yield Server(f"unix://{tmp / 's'}", proc)
        if proc.poll() is not None:
            raise ServerFailed(
                f"cqsd died during the run (exit {proc.returncode}):\n{watcher.text()}")
    finally:
        code = stop_process(proc)
        if code not in (0, None):
            print(f"cqsd exited with {code}", file=sys.stderr)


def callgrind_total(out: Path) -> int:
    """The instructions a callgrind output file counted (its ``summary:`` line, or the
    ``totals:`` of an older valgrind)."""
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {out}")


def redis_server_path(install: bool = True) -> str | None:
    """The redis-server binary; installs Debian's package first when root and *install*.

    Returns None (after printing how to install it) when it cannot be had.
    """
    return debian_binary("redis-server", "redis-server", install)


def debian_binary(binary: str, package: str, install: bool = True) -> str | None:
    """The path of *binary*; installs Debian's *package* first when root and *install*.

    Returns None (after printing how to install it) when it cannot be had.
    """
    found = shutil.which(binary)
    if found or not install:
        return found
    hint = (f"{binary} is not installed; as root: apt-get update && "
            f"apt-get install -y {package}")
    if os.geteuid() != 0:
        print(hint, file=sys.stderr)
        return None
    print(f"installing {package} with apt-get ...", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT, "env": env}
    if subprocess.run(["apt-get", "install", "-y", package], **quiet).returncode:
        subprocess.run(["apt-get", "update"], **quiet)
        subprocess.run(["apt-get", "install", "-y", package], **quiet)
    found = shutil.which(binary)
    if not found:
        print(hint, file=sys.stderr)
    return found


@contextlib.contextmanager
def redis(tmp: Path, binary: str) -> Iterator[Server]:
    """A running redis-server on a Unix socket in *tmp*, no TCP, no persistence;
    yields it (its address is the socket path) once it answers PING."""
    import redis as redis_py

    sock = tmp / "redis.sock"
    cmd = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
           "--save", "", "--appendonly", "no", "--dir", str(tmp), "--daemonize", "no",
           "--loglevel", "notice"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp)
    try:
        watcher = LineWatcher(proc.stdout,
                              lambda line: "ready to accept connections" in line.lower())
        if not watcher.wait(STARTUP_TIMEOUT):
            raise ServerFailed(f"redis-server did not become ready (exit {proc.poll()}):\n"
                               f"{watcher.text()}")
        client = redis_py.Redis(unix_socket_path=str(sock), socket_timeout=STARTUP_TIMEOUT)
        try:
            if not client.ping():
                raise ServerFailed("redis-server does not answer PING")
        finally:
            client.close()
        yield Server(str(sock), proc)
        if proc.poll() is not None:
            raise ServerFailed(f"redis-server died during the run (exit {proc.returncode}):\n"
                               f"{watcher.text()}")
    finally:
        stop_process(proc)
