"""Structured logging: one JSON object per line (structlog), to stderr or a file
that SIGHUP reopens so logrotate can move it away."""

import logging
import os
import sys
from typing import TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


class _Sink:
    """The one place log lines go; ``reopen`` swaps the file under every logger.

    Under systemd, standard error is the journal's stream: systemd names it in
    ``$JOURNAL_STREAM`` (device:inode), and journald reads a ``<N>`` prefix on a
    line as its syslog priority, so that ``journalctl -p warning`` finds the
    daemon's warnings. Each line then starts with its level's priority; a log
    file or a terminal gets the JSON alone.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: TextIO = sys.stderr
        self.journal = False
        self.reopen()

    def reopen(self) -> None:
        old = self.file
        self.file = open(self.path, "a", buffering=1) if self.path else sys.stderr
        self.journal = self.file is sys.stderr and _is_journal(sys.stderr)
        if old is not sys.stderr:
            old.close()

    def _write(self, message: str, priority: int) -> None:
        if self.journal:
            message = f"<{priority}>{message}"
        self.file.write(message + "\n")
        self.file.flush()

    def debug(self, message: str) -> None:
        self._write(message, 7)

    def info(self, message: str) -> None:
        self._write(message, 6)

    def warning(self, message: str) -> None:
        self._write(message, 4)

    def error(self, message: str) -> None:
        self._write(message, 3)

    def critical(self, message: str) -> None:
        self._write(message, 2)

    msg = log = info
    warn = warning
    exception = error
    fatal = critical


def _is_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the journal stream systemd named in ``$JOURNAL_STREAM``."""
    expected = os.environ.get("JOURNAL_STREAM")
    if not expected:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


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
