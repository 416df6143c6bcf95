"""Real daemon processes for end-to-end tests: started with `python -m cqsd run`,
stopped with SIGTERM, killed with SIGKILL, restarted on the same data directory.

Readiness is awaited by reading the daemon's "ready" log line, never by sleeping.
"""

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from cqsd.protocol.codec import NEED_DATA, PROTOCOL_VERSION, FrameDecoder, encode_frame

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


class Daemon:
    def __init__(self, daemon_keys: str = "", structures: str = STRUCTURES, extra: str = "",
                 prefix: tuple[str, ...] = ()):
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
        self.proc: subprocess.Popen | None = None
        self.lines: list[dict] = []
        self._ready = threading.Event()
        self._logged = threading.Condition()

    def start(self, timeout: float = 30) -> "Daemon":
        self._ready.clear()
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "cqsd", "run", "--config", str(self.config)],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )
        threading.Thread(target=self._read_log, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"daemon did not become ready: {self.lines[-5:]}")
        return self

    def _read_log(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "text", "text": line.rstrip()}
            with self._logged:
                self.lines.append(event)
                self._logged.notify_all()
            if event.get("event") == "ready":
                self._ready.set()

    def events(self, name: str) -> list[dict]:
        return [e for e in self.lines if e.get("event") == name]

    def wait_for(self, name: str, count: int = 1, timeout: float = 20) -> list[dict]:
        """Block until the daemon has logged ``count`` events called ``name``."""
        self.wait_until(lambda: len(self.events(name)) >= count, f"{count} {name!r}", timeout)
        return self.events(name)

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

    def restart(self) -> "Daemon":
        return self.start()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


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
