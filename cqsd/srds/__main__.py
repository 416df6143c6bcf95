"""``python -m cqsd.srds checkpoint|recover|report`` (or ``spark-submit
cqsd/srds/__main__.py ...``): the SRDS jobs from the command line.

Progress goes to stderr as structlog JSON events; the result is one JSON object
on the last line of stdout, which is what the daemon reads. Exit 0: done;
1: the job failed, and its last stderr event (level "error") names the problem
in ``error``; 2: the command line is wrong.
"""

import argparse
import atexit
import json
import math
import os
import select
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import structlog

# Absolute imports: under spark-submit this file runs as a script, not a package.
from cqsd import logs
from cqsd.srds import jobs, slots
from logstream.segment import check_writer_id

log = structlog.get_logger()
NICE = 10  # a job's CPU priority below the daemon's (--priority nice or idle)
JVM_CAUSE = "Caused by: "  # how a Java stack trace starts the part of an exception's cause


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = _checked(parser.parse_args(argv), parser)
    lower_priority(args.priority)
    logs.configure("info")
    if args.parent is not None:
        _exit_with_parent(args.parent)
        atexit.register(_end_the_rest_of_the_group)
    try:
        for structure in _structures(args):
            slots.check_structure_name(structure)
        result = _run(args)
    except Exception as err:  # noqa: BLE001 - every failure is reported alike: named, exit 1
        log.error("srds_job_failed", job=args.job, structure=_label(args),
                  kind=type(err).__name__, error=_first_line(err))
        return 1
    print(json.dumps(result), flush=True)
    return 0


def lower_priority(priority: str) -> None:
    """``nice``: below the daemon (NICE); ``idle``: besides, only the CPU the daemon
    leaves idle (SCHED_IDLE, Linux): with nice alone, a checkpoint's JVM bursts still
    delayed puts by milliseconds. The JVM the job starts inherits both."""
    if priority == "normal":
        return
    os.nice(NICE)
    if priority == "idle" and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _run(args: argparse.Namespace) -> dict:
    data_dir = Path(args.data_dir)
    if args.job == "report" and args.out is not None:
        from cqsd.srds import session, traffic  # imports pyspark, as the folding jobs do

        return traffic.run(data_dir, Path(args.out), lambda conf: session.start(
            args.master, {**conf, **dict(args.conf)},
            progress=args.progress and sys.stderr.isatty(),
            app="cqsd-report"), since=args.since, events=args.events, structure=args.structure)
    if args.job == "report":
        return jobs.report(data_dir, args.structure)
    stages = jobs.Stages(args.job, _label(args) or "")
    with stages.stage("session"):
        from cqsd.srds import session  # imports pyspark: only the jobs that fold need it

        spark = session.start(args.master, dict(args.conf),
                              progress=args.progress and sys.stderr.isatty())
    try:
        cut = dict(args.cut) if args.cut else None
        if args.job == "checkpoint":
            return jobs.checkpoint(spark, data_dir, args.structure, cut, stages)
        if len(args.structure) > 1:
            return jobs.recover_together(spark, data_dir, args.structure, stages, cut)
        return jobs.recover(spark, data_dir, args.structure[0], args.to_image, stages, cut)
    finally:
        spark.stop()


def _structures(args: argparse.Namespace) -> list[str]:
    """The structures named: recover takes several, the others one or none."""
    if isinstance(args.structure, list):
        return args.structure
    return [] if args.structure is None else [args.structure]


def _label(args: argparse.Namespace) -> str | None:
    return ",".join(_structures(args)) or None


def _exit_with_parent(parent: int) -> None:
    """End the job, and the JVM it starts, as soon as ``parent``, the process that
    started it, is gone (or is no longer its parent: gone before we looked). The
    daemon reads the result from a pipe, so a job that outlives it works for
    nobody, and holds the structure's lock that the next daemon's checkpoint
    needs. (Not PR_SET_PDEATHSIG: that fires when the parent's *thread* ends, and
    trio starts processes from worker threads that end when idle.) The job leads a
    process group of its own, which the JVM joins, and ends the whole group: a JVM
    whose Python driver was gone did not always stop. The wait is on a pidfd, with
    no clock: a watch that slept between looks died of a faked clock in the fault
    loop (libfaketime: ``time.sleep`` raised EINVAL), and left jobs and their JVMs
    running for good after their daemons were killed."""
    try:
        os.setpgid(0, 0)
    except PermissionError:
        pass  # it leads a session of its own, so a group too
    try:
        gone: int | None = os.pidfd_open(parent)
    except ProcessLookupError:
        gone = None

    def watch() -> None:
        if gone is not None and os.getppid() == parent:
            select.select([gone], [], [])
        if os.getpgrp() == os.getpid():
            os.killpg(0, signal.SIGKILL)  # itself and its JVM
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _end_the_rest_of_the_group() -> None:
    """At a job's exit, SIGKILL what is left of its process group (its JVM): a JVM
    still starting when its driver failed never saw the driver go, and lived on."""
    me = os.getpid()
    if os.getpgrp() != me:
        return
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != me:
            try:
                if os.getpgid(int(entry.name)) == me:
                    os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone meanwhile


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
    common.add_argument("--data-dir", default="./cqsd-data", help="default ./cqsd-data")
    common.add_argument("--master", default="local[*]", help="Spark master, default local[*]")
    common.add_argument("--conf", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable)")
    common.add_argument("--progress", action="store_true",
                        help="a progress bar on stderr when it is a terminal")
    common.add_argument("--priority", choices=("normal", "nice", "idle"), default="normal",
                        help="run below the daemon: nice, or on idle CPU only (idle)")
    common.add_argument("--parent", type=int, metavar="PID",
                        help="end the job once process PID (the daemon that started it) "
                             "is no longer its parent")
    one = argparse.ArgumentParser(add_help=False, parents=[common])
    one.add_argument("--structure", required=True, help="the structure (e.g. MSGQ01)")
    parser = argparse.ArgumentParser(prog="python -m cqsd.srds",
                                     description="structure checkpoints (SRDS) and recovery")
    jobs_ = parser.add_subparsers(dest="job", required=True)
    cut = argparse.ArgumentParser(add_help=False)
    cut.add_argument("--cut", action="append", type=_position, default=[], metavar="WRITER=LSN",
                     help="last LSN to include per writer, writers not named left out "
                          "(repeatable; default: every writer to the log's end)")
    jobs_.add_parser("checkpoint", parents=[one, cut],
                     help="fold the current slot and the log into the other slot")
    rebuild = jobs_.add_parser("recover", parents=[common, cut],
                               help="newest valid slot + the log after it -> an image; "
                                    "with several --structure, all folded in one job")
    rebuild.add_argument("--structure", action="append", required=True,
                         help="the structure (e.g. MSGQ01); repeat it to recover several "
                              "together (RECOVER CFSTRUCT of a list), each into "
                              "<data-dir>/images/<S>.recovered")
    rebuild.add_argument("--to-image", help="default <data-dir>/images/<S>.recovered "
                                            "(one structure only)")
    report = jobs_.add_parser(
        "report", parents=[common],
        help="with --out: the traffic report (HTML, PNG plots, Parquet); "
             "else the slots and the log tail of --structure, as JSON")
    report.add_argument("--structure", help="only this structure (required without --out)")
    report.add_argument("--out", help="directory for index.html, the plots and the Parquet tables")
    report.add_argument("--since", type=_since, metavar="TIME",
                        help="only effects from TIME on: ISO 8601 (UTC unless it names a "
                             "zone) or epoch seconds")
    report.add_argument("--events", type=Path, metavar="FILE",
                        help="the daemon's event log (log_file), for structure-full and "
                             "overflow episodes")
    return parser


def _checked(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    if args.job == "recover" and len(args.structure) > 1 and args.to_image is not None:
        parser.error("recover: --to-image names one structure's image; with several, each "
                     "goes to <data-dir>/images/<S>.recovered")
    if args.job == "report" and args.out is None and args.structure is None:
        parser.error("report needs --out DIR (the traffic report) or --structure S "
                     "(the slots and the log tail)")
    return args


def _since(text: str) -> float:
    """An ISO 8601 time (UTC if it names no zone) or epoch seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither an ISO 8601 time (e.g. 2026-11-24T09:30:00Z) nor epoch "
                "seconds") from None
        value = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time after 1970")
    return value


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
