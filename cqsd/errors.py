"""The root of the errors that stop the daemon from starting or running.

Each carries what ``cqsd run`` (``cqsd/__main__.py``) makes of it: the exit code
and the line it prints, and whether it is logged as ``start_failed`` (a config
refused is not: logging is configured from the config). The errors keep their
homes (the config's, the data directory's, the image's, the log's): this module
imports nothing, so that every layer can name the root. The log's own errors
(logstream) and the system's (OSError) are not ours to subclass: the daemon
wraps those in ``CannotStart`` where they leave it.
"""


class DaemonError(Exception):
    """Base of every error that stops the daemon; by default it could not start."""

    exit_code = 1
    logged = True  # as a start_failed event, before the line is printed

    @property
    def kind(self) -> str:
        """The error's name in the start_failed event."""
        return type(self).__name__

    def headline(self) -> str:
        """The line ``cqsd:`` prints on stderr."""
        return f"cannot start: {self}"


class CannotStart(DaemonError):
    """A log or system error (logstream's, an OSError) that stopped the daemon."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause

    @property
    def kind(self) -> str:
        return type(self.cause).__name__
