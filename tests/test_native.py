"""The compiled build of the request path (docs/native.md): a test runs the build
it asked for, and never a compiled module older than its source."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cqsproto import native

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("tools_native", ROOT / "tools" / "native.py")
tools_native = importlib.util.module_from_spec(_spec)  # the build (tools/native.py)
_spec.loader.exec_module(tools_native)


def test_the_suite_runs_the_build_it_asked_for():
    """`make test` runs once with CQSD_BUILD=source and once with native: each
    package's compiled modules load from where that build says."""
    asked = os.environ.get(native.ENV)
    for package, (_, modules) in tools_native.PACKAGES.items():
        importlib.import_module(package)
        chose = native.chosen[package]
        assert asked in (None, "", chose), (package, asked, chose)
        for source in modules:
            module = importlib.import_module(native.module_name(package, source))
            compiled = not module.__file__.endswith(".py")
            assert compiled == (chose == "native"), (module.__name__, module.__file__)


TOY = '''\
def answer() -> int:
    return {value}
'''
DUO = '''\
from toy.m import answer


def twice() -> int:
    return 2 * answer()
'''
INIT = "from cqsproto import native\nnative.choose(__name__, __path__)\n"


def python(tmp_path: Path, code: str, build: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT / "clients")])
    # No bytecode cache: m.py is rewritten within a second at the same size, which a
    # cached .pyc's stamp (mtime in seconds, size) would not tell from the first.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if build:
        env[native.ENV] = build
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


ASK = ("import toy.m, cqsproto.native as n; "
       "print(toy.m.__file__.endswith('.py'), toy.m.answer(), n.chosen['toy'])")
ASK_DUO = ("import duo.n, cqsproto.native as n; "
           "print(duo.n.__file__.endswith('.py'), duo.n.twice(), n.chosen['duo'])")


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """Two packages of one module each, ``duo``'s calling ``toy``'s, compiled by
    the build's own code, their sources as an editable install leaves them: live,
    beside the extensions."""
    where = tmp_path_factory.mktemp("native")
    for package, module, source in (("toy", "m.py", TOY.format(value=1)), ("duo", "n.py", DUO)):
        (where / package).mkdir()
        (where / package / "__init__.py").write_text(INIT)
        (where / package / module).write_text(source)
    run = subprocess.run(
        [sys.executable, "-c", "import sys, pathlib; sys.path.insert(0, sys.argv[1]); "
         "import native; p = pathlib.Path(sys.argv[2]); "
         "native.build({'toy': (p / 'toy', ['m.py']), 'duo': (p / 'duo', ['n.py'])}, "
         "p / 'build', multi_file=False)",
         str(ROOT / "tools"), str(where)],
        cwd=where, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return where


def test_a_fresh_build_loads_compiled_and_a_stale_one_never(toy):
    fresh = python(toy, ASK)
    assert fresh.stdout.split() == ["False", "1", "native"], fresh.stderr
    assert python(toy, ASK, "source").stdout.split() == ["True", "1", "source"]

    m = toy / "toy" / "m.py"
    m.write_text(TOY.format(value=2))  # edited after the build, not rebuilt
    try:
        stale = python(toy, ASK)
        assert stale.stdout.split() == ["True", "2", "source"], stale.stderr
        assert "toy: running the Python source" in stale.stderr and "toy.m" in stale.stderr
        refused = python(toy, ASK, "native")
        assert refused.returncode != 0 and refused.stdout == ""
        assert "CQSD_BUILD=native, but toy has no fresh build (toy.m)" in refused.stderr
    finally:
        m.write_text(TOY.format(value=1))
    assert python(toy, ASK).stdout.split() == ["False", "1", "native"]


def test_extensions_without_a_manifest_are_never_loaded(toy):
    """A build that stopped before writing its manifest leaves extensions nobody
    vouches for."""
    manifest = toy / "toy" / native.MANIFEST
    kept = manifest.read_text()
    manifest.unlink()
    try:
        run = python(toy, ASK)
        assert run.stdout.split() == ["True", "1", "source"], run.stderr
        assert "toy.m" in run.stderr
    finally:
        manifest.write_text(kept)


def test_a_damaged_manifest_or_a_wrong_build_name_says_so(toy):
    manifest = toy / "toy" / native.MANIFEST
    kept = manifest.read_text()
    manifest.write_text("{")
    try:
        run = python(toy, ASK)
        assert run.returncode != 0 and f"{manifest} is unreadable" in run.stderr
    finally:
        manifest.write_text(kept)
    assert json.loads(manifest.read_text())["modules"]["toy.m"]["source"] == "m.py"
    run = python(toy, ASK, "fast")
    assert run.returncode != 0
    assert "CQSD_BUILD='fast': it must be 'native' or 'source'" in run.stderr


def test_a_build_compiled_by_another_python_is_never_loaded(toy):
    """An extension compiled with another interpreter's headers (a virtualenv
    re-made on another Python of the same ABI tag) is as stale as an edited
    source: the source runs, or CQSD_BUILD=native refuses, naming that Python."""
    manifest = toy / "toy" / native.MANIFEST
    kept = manifest.read_text()
    assert json.loads(kept)["python"] == sys.version
    manifest.write_text(json.dumps(json.loads(kept) | {"python": "3.11.0 (elsewhere)"}))
    try:
        run = python(toy, ASK)
        assert run.stdout.split() == ["True", "1", "source"], run.stderr
        assert "compiled by another Python: 3.11.0 (elsewhere)" in run.stderr
        refused = python(toy, ASK, "native")
        assert refused.returncode != 0 and refused.stdout == ""
        assert "no fresh build (compiled by another Python: 3.11.0 (elsewhere))" in refused.stderr
    finally:
        manifest.write_text(kept)
    assert python(toy, ASK).stdout.split() == ["False", "1", "native"]


def test_a_package_runs_compiled_only_with_the_build_it_was_compiled_against(toy):
    """duo's compiled code calls toy's through toy's export table, whose layout
    is fixed by the build: if toy runs its source, or another build of toy is
    installed, duo runs its source too (or CQSD_BUILD=native refuses)."""
    assert json.loads((toy / "duo" / native.MANIFEST).read_text())["needs"] == ["toy"]
    assert python(toy, ASK_DUO).stdout.split() == ["False", "2", "native"]

    m = toy / "toy" / "m.py"
    m.write_text(TOY.format(value=2))  # toy edited after the build
    try:
        run = python(toy, ASK_DUO)
        assert run.stdout.split() == ["True", "4", "source"], run.stderr
        assert "duo: running the Python source, since the build of toy it was " \
               "compiled against does not run here" in run.stderr
    finally:
        m.write_text(TOY.format(value=1))

    manifest = toy / "toy" / native.MANIFEST
    kept = manifest.read_text()
    manifest.write_text(json.dumps(json.loads(kept) | {"build": "another"}))  # toy rebuilt alone
    try:
        assert python(toy, ASK).stdout.split() == ["False", "1", "native"]
        run = python(toy, ASK_DUO)
        assert run.stdout.split() == ["True", "2", "source"], run.stderr
        refused = python(toy, ASK_DUO, "native")
        assert refused.returncode != 0 and refused.stdout == ""
        assert "CQSD_BUILD=native, but duo has no fresh build (the build of toy it was " \
               "compiled against does not run here)" in refused.stderr
    finally:
        manifest.write_text(kept)
    assert python(toy, ASK_DUO).stdout.split() == ["False", "2", "native"]
