"""The client installs alone (issue 12): `pip install clients/` into a fresh virtualenv
brings msgpack and anyio and nothing of the server, and that venv talks to a real daemon."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What only the server needs: an application on pandas 3 or trio 0.36 must not meet them.
SERVER_ONLY = {"cqsd", "trio", "pyspark", "pyarrow", "pandas", "structlog", "psutil", "crc32c"}

# Run by the venv's python: the blocking SDK, then cqsclient.aio on asyncio (trio is absent).
SESSION = """
import sys, anyio, cqsclient, cqsclient.aio
address = sys.argv[1]
with cqsclient.connect(address, client="ALONE") as c:
    s = c.structure("MSGQ01")
    eid = s.put("ALONEQ", b"from the client alone")
    m = s.read("ALONEQ", wait=5.0)
    assert (m.entry_id, m.data) == (eid, b"from the client alone"), m
    s.delete(m.entry_id)

async def main():
    async with cqsclient.aio.connect(address, client="ALONE") as c:
        s = await c.structure("MSGQ01")
        eid = await s.put("ALONEQ", b"async")
        m = await s.read("ALONEQ", wait=5.0)
        assert (m.entry_id, m.data) == (eid, b"async"), m
        await s.delete(m.entry_id)

anyio.run(main, backend="asyncio")
print("ok")
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with only clients/ installed, from a copy (the build writes to it)."""
    where = tmp_path_factory.mktemp("alone")
    source = where / "clients"
    shutil.copytree(ROOT / "clients", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    run([sys.executable, "-m", "venv", str(where / "venv")], cwd=where)
    python = where / "venv" / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         str(source)], cwd=where, timeout=300)
    return where / "venv"


def run(command: list[str], cwd: Path, timeout: float = 120) -> str:
    # Without our PYTHONPATH, so nothing of the source tree can leak into the venv, nor
    # CQSD_BUILD: the wheel installs the source build (docs/native.md).
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "CQSD_BUILD")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_client_needs_only_msgpack_msgspec_and_anyio(venv):
    """cqsclient requires msgpack, msgspec and anyio, and nothing of the server got
    installed."""
    python = str(venv / "bin" / "python")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(
        run([python, "-m", "pip", "list", "--format=json"], cwd=venv))}
    script = "import importlib.metadata as m, json; print(json.dumps(m.requires('cqsclient')))"
    requires = json.loads(run([python, "-c", script], cwd=venv))
    assert sorted(re.match(r"[A-Za-z0-9_.-]+", r)[0] for r in requires) == [
        "anyio", "msgpack", "msgspec"]
    assert {"cqsclient", "msgpack", "msgspec", "anyio"} <= installed
    assert installed & SERVER_ONLY == set()


def test_the_client_alone_talks_to_a_daemon(venv, daemon):
    """The venv's python puts and reads with the blocking and async SDK, and its cqsctl works."""
    assert run([str(venv / "bin" / "python"), "-c", SESSION, daemon.address], cwd=venv) == "ok\n"
    cqsctl = [str(venv / "bin" / "cqsctl"), "--address", daemon.address]
    entry_id = run([*cqsctl, "put", "MSGQ01", "ALONEQ", "by cqsctl"], cwd=venv).strip()
    read = run([*cqsctl, "read", "MSGQ01", "ALONEQ"], cwd=venv)
    assert entry_id in read and "by cqsctl" in read
    assert run([*cqsctl, "--version"], cwd=venv).startswith("cqsctl ")
