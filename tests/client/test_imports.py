"""The SDK's imports: the blocking client needs neither trio nor anyio, and no module
under clients/ is in an import circle."""

from __future__ import annotations

import graphlib
import subprocess
import sys
from pathlib import Path

import tests.test_imports as imports_module
from tests.test_imports import MODULES, imported

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



# -- no import circle in the SDK --------------------------------------------------
# Read from the source with ``ast`` (tests/test_imports.py), counting every import
# statement, those under ``if TYPE_CHECKING:`` and inside functions too: a circle
# through either still ties two modules together (neither can be read, typed or
# tested without the other). A consumer reaches its client through the protocols of
# cqsclient.source instead.

SDK_PACKAGES = ("cqsclient", "cqsproto")


def sdk_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the SDK it imports, by any import statement."""
    sdk = {m: p for m, p in modules.items() if m.split(".")[0] in SDK_PACKAGES}
    return {m: {n for n in imported(m, p, type_checking=True) if n in modules and n != m}
            for m, p in sdk.items()}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of *graph* (its modules in order, the first repeated at the
    end), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


SDK = sdk_graph(MODULES)


def test_the_graph_sees_the_sdks_imports():
    """The reader finds what is there: each client makes its consumer, the consumers
    import the protocol they use, and the SDK imports the wire protocol."""
    assert {"cqsclient.consume", "cqsproto"} <= SDK["cqsclient.client"]
    assert "cqsclient.aioconsume" in SDK["cqsclient.aio"]
    assert "cqsclient.source" in SDK["cqsclient.consume"]
    assert "cqsclient.consume" in SDK["cqsclient.aioconsume"]


def test_the_consumers_import_no_client():
    """consume.py and aioconsume.py reach their structure through cqsclient.source."""
    for consumer in ("cqsclient.consume", "cqsclient.aioconsume"):
        assert not SDK[consumer] & {"cqsclient.client", "cqsclient.aio", "cqsclient"}


def test_no_import_circle_in_the_sdk():
    """No module under clients/ imports, by any path, one that imports it back."""
    assert circle(SDK) is None


def test_a_circle_through_type_checking_is_found(tmp_path: Path, monkeypatch):
    """An import under ``if TYPE_CHECKING:`` counts (the circle client.py ⇄ consume.py
    once went through one), so the test above can fail."""
    package = tmp_path / "cqsclient"
    package.mkdir()
    sources = {
        "__init__": "",
        "client": "from .consume import Consumer\n",
        "consume": "from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from .client import Client\n",
    }
    for name, text in sources.items():
        (package / f"{name}.py").write_text(text)
    modules = {"cqsclient" + ("" if name == "__init__" else f".{name}"): package / f"{name}.py"
               for name in sources}
    monkeypatch.setattr(imports_module, "MODULES", modules)
    assert circle(sdk_graph(modules)) in (["cqsclient.client", "cqsclient.consume",
                                           "cqsclient.client"],
                                          ["cqsclient.consume", "cqsclient.client",
                                           "cqsclient.consume"])
