"""``cqsd run [--config FILE]``: the daemon in the foreground (DESIGN §7)."""

import argparse
import sys

import structlog
import trio

from . import __version__, logs
from .config import ConfigError, load
from .errors import DaemonError


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
        return _stopped(err)
    sink = logs.configure(config.daemon.log_level, config.daemon.log_file)
    from .server import heap
    from .server.daemon import Daemon  # after logging is configured

    heap.tune()
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


if __name__ == "__main__":
    sys.exit(main())
