"""``cqsd run [--config FILE]``: the daemon in the foreground (DESIGN §7)."""

import argparse
import sys

import structlog
import trio

from logstream import LogstreamError

from . import __version__, logs
from .config import ConfigError, load
from .records import FoldError
from .recovery.restart import LogBehindImage
from .srds.manifest import ManifestError
from .srds.slots import SlotError
from .storage.datadir import DataDirError
from .storage.image import ImageError
from .storage.repository import RepositoryError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cqsd", description="the cqsd shared queue server")
    parser.add_argument("--version", action="version", version=f"cqsd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the daemon in the foreground")
    run.add_argument("--config", help="TOML configuration file (default: the embedded one)")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as err:
        print(f"cqsd: configuration refused:\n{err}", file=sys.stderr)
        return 2
    sink = logs.configure(config.daemon.log_level, config.daemon.log_file)
    from .server import heap
    from .server.daemon import Daemon, LogFailed  # after logging is configured

    heap.tune()

    try:
        daemon = Daemon(config, sink, args.config)
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


if __name__ == "__main__":
    sys.exit(main())
