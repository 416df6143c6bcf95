"""sd_notify: tell systemd (or whoever set ``$NOTIFY_SOCKET``) how the daemon is doing.

Design note. The protocol is one datagram of ``KEY=VALUE`` lines to the Unix
socket named in ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract
namespace); libsystemd's sd_notify is no more than that, so these few lines
replace a C dependency. Without the variable every call does nothing, and a
send that fails is ignored: supervision must never stop the daemon.

What the daemon says (config/cqsd.service is ``Type=notify``):

- ``STATUS=…`` (and ``EXTEND_TIMEOUT_USEC``) while recovery rebuilds the
  structures, so that a long start is seen and not killed;
- ``READY=1`` once every structure is rebuilt and the listeners accept;
- ``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` from a task on the event loop,
  so that a loop stuck in one request stops the pings and systemd restarts it;
- ``RELOADING=1`` … ``READY=1`` around a SIGHUP reload, ``STOPPING=1`` when a
  stop begins.
"""

import os
import socket
import time

import trio

# How much longer than its TimeoutStartSec/TimeoutStopSec systemd is asked to
# wait each time the daemon reports progress in a long start or stop.
EXTEND_SECONDS = 120
EXTEND = f"EXTEND_TIMEOUT_USEC={EXTEND_SECONDS * 1_000_000}"


def _address() -> str | None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path or path[0] not in "/@":
        return None
    return "\0" + path[1:] if path[0] == "@" else path


def send(*lines: str) -> bool:
    """Send ``lines`` as one notification; False if there is nobody to tell."""
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(lines).encode(), address)
    except OSError:
        return False
    return True


def status(text: str, extend: bool = False) -> None:
    """A status line (``systemctl status`` shows it); ``extend`` also asks for more
    time to start or stop, as a long recovery or image save needs."""
    send(f"STATUS={text}", *([EXTEND] if extend else []))


def ready(text: str) -> None:
    send("READY=1", f"STATUS={text}", f"MAINPID={os.getpid()}")


def reloading() -> None:
    # MONOTONIC_USEC: systemd 253+ matches the reload to this message by it
    send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
         "STATUS=reloading the configuration")


def stopping(why: str) -> None:
    send("STOPPING=1", f"STATUS=stopping ({why})", EXTEND)


def watchdog_interval() -> float | None:
    """Seconds between pings (half the watchdog timeout), None if none is asked for."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or _address() is None or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6 if int(usec) > 0 else None
    except ValueError:
        return None


async def watchdog(interval: float) -> None:
    """Ping every ``interval`` seconds for as long as the event loop runs tasks."""
    while True:
        send("WATCHDOG=1")
        await trio.sleep(interval)
