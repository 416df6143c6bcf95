"""``cqsd run [--config FILE]``: the daemon in the foreground (docs/operations.md)."""

import argparse
import os
import pwd
import sys
from pathlib import Path

import structlog
import trio

from cqsproto import native

from . import __version__, logs
from .config import ConfigError, check_host, load
from .errors import DaemonError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cqsd", description="the cqsd shared queue server")
    parser.add_argument("--version", action="version", version=f"cqsd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the daemon in the foreground")
    run.add_argument("--config", help="TOML configuration file (default: the embedded one)")
    _fscheck_arguments(commands.add_parser(
        "fscheck", help="check that DIR's file system can hold a group's shared data directory"))
    args = parser.parse_args(argv)
    if args.command == "fscheck":
        from .storage import fscheck  # here: a daemon's start need not import it
        return fscheck.run(args)
    try:
        config = load(args.config)
        check_host(config, args.config)
    except ConfigError as err:
        return _stopped(err)
    sink = logs.configure(config.daemon.log_level, config.daemon.log_file)
    from .server import heap
    from .server.daemon import Daemon  # after logging is configured

    heap.tune()
    structlog.get_logger().info(
        "starting", version=__version__, pid=os.getpid(),
        config=os.path.abspath(args.config) if args.config else "(the embedded default)",
        data_dir=os.path.abspath(config.daemon.data_dir), user=_user(),
        build=native.chosen)  # compiled or source, by package (docs/native.md)
    try:
        trio.run(Daemon(config, sink, args.config).run)
    except DaemonError as err:  # cqsd/errors.py: each says its exit code and line
        return _stopped(err)
    return 0


def _fscheck_arguments(parser: argparse.ArgumentParser) -> None:
    """``cqsd fscheck``'s arguments (cqsd/storage/fscheck.py), here so that the parser
    every start builds does not import the check."""
    parser.add_argument("dir", metavar="DIR", type=Path, help="the shared data directory")
    parser.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                        help="how long the first node waits for the second (default 60)")
    parser.add_argument("--single", action="store_true",
                        help="fork the partner here: a one-host check")
    parser.add_argument("--records", type=int, default=1000,
                        help="records each node appends for the read-while-append check")


def _stopped(err: DaemonError) -> int:
    """Say why the daemon did not start, or stopped: once in the log (unless it was
    logged already, or cannot be), once on stderr; its exit code."""
    if err.logged:
        structlog.get_logger().critical("start_failed", error=str(err), kind=err.kind)
    print(f"cqsd: {err.headline()}", file=sys.stderr)
    return err.exit_code


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


if __name__ == "__main__":
    sys.exit(main())
