"""The spelling of sizes: ``"64MiB"``, ``"32kib"``, ``"512"`` (docs/operations.md).

Both sides read it — the daemon's config and cqsctl's ``--size`` — so an
operator writes a size the same way wherever it goes.
"""

import json
import re
from typing import Final

__all__ = ["EXPECTED", "GiB", "KiB", "MiB", "format_size", "parse_size"]

KiB: Final = 1024
MiB: Final = 1024**2
GiB: Final = 1024**3

_UNITS: Final = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": KiB, "mib": MiB, "gib": GiB,
}
_SIZE: Final = re.compile(r"\s*([0-9]+)\s*([A-Za-z]*)\s*")
EXPECTED: Final = 'expected a size like "64MiB" or an integer number of bytes'
_FORMAT_UNITS: Final = (
    (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"), (1000**3, "GB"), (1000**2, "MB"), (1000, "KB"),
)


def parse_size(text: str) -> int:
    """Bytes in *text*, a whole number with an optional unit.

    Units are B, KB/MB/GB (powers of 1000) and KiB/MiB/GiB (powers of 1024),
    case-insensitive; fractions are not accepted. Raises ValueError saying
    what is wrong.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{EXPECTED}, got {_quote(text)}")
    number, unit = match.groups()
    if unit.lower() not in _UNITS:
        raise ValueError(f"unknown unit {_quote(unit)} in {_quote(text)} "
                         "(use B, KB, MB, GB, KiB, MiB or GiB)")
    return int(number) * _UNITS[unit.lower()]


def format_size(n: int) -> str:
    """*n* bytes in the largest unit that divides it, e.g. ``"64MiB"``; parse_size reads it back."""
    for unit, name in _FORMAT_UNITS:
        if n and n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n}B"


def _quote(text: str) -> str:
    # as the operator wrote it in TOML
    return json.dumps(text, ensure_ascii=False)
