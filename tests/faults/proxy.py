"""A TCP proxy that a test switches into a network partition: pass, blackhole, reset.

Why it exists. The group's fault loops must cut a node off from etcd (or a
client from a node) without root-only tools: this kernel has no netem, and
iptables rules would outlive a crashed test. Put this proxy between the two
instead, and switch it:

- ``pass``: new connections are accepted and joined to the target; bytes flow.
- ``blackhole``: nothing new is accepted (the kernel still completes up to a
  backlog of handshakes, so a connect succeeds and then hears nothing), and
  the bytes of open connections are dropped silently both ways; connections
  stay open, so the peers see a silent partner and time out, as in a
  partition. Back in ``pass``, the open connections carry bytes again (those
  sent meanwhile are lost) and the waiting connections are served.
- ``reset``: every connection is closed with an RST, and so is every new one:
  a peer whose process or host is gone.
- `drop_replies(n)` swallows the next n chunks the target sends to clients (one
  chunk is what one recv returned: one reply, for small request/reply traffic):
  a reply lost after the target applied the request.

One thread runs a selector loop over non-blocking sockets; every control call
runs in that loop and returns once applied, so a test that switched to
``blackhole`` knows no byte passes after the call. Run in a test with `Proxy`,
or as ``python -m tests.faults.proxy LISTEN_PORT TARGET_HOST:TARGET_PORT`` with
commands on stdin (``pass``, ``blackhole``, ``reset``, ``drop N``), each
answered ``ok``.
"""

from __future__ import annotations

import dataclasses
import queue
import selectors
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

MODES = ("pass", "blackhole", "reset")
CHUNK = 65536
CONNECT_TIMEOUT = 2.0  # the target is a local test process: it answers at once or not at all


@dataclasses.dataclass
class Stats:
    """Counters a test can wait on."""

    accepted: int = 0
    open: int = 0
    reset: int = 0
    bytes_dropped: int = 0
    replies_dropped: int = 0


class _Side:
    """One socket of a link and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.eof_in = False  # it sent FIN: nothing more to read from it
        self.shut = False  # we forwarded the other side's FIN to it


class _Link:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = _Side(client), _Side(server)

    def other(self, side: _Side) -> _Side:
        return self.server if side is self.client else self.client


def _rst(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN: the peer gets ECONNRESET."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Proxy:
    """Forward `listen` to `target` in a thread; switch modes with `set_mode`."""

    def __init__(self, target: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.target = target
        self.mode = "pass"
        self.stats = Stats()
        self._drop_replies = 0
        self._links: set[_Link] = set()
        self._sel = selectors.DefaultSelector()
        self._listener = socket.create_server(listen, backlog=64)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]] = (
            queue.SimpleQueue())
        self._changed = threading.Condition()
        self._running = False
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)

    # -- control (any thread) -------------------------------------------------------------

    def start(self) -> Proxy:
        self._running = True
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._thread.start()
        return self

    def _call(self, fn: Callable[[], object]) -> None:
        done = threading.Event()
        self._calls.put((fn, done))
        self._wake_w.send(b"x")
        if not done.wait(10.0):
            raise RuntimeError("the proxy's loop did not answer (did its thread die?)")

    def set_mode(self, mode: str) -> None:
        """Switch to `mode` ("pass", "blackhole" or "reset"); returns once it applies."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self._call(lambda: self._apply(mode))

    def heal(self) -> None:
        self.set_mode("pass")

    def blackhole(self) -> None:
        self.set_mode("blackhole")

    def reset(self) -> None:
        self.set_mode("reset")

    def drop_replies(self, n: int) -> None:
        """Swallow the next `n` chunks the target sends towards clients."""
        def arm() -> None:
            self._drop_replies = n
        self._call(arm)

    def wait(self, predicate: Callable[[Stats], bool], timeout: float = 10.0) -> bool:
        """Wait until `predicate(stats)` holds (checked whenever the loop did something)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self.stats), timeout)

    def stop(self) -> None:
        """Close every connection and the listener, and end the thread."""
        if self._running:
            def end() -> None:
                self._running = False
                for link in list(self._links):
                    self._close(link)
            self._call(end)
            self._thread.join()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop (its own thread) ----------------------------------------------------------

    def _loop(self) -> None:
        while self._running:
            for key, mask in self._sel.select():
                if key.data == "wake":
                    self._wake_r.recv(CHUNK)
                    while not self._calls.empty():
                        fn, done = self._calls.get()
                        try:
                            fn()
                        finally:
                            done.set()
                elif key.data == "listen":
                    self._accept()
                else:
                    link, side = key.data
                    if link in self._links and mask & selectors.EVENT_READ:
                        self._read(link, side)
                    if link in self._links and mask & selectors.EVENT_WRITE:
                        self._flush(link, side)
            with self._changed:
                self._changed.notify_all()

    def _apply(self, mode: str) -> None:
        was, self.mode = self.mode, mode
        if mode == "reset":
            for link in list(self._links):
                self._close(link, reset=True)
        elif mode == "blackhole":
            for link in self._links:
                for side in (link.client, link.server):
                    self.stats.bytes_dropped += len(side.out)
                    side.out.clear()
        if (was == "blackhole") != (mode == "blackhole"):  # accept again, or stop accepting
            if mode == "blackhole":
                self._sel.unregister(self._listener)
            else:
                self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        for link in list(self._links):
            for side in (link.client, link.server):
                self._interest(link, side)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            self.stats.accepted += 1
            if self.mode == "reset":
                self.stats.reset += 1
                _rst(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
            except OSError:
                _rst(client)  # the target is down: so is the proxied address
                continue
            link = _Link(client, server)
            for side in (link.client, link.server):
                side.sock.setblocking(False)
                self._sel.register(side.sock, selectors.EVENT_READ, (link, side))
            self._links.add(link)
            self.stats.open += 1

    def _read(self, link: _Link, side: _Side) -> None:
        try:
            data = side.sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            if self.mode != "blackhole":
                self._close(link, reset=True)
                return
            data = b""  # in a partition the other side must not hear of it: a quiet end
        other = link.other(side)
        if not data:
            side.eof_in = True
        elif self.mode == "blackhole":
            self.stats.bytes_dropped += len(data)
        elif side is link.server and self._drop_replies > 0:
            self._drop_replies -= 1
            self.stats.replies_dropped += 1
            self.stats.bytes_dropped += len(data)
        else:
            other.out += data
            self._flush(link, other)
            return
        self._interest(link, side)
        self._interest(link, other)

    def _flush(self, link: _Link, side: _Side) -> None:
        """Write what waits for `side`; pass on the other side's FIN once all is written."""
        try:
            if side.out:
                del side.out[: side.sock.send(side.out)]
            if not side.out and link.other(side).eof_in and not side.shut \
                    and self.mode == "pass":
                side.sock.shutdown(socket.SHUT_WR)
                side.shut = True
        except BlockingIOError:
            pass
        except OSError:
            self._close(link, reset=True)
            return
        if not self._done(link):
            self._interest(link, side)

    def _interest(self, link: _Link, side: _Side) -> None:
        """Read while the peer may send; write while bytes (or a FIN) wait for it."""
        events = 0 if side.eof_in else selectors.EVENT_READ
        if self.mode == "pass" and (side.out or (link.other(side).eof_in and not side.shut)):
            events |= selectors.EVENT_WRITE
        registered = side.sock in self._sel.get_map()
        if events and registered:
            self._sel.modify(side.sock, events, (link, side))
        elif events:
            self._sel.register(side.sock, events, (link, side))
        elif registered:
            self._sel.unregister(side.sock)

    def _done(self, link: _Link) -> bool:
        """Close a link whose two FINs were both passed on."""
        if link.client.eof_in and link.server.eof_in and link.client.shut and link.server.shut:
            self._close(link)
            return True
        return False

    def _close(self, link: _Link, reset: bool = False) -> None:
        self._links.discard(link)
        self.stats.open -= 1
        self.stats.reset += reset
        for side in (link.client, link.server):
            if side.sock in self._sel.get_map():
                self._sel.unregister(side.sock)
            if reset:
                _rst(side.sock)
            else:
                side.sock.close()


class ProxyProcess:
    """A Proxy in a process of its own, switched over its stdin: a test process busy
    with its clients' threads (one GIL) must not hold up the bytes it relays (a fault
    loop saw both of its nodes miss etcd for a second at the same moment)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.proxy", "0", f"{target[0]}:{target[1]}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2])
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().split()
        if first[:1] != ["listening"]:
            self.proc.kill()
            raise RuntimeError(f"the proxy did not start: {first}")
        self.address = ("127.0.0.1", int(first[1]))

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ok":  # applied once answered
            raise RuntimeError(f"the proxy did not apply {line!r}")

    def heal(self) -> None:
        self._say("pass")

    def blackhole(self) -> None:
        self._say("blackhole")

    def reset(self) -> None:
        self._say("reset")

    def drop_replies(self, n: int) -> None:
        self._say(f"drop {n}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str]) -> int:
    """The proxy as a process, for daemons that a test runs as processes."""
    port, target = int(argv[0]), argv[1].rpartition(":")
    with Proxy((target[0], int(target[2])), ("127.0.0.1", port)) as proxy:
        print(f"listening {proxy.address[1]}", flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["drop"]:
                proxy.drop_replies(int(words[1]))
            elif words:
                proxy.set_mode(words[0])
            print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
