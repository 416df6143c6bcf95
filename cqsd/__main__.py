"""``cqsd run [--config FILE]``: the daemon in the foreground (docs/operations.md)."""

import argparse
import os
import pwd
import sys

import structlog
import trio

from cqsproto import native

from . import __version__, logs
from .config import ConfigError, check_host, load
from .errors import DaemonError
from .storage import fscheck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cqsd", description="the cqsd shared queue server")
    parser.add_argument("--version", action="version", version=f"cqsd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the daemon in the foreground")
    run.add_argument("--config", help="TOML configuration file (default: the embedded one)")
    fscheck.add_arguments(commands.add_parser(
        "fscheck", help="check that DIR's file system can hold a group's shared data directory"))
    args = parser.parse_args(argv)
    if args.command == "fscheck":
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
