"""The SDK's import footprint: the blocking client needs neither trio nor anyio."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import cqsclient
from cqsclient import errors, ops, client, connection, model, unitofwork
assert "trio" not in sys.modules, "cqsclient imported trio"
assert "anyio" not in sys.modules, "cqsclient imported anyio"
import cqsclient.aio
assert "trio" not in sys.modules, "cqsclient.aio imported trio"
assert cqsclient.aio.connect
"""


def test_importing_cqsclient_leaves_trio_out():
    """`import cqsclient` pulls in neither trio nor anyio, and `cqsclient.aio` not trio."""
    subprocess.run([sys.executable, "-c", CHECK], check=True)


def test_aio_is_reachable_as_an_attribute():
    """`cqsclient.aio` works without importing the submodule first."""
    import cqsclient

    assert cqsclient.aio.Client.__name__ == "Client"
