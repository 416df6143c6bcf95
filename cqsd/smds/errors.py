"""The named errors of shared message data sets (docs/smds.md, "Errors at a glance").

Damage has names: the daemon turns each into a status (seed 000's FAILED,
SUSPENDED, OPENFAIL…) by its class, never by parsing a message. Three
families: ``DataSetDamage`` (the data set cannot be trusted), the space map's
own errors (``NoSpace`` is ordinary, ``BadFree`` is a bug, ``BadSpaceMap``
only costs a rebuild), and ``BadDataMap`` for a map that breaks the rules.
"""

from __future__ import annotations


class SmdsError(Exception):
    """Base of every SMDS error."""


class DataSetDamage(SmdsError):
    """A data set that cannot be trusted: seed 000 marks it FAILED and SUSPENDED.

    ``reason`` is a short stable word for tests and events; the message says more.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Unformatted(DataSetDamage):
    """No header at all: the file is empty or its header pages are zeros.

    Damage only for a data set that should be ACTIVE ("unexpectedly empty");
    a NEW or EMPTY one is simply formatted."""


class ShortDataSet(DataSetDamage):
    """Fewer bytes than the header pages, or than the extent the header records."""


class ForeignHeader(DataSetDamage):
    """Not a cqsd SMDS header, or the header of another structure's or owner's data set."""


class TornHeader(DataSetDamage):
    """Our magic, but the CRC or a fixed field fails in every copy."""


class UnsupportedVersion(DataSetDamage):
    """A format version or flag this code does not know (a newer cqsd wrote it)."""


class Recreated(DataSetDamage):
    """A valid header of a different data set than the one the repository made ACTIVE."""


class IncompleteRecovery(DataSetDamage):
    """Data-set recovery started writing blocks and did not finish (seed 000)."""


class BadPrefix(DataSetDamage):
    """A message block that is not the one the data map names: torn, unwritten, another
    entry's, or with data that fails its CRC."""


class DownLevel(DataSetDamage):
    """The newest message's first block is not in the data set: an older copy of it."""


class OutsideDataSet(DataSetDamage):
    """A range outside the data blocks (past the extent, or in the control block)."""


class OverlappingRanges(DataSetDamage):
    """Two data maps claim the same page."""


class WriteFailed(DataSetDamage):
    """A write or fdatasync of the data set failed (``reason`` ``write`` or ``sync``).

    Sticky, as the log's (docs/logstream.md, "Write errors"): after an fdatasync
    fails, the page cache no longer says what the disk holds, so every later
    write, sync, expansion or close of that data set raises this same error;
    seed 000's "permanent I/O error": FAILED."""

    def __init__(self, reason: str, detail: str, errno: int | None = None) -> None:
        super().__init__(reason, detail)
        self.errno = errno


class ReadFailed(DataSetDamage):
    """The operating system refused a read of the data set (EIO and the like)."""

    def __init__(self, reason: str, detail: str, errno: int | None = None) -> None:
        super().__init__(reason, detail)
        self.errno = errno


class ExpandFailed(SmdsError):
    """An expansion that could not be made: the data set is at ``dsmax``
    (``reason`` ``at-dsmax``) or the file system refused the space (``reason`` the
    errno's name, e.g. ``ENOSPC``). Not damage: the header and the map are as
    they were, and the caller turns ``dsexpand`` off and says why (seed 000)."""

    def __init__(self, reason: str, detail: str, *, size: int, dsmax: int) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.size = size
        self.dsmax = dsmax


class BadDataMap(SmdsError, ValueError):
    """A data map that does not decode, or breaks the allocation rules."""


class SpaceMapError(SmdsError):
    """Base of the space map's errors."""


class NoSpace(SpaceMapError):
    """Not enough free space for a payload; nothing was allocated."""

    def __init__(self, wanted: int, available: int) -> None:
        super().__init__(f"{wanted} pages wanted, {available} available")
        self.wanted = wanted
        self.available = available


class BadSpaceMap(SpaceMapError):
    """A saved space map that cannot be used; the map is rebuilt instead."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class BadFree(SpaceMapError):
    """A free that can only be a bug (bbolt panics on it); nothing was freed."""


class DoubleFree(BadFree):
    """A page freed again while its first free is still pending."""


class UnallocatedFree(BadFree):
    """A page freed that no allocation holds."""
