"""Why a node lost its lease while etcd was well: its event loop stood still.

Design note. A group node renews its lease, and checks it after every fsync, from
its Trio loop; a call that blocks the loop (a file system that stops answering, a
long computation that should have run in a thread) starves both, and the node is
fenced "not renewed" with nothing in its log to say why. So the loop beats
every BEAT seconds and a thread watches the beat: when it is STALL seconds late
the thread logs ``loop_stalled`` with the loop thread's stack as it stands, and
the loop logs ``loop_resumed`` with the stall's length when it runs again, and
how much of it the garbage collector took (a full collection holds the GIL, so
no thread runs). The thread only reads; it never touches the daemon's state.
"""

import gc
import sys
import threading
import time
import traceback
from collections import deque

import structlog
import trio

log = structlog.get_logger()

BEAT = 0.25  # seconds between two beats of the loop
STALL = 1.0  # seconds a beat may be late (past BEAT) before the loop counts as stalled
FRAMES = 15  # innermost frames of the stack reported


async def watch(stall: float = STALL) -> None:
    """Beat until cancelled, while a thread reports beats that do not come."""
    beat = [time.monotonic()]
    loop = threading.get_ident()
    stop = threading.Event()
    collections: deque[tuple[float, float, int]] = deque(maxlen=32)  # (start, end, generation)
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            collections.append((started[0], time.monotonic(), info["generation"]))

    def watcher() -> None:
        reported = None
        while not stop.wait(BEAT):
            last = beat[0]
            late = time.monotonic() - last
            if late > BEAT + stall and reported != last:
                reported = last
                frame = sys._current_frames().get(loop)
                stack = traceback.format_stack(frame)[-FRAMES:] if frame is not None else []
                log.warning("loop_stalled", seconds=round(late, 3),
                            stack="".join(stack).rstrip())

    thread = threading.Thread(target=watcher, name="loop stall watch", daemon=True)
    thread.start()
    gc.callbacks.append(timed)
    try:
        while True:
            await trio.sleep(BEAT)
            now = time.monotonic()
            if now - beat[0] > stall + BEAT:
                during = [(e - s, g) for s, e, g in list(collections) if e > beat[0]]
                log.warning("loop_resumed", stalled_seconds=round(now - beat[0] - BEAT, 3),
                            gc_seconds=round(sum(d for d, _ in during), 3),
                            gc_generations=sorted({g for _, g in during}))
            beat[0] = now
    finally:
        gc.callbacks.remove(timed)
        stop.set()
        thread.join()  # a report it is writing lands before the watch is over, not after
