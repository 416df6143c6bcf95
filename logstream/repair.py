"""Cutting a torn tail off the last segment, keeping a copy of what was cut.

The cut bytes are never needed to recover (they were never acknowledged as
durable), but they are the only evidence of what went wrong, so they are
saved next to the segment before it is truncated, in the same durable way;
up to their last non-zero byte only, since a preallocated segment's unused
space (most of the file) is zeros and says nothing.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import durable
from .durable import Fsync
from .errors import Damage, TornTail
from .scan import find_zero_tail


@dataclasses.dataclass(frozen=True, slots=True)
class Repair:
    """What opening a writer cut: which file, from where, how much, why, kept where."""

    path: Path
    offset: int
    bytes_cut: int  # from `offset` to the end of the file, zeros included
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
    """Save the torn bytes to a `.broken-<offset>` file, then truncate the segment there.

    The copy ends at the last non-zero byte: a torn record's own trailing zeros
    cannot be told from the preallocated zeros after it.
    """
    path = Path(torn.path)
    sync = os.fsync if fsync is None else fsync
    with open(path, "rb") as f:
        data_end, file_end = find_zero_tail(f, torn.offset)
        f.seek(torn.offset)
        kept = f.read(data_end - torn.offset).rstrip(b"\0")
    copy = _copy_name(path, torn.offset)
    os.close(durable.create_file(copy, kept, sync))
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, torn.offset)
        sync(fd)
    finally:
        os.close(fd)
    return Repair(path, torn.offset, file_end - torn.offset, torn.reason, copy)
