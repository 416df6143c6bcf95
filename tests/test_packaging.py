"""The wheels ship every package of the source tree (an editable install would hide a gap)."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# distribution root -> the top-level import packages it ships
DISTRIBUTIONS = {
    ROOT: ("cqsd", "logstream"),
    ROOT / "clients": ("cqsclient", "cqsproto"),
}


@pytest.mark.parametrize("root", list(DISTRIBUTIONS), ids=["cqsd", "cqsclient"])
def test_every_package_is_listed_in_its_pyproject(root):
    """Each directory with an __init__.py under a distribution's packages is listed in it."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {
        ".".join(p.parent.relative_to(root).parts)
        for top in DISTRIBUTIONS[root]
        for p in (root / top).rglob("__init__.py")
    }
    assert found <= listed, f"not shipped: {sorted(found - listed)}"
    assert set(DISTRIBUTIONS[root]) <= listed


@pytest.mark.parametrize(("module", "name", "package"), [
    ("cqsd", "cqsd", "cqsd"), ("cqsclient.ctl", "cqsctl", "cqsclient")])
def test_the_commands_print_their_version(module, name, package):
    """`cqsd --version` and `cqsctl --version` (docs/operations.md) print the package's
    __version__."""
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout == f"{name} {importlib.import_module(package).__version__}\n"
