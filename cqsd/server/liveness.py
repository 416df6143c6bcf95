"""How the daemon lets go of a peer that does not do its part: one that does
not register, trickles a request frame or stops half-way through one, reads
none of its replies, or vanished without closing its TCP connection.

Design note. Each of these holds a connection slot, and the first three hold
memory, for as long as the daemon lets them, so each has a deadline
(docs/protocol.md, "Flow control and limits"). The frame and handshake
deadlines are kept by one task per connection that wakes at most once every
``frame_timeout`` while the connection is idle: the reader only notes when a
partial frame began (``Session.partial_since``), so the request fast path
pays for no timer. The send deadline wraps the writer task's sends, which are
already the slow path. A peer that vanished (a host that crashed, a cable
pulled) sends nothing, not even a close: over TCP only probing finds it, so
keepalive is set on every TCP connection; a Unix socket's peer is on the same
kernel, which closes the socket when the peer dies.
"""

import math
import socket

import trio

from .session import SEND_BATCH, Session

KEEPALIVE_PROBES = 6  # probes in a keepalive period: a lost packet or two is not a dead peer


async def overdue(session: Session, handshake_timeout: float, frame_timeout: float) -> str:
    """Return ``"handshake"`` once ``session`` has been unregistered for
    ``handshake_timeout`` seconds, ``"frame"`` once a request frame has been
    arriving for ``frame_timeout`` seconds while the daemon was reading; never,
    for a connection that keeps both deadlines."""
    register_by = trio.current_time() + handshake_timeout
    while True:
        now = trio.current_time()
        if session.client is None and now >= register_by:
            return "handshake"
        since = None if session.paused else session.partial_since
        if since is not None and now >= since + frame_timeout:
            return "frame"
        # A frame begun after now cannot be late before now + frame_timeout.
        wake = (now if since is None else since) + frame_timeout
        await trio.sleep_until(min(wake, register_by) if session.client is None else wake)


# ``timeout`` bounds each stall, not the whole send: a cancel scope cannot say that
async def send_or_stall(stream: trio.abc.SendStream, data, timeout: float) -> bool:  # noqa: ASYNC109
    """Send ``data``, SEND_BATCH bytes at a time; False if the peer did not take
    one of them within ``timeout`` seconds (it reads nothing, or hardly)."""
    view = memoryview(data)
    for start in range(0, len(view), SEND_BATCH):
        with trio.move_on_after(timeout):
            await stream.send_all(view[start:start + SEND_BATCH])
            continue
        return False
    return True


def keep_alive(stream: trio.abc.Stream, idle: float) -> None:
    """Probe the TCP peer of ``stream`` after ``idle`` seconds of silence, and
    drop it when it answers none of the probes, or acknowledges none of the data
    sent to it, within as long again (``tcp_keepalive``; 0: leave it to the kernel)."""
    if not idle:
        return
    # over TCP (the only caller): a SocketStream, or the SSLStream wrapping one
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    assert isinstance(inner, trio.SocketStream)
    sock = inner.socket
    seconds = max(1, math.ceil(idle))
    interval = max(1, seconds // KEEPALIVE_PROBES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; macOS has only the idle time
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, seconds // interval))
    elif hasattr(socket, "TCP_KEEPALIVE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPALIVE, seconds)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # unacknowledged data: keepalive does not probe then
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2 * seconds * 1000)
