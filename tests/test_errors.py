"""Every error that stops the daemon derives from one root (cqsd/errors.py), which
says its exit code, its line on stderr and whether it is logged, so ``cqsd run``
catches one class and keeps each exit code and message."""

import errno

import pytest
import structlog

from cqsd import __main__ as cli
from cqsd.config import ConfigError
from cqsd.errors import CannotStart, DaemonError
from cqsd.records import FoldError
from cqsd.recovery.restart import LogBehindImage
from cqsd.server.daemon import InternalFailure, LogFailed
from cqsd.srds.manifest import ManifestError
from cqsd.srds.slots import SlotError
from cqsd.storage.datadir import DataDirError
from cqsd.storage.image import ImageError
from cqsd.storage.repository import RepositoryError
from logstream import LogstreamError

STARTUP = [DataDirError, ImageError, FoldError, LogBehindImage, ManifestError, SlotError,
           RepositoryError]


@pytest.mark.parametrize("kind", STARTUP, ids=lambda k: k.__name__)
def test_a_startup_error_exits_1_saying_it_cannot_start(kind, capsys):
    """Each is logged as start_failed with its name, and exits 1 with one line."""
    with structlog.testing.capture_logs() as logs:
        code = cli._stopped(kind("the reason"))
    assert code == 1 and capsys.readouterr().err == "cqsd: cannot start: the reason\n"
    assert [(e["event"], e["kind"]) for e in logs] == [("start_failed", kind.__name__)]


@pytest.mark.parametrize("cause", [LogstreamError("torn"), OSError(errno.EROFS, "read-only")])
def test_a_log_or_system_error_is_wrapped_and_named_by_its_cause(cause, capsys):
    """What the daemon cannot subclass keeps its own name in the event and its text."""
    with structlog.testing.capture_logs() as logs:
        code = cli._stopped(CannotStart(cause))
    assert code == 1 and capsys.readouterr().err == f"cqsd: cannot start: {cause}\n"
    assert logs[0]["kind"] == type(cause).__name__


@pytest.mark.parametrize(("err", "code"), [(LogFailed("log gone"), 3),
                                           (InternalFailure("bug"), 4)])
def test_a_stop_after_a_failure_says_why_with_its_code(err, code, capsys):
    """LogFailed and InternalFailure print their own line, logged already."""
    with structlog.testing.capture_logs() as logs:
        assert cli._stopped(err) == code
    assert capsys.readouterr().err == f"cqsd: {err}\n" and logs == []


def test_a_refused_config_exits_2_and_is_not_logged(capsys):
    """A config refused is printed with its problems; logging is not configured yet."""
    err = ConfigError(["daemon.port: not a port"], "cqsd.toml")
    assert isinstance(err, DaemonError)
    with structlog.testing.capture_logs() as logs:
        assert cli._stopped(err) == 2
    assert capsys.readouterr().err == \
        "cqsd: configuration refused:\ncqsd.toml: daemon.port: not a port\n"
    assert logs == []


def test_cqsd_run_with_a_missing_config_file_exits_2(capsys, tmp_path):
    """The command line end to end: a config that cannot be read."""
    assert cli.main(["run", "--config", str(tmp_path / "none.toml")]) == 2
    assert capsys.readouterr().err.startswith("cqsd: configuration refused:\n")
