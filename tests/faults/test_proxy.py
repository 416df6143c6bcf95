"""The partition proxy: bytes pass, vanish in a blackhole, connections reset, replies get lost."""

import socket
import struct
import subprocess
import sys
import threading

import pytest

from tests.faults.proxy import Proxy

SILENCE = 0.3  # how long a test listens to be sure nothing comes back


class EchoServer:
    """Echoes each chunk it receives and remembers it (a lost request is not a lost reply)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.received = []
        self.closed = 0
        self.seen = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn):
        with conn:
            while data := self._recv(conn):
                with self.seen:
                    self.received.append(data)
                    self.seen.notify_all()
                conn.sendall(data)
        with self.seen:
            self.closed += 1
            self.seen.notify_all()

    @staticmethod
    def _recv(conn):
        try:
            return conn.recv(4096)
        except OSError:
            return b""

    def wait_received(self, data, timeout=5.0):
        with self.seen:
            return self.seen.wait_for(lambda: data in self.received, timeout)

    def wait_closed(self, n, timeout=5.0):
        with self.seen:
            return self.seen.wait_for(lambda: self.closed >= n, timeout)


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.listener.close()


@pytest.fixture
def proxy(echo):
    with Proxy(echo.address) as p:
        yield p


def connect(proxy):
    sock = socket.create_connection(proxy.address, timeout=5)
    return sock


def roundtrip(sock, data):
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        got += sock.recv(4096)
    return got


def silent(sock):
    """True if nothing arrives on `sock` for SILENCE seconds (and the connection stays open)."""
    sock.settimeout(SILENCE)
    try:
        sock.recv(4096)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_bytes_pass_both_ways(proxy):
    """In pass mode the proxy is transparent: a large message comes back whole."""
    with connect(proxy) as sock:
        assert roundtrip(sock, b"hello") == b"hello"
        big = bytes(range(256)) * 4000
        assert roundtrip(sock, big) == big


def test_a_blackhole_drops_bytes_but_keeps_connections_open(proxy, echo):
    """Requests in a blackhole never reach the target; healed, the same connection works."""
    with connect(proxy) as sock:
        assert roundtrip(sock, b"before") == b"before"
        proxy.blackhole()
        sock.sendall(b"lost")
        assert silent(sock)
        assert b"lost" not in echo.received and proxy.stats.bytes_dropped >= 4
        proxy.heal()
        assert roundtrip(sock, b"after") == b"after"


def test_a_client_gone_during_a_blackhole_is_heard_of_only_once_healed(proxy, echo):
    """A client's reset in a partition does not reach the target; after healing, its end does."""
    sock = connect(proxy)
    assert roundtrip(sock, b"hi") == b"hi"
    proxy.blackhole()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert not echo.wait_closed(1, timeout=SILENCE)
    proxy.heal()
    assert echo.wait_closed(1)


def test_a_connection_made_in_a_blackhole_is_only_served_once_healed(proxy, echo):
    """Nothing new is accepted in a blackhole: the connect waits in the backlog, unanswered."""
    proxy.blackhole()
    with connect(proxy) as sock:
        sock.sendall(b"waiting")
        assert silent(sock) and proxy.stats.accepted == 0
        proxy.heal()
        assert sock.recv(4096) == b"waiting"  # the kernel kept the bytes; the proxy passes them


def test_reset_closes_open_connections_and_refuses_new_ones(proxy):
    """Reset: open connections get an RST; so does every new one until healed."""
    with connect(proxy) as sock:
        assert roundtrip(sock, b"x") == b"x"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            roundtrip(sock, b"y")
    with pytest.raises(ConnectionResetError):  # at connect or at the first read: a race
        with connect(proxy) as sock:
            roundtrip(sock, b"z")
    proxy.heal()
    with connect(proxy) as sock:
        assert roundtrip(sock, b"back") == b"back"


def test_drop_replies_loses_the_reply_after_the_target_applied_the_request(proxy, echo):
    """The target receives the request, its reply is swallowed; the next one passes."""
    with connect(proxy) as sock:
        proxy.drop_replies(1)
        sock.sendall(b"applied")
        assert echo.wait_received(b"applied")
        assert proxy.wait(lambda s: s.replies_dropped == 1)
        assert silent(sock)
        assert roundtrip(sock, b"next") == b"next"


def test_a_fin_from_either_side_is_passed_on(proxy):
    """A client's shutdown reaches the target, whose close comes back as EOF."""
    with connect(proxy) as sock:
        assert roundtrip(sock, b"bye") == b"bye"
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(4096) == b""
    assert proxy.wait(lambda s: s.open == 0)


def test_the_proxy_runs_as_a_process_driven_by_stdin(echo):
    """`python -m tests.faults.proxy PORT HOST:PORT` takes the same commands on stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.proxy", "0", f"{echo.address[0]}:{echo.address[1]}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().split()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            assert roundtrip(sock, b"one") == b"one"
            proc.stdin.write("blackhole\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "ok\n"
            sock.sendall(b"two")
            assert silent(sock)
    finally:
        proc.stdin.close()
        assert proc.wait(10) == 0
