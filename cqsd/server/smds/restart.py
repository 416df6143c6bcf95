"""Restart processing of one data set (seed 000, "Shared message data set restart
processing" and "restart after recovery"; docs/smds.md, "Restart processing").

Opening a data set for update is more than opening a file: its STATUS says what
the daemon may find there and what to do with it. An ACTIVE data set must be
the one the repository knows, and its saved space map is used if it is current;
a NEW, EMPTY or RECOVERED one may be missing or blank and is then formatted; an
EMPTY one's map starts empty; otherwise the map is rebuilt from the entries that
name the data set, and the newest entry's first block is read to catch an older
copy. After a recovery (RECOVERED) every entry's blocks are checked instead, and
those whose data is not there are handed back as lost, for the caller to delete.

Blocking file I/O, called on the event loop as the data path's reads are.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...config import StructureConfig
from ...engine import Entry
from ...smds import (
    BadDataMap,
    BadPrefix,
    BufferPool,
    OutsideDataSet,
    SpaceMap,
    Unformatted,
)
from ...smds.dataset import DataSet, path_of
from ...smds.pages import PAGE, PREFIX
from ...smds.states import Status


class AllocFailed(Exception):
    """The data set file could not be found or made (SMDSCONN ALLOCFAIL)."""


def restart(data_dir: Path, key: tuple[str, str], status: Status, record: dict[str, Any],
            sc: StructureConfig, pool: BufferPool, owned: Callable[[], list[Entry]], *,
            writer: str | None = None,
            inherited: bool = False) -> tuple[DataSet, str, list[Entry]]:
    """The data set of ``key`` (in a group, the one incarnation ``writer`` put in)
    opened for update (made, if NEW, EMPTY or RECOVERED and missing or without a
    header) with its space map loaded, reset or rebuilt from ``owned()``;
    returns it, how its map was had, and the entries whose data it does not
    hold (RECOVERED only). An ``inherited`` one, another incarnation's, is
    opened read-only, never made, and its map always rebuilt (docs/smds.md,
    "In a group of daemons").

    ``record`` is the repository's row (identity, saved map's timestamp). Raises
    FileNotFoundError (an ACTIVE one is missing), AllocFailed, OSError, or the
    named damage of cqsd.smds (header, Unformatted for an ACTIVE one, DownLevel,
    OutsideDataSet, OverlappingRanges, ReadFailed, WriteFailed), BadDataMap.
    """
    structure, owner = key[0], key[1].removesuffix(f".{writer}")
    active = status == Status.ACTIVE
    created = (record.get("created") or None) if active else None
    try:
        if inherited:
            assert writer is not None
            dataset = DataSet.inherit(data_dir, structure, owner, writer, created=created,
                                      pool=pool)
        else:
            dataset = DataSet.open(data_dir, structure, owner, pool=pool, writer=writer,
                                   map_time=record.get("map_time") if active else None,
                                   created=created)
        how = "inherited" if inherited else "saved map" if dataset.space is not None \
            else "rebuilt"
    except (FileNotFoundError, Unformatted):
        if active or inherited:
            raise  # missing: ALLOCFAIL; unformatted: "unexpectedly empty", FAILED
        try:
            dataset = DataSet.create(data_dir, structure, owner, dsblock=sc.dsblock,
                                     dssize=sc.dssize, pool=pool, replace=True, writer=writer)
        except OSError as err:
            raise AllocFailed(f"{path_of(data_dir, structure, owner, writer)} cannot be "
                              "made") from err
        how = "created"
    if how == "saved map":
        return dataset, how, []  # no scan of the structure: a clean restart stays quick
    entries = owned()
    if how == "created" and not entries:
        return dataset, how, []
    if status == Status.EMPTY and not entries:
        dataset.space = SpaceMap(dataset.header.dsblock, dataset.size)
        return dataset, "reset", []
    try:
        dataset.space, lost = rebuild(dataset, entries, check_all=status == Status.RECOVERED)
    except BaseException:
        dataset.abandon()
        raise
    return dataset, how, lost


def rebuild(dataset: DataSet, entries: list[Entry], *,
            check_all: bool = False) -> tuple[SpaceMap, list[Entry]]:
    """The space map from every entry naming this data set, then the newest block's
    prefix checked (down-level detection); with ``check_all`` (after recovery)
    every block's prefix, an entry failing it being lost instead. Raises
    OutsideDataSet or OverlappingRanges (a smaller copy than what is in use, or a
    map gone wrong), DownLevel, ReadFailed."""
    h = dataset.header
    kept, lost = [], []
    for e in entries:
        assert e.map is not None
        try:
            e.map.check_within(h.dsblock // PAGE, h.size // h.dsblock)
            if check_all:
                e.map.check_prefixes(e.entry_id, [dataset.read_raw(at, PREFIX)
                                                  for at, _ in e.map.read_sizes()])
        except (OutsideDataSet, BadDataMap, BadPrefix):
            if not check_all:
                raise
            lost.append(e)
            continue
        kept.append(e)
    space = SpaceMap.rebuild(h.dsblock, h.size,
                             (r for e in kept if e.map is not None for r in e.map.ranges))
    if kept and not check_all:
        newest = max(kept, key=lambda e: e.entry_id)
        assert newest.map is not None
        position, nbytes = newest.map.read_sizes()[0]
        newest.map.check_newest(newest.entry_id, dataset.read_raw(position, nbytes))
    return space, lost
