"""Real daemon processes for end-to-end tests: started with `python -m cqsd run`,
stopped with SIGTERM, killed with SIGKILL, restarted on the same data directory.

Readiness is awaited by reading the daemon's "ready" log line, never by sleeping.
"""

import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import coverage

from cqsproto import NEED_DATA, PROTOCOL_VERSION, FrameDecoder, encode_frame


def measured() -> dict[str, str]:
    """The environment that has coverage's .pth hook measure a daemon we start, and
    the Spark jobs it starts, when the tests are measured (`make test`), else {}:
    the configuration the tests run under, and its data file's absolute path (each
    process writes its own beside it; pytest-cov combines them at the end). Only
    the daemons get it: a child that checks what an import loads must not see
    coverage's own imports (tests/protocol/test_codec.py)."""
    cov = coverage.Coverage.current()
    if cov is None or cov.config.config_file is None:
        return {}
    return {"COVERAGE_PROCESS_START": cov.config.config_file,
            "COVERAGE_FILE": os.path.abspath(cov.config.data_file)}


# Seconds a daemon left running by its test gets to stop on SIGTERM (it takes
# milliseconds) before it is killed.
STOP_GRACE = 10

STRUCTURES = """
[[structure]]
name = "MSGQ01"
size = "64MiB"
initsize = "32MiB"
overflow = "MSGQ01OV"

[[structure]]
name = "MSGQ01OV"
size = "16MiB"

[[structure]]
name = "SMALL"
size = "8KiB"
entry_max = "1KiB"
"""


class _Log:
    """One daemon process's stderr, as far as the harness has read it: ``read`` bytes
    taken from the pipe, of which ``parsed`` made whole lines."""

    def __init__(self, stream) -> None:
        self.stream = stream  # held, so that its descriptor stays open while read
        self.fd = stream.fileno()
        self.read = self.parsed = 0
        self.reading = self.ended = False

    def unread(self) -> int:
        """Bytes written to the pipe and not yet read from it."""
        return struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0" * 4))[0]


class Daemon:
    def __init__(self, daemon_keys: str = "", structures: str = STRUCTURES, extra: str = "",
                 prefix: tuple[str, ...] = (), env: dict[str, str] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="cq"))  # short: Unix socket paths are limited
        self.data = self.dir / "data"
        self.prefix = list(prefix)  # e.g. nsenter into a namespace with a small filesystem
        self.socket = str(self.dir / "s")
        self.address = f"unix://{self.socket}"
        self.config = self.dir / "cqsd.toml"
        self.config.write_text(
            f'[daemon]\ndata_dir = "{self.data}"\nsocket = "{self.socket}"\n'
            f"{daemon_keys}\n{structures}\n{extra}"
        )
        self.env = env  # added to the daemon's environment
        self.proc: subprocess.Popen | None = None
        self._log: _Log | None = None  # the running process's stderr, as read so far
        self.lines: list[dict] = []
        self._ready = threading.Event()
        self._logged = threading.Condition()

    def start(self, timeout: float = 30) -> "Daemon":
        self._ready.clear()
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "cqsd", "run", "--config", str(self.config)],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            env={**os.environ, **measured(), **(self.env or {})},
        )
        self._log = _Log(self.proc.stderr)
        threading.Thread(target=self._read_log, args=(self._log,), daemon=True).start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"daemon did not become ready: {self.lines[-5:]}")
        return self

    def _read_log(self, log: "_Log") -> None:
        partial = b""
        while True:
            select.select([log.fd], [], [])
            with self._logged:
                log.reading = True
            chunk = os.read(log.fd, 1 << 16)
            *whole, partial = (partial + chunk).split(b"\n")
            with self._logged:
                for line in whole:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        event = {"event": "text", "text": line.decode(errors="replace").rstrip()}
                    self.lines.append(event)
                    if event.get("event") == "ready":
                        self._ready.set()
                log.read += len(chunk)
                log.parsed = log.read - len(partial)
                log.reading, log.ended = False, not chunk
                self._logged.notify_all()
            if not chunk:
                return

    def settle(self, timeout: float = 10) -> None:
        """Wait until every line the daemon had written when called has been read
        into ``lines``: a reply can reach the test before the log line the daemon
        wrote ahead of it, and a test that looks at once must see that line."""
        log = self._log
        if log is None:
            return
        with self._logged:
            self._logged.wait_for(lambda: not log.reading, timeout)
            if log.ended:
                return
            target = log.read + log.unread()
            self._logged.wait_for(lambda: log.parsed >= target or log.ended, timeout)

    def mark(self) -> int:
        """How many lines the daemon has logged so far: ``after`` for later looks."""
        self.settle()
        return len(self.lines)

    def events(self, name: str, after: int = 0, **fields) -> list[dict]:
        """The events called ``name`` with these ``fields``, of those logged after the
        first ``after`` lines (a ``mark()`` before a restart: that run's only)."""
        self.settle()
        return [e for e in self.lines[after:] if e.get("event") == name
                and all(e.get(k) == v for k, v in fields.items())]

    def wait_for(self, name: str, count: int = 1, timeout: float = 20, after: int = 0,
                 **fields) -> list[dict]:
        """Block until the daemon has logged ``count`` events called ``name`` with these
        ``fields`` (after the first ``after`` lines)."""
        self.wait_until(lambda: len(self.events(name, after, **fields)) >= count,
                        f"{count} {name!r}", timeout)
        return self.events(name, after, **fields)

    def wait_until(self, logged, what: str, timeout: float = 20) -> None:
        """Block until ``logged()`` is true of what the daemon has logged."""
        with self._logged:
            if not self._logged.wait_for(logged, timeout):
                raise AssertionError(f"daemon did not log {what}: {self.lines[-5:]}")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: a graceful stop."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def use_data_dir(self, path: Path) -> None:
        """Keep the data in ``path`` (say on a small filesystem) from the next start."""
        self.config.write_text(self.config.read_text().replace(
            f'data_dir = "{self.data}"', f'data_dir = "{path}"'))
        self.data = path

    def restart(self) -> "Daemon":
        return self.start()

    def cleanup(self) -> None:
        """After the test: stop the daemon if it still runs, gracefully (so it ends as
        a daemon does, and saves what coverage measured in it: `make test`), or kill
        it if it has not stopped within STOP_GRACE seconds; then remove its files."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class MountNamespace:
    """A private mount namespace (``unshare -rm``: no root needed, and root inside it
    still cannot write to a read-only mount) for the disk tests: small filesystems
    and read-only ones that only processes run with ``prefix`` (nsenter) see."""

    def __init__(self) -> None:
        if shutil.which("unshare") is None or shutil.which("nsenter") is None:
            raise RuntimeError("util-linux unshare and nsenter are needed for the disk tests")
        self.holder = subprocess.Popen(["unshare", "-rm", "sh", "-c", "echo in && exec sleep 600"],
                                       stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline().strip() == "in"
        self.prefix = ("nsenter", "-t", str(self.holder.pid), "-U", "-m",
                       "--preserve-credentials")

    def run(self, *command: str) -> str:
        """Run ``command`` in the namespace; its standard output."""
        return subprocess.run([*self.prefix, *command], check=True, capture_output=True,
                              text=True).stdout

    def small_disk(self, path: Path, size: str) -> Path:
        """A tmpfs of ``size`` (e.g. "6m") mounted at ``path``, created if need be."""
        self.run("mkdir", "-p", str(path))  # in here: ``path`` may be on one of our mounts
        self.run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
        return path

    def writable(self, path: Path, on: bool) -> None:
        """Remount the filesystem mounted at ``path`` read-write or read-only; a path
        that is no mount point is bound onto itself first."""
        if subprocess.run([*self.prefix, "mountpoint", "-q", str(path)], check=False).returncode:
            self.run("mount", "--bind", str(path), str(path))
        remount = [*self.prefix, "mount", "-o", f"remount,bind,{'rw' if on else 'ro'}", str(path)]
        # read-only is refused (EBUSY) while a file there is open for writing, which may
        # be for a moment (the daemon rewriting clients.ckpt): tried again for a while
        for _ in range(100):
            if subprocess.run(remount, check=False).returncode == 0:
                return
            time.sleep(0.05)
        self.run("mount", "-o", f"remount,bind,{'rw' if on else 'ro'}", str(path))

    def fill(self, path: Path, megabytes: int) -> None:
        """Take ``megabytes`` of the filesystem holding ``path`` (a file at it)."""
        self.run("dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}")

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


class Raw:
    """A client speaking frames by hand, to send what no SDK would."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.decoder = FrameDecoder()
        self.next_id = 1

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, op: str, **fields) -> dict:
        self.next_id += 1
        self.send(encode_frame({"id": self.next_id, "op": op, **fields}))
        return self.receive()

    def register(self, client: str, **fields) -> dict:
        return self.request("register", client=client, version=PROTOCOL_VERSION, **fields)

    def receive(self) -> dict | None:
        """The next frame, or None once the server has closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not NEED_DATA:
                return frame if isinstance(frame, dict) else None
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            self.decoder.receive_data(data)

    def close(self) -> None:
        self.sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
