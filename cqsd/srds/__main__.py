"""``python -m cqsd.srds checkpoint|recover|report`` (or ``spark-submit
cqsd/srds/__main__.py ...``): the SRDS jobs from the command line.

Progress goes to stderr as structlog JSON events; the result is one JSON object
on the last line of stdout, which is what the daemon reads. Exit 0: done;
1: the job failed, and its last stderr event (level "error") names the problem
in ``error``; 2: the command line is wrong.
"""

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import structlog

# Absolute imports: under spark-submit this file runs as a script, not a package.
from cqsd import logs
from cqsd.srds import jobs, slots
from logstream.segment import check_writer_id

log = structlog.get_logger()
JVM_CAUSE = "Caused by: "  # how a Java stack trace starts the part of an exception's cause
PARENT_POLL = 0.5  # seconds between checks that the daemon that started the job is alive


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure("info")
    if args.parent is not None:
        _exit_with_parent(args.parent)
    try:
        slots.check_structure_name(args.structure)
        result = _run(args)
    except Exception as err:  # noqa: BLE001 - every failure is reported alike: named, exit 1
        log.error("srds_job_failed", job=args.job, structure=args.structure,
                  kind=type(err).__name__, error=_first_line(err))
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _run(args: argparse.Namespace) -> dict:
    data_dir = Path(args.data_dir)
    if args.job == "report":
        return jobs.report(data_dir, args.structure)
    stages = jobs.Stages(args.job, args.structure)
    with stages.stage("session"):
        from cqsd.srds import session  # imports pyspark: only the jobs that fold need it

        spark = session.start(args.master, dict(args.conf),
                              progress=args.progress and sys.stderr.isatty())
    try:
        if args.job == "checkpoint":
            cut = dict(args.cut) if args.cut else None
            return jobs.checkpoint(spark, data_dir, args.structure, cut, stages)
        return jobs.recover(spark, data_dir, args.structure, args.to_image, stages)
    finally:
        spark.stop()


def _exit_with_parent(parent: int) -> None:
    """End the job as soon as ``parent``, the process that started it, is no longer
    its parent (it was gone even before we looked, if it is not). The daemon reads
    the result from a pipe, so a job that outlives it works for nobody, and holds
    the structure's lock that the next daemon's checkpoint needs. (Not
    PR_SET_PDEATHSIG: that fires when the parent's *thread* ends, and trio starts
    processes from worker threads that end when idle.) The JVM exits with us: it
    stops when its standard input, a pipe from this process, closes."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _first_line(err: Exception) -> str:
    """What went wrong, in one line. An error in a Python worker carries its
    traceback, whose last line is the error itself. A JVM error carries its stack
    trace: its first line says only which call failed ("An error occurred while
    calling o304.parquet."), so take the exception on the line after it, and the
    root cause, the last "Caused by:" (say, "No space left on device")."""
    lines = (str(err).strip() or type(err).__name__).splitlines()
    if type(err).__name__ == "PythonException":
        return lines[-1]
    causes = [line.removeprefix(JVM_CAUSE) for line in lines if line.startswith(JVM_CAUSE)]
    if not causes:
        return lines[0]
    what = lines[1].removeprefix(": ") if len(lines) > 1 and lines[1].startswith(": ") else lines[0]
    return f"{what}; caused by {causes[-1]}"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--structure", required=True, help="the structure (e.g. MSGQ01)")
    common.add_argument("--data-dir", default="./cqsd-data", help="default ./cqsd-data")
    common.add_argument("--master", default="local[*]", help="Spark master, default local[*]")
    common.add_argument("--conf", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable)")
    common.add_argument("--progress", action="store_true",
                        help="a progress bar on stderr when it is a terminal")
    common.add_argument("--parent", type=int, metavar="PID",
                        help="end the job once process PID (the daemon that started it) "
                             "is no longer its parent")
    parser = argparse.ArgumentParser(prog="python -m cqsd.srds",
                                     description="structure checkpoints (SRDS) and recovery")
    jobs_ = parser.add_subparsers(dest="job", required=True)
    take = jobs_.add_parser("checkpoint", parents=[common],
                            help="fold the current slot and the log into the other slot")
    take.add_argument("--cut", action="append", type=_position, default=[],
                      metavar="WRITER=LSN",
                      help="last LSN to include per writer (repeatable; default: the log's end)")
    rebuild = jobs_.add_parser("recover", parents=[common],
                               help="newest valid slot + the whole log after it -> an image")
    rebuild.add_argument("--to-image", help="default <data-dir>/images/<S>.recovered")
    jobs_.add_parser("report", parents=[common], help="the slots and the log tail, as JSON")
    return parser


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _position(text: str) -> tuple[str, int]:
    writer, sep, lsn = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return check_writer_id(writer), _lsn(lsn)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not WRITER=LSN (a writer id and a number >= 0)") from None


def _lsn(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


if __name__ == "__main__":
    sys.exit(main())
