"""The compiled build of the request path: mypyc over the modules every request
runs through, the Python source kept as the reference (docs/native.md).

    python tools/native.py build   # compile, unless the last build still matches
    python tools/native.py clean   # remove every extension and manifest

mypyc compiles every package's modules in one run, each package into one group
(a shared library inside the package, ``<package>/_native__mypyc*.so``, and a
small extension per module). A group calls into the groups it imports through
their export tables, natively, so a group is only ever run with the very build
of the others it was compiled against. This script builds under
``build/native``, copies the extensions beside their sources, then writes each
package's manifest: its sources' hashes, the build's identity and the builds it
needs (``cqsproto/native.py`` reads it at import to refuse a stale or mismatched
build). A build whose manifests still match the sources, this script, the mypyc
version and the interpreter does nothing, so ``make test`` and ``make run`` can
always ask for it; any change rebuilds every package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients"))

from cqsproto.native import MANIFEST, SUFFIX, digest, module_name, stale  # noqa: E402

# package -> (its directory, the modules compiled, relative to it). The request
# path: frames and requests (cqsproto), the engine, the server's per-request
# modules, the log's records and writer. Not errors.py: its exceptions are
# subclassed by interpreted code.
PACKAGES: dict[str, tuple[Path, list[str]]] = {
    "cqsproto": (ROOT / "clients" / "cqsproto",
                 ["codec.py", "requests.py", "names.py", "reasons.py", "sizes.py"]),
    "logstream": (ROOT / "logstream", ["record.py", "writer.py"]),
    "cqsclient": (ROOT / "clients" / "cqsclient", ["connection.py", "replies.py"]),
    "cqsd": (ROOT / "cqsd", [
        "dedup.py", "records.py",
        *(f"engine/{name}" for name in (
            "api.py", "browse.py", "byid.py", "capacity.py", "cleanup.py", "commit.py",
            "counts.py", "entry.py", "events.py", "ids.py", "locks.py", "overflow.py",
            "pair.py", "qtypes.py", "reports.py", "structure.py", "timed.py")),
        *(f"server/smds/{name}" for name in ("datasets.py", "space.py", "syncs.py")),
        *(f"server/{name}" for name in (
            "connections.py", "dedup.py", "dispatch.py", "handlers.py", "idle.py", "journal.py",
            "limits.py", "poller.py", "registry.py", "session.py", "waiters.py", "wire.py")),
    ]),
}
BUILD = ROOT / "build" / "native"


def recipe() -> str:
    """What a build depends on besides the sources: this script and mypyc."""
    import mypy.version

    return hashlib.sha256(Path(__file__).read_bytes()
                          + mypy.version.__version__.encode()).hexdigest()


def fresh(package: str) -> bool:
    """``package``'s extensions were compiled from its sources as they are, by
    this recipe and interpreter."""
    directory, _ = PACKAGES[package]
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    modules = {module_name(package, m) for m in PACKAGES[package][1]}
    return (manifest.get("recipe") == recipe() and manifest.get("python") == sys.version
            and set(manifest.get("modules", ())) == modules
            and not stale(directory, manifest["modules"]))


def current() -> bool:
    """Every package fresh, and all of one build."""
    builds = set()
    for package, (directory, _) in PACKAGES.items():
        if not fresh(package):
            return False
        builds.add(json.loads((directory / MANIFEST).read_text()).get("build"))
    return len(builds) == 1


def clean(directory: Path) -> None:
    """The manifest first, so that a build stopped half way leaves none
    (cqsproto.native then takes the extensions left for stale)."""
    (directory / MANIFEST).unlink(missing_ok=True)
    for extension in directory.rglob("*" + SUFFIX):
        extension.unlink()


def build(packages: dict[str, tuple[Path, list[str]]], out: Path,
          multi_file: bool = True) -> None:
    """Compile each package's ``modules`` (relative to its directory) into a group
    of its own, all in one mypyc run under ``out``, copy the extensions beside
    their sources and write the manifests."""
    from mypyc.build import mypycify
    from setuptools import Distribution  # type: ignore[import-untyped]

    hashes: dict[str, dict[str, dict[str, str]]] = {}
    groups: list[tuple[list[str], str | None]] = []
    for package, (directory, modules) in packages.items():
        clean(directory)
        hashes[package] = {module_name(package, m): {"source": m, "sha256": digest(directory / m)}
                           for m in modules}
        groups.append(([str(directory / m) for m in modules], f"{package}._native"))
    identity = hashlib.sha256(json.dumps([recipe(), sys.version, hashes], sort_keys=True)
                              .encode()).hexdigest()
    shutil.rmtree(out, ignore_errors=True)
    # mypy reads its options ([tool.mypy], mypy_path) from the pyproject.toml here.
    extensions = mypycify([source for sources, _ in groups for source in sources],
                          separate=groups, multi_file=multi_file, target_dir=str(out / "c"))
    for extension in extensions:
        # Each group's headers are in a directory of their own, its own searched
        # first: the headers of the groups it imports have the same names.
        own = extension.name.split(".")[0]
        for package in sorted(packages, key=lambda p: p != own):
            extension.include_dirs.append(str(out / "c" / package))
        # Every C file of a group declares the export tables of the groups it
        # imports (``struct export_table_X exports_X;``, no ``extern``): one
        # common symbol, as C compilers made them before GCC 10.
        extension.extra_compile_args.append("-fcommon")
    dist = Distribution({"name": "cqs-native", "ext_modules": extensions})
    dist.cmdclass["build_ext"] = _parallel(dist.get_command_class("build_ext"))
    command = dist.get_command_obj("build_ext")
    command.build_lib, command.build_temp = str(out / "lib"), str(out / "o")
    dist.run_command("build_ext")
    for extension in extensions:
        parts = extension.name.split(".")
        built = out / "lib" / Path(*parts[:-1]) / (parts[-1] + SUFFIX)
        shutil.copy2(built, packages[parts[0]][0] / Path(*parts[1:-1]) / built.name)
    for package, (directory, _) in packages.items():
        (directory / MANIFEST).write_text(json.dumps(
            {"recipe": recipe(), "python": sys.version, "modules": hashes[package],
             "build": identity,
             "needs": sorted(imported(out / "c" / package, package) & set(packages))},
            indent=1, sort_keys=True) + "\n")


def imported(generated: Path, package: str) -> set[str]:
    """The groups ``package``'s generated C calls into: the packages whose group
    headers it includes (mypyc's ``#include <cqsproto/__native_….h>``)."""
    found = set()
    for header in generated.glob("*.h"):
        found.update(re.findall(r"#include <(\w+)/__native_", header.read_text()))
    return found - {package}


def _parallel(build_ext: type) -> type:
    """``build_ext`` compiling an extension's C files on every CPU at once. A group
    is one extension of many files (cqsd's: 28, 12 MB of C), which setuptools
    compiles one after another, so a build used one core: 83 s in a fresh clone on
    two cores, against 55 s this way (docs/native.md)."""

    class ParallelBuildExt(build_ext):  # type: ignore[misc]
        def build_extension(self, ext):  # type: ignore[no-untyped-def]
            serial = self.compiler.compile

            def compile(sources, *args, **kwargs):  # type: ignore[no-untyped-def]
                with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                    done = pool.map(lambda source: serial([source], *args, **kwargs), sources)
                    return [obj for objects in done for obj in objects]

            self.compiler.compile = compile
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = serial

    return ParallelBuildExt


def main(argv: list[str]) -> int:
    if argv[1:] == ["clean"]:
        for package in PACKAGES:
            clean(PACKAGES[package][0])
        return 0
    if argv[1:] != ["build"]:
        print(__doc__, file=sys.stderr)
        return 2
    if current():
        print(f"native: {', '.join(PACKAGES)} are up to date")
    else:
        print(f"native: compiling {', '.join(PACKAGES)} "
              f"({sum(len(modules) for _, modules in PACKAGES.values())} modules)")
        build(PACKAGES, BUILD)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
