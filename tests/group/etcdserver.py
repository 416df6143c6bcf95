"""A real etcd (Debian's etcd-server) on loopback ports in a temporary directory,
started and stopped by the tests that need one, never assumed running."""

import atexit
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
START_TIMEOUT = 30.0  # seconds: a loaded 2-core machine starts etcd in about one
# etcd's data on its own fast device, as etcd's tuning guide advises: in memory here,
# so that the fsyncs of the daemons and Spark jobs the tests run beside it cannot hold
# up its lease renewals for seconds (soaks saw both nodes fenced "not renewed", and
# "no answer in 1 s", while other tests wrote gigabytes)
FAST = Path("/dev/shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd member; ``endpoint`` is its client URL (``http://127.0.0.1:PORT``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen | None = None
        self.data = Path(tempfile.mkdtemp(prefix="cqetcd", dir=FAST if FAST.is_dir() else None))
        atexit.register(shutil.rmtree, self.data, ignore_errors=True)  # kept across restarts

    def start(self) -> "EtcdServer":
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.log = open(self.directory / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "test", "--data-dir", str(self.data),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}", "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: "
                                   f"{(self.directory / 'etcd.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not become healthy in {START_TIMEOUT} s")
            time.sleep(0.05)  # polling a process we cannot be told about

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
