"""Imports go one way (docs/architecture.md, issue 12): read from the source with ``ast``, not by
importing, so a lazy import inside a function counts as much as one at the top (one
under ``if TYPE_CHECKING:`` never runs, and does not count).

    cqsclient ──▶ cqsproto ◀── cqsd ──▶ logstream

cqsproto (the wire protocol) is the leaf and imports nothing of ours; the SDK never
imports the daemon; logstream stands alone.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# top-level package -> the directory its source lives in
PACKAGES = {
    "cqsd": ROOT / "cqsd",
    "logstream": ROOT / "logstream",
    "cqsclient": ROOT / "clients" / "cqsclient",
    "cqsproto": ROOT / "clients" / "cqsproto",
}


def modules() -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every source file of ours."""
    for top, where in PACKAGES.items():
        for path in sorted(where.rglob("*.py")):
            parts = [top, *path.relative_to(where).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


MODULES = dict(modules())


def imported(module: str, path: Path, type_checking: bool = False,
             functions: bool = True) -> set[str]:
    """The modules (of ours or not) that *module* imports anywhere in its source (with
    *type_checking*, under ``if TYPE_CHECKING:`` too; without *functions*, only those
    importing the module runs, not those in the bodies of its functions)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree, functions):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up one more per extra dot
                base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0], base]))
            # `from x import y` imports the module x.y if there is one, else x
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return found


def _runtime_nodes(tree: ast.AST, functions: bool = True) -> Iterator[ast.AST]:
    """Every node that can run: all but the bodies of ``if TYPE_CHECKING:`` (an
    import there is for the type checker alone and makes no arrow), and without
    *functions* all but the bodies of functions too."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if not functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


GRAPH = {module: {n for n in imported(module, path) if ours(n)} for module, path in MODULES.items()}


def arrows(level: int) -> set[tuple[str, str]]:
    """Arrows between packages, each named by its first *level* dotted parts."""
    def cut(name: str) -> str:
        return ".".join(name.split(".")[:level])

    return {(cut(a), cut(b)) for a, targets in GRAPH.items() for b in targets if cut(a) != cut(b)}


def cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph *edges*, or None."""
    sorter = graphlib.TopologicalSorter()
    for a, b in edges:
        sorter.add(a, b)
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def from_package(top: str) -> set[str]:
    return {b.split(".")[0] for a, b in arrows(1) if a == top}


def test_the_graph_sees_the_arrows_that_must_exist():
    """The reader finds what is really there: both sides import the protocol."""
    assert {("cqsclient", "cqsproto"), ("cqsd", "cqsproto"), ("cqsd", "logstream")} <= arrows(1)


def test_the_protocol_imports_nothing_of_ours():
    """cqsproto is the leaf: no arrow leaves it for cqsd, cqsclient or logstream."""
    assert from_package("cqsproto") == set()


def test_the_client_never_imports_the_server():
    """cqsclient (the SDK and cqsctl) imports only the protocol."""
    assert from_package("cqsclient") == {"cqsproto"}


def test_logstream_stands_alone():
    """logstream imports nothing of ours, so it is usable on its own."""
    assert from_package("logstream") == set()


def test_no_cycle_between_packages():
    """The top-level packages import one another in one direction only."""
    assert cycle(arrows(1)) is None


def test_no_cycle_between_the_daemons_packages():
    """cqsd's subpackages (engine, server, recovery, srds, storage, and the record
    formats) import one another in one direction only."""
    assert cycle(arrows(2)) is None


def test_the_spark_jobs_never_import_the_server():
    """The jobs run as their own processes: cqsd.srds reaches nothing of cqsd.server."""
    assert not {b for a, b in arrows(2) if a == "cqsd.srds" and b == "cqsd.server"}


SMDS_STORAGE = "cqsd.smds.dataset"  # the one module of cqsd.smds that touches files


def test_the_smds_core_imports_no_server_and_does_no_io():
    """cqsd.smds is pure (docs/architecture.md) but for its storage module: the rest reaches only
    the protocol's name rule, nothing that awaits or touches files, and not the
    storage module either."""
    smds = {a: targets for a, targets in GRAPH.items()
            if a.startswith("cqsd.smds") and a != SMDS_STORAGE}
    assert smds, "the reader must see the package"
    reached = {b for targets in smds.values() for b in targets if not b.startswith("cqsd.smds")}
    assert reached <= {"cqsproto.names"}
    assert not any(SMDS_STORAGE in targets for targets in smds.values())
    foreign = {n for a in smds for n in imported(a, MODULES[a]) if not ours(n)}
    assert not foreign & {"trio", "anyio", "os", "io", "pathlib", "socket", "mmap"}


def test_the_smds_storage_module_never_awaits_nor_reaches_the_server():
    """cqsd.smds.dataset does blocking file I/O for a worker thread: no trio, and of
    ours only the SMDS core and logstream's fsync recipes."""
    reached = {b for b in GRAPH[SMDS_STORAGE] if not b.startswith("cqsd.smds")}
    assert reached <= {"logstream.durable", "cqsproto.names"}
    assert not imported(SMDS_STORAGE, MODULES[SMDS_STORAGE]) & {"trio", "anyio"}


def test_the_cycle_finder_finds_a_cycle():
    """A two-package loop is reported, so the test above can fail."""
    assert cycle({("a", "b"), ("b", "a"), ("b", "c")}) in (["a", "b", "a"], ["b", "a", "b"])


def loaded_by(roots: set[str]) -> set[str]:
    """The modules (of ours or not) that importing *roots* loads: what their top levels
    import, then what those import, with the packages each is in (``import a.b`` runs
    ``a/__init__.py`` first). Others' modules are listed, not followed."""
    loaded: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if n not in loaded:
                loaded.add(n)
                if n in MODULES:
                    todo.extend(imported(n, MODULES[n], functions=False))
    return loaded


# What only some configurations use, imported where it is used: a group's modules
# (etcd's client, over h11; the standby), the metrics (prometheus_client, psutil) and
# the fscheck subcommand's; together ~0.1 s of every start (tests start hundreds).
NOT_AT_START = {"cqsd.group.node", "cqsd.group.etcd", "h11", "cqsd.group.standby",
                "cqsd.server.membership", "cqsd.server.metrics", "prometheus_client", "psutil",
                "cqsd.storage.fscheck"}


def test_a_start_with_the_default_config_loads_nothing_it_does_not_use():
    """``cqsd run`` without a group and without metrics imports none of their modules."""
    loaded = loaded_by({"cqsd.__main__", "cqsd.server.daemon"})
    assert {"cqsd.server.journal", "cqsd.config", "trio", "logstream"} <= loaded
    assert loaded & NOT_AT_START == set()


def every_import(module: str, path: Path) -> set[str]:
    """The modules of ours *module* imports anywhere, ``if TYPE_CHECKING:`` bodies
    included: an import for the type checker alone still ties two rooms together."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0], base]))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {n for n in found if ours(n)}


def server_arrows() -> set[tuple[str, str]]:
    """Module-to-module arrows inside cqsd.server, TYPE_CHECKING imports included
    (the package itself, cqsd.server, is left out: its __init__ imports nothing)."""
    inside = {m: p for m, p in MODULES.items() if m.startswith("cqsd.server.")}
    return {(a, b) for a, path in inside.items() for b in every_import(a, path) if b in inside}


def test_no_import_circle_among_the_servers_modules():
    """No module of cqsd.server reaches itself again through the modules it imports,
    counting those imported only for type checking (docs/architecture.md, the rooms)."""
    assert cycle(server_arrows()) is None


def test_the_server_graph_sees_type_checking_imports(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is an arrow to the circle check, so the
    test above would catch the daemon imported back for its type."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from .daemon import Daemon\n")
    assert "cqsd.server.daemon" in every_import("cqsd.server.m", source)
    assert "cqsd.server.daemon" not in imported("cqsd.server.m", source)


def test_no_server_module_imports_the_daemon():
    """The daemon makes the rooms; no room reaches back into it, not even for a type."""
    assert not {a for a, b in server_arrows() if b == "cqsd.server.daemon"}
