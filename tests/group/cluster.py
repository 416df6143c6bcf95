"""A group on one machine for the tests: real etcd, real daemons sharing a data
directory, each its own socket and log series, killed and restarted for real.

`FaultyGroup` puts every fault of the takeover loop within reach of a test: each
node reaches etcd through its own TCP proxy (tests/faults/proxy.py: a node cut
off from etcd), keeps the shared data directory through its own lazyfs mount of
one backing directory (tests/faults/lazyfs.py: its unsynced writes lost in a
power cut, its disk full) and runs under libfaketime steered through a file (its
wall clock stepped; CLOCK_BOOTTIME, the lease's clock, is left alone).
"""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.daemon.harness import Daemon
from tests.faults.clock import faked_clock
from tests.faults.lazyfs import LazyFS
from tests.faults.proxy import ProxyProcess

STRUCTURES = """
[[structure]]
name = "MSGQ01"
size = "64MiB"
overflow = "MSGQ01OV"
{prefer}

[[structure]]
name = "MSGQ01OV"
size = "16MiB"

[[structure]]
name = "EMHQ01"
size = "8MiB"
"""

class Seen(list):
    """A node's log lines, each stamped ``seen`` with the test's monotonic clock when it
    arrived (the daemon's own timestamps follow its wall clock, which a test may step)."""

    def append(self, event: dict) -> None:
        event.setdefault("seen", time.monotonic())
        super().append(event)


class Node(Daemon):
    """One node: ``name`` in group ``group``, data in the shared ``data``."""

    def __init__(self, name: str, data: Path, etcd: str, group: str = "TESTG", lease: int = 2,
                 prefer: str = "", standby: str = "cold", daemon_keys: str = "",
                 env: dict[str, str] | None = None, structures: str | None = None,
                 structure_keys: str = ""):
        """``structures``: the [[structure]] tables, else STRUCTURES with ``prefer`` and
        ``structure_keys`` (lines of MSGQ01's table)."""
        structures = structures or STRUCTURES.format(prefer=f"{prefer}\n{structure_keys}")
        super().__init__(daemon_keys=daemon_keys, structures=structures, env=env)
        self.name = name
        self.data = data
        self.lines = Seen()
        self.config.write_text(
            f'[daemon]\ndata_dir = "{data}"\nsocket = "{self.socket}"\n{daemon_keys}\n'
            f"{structures}\n"
            f'[group]\nname = "{group}"\nnode = "{name}"\netcd = ["{etcd}"]\n'
            f'lease = {lease}\nstandby = "{standby}"\nadvertise = "{self.address}"\n')

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def shared_data(keep: bool = False) -> Path:
    """A fresh data directory for a group's nodes, removed when the tests end unless
    ``keep``."""
    top = tempfile.mkdtemp(prefix="cqg")
    if not keep:
        atexit.register(shutil.rmtree, top, ignore_errors=True)
    return Path(top) / "data"


class FaultyGroup:
    """Nodes sharing a data directory, each behind its own etcd proxy, lazyfs mount
    and faked wall clock. ``data`` is the backing directory: what is on the disk."""

    def __init__(self, names: tuple[str, ...], etcd: str, group: str, lease: int,
                 daemon_keys: str = "", standby: tuple[str, ...] = ("cold",),
                 structure_keys: str = "") -> None:
        """``standby``: each node's, in turn (a warm one and a cold one test both);
        ``structure_keys``: lines of MSGQ01's table."""
        self.root = Path(tempfile.mkdtemp(prefix="cqf"))
        self.backing = self.root / "backing"
        self.data = self.backing / "data"
        target = urlsplit(etcd)
        self.proxies: dict[str, ProxyProcess] = {}
        self.mounts: dict[str, LazyFS] = {}
        self.clocks: dict[str, Path] = {}
        self.nodes: dict[str, Node] = {}
        try:
            for i, name in enumerate(names):
                proxy = self.proxies[name] = ProxyProcess((target.hostname, target.port))
                mount = self.mounts[name] = LazyFS(self.backing, self.root / name).start()
                clock = self.clocks[name] = self.root / f"{name}.faketime"
                env = faked_clock(clock)
                self.nodes[name] = Node(name, mount.mountpoint / "data",
                                        f"http://127.0.0.1:{proxy.address[1]}", group=group,
                                        lease=lease, daemon_keys=daemon_keys, env=env,
                                        standby=standby[i % len(standby)],
                                        structure_keys=structure_keys)
        except BaseException:
            self.close()
            raise

    def step_clock(self, name: str, seconds: int) -> None:
        """Set node ``name``'s wall clock ``seconds`` off the true time (read at once:
        FAKETIME_NO_CACHE)."""
        self.clocks[name].write_text(f"{seconds:+d}\n")

    def close(self) -> None:
        """Stop everything and remove the files; with CQSD_KEEP_FAILED set (a long
        run's failure to study), the nodes are killed where they stand and the
        backing directory is kept, with each node's log lines beside it."""
        if os.environ.get("CQSD_KEEP_FAILED"):
            for node in self.nodes.values():
                if node.alive:  # where each node stands, threads and all
                    with open(self.root / f"{node.name}.stacks", "w") as out:
                        spy = Path(sys.executable).with_name("py-spy")  # the venv's
                        subprocess.run([str(spy), "dump", "--locals", "--pid",
                                        str(node.proc.pid)], stdout=out,
                                       stderr=subprocess.STDOUT, timeout=60, check=False)
                        if shutil.which("gdb"):  # native frames: a lock inside a library
                            subprocess.run(["gdb", "-p", str(node.proc.pid), "-batch",
                                            "-ex", "thread apply all bt"], stdout=out,
                                           stderr=subprocess.STDOUT, timeout=120, check=False)
                    node.kill()
                (self.root / f"{node.name}.jsonl").write_text(
                    "".join(json.dumps(e, default=str) + "\n" for e in node.lines))
            print(f"kept: {self.root}", file=sys.stderr)
        for node in self.nodes.values():
            if node.alive:
                os.kill(node.proc.pid, signal.SIGCONT)
            node.cleanup()
        for mount in self.mounts.values():
            mount.stop()
        for proxy in self.proxies.values():
            proxy.stop()
        if not os.environ.get("CQSD_KEEP_FAILED"):
            shutil.rmtree(self.root, ignore_errors=True)
        for leaked in Path("/dev/shm").glob("*faketime_s[he]m_*"):  # one per process
            if not Path("/proc", leaked.name.rpartition("_")[2]).exists():  # SIGKILLed
                leaked.unlink(missing_ok=True)
