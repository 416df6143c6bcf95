"""``cqsd run [--config FILE]``: the daemon in the foreground (DESIGN §7)."""

import argparse
import sys

import structlog
import trio

from . import logs
from .config import ConfigError, load
from .storage.datadir import DataDirError
from .recovery.fold import FoldError
from .recovery.restart import LogBehindImage
from .srds.manifest import ManifestError
from .srds.slots import SlotError
from .storage.image import ImageError
from logstream import LogstreamError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cqsd", description="the cqsd shared queue server")
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
    from .server.daemon import Daemon, LogFailed  # after logging is configured

    try:
        daemon = Daemon(config, sink)
    except ConfigError as err:
        print(f"cqsd: configuration refused:\n{err}", file=sys.stderr)
        return 2
    try:
        trio.run(daemon.run)
    except LogFailed as err:
        print(f"cqsd: {err}", file=sys.stderr)
        return 3
    except (DataDirError, ImageError, FoldError, LogBehindImage, LogstreamError, ManifestError,
            SlotError, OSError) as err:
        structlog.get_logger().critical("start_failed", error=str(err), kind=type(err).__name__)
        print(f"cqsd: cannot start: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
