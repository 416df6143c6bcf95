"""The wheels ship every package of the source tree (an editable install would hide a gap)."""

import hashlib
import importlib
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_native import tools_native  # tools/native.py, loaded by its path

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


@pytest.mark.parametrize("root", list(DISTRIBUTIONS), ids=["cqsd", "cqsclient"])
def test_a_wheel_built_beside_the_compiled_build_carries_it(root, tmp_path):
    """`make install` (docs/operations.md) installs the service from wheels of this
    tree: each carries the compiled build `make native` left here, its manifest and
    every module's extension, and the manifest still vouches for the sources
    shipped beside them, so that the installed packages run compiled."""
    # a copy, as the Dockerfile's build stage has it: setuptools' build/lib in the tree
    # may hold what an earlier package-data put there
    source = tmp_path / "source"
    for top in DISTRIBUTIONS[root]:
        shutil.copytree(root / top, source / top,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (root / name).exists():
            shutil.copy2(root / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--wheel-dir", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for package in DISTRIBUTIONS[root]:
            if package not in tools_native.PACKAGES:
                continue
            directory, modules = tools_native.PACKAGES[package]
            assert tools_native.fresh(package), f"{package}: `make native` first"
            prefix = directory.relative_to(root).as_posix()
            manifest = json.loads(archive.read(f"{prefix}/_native.json"))
            assert manifest["python"] == sys.version
            for module in modules:
                stem = f"{prefix}/{module.removesuffix('.py')}"
                assert stem + tools_native.SUFFIX in names, stem
                shipped = hashlib.sha256(archive.read(f"{prefix}/{module}")).hexdigest()
                assert manifest["modules"][tools_native.module_name(package, module)]["sha256"] \
                    == shipped, module
            assert any(n.startswith(f"{prefix}/_native__mypyc") for n in names), package
