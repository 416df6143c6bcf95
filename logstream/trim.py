"""Deleting the front of a series once its records are no longer needed.

A segment may go only when its *next* segment starts at or below the trim
point, so every record in it is below; that also means the last segment of a
series, the one a writer appends to, is never deleted. Segments go oldest
first, so a crash part way still leaves a series without holes.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from . import durable
from .durable import Fsync
from .series import list_segments


def trim(
    directory: str | os.PathLike[str],
    writer: str,
    before_lsn: int,
    *,
    fsync: Fsync | None = None,
) -> list[Path]:
    """Delete `writer`'s segments whose every record has LSN < `before_lsn`.

    Returns the deleted paths, oldest first, after fsyncing the directory.
    Safe while the writer appends: the listing may miss a newer segment, never
    an older one. Raises ValueError for a bad writer id.
    """
    segments = list_segments(directory, writer)
    doomed = [seg for seg, after in itertools.pairwise(segments) if after.first_lsn <= before_lsn]
    for seg in doomed:
        os.unlink(seg.path)
    if doomed:
        durable.fsync_dir(directory, fsync)
    return [seg.path for seg in doomed]
