"""Glibc's heap, tuned for payloads of megabytes.

Design note. glibc serves an allocation above its mmap threshold (128 KiB at
first, raised up to 32 MiB as such blocks are freed) with a fresh mmap, and
gives the top of its heap back to the kernel once more than twice that
threshold is free there. A daemon moving 1 MiB messages allocates and frees
megabytes per request (frames, payloads, replies), so both kept handing it
fresh pages: ~300 minor page faults a 1 MiB message moved, 17% of the daemon's
CPU (perf, 4 producers and 4 consumers). Fixing the mmap threshold at its
ceiling and trimming only above 64 MiB halves the faults (~150-190 a message),
keeping at most 64 MiB of freed heap in the process. Setting any of these
thresholds turns glibc's own adjustment off, so an operator's MALLOC_*_
environment variables win: then nothing is changed.
"""

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for its own adjustment (64-bit)
TRIM_THRESHOLD = 64 * 1024 * 1024
_OPERATOR_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                   "MALLOC_MMAP_MAX_")


def tune() -> bool:
    """Set the thresholds above, unless the C library is not glibc or the environment
    sets one already; whether they were set."""
    if any(name in os.environ for name in _OPERATOR_KNOBS):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): left as it is
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) & mallopt(M_TRIM_THRESHOLD,
                                                                    TRIM_THRESHOLD))
