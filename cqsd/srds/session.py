"""The Spark session of an SRDS job: quiet, UI off, workers in our interpreter."""

import atexit
import os
import subprocess
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

from . import cds

LOG4J = Path(__file__).with_name("log4j2.properties")
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"
DEFAULTS = {
    "spark.ui.enabled": "false",  # a job is a batch step; nothing should bind a port
    # A job is one shuffle whose partitions the fold chooses (fold.by_entry): adaptive
    # re-planning has nothing to gain and costs a planning pass per stage.
    "spark.sql.adaptive.enabled": "false",
    # the Python workers import pyspark compiled, not from its zip (workers.py)
    "spark.python.daemon.module": "cqsd.srds.workers",
}
# A job is short and its JVM does little per row (the Python workers decode and
# fold): C2's compiling costs more CPU than its code saves. Measured on 10^6 puts,
# local[2]: the JVM's CPU from 20.5 s to 14.5 s, a 20,000-put job's from 12.9 s to 7.3 s.
JIT = "-XX:TieredStopAtLevel=1"
# Seconds a job's JVM gets to exit by itself at the job's end. It takes about a
# second; one writing the class archive (cds) takes 15 s or more on two cores.
EXIT_WAIT = 120.0


def start(master: str = "local[*]", conf: dict[str, str] | None = None, *,
          progress: bool = False, app: str = "cqsd-srds") -> SparkSession:
    """Start (or join, under spark-submit) a session; ``conf`` overrides the defaults.

    Python workers run ``sys.executable`` so they import this very cqsd.
    ``progress`` turns on Spark's console progress bar (on stderr). Driver
    JVM options in ``conf`` are added to the one that quiets Spark's logging
    and JIT (a later ``-XX:TieredStopAtLevel`` wins), and to the ones that share
    the classes of an earlier job's JVM (``cds``); on a cluster, executor JVM
    options are added to the ones that map those classes.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # A job the tests measure (COVERAGE_PROCESS_START, tests/daemon/harness.py) must
    # not pass it on: Spark's Python workers would trace every row they fold, and
    # they end by os._exit, saving nothing (pyproject.toml, [tool.coverage.run]).
    # Its own measurement started with the process, so it is kept.
    os.environ.pop("COVERAGE_PROCESS_START", None)
    settings = {**DEFAULTS, "spark.ui.showConsoleProgress": str(progress).lower(), **(conf or {})}
    spark_home = _find_spark_home()
    settings[JAVA_OPTIONS] = " ".join(
        [f"-Dlog4j2.configurationFile={LOG4J.as_uri()}", JIT, cds.options(spark_home),
         settings.get(JAVA_OPTIONS, "")]
    ).strip()
    if not master.startswith("local"):
        settings[EXECUTOR_OPTIONS] = " ".join(
            [cds.executor_options(spark_home), settings.get(EXECUTOR_OPTIONS, "")]).strip()
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")  # under spark-submit the JVM started without our file
    proc = getattr(SparkContext._gateway, "proc", None)  # None under spark-submit: it is our parent
    if proc is not None and proc not in _ending:
        _ending.add(proc)
        atexit.register(_end, proc)
    return spark


_ending: set[subprocess.Popen] = set()


def _end(proc: subprocess.Popen) -> None:
    """At the process's exit, let the JVM exit by itself, as its end of input tells
    it to: its shutdown hooks delete what it made in /tmp (native libraries, Spark's
    local directories) and write a class archive (cds). Registered after a job's
    handler that kills what is left of its process group, so it runs before it
    (atexit runs the later registered first), and after the job's error is logged:
    a JVM error's text comes from the JVM."""
    if proc.poll() is not None or proc.stdin is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if SparkContext._gateway is not None:
        # py4j's side first: its finalizer thread, sending a collected object's
        # release to a JVM on its way out, logged a traceback at the exit
        SparkContext._gateway.shutdown()
    try:
        proc.stdin.close()
        proc.wait(timeout=EXIT_WAIT)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass  # a job's end kills it
