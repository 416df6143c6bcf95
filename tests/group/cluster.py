"""A group on one machine for the tests: real etcd, real daemons sharing a data
directory, each its own socket and log series, killed and restarted for real."""

import tempfile
from pathlib import Path

from tests.daemon.harness import Daemon

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


class Node(Daemon):
    """One node: ``name`` in group ``group``, data in the shared ``data``."""

    def __init__(self, name: str, data: Path, etcd: str, group: str = "TESTG", lease: int = 2,
                 prefer: str = "", standby: str = "cold", daemon_keys: str = ""):
        super().__init__(daemon_keys=daemon_keys, structures=STRUCTURES.format(prefer=prefer))
        self.name = name
        self.data = data
        self.config.write_text(
            f'[daemon]\ndata_dir = "{data}"\nsocket = "{self.socket}"\n{daemon_keys}\n'
            f"{STRUCTURES.format(prefer=prefer)}\n"
            f'[group]\nname = "{group}"\nnode = "{name}"\netcd = ["{etcd}"]\n'
            f'lease = {lease}\nstandby = "{standby}"\nadvertise = "{self.address}"\n')


def shared_data() -> Path:
    return Path(tempfile.mkdtemp(prefix="cqg")) / "data"
