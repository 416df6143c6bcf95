"""Why a node lost its lease while etcd was well: its event loop stood still.

Design note. A group node renews its lease, and checks it after every fsync, from
its Trio loop; a call that blocks the loop (a file system that stops answering, a
long computation that should have run in a thread) starves both, and the node is
fenced "not renewed" with nothing in its log to say why. So the loop beats
every BEAT seconds and a thread watches the beat: when it is STALL seconds late
the thread logs ``loop_stalled`` with the loop thread's stack as it stands, and
the loop logs ``loop_resumed`` with the stall's length when it runs again. The
thread only reads; it never touches the daemon's state.
"""

import sys
import threading
import time
import traceback

import structlog
import trio

log = structlog.get_logger()

BEAT = 0.25  # seconds between two beats of the loop
STALL = 1.0  # seconds a beat may be late before the loop counts as stalled
FRAMES = 15  # innermost frames of the stack reported


async def watch(stall: float = STALL) -> None:
    """Beat until cancelled, while a thread reports beats that do not come."""
    beat = [time.monotonic()]
    loop = threading.get_ident()
    stop = threading.Event()

    def watcher() -> None:
        reported = None
        while not stop.wait(BEAT):
            last = beat[0]
            late = time.monotonic() - last
            if late > stall and reported != last:
                reported = last
                frame = sys._current_frames().get(loop)
                stack = traceback.format_stack(frame)[-FRAMES:] if frame is not None else []
                log.warning("loop_stalled", seconds=round(late, 3),
                            stack="".join(stack).rstrip())

    thread = threading.Thread(target=watcher, name="loop stall watch", daemon=True)
    thread.start()
    try:
        while True:
            await trio.sleep(BEAT)
            now = time.monotonic()
            if now - beat[0] > stall + BEAT:
                log.warning("loop_resumed", stalled_seconds=round(now - beat[0] - BEAT, 3))
            beat[0] = now
    finally:
        stop.set()
