"""Which payloads go to the data set: IBM MQ's three offload rules (docs/smds.md).

Large payloads always; smaller ones only as the structure fills, so a lightly
used structure keeps its messages in memory, where reads cost no I/O.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024

# (offldNthr percent, offldNsze bytes) for N = 1, 2, 3: MQ's CFSTRUCT defaults.
DEFAULT_RULES: Final = ((70, 32 * KiB), (80, 4 * KiB), (90, 0))


def offloads(nbytes: int, used_percent: float, entry_max: int,
             rules: tuple[tuple[int, int], ...] = DEFAULT_RULES) -> bool:
    """Whether a payload of ``nbytes`` put to a structure with ``used_percent`` of its
    data elements in use goes to SMDS: always above ``entry_max``; otherwise when
    some rule's threshold is exceeded (strictly, so 100 turns a rule off) and the
    payload is at least that rule's size."""
    return nbytes > entry_max or any(used_percent > threshold and nbytes >= size
                                     for threshold, size in rules)
