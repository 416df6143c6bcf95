"""The traffic report (``python -m cqsd.srds report --out DIR``): what the log says
happened to each queue. It reads the log as the checkpoint does (segments.py,
effects.py, one Spark task per segment), which is why it lives among the Spark
jobs, in a room of its own: the tables (report.py), the page (plots.py), and
the job that makes both from a data directory (job.py)."""

from .job import run

__all__ = ["run"]
