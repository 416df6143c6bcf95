"""The daemon speaks sd_notify to a fake NOTIFY_SOCKET, as systemd would hear it: status
while recovery runs, READY only after recovery and once it listens, watchdog pings
that keep coming, RELOADING then READY around a SIGHUP, STOPPING on SIGTERM."""

import signal
import socket
import threading

import pytest

import cqsclient


class FakeSystemd:
    """A datagram socket in the place of systemd's notification socket; it keeps every
    message, and on READY=1 at once tries the daemon's socket (``probe``)."""

    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = str(path)
        self.heard: list[tuple[dict[str, str], bool | None]] = []  # (fields, probe on READY)
        self.daemon = None
        self._cond = threading.Condition()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            accepted = self._probe() if "READY" in fields else None
            with self._cond:
                self.heard.append((fields, accepted))
                self._cond.notify_all()

    def _probe(self) -> bool:
        """Whether the daemon's socket accepts a connection right now."""
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(self.daemon.socket)
            except OSError:
                return False
        return True

    def wait_for(self, key: str, count: int = 1, after: int = 0, timeout: float = 30) -> int:
        """The index of the ``count``-th message with ``key`` at or after ``after``."""
        def found():
            hits = [i for i, (f, _) in enumerate(self.heard) if i >= after and key in f]
            return hits[count - 1] if len(hits) >= count else None
        with self._cond:
            assert self._cond.wait_for(lambda: found() is not None, timeout), (key, self.heard)
            return found()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def systemd(tmp_path):
    fake = FakeSystemd(tmp_path / "notify")
    yield fake
    fake.close()


def test_ready_after_recovery_watchdog_and_stopping(make_daemon, systemd):
    """After a crash, READY=1 comes once recovery has rebuilt the structures and the socket
    accepts; STATUS lines precede it; WATCHDOG=1 keeps coming; SIGTERM brings STOPPING=1."""
    d = make_daemon(env={"NOTIFY_SOCKET": systemd.path, "WATCHDOG_USEC": "200000"})
    systemd.daemon = d
    d.start()
    with cqsclient.connect(d.address, client="APP") as c:
        c.structure("MSGQ01").put_batch("TRANX", [b"m%d" % i for i in range(200)])
    d.kill()  # a crash: the restart recovers from the log
    start, before = len(systemd.heard), d.mark()
    d.restart()
    ready = systemd.wait_for("READY", after=start)
    fields, accepted = systemd.heard[ready]
    assert accepted  # it was listening when it said so
    assert fields["MAINPID"] == str(d.proc.pid)
    assert any("recovering" in f.get("STATUS", "") for f, _ in systemd.heard[start:ready])
    events = [e["event"] for e in d.lines[before:d.mark()]]  # READY follows "ready"
    rebuilt = d.events("structure_rebuilt", before, structure="MSGQ01")
    assert rebuilt[0]["clean"] is False and rebuilt[0]["records_replayed"] > 0
    assert events.index("structure_rebuilt") < events.index("ready")
    with cqsclient.connect(d.address, client="APP") as c:
        assert c.structure("MSGQ01").stats["messages"] == 200
    pings = systemd.wait_for("WATCHDOG", count=5, after=ready)
    assert all(f["WATCHDOG"] == "1" for f, _ in systemd.heard[ready + 1:pings + 1]
               if "WATCHDOG" in f)
    d.proc.send_signal(signal.SIGHUP)
    reloading = systemd.wait_for("RELOADING", after=pings)
    assert "MONOTONIC_USEC" in systemd.heard[reloading][0]
    systemd.wait_for("READY", after=reloading)
    assert d.stop() == 0
    stopping = systemd.wait_for("STOPPING", after=reloading)
    assert systemd.heard[stopping][0]["STOPPING"] == "1"


def test_watchdog_for_another_pid_is_not_ours(make_daemon, systemd):
    """WATCHDOG_PID naming another process (the unit's, inherited) means no pings from
    the daemon, though it still says READY=1 and STOPPING=1."""
    d = make_daemon(env={"NOTIFY_SOCKET": systemd.path, "WATCHDOG_USEC": "100000",
                         "WATCHDOG_PID": "1"})
    systemd.daemon = d
    d.start()
    systemd.wait_for("READY")
    with cqsclient.connect(d.address, client="APP") as c:  # a few event-loop turns
        c.structure("MSGQ01").put("Q", b"x")
    assert d.stop() == 0
    systemd.wait_for("STOPPING")
    assert not any("WATCHDOG" in f for f, _ in systemd.heard)


def test_a_reload_that_fails_is_not_told_as_ready(make_daemon, systemd):
    """A config that does not load: systemd hears a STATUS naming the failure, and no
    RELOADING=1, READY=1 or "reloaded"; the next good reload is RELOADING … READY=1."""
    d = make_daemon(env={"NOTIFY_SOCKET": systemd.path})
    systemd.daemon = d
    d.start()
    systemd.wait_for("READY")
    good = d.config.read_text()
    d.config.write_text(good + "\ngarbage [[[\n")
    start = len(systemd.heard)
    d.proc.send_signal(signal.SIGHUP)
    said = systemd.wait_for("STATUS", after=start)
    fields = systemd.heard[said][0]
    assert fields["STATUS"].startswith("reload failed:"), fields
    assert "previous configuration" in fields["STATUS"]
    assert "READY" not in fields and "RELOADING" not in fields
    d.wait_for("reload_failed")
    d.config.write_text(good)
    d.proc.send_signal(signal.SIGHUP)
    reloading = systemd.wait_for("RELOADING", after=said + 1)
    ready = systemd.wait_for("READY", after=reloading)
    assert systemd.heard[ready][0]["STATUS"] == "reloaded"
    # between the failure and the good reload, nothing else was said
    assert all("READY" not in f and "RELOADING" not in f
               for f, _ in systemd.heard[start:reloading])
    assert d.stop() == 0
