"""A process's wall clock set off the true time, and stepped while it runs, with
libfaketime (Debian's `faketime`): the clock faults of the group's tests."""

import os
from pathlib import Path

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# its sitecustomize.py: time.sleep without clock_nanosleep, which libfaketime breaks
SLEEP_SHIM = Path(__file__).parent / "faketime"


def faked_clock(clock: Path, offset: int = 0) -> dict[str, str]:
    """The environment that runs a node under libfaketime, its wall clock ``offset``
    seconds off the true time and stepped by writing the file ``clock`` (read at
    once: FAKETIME_NO_CACHE)."""
    clock.write_text(f"{offset:+d}\n")
    # NO_FAKE_STAT: libfaketime fakes a stat's times under a semaphore it shares with
    # the node's children (FAKETIME_SHARED). A Spark job that failed SIGKILLed its
    # JVM, still starting, inside one: the semaphore stayed taken, and the node's next
    # stat (pyarrow's, opening a slot file) waited forever. The files' times are the
    # true ones then, as a shared file system's server would set them.
    # SLEEP_SHIM: every time.sleep raised EINVAL under libfaketime, and so every Spark
    # job failed at once. FAKETIME_SKIP_CMDS: a job's JVM runs unfaked; faked, its
    # timed waits spun (a job took 275 s, not 10)
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock),
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1", "FAKETIME_SKIP_CMDS": "java",
            "PYTHONPATH": os.pathsep.join(
                [str(SLEEP_SHIM), *filter(None, [os.environ.get("PYTHONPATH")])])}
