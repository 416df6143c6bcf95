"""Which build of a package runs: its compiled modules or its Python source.

The request path's modules are also compiled by mypyc (``tools/native.py``,
``make native``) into extension modules placed beside their sources, and
Python's import takes an extension before a ``.py`` of the same name. The
source stays the reference (docs/native.md). An editable install keeps the
sources live, so a source edited after its extension was built would be
shadowed by the old code, and a test or a daemon would run what is no longer
written. So the build leaves in each package a manifest, ``_native.json``, of
the SHA-256 of every source it compiled, and the package's ``__init__`` calls
`choose` before it imports anything else:

- ``CQSD_BUILD=source``: every module loads from its source;
- ``CQSD_BUILD=native``: the extensions load, and a stale or missing one is an
  ImportError that names it (CI runs the suite this way);
- unset: the extensions load if every source they were built from is unchanged;
  if one is not, the whole package loads from its source (modules of one build
  call each other natively, so they are never mixed), and stderr says which
  source changed and how to rebuild.

This module is pure Python on purpose and is never compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

MANIFEST = "_native.json"
ENV = "CQSD_BUILD"
BUILDS = ("native", "source")

# package name -> the build it runs ("native" or "source"), once chosen
chosen: dict[str, str] = {}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale(directory: Path, manifest: dict[str, dict[str, str]]) -> list[str]:
    """The modules of ``manifest`` whose source changed or whose extension is gone."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    out = []
    for name, built in manifest.items():
        source = directory / built["source"]
        extension = source.with_name(source.stem + suffixes[0])
        try:
            changed = digest(source) != built["sha256"]
        except OSError:
            changed = True
        if changed or not extension.exists():
            out.append(name)
    return out


def unlisted(directory: Path, package: str) -> dict[str, dict[str, str]]:
    """Extensions found without a manifest (a build that stopped half way), as
    stale entries: they are never loaded."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    found = {}
    for extension in directory.rglob("*" + suffix):
        source = extension.with_name(extension.name.removesuffix(suffix) + ".py")
        if source.exists():
            relative = source.relative_to(directory)
            name = ".".join((package, *relative.with_suffix("").parts))
            found[name.removesuffix(".__init__")] = {"source": str(relative), "sha256": ""}
    return found


def choose(package: str, path: Sequence[str] | None = None) -> str:
    """Decide which build ``package`` (its directory first in ``path``, or found
    without importing it) runs, and make imports of its compiled modules follow:
    "native" or "source"."""
    if package in chosen:
        return chosen[package]
    if path is None:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"no package {package} to choose a build of")
        path = spec.submodule_search_locations
    wanted = os.environ.get(ENV, "")
    if wanted not in ("", *BUILDS):
        raise ImportError(f"{ENV}={wanted!r}: it must be 'native' or 'source'")
    directory = Path(path[0])
    try:
        manifest = json.loads((directory / MANIFEST).read_text())["modules"]
    except FileNotFoundError:
        manifest = unlisted(directory, package)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ImportError(f"{directory / MANIFEST} is unreadable ({error}): "
                          "run `make native` to rebuild it") from None
    changed = stale(directory, manifest)
    if wanted == "native" and (changed or not manifest):
        what = ", ".join(changed) or "nothing compiled"
        raise ImportError(f"{ENV}=native, but {package} has no fresh build ({what}): "
                          "run `make native`")
    build = "native" if manifest and not changed and wanted != "source" else "source"
    if build == "source" and manifest:
        if changed and not wanted:
            print(f"{package}: running the Python source, since it changed after the "
                  f"compiled build ({', '.join(changed[:3])}{' ...' * (len(changed) > 3)}); "
                  "`make native` rebuilds it", file=sys.stderr)
        # Just ahead of the finder that would find the extension, and after any
        # that wrap what the others find (atheris's instrumentation, coverage).
        finders = sys.meta_path
        at = finders.index(importlib.machinery.PathFinder) \
            if importlib.machinery.PathFinder in finders else 0
        finders.insert(at, SourceFinder(directory, manifest))
    chosen[package] = build
    return build


class SourceFinder(importlib.abc.MetaPathFinder):
    """Loads a package's compiled modules from their ``.py`` instead."""

    def __init__(self, directory: Path, manifest: dict[str, dict[str, str]]) -> None:
        self.sources = {name: directory / built["source"] for name, built in manifest.items()}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        if source.name == "__init__.py":
            return importlib.util.spec_from_file_location(
                fullname, source, submodule_search_locations=[str(source.parent)])
        return importlib.util.spec_from_file_location(fullname, source)
