"""sd_notify's few lines: one datagram of KEY=VALUE lines to $NOTIFY_SOCKET (a path or an
abstract name), nothing without it, and the watchdog interval systemd asks for."""

import os
import socket

from cqsd.server import notify


def test_messages_go_to_the_socket_systemd_names(tmp_path, monkeypatch):
    """A path socket and an abstract one each get the lines as one datagram."""
    for name in (str(tmp_path / "n"), f"@cqsd-test-{os.getpid()}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
            listener.bind(name if name[0] == "/" else "\0" + name[1:])
            monkeypatch.setenv("NOTIFY_SOCKET", name)
            notify.ready("serving")
            assert listener.recv(4096).decode().splitlines() == [
                "READY=1", "STATUS=serving", f"MAINPID={os.getpid()}"]


def test_without_a_socket_nothing_is_sent(monkeypatch):
    """No NOTIFY_SOCKET (or one that is gone) is no error: the daemon runs unsupervised."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.send("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify")
    assert notify.send("READY=1") is False


def test_watchdog_interval_is_half_the_timeout(monkeypatch):
    """Pings every half WATCHDOG_USEC, for this process only (WATCHDOG_PID)."""
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert notify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "nonsense")
    assert notify.watchdog_interval() is None
