"""The process a job's Python workers are forked from (``spark.python.daemon.module``):
pyspark's own, importing pyspark from the installed package instead of its zip.

Design note. Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first
on its Python workers' path. For a pip-installed pyspark, SPARK_HOME is the package
itself, so the zips hold the modules the package holds, but as sources that Python
cannot cache compiled: a job's worker daemon and its workers compiled every module
of pyspark they imported, again in every job. Dropping the zips that lie inside the
installed package, for packages also installed, leaves the same modules, compiled
once by pip: a 10-row checkpoint's fold went from 6.9-7.0 s to 4.6-4.8 s
(docs/srds.md, "Performance").
A Spark distribution's zips (SPARK_HOME elsewhere, as on a cluster) stay: its
pyspark need not be the one installed here.
"""

import os
import sys


def _installed(package: str, path: list[str]) -> str | None:
    """The directory of ``package`` in a plain directory of ``path``, if any."""
    for entry in path:
        if entry and not entry.endswith(".zip"):
            found = os.path.join(entry, package)
            if os.path.isfile(os.path.join(found, "__init__.py")):
                return found
    return None


def unzipped(path: list[str]) -> list[str]:
    """``path`` without the installed pyspark's own zips of packages also installed."""
    pyspark = _installed("pyspark", path)
    if pyspark is None:
        return path
    own = os.path.join(pyspark, "python", "lib") + os.sep

    def redundant(entry: str) -> bool:
        name = os.path.basename(entry).split("-")[0].removesuffix(".zip")
        return entry.startswith(own) and _installed(name, path) is not None

    return [entry for entry in path if not redundant(entry)]


if __name__ == "__main__":
    sys.path[:] = unzipped(sys.path)  # before pyspark is imported, here and in the workers
    from pyspark.daemon import manager

    manager()
