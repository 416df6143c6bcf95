"""``python -m cqsd.srds report --out DIR``: the traffic report, from the data
directory's files to the page (report.py reads, plots.py draws).

It only reads the data directory (the repository read-only), so it runs beside
a live daemon and never asks it anything. A directory with no log still gets a
page, saying so, and no Spark is started for it.
"""

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import structlog
from pyspark.sql import SparkSession

from logstream.durable import make_dirs

from ...storage.datadir import DataDir
from . import plots, report

log = structlog.get_logger()
# Spark settings of the report: timestamps in UTC whatever the machine's zone.
CONF = {"spark.sql.session.timeZone": "UTC"}


def run(data_dir: Path, out: Path,
        spark_session: Callable[[dict[str, str]], AbstractContextManager[SparkSession]], *,
        since: float | None = None, events: Path | None = None,
        structure: str | None = None) -> dict:
    """Write the report of ``data_dir`` into ``out``; the result the CLI prints.
    ``spark_session(conf)`` gives the session to use while in its ``with`` (a
    SparkSession stops at the end of it); asked for only if there is a log."""
    began = time.perf_counter()
    make_dirs(out)
    tasks = report.plan(DataDir(str(data_dir)).logstream)
    with spark_session(CONF) if tasks else nullcontext(None) as spark:
        built = report.build(spark, data_dir, tasks, since, events, structure)
    for problem in built.problems:
        log.warning("traffic_report_problem", problem=problem)
    files = report.write(built, out)
    page = plots.draw(built, out, data_dir=data_dir, since=since)
    return {"out": str(out), "page": str(page), "records": built.records,
            "span": list(built.span) if built.span else None,
            "tables": {name: t.num_rows for name, t in built.tables.items()},
            "parquet": [f.name for f in files], "plots": sorted(p.name for p in out.glob("*.png")),
            "problems": built.problems, "seconds": round(time.perf_counter() - began, 3)}

