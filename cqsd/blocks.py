"""Materialising offloaded payloads from the log: ``B`` effects kept until their ``M``.

A recoverable offloaded put logs its payload as one ``B`` effect per range of
its data map, then ``P`` with empty data and ``M`` with the map (docs/smds.md,
docs/recovery.md). A fold that must hold the bytes (the Spark jobs, and the
reference fold as their oracle) keeps the blocks here and joins them when the
``M`` comes, checking them against the map. Both folds use this one class —
the reference fold over the whole log, the Spark fold per entry in log order —
so they agree on every payload and every error. It lives beside the record
formats, in neither fold's package: ``cqsd.recovery`` already imports
``cqsd.srds`` (a restart reads SRDS slots), so the Spark fold cannot import it.
"""

from crc32c import crc32c

from .records import FoldError
from .smds.datamap import DataMap
from .smds.errors import BadDataMap


def decode(structure: str, eid: int, datamap: object) -> DataMap:
    """The data map of an ``M`` effect; raises FoldError if it is not one."""
    try:
        return DataMap.decode(datamap)
    except BadDataMap as err:
        raise FoldError(f"structure {structure}: effect M on entry {eid} has a bad data "
                        f"map: {err}") from None


class Blocks:
    """The ``B`` effects of a materialising fold, by entry and page, until their ``M``."""

    def __init__(self, structure: str) -> None:
        self.structure = structure
        self.pending: dict[int, dict[int, bytes]] = {}
        self.mapped: set[int] = set()  # entries whose M this fold took

    def add(self, eid: int, page: int, data: bytes) -> None:
        """Keep a block; raises FoldError for a block after its entry's M, or a second
        one for the same page."""
        where = f"structure {self.structure}: effect B on entry {eid} at page {page}"
        if eid in self.mapped:
            raise FoldError(f"{where} comes after the entry's M")
        pages = self.pending.setdefault(eid, {})
        if page in pages:
            raise FoldError(f"{where} is the second block of that page")
        pages[page] = data

    def take(self, eid: int, datamap: DataMap) -> bytes:
        """The payload of entry ``eid`` from its blocks, in its map's range order.

        Raises FoldError if a range has no block, a block is at a page where no
        range starts or holds other than its range's share, or the payload fails
        the map's CRC.
        """
        where = f"structure {self.structure}: effect M on entry {eid}"
        pieces = datamap.pieces()
        self.mapped.add(eid)
        pages = self.pending.pop(eid, {})
        stray = sorted(set(pages) - {r.page for r, _, _ in pieces})
        if stray:
            raise FoldError(f"{where}: a B effect holds a block at page {stray[0]}, where "
                            "none of its ranges starts")
        parts = []
        for (page, _), _, nbytes in pieces:
            if page not in pages:
                raise FoldError(f"{where}: no B effect holds its block at page {page}")
            if len(pages[page]) != nbytes:
                raise FoldError(f"{where}: its block at page {page} holds {len(pages[page])} "
                                f"bytes, the map says {nbytes}")
            parts.append(pages[page])
        payload = b"".join(parts)
        if crc32c(payload) != datamap.crc:
            raise FoldError(f"{where}: its blocks fail the map's CRC-32C")
        return payload
