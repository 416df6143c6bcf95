"""Cutting a torn tail off the last segment, keeping a copy of what was cut.

The cut bytes are never needed to recover (they were never acknowledged as
durable), but they are the only evidence of what went wrong, so they are
saved next to the segment before it is truncated, in the same durable way.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import durable
from .durable import Fsync
from .errors import Damage, TornTail


@dataclasses.dataclass(frozen=True, slots=True)
class Repair:
    """What opening a writer cut: which file, from where, how much, why, kept where."""

    path: Path
    offset: int
    bytes_cut: int
    reason: Damage
    copy: Path


def _copy_name(path: Path, offset: int) -> Path:
    copy = path.with_name(f"{path.name}.broken-{offset}")
    n = 1
    while copy.exists():  # an earlier repair at the same offset: keep both
        copy = path.with_name(f"{path.name}.broken-{offset}.{n}")
        n += 1
    return copy


def cut_tail(torn: TornTail, fsync: Fsync | None = None) -> Repair:
    """Save the torn bytes to a `.broken-<offset>` file, then truncate the segment there."""
    path = Path(torn.path)
    sync = os.fsync if fsync is None else fsync
    with open(path, "rb") as f:
        f.seek(torn.offset)
        cut = f.read()
    copy = _copy_name(path, torn.offset)
    os.close(durable.create_file(copy, cut, sync))
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, torn.offset)
        sync(fd)
    finally:
        os.close(fd)
    return Repair(path, torn.offset, len(cut), torn.reason, copy)
