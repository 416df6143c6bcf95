"""Shared message data sets: the pure core (docs/smds.md).

The formats (header page, block prefix, data map, space-map checkpoint) and the
space map, with no I/O and no import of the server: the daemon's storage layer
does the reads, writes and fsyncs around them.
"""

from .datamap import Block, DataMap
from .errors import (
    BadDataMap,
    BadFree,
    BadPrefix,
    BadSpaceMap,
    DataSetDamage,
    DoubleFree,
    DownLevel,
    ForeignHeader,
    IncompleteRecovery,
    NoSpace,
    OutsideDataSet,
    OverlappingRanges,
    Recreated,
    ShortDataSet,
    SmdsError,
    SpaceMapError,
    TornHeader,
    UnallocatedFree,
    Unformatted,
    UnsupportedVersion,
)
from .header import Header, Prefix, pack_header, read_header, unpack_header, validate
from .offload import DEFAULT_RULES, offloads
from .pages import PAGE, PREFIX, Piece, Range
from .spacemap import EXPAND_AT, EXPAND_BY, SpaceMap, Usage, expanded_size, whole_blocks

__all__ = [
    "DEFAULT_RULES", "EXPAND_AT", "EXPAND_BY", "PAGE", "PREFIX",
    "BadDataMap", "BadFree", "BadPrefix", "BadSpaceMap", "Block", "DataMap", "DataSetDamage",
    "DoubleFree", "DownLevel", "ForeignHeader", "Header", "IncompleteRecovery", "NoSpace",
    "OutsideDataSet", "OverlappingRanges", "Piece", "Prefix", "Range", "Recreated",
    "ShortDataSet", "SmdsError", "SpaceMap", "SpaceMapError", "TornHeader", "UnallocatedFree",
    "Unformatted", "UnsupportedVersion", "Usage",
    "expanded_size", "offloads", "pack_header", "read_header", "unpack_header", "validate",
    "whole_blocks",
]
