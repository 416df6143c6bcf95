"""``cqsd run [--config FILE]``: the daemon in the foreground (docs/operations.md)."""

import argparse
import os
import pwd
import sys

import structlog
import trio

from logstream import LogstreamError

from . import __version__, logs
from .config import ConfigError, check_host, load
from .records import FoldError
from .recovery.restart import LogBehindImage
from .srds.manifest import ManifestError
from .srds.slots import SlotError
from .storage import fscheck
from .storage.datadir import DataDirError
from .storage.image import ImageError
from .storage.repository import RepositoryError


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
        print(f"cqsd: configuration refused:\n{err}", file=sys.stderr)
        return 2
    sink = logs.configure(config.daemon.log_level, config.daemon.log_file)
    from .server import heap
    from .server.daemon import Daemon, LogFailed  # after logging is configured

    heap.tune()
    structlog.get_logger().info(
        "starting", version=__version__, pid=os.getpid(),
        config=os.path.abspath(args.config) if args.config else "(the embedded default)",
        data_dir=os.path.abspath(config.daemon.data_dir), user=_user())

    try:
        daemon = Daemon(config, sink)
        daemon.config_path = args.config
    except ConfigError as err:
        print(f"cqsd: configuration refused:\n{err}", file=sys.stderr)
        return 2
    try:
        trio.run(daemon.run)
    except LogFailed as err:  # or InternalFailure: stopped without an image
        print(f"cqsd: {err}", file=sys.stderr)
        return err.exit_code
    except (DataDirError, ImageError, FoldError, LogBehindImage, LogstreamError, ManifestError,
            SlotError, RepositoryError, OSError) as err:
        structlog.get_logger().critical("start_failed", error=str(err), kind=type(err).__name__)
        print(f"cqsd: cannot start: {err}", file=sys.stderr)
        return 1
    return 0


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


if __name__ == "__main__":
    sys.exit(main())
