"""Shared message data sets: the pure core (docs/smds.md).

The formats (header page, block prefix, data map, space-map checkpoint) and the
space map and the buffer pool's bookkeeping, with no I/O and no import of the
server. The one storage module, ``cqsd.smds.dataset``, does the reads, writes
and fsyncs around them and is imported by name, so importing this package
stays pure.
"""

from .bufferpool import BufferPool, PoolStatistics
from .datamap import Block, DataMap
from .errors import (
    BadDataMap,
    BadFree,
    BadPrefix,
    BadSpaceMap,
    DataSetDamage,
    DoubleFree,
    DownLevel,
    ExpandFailed,
    ForeignHeader,
    IncompleteRecovery,
    NoSpace,
    OutsideDataSet,
    OverlappingRanges,
    ReadFailed,
    Recreated,
    ShortDataSet,
    SmdsError,
    SpaceMapError,
    TornHeader,
    UnallocatedFree,
    Unformatted,
    UnsupportedVersion,
    WriteFailed,
)
from .header import Header, Prefix, pack_header, read_header, unpack_header, validate
from .offload import DEFAULT_RULES, offloads
from .pages import PAGE, PREFIX, Piece, Range
from .spacemap import EXPAND_AT, EXPAND_BY, SpaceMap, Usage, expanded_size, whole_blocks

__all__ = [
    "DEFAULT_RULES", "EXPAND_AT", "EXPAND_BY", "PAGE", "PREFIX",
    "BadDataMap", "BadFree", "BadPrefix", "BadSpaceMap", "Block", "BufferPool", "DataMap",
    "DataSetDamage", "DoubleFree", "DownLevel", "ExpandFailed", "ForeignHeader", "Header",
    "IncompleteRecovery", "NoSpace", "OutsideDataSet", "OverlappingRanges", "Piece",
    "PoolStatistics", "Prefix", "Range", "ReadFailed", "Recreated", "ShortDataSet", "SmdsError",
    "SpaceMap", "SpaceMapError", "TornHeader", "UnallocatedFree", "Unformatted",
    "UnsupportedVersion", "Usage", "WriteFailed",
    "expanded_size", "offloads", "pack_header", "read_header", "unpack_header", "validate",
    "whole_blocks",
]
