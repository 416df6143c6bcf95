"""Imported at start by every Python process of a node the fault loop runs under
libfaketime (tests/group/cluster.py puts this directory first on its PYTHONPATH):
the daemon, its Spark jobs and their workers.

``time.sleep`` sleeps in ``select`` rather than in ``clock_nanosleep``. CPython
sleeps until an absolute CLOCK_MONOTONIC deadline, which libfaketime 0.9.10
shifts by the faked wall clock even with FAKETIME_DONT_FAKE_MONOTONIC: the
deadline comes out negative and every ``time.sleep`` raised EINVAL. PySpark
sleeps while its JVM starts, so every checkpoint job failed at once. A relative
timeout, as ``select`` takes, is left alone.
"""

import select
import time


def _sleep(seconds: float) -> None:
    select.select([], [], [], seconds)


time.sleep = _sleep
