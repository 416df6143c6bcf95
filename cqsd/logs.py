"""Structured logging: one JSON object per line (structlog), to stderr or a file
that SIGHUP reopens so logrotate can move it away."""

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


class _Sink:
    """The one place log lines go; ``reopen`` swaps the file under every logger."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: TextIO = sys.stderr
        self.reopen()

    def reopen(self) -> None:
        old = self.file
        self.file = open(self.path, "a", buffering=1) if self.path else sys.stderr
        if old is not sys.stderr:
            old.close()

    def msg(self, message: str) -> None:
        self.file.write(message + "\n")
        self.file.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def configure(level: str = "info", path: str = "") -> _Sink:
    """Set up structlog for the daemon; returns the sink (call ``reopen`` on SIGHUP)."""
    sink = _Sink(path)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=lambda *args: sink,
        cache_logger_on_first_use=False,
    )
    return sink


def set_level(level: str) -> None:
    """Log events of ``level`` and above from now on (a SIGHUP reload)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]))
