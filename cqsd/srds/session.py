"""The Spark session of an SRDS job: quiet, UI off, workers in our interpreter."""

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

LOG4J = Path(__file__).with_name("log4j2.properties")
DEFAULTS = {
    "spark.ui.enabled": "false",  # a job is a batch step; nothing should bind a port
    "spark.ui.showConsoleProgress": "false",
    # Fewer rows per Arrow batch than Spark's 10,000: messages are up to 1 MiB each.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J.as_uri()}",
}


def start(master: str = "local[*]", conf: dict[str, str] | None = None, *,
          progress: bool = False, app: str = "cqsd-srds") -> SparkSession:
    """Start (or join, under spark-submit) a session; ``conf`` overrides the defaults.

    Python workers run ``sys.executable`` so they import this very cqsd.
    ``progress`` turns on Spark's console progress bar (on stderr).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = {**DEFAULTS, "spark.ui.showConsoleProgress": str(progress).lower(), **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")  # under spark-submit the JVM started without our file
    return spark
