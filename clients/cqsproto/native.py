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

A package's compiled modules also call those of the packages it imports
natively, through tables whose layout is fixed when they are compiled. So the
manifest names its build and the packages it was compiled against, and a
package runs compiled only if each of those runs compiled too, from that same
build; otherwise it runs its source (or, with ``CQSD_BUILD=native``, refuses).

This module is pure Python on purpose and is never compiled. Every SDK process
imports it, so it imports only what the interpreter has loaded already, and
hashlib only where there is a build to check.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType

MANIFEST = "_native.json"
ENV = "CQSD_BUILD"
BUILDS = ("native", "source")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # what the build names a module's extension
_SOURCE = (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)

# package name -> the build it runs ("native" or "source"), once chosen
chosen: dict[str, str] = {}
# package name -> the identity of the compiled build it runs, if it runs one
builds: dict[str, str] = {}


def digest(path: str | os.PathLike[str]) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def module_name(package: str, relative: str) -> str:
    """The module a source of ``package`` is, by its path relative to the package."""
    parts = os.path.splitext(relative)[0].split(os.sep)
    return ".".join((package, *parts)).removesuffix(".__init__")


def stale(directory: str | os.PathLike[str], manifest: dict[str, dict[str, str]]) -> list[str]:
    """The modules of ``manifest`` whose source changed or whose extension is gone."""
    out = []
    for name, built in manifest.items():
        source = os.path.join(directory, built["source"])
        try:
            changed = digest(source) != built["sha256"]
        except OSError:
            changed = True
        if changed or not os.path.exists(source.removesuffix(".py") + SUFFIX):
            out.append(name)
    return out


def unlisted(directory: str, package: str) -> dict[str, dict[str, str]]:
    """Extensions found without a manifest (a build that stopped half way), as
    stale entries: they are never loaded."""
    found = {}
    for where, _, files in os.walk(directory):
        for file in files:
            source = os.path.join(where, file.removesuffix(SUFFIX) + ".py")
            if file.endswith(SUFFIX) and os.path.exists(source):
                relative = os.path.relpath(source, directory)
                found[module_name(package, relative)] = {"source": relative, "sha256": ""}
    return found


def choose(package: str, path: Sequence[str] | None = None) -> str:
    """Decide which build ``package`` (its directory first in ``path``, or found
    without importing it) runs, and make imports of its compiled modules follow:
    "native" or "source"."""
    if package in chosen:
        return chosen[package]
    if path is None:
        from importlib.util import find_spec  # every finder, an editable install's too

        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"no package {package} to choose a build of")
        path = spec.submodule_search_locations
    wanted = os.environ.get(ENV, "")
    if wanted not in ("", *BUILDS):
        raise ImportError(f"{ENV}={wanted!r}: it must be 'native' or 'source'")
    directory = path[0]
    where = os.path.join(directory, MANIFEST)
    built_by, identity, needs = sys.version, "", []
    try:
        with open(where) as f:
            found = json.load(f)
        manifest, built_by = found["modules"], found.get("python")
        identity, needs = found.get("build", ""), list(found.get("needs", []))
    except FileNotFoundError:
        manifest = unlisted(directory, package)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ImportError(f"{where} is unreadable ({error}): "
                          "run `make native` to rebuild it") from None
    if built_by != sys.version and manifest:  # compiled with another interpreter's headers
        changed = list(manifest)
        listed = why = f"compiled by another Python: {built_by}"
    else:
        changed = stale(directory, manifest)
        listed = ", ".join(changed[:3]) + " ..." * (len(changed) > 3)
        why = f"it changed after the compiled build ({listed})"
    if manifest and not changed and wanted != "source":
        apart = [need for need in needs if choose(need) != "native" or builds[need] != identity]
        if apart:
            changed = list(manifest)
            listed = why = (f"the build of {', '.join(apart)} it was compiled against "
                            "does not run here")
    if wanted == "native" and (changed or not manifest):
        raise ImportError(f"{ENV}=native, but {package} has no fresh build "
                          f"({listed or 'nothing compiled'}): run `make native`")
    build = "native" if manifest and not changed and wanted != "source" else "source"
    if build == "source" and manifest:
        if changed and not wanted:
            print(f"{package}: running the Python source, since {why}; "
                  "`make native` rebuilds it", file=sys.stderr)
        # Just ahead of the finder that would find the extension, and after any
        # that wrap what the others find (atheris's instrumentation, coverage).
        finders = sys.meta_path
        at = finders.index(importlib.machinery.PathFinder) \
            if importlib.machinery.PathFinder in finders else 0
        finders.insert(at, SourceFinder(directory, manifest))
    chosen[package] = build
    if build == "native":
        builds[package] = identity
    return build


class SourceFinder:
    """Loads a package's compiled modules from their ``.py`` instead (a meta path
    finder: only ``find_spec`` is asked of one)."""

    def __init__(self, directory: str, manifest: dict[str, dict[str, str]]) -> None:
        self.sources = {name: os.path.join(directory, built["source"])
                        for name, built in manifest.items()}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        where = os.path.dirname(source)
        if os.path.basename(source) == "__init__.py":  # the package's own directory
            where = os.path.dirname(where)
        return importlib.machinery.FileFinder(where, _SOURCE).find_spec(fullname)
