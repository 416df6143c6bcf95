"""Shared message data sets as the daemon runs them (DESIGN §11, docs/smds.md).

Design note. A structure with ``offload = "smds"`` keeps only the data map of
an offloaded payload; the payload lives in the data set of (structure, owner).
This room opens those files, hands out their space, writes and reads the
message blocks, and keeps the log's promise about them: a record naming blocks
reaches the log only after the blocks are fsynced (the journal holds such a
record back until ``sync`` has run), so a durable entry never points at blocks
a power failure could take back.

Writes and reads are positioned calls made on the event loop. They copy to and
from the page cache, as the log's appends do, so a put keeps its place in
request order without a thread hand-off per message; only the fdatasyncs,
one per data set for every put waiting on it (group commit), go to a worker
thread. Pages freed by a delete stay pending under the delete's LSN, its entry
on the clean-up queue (LH 4), until that LSN is durable (``durable``).

A data set that cannot be opened or read is *unavailable*: the requests that
need it get SMDS_UNAVAILABLE, everything else carries on (DESIGN §11).
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
import trio

from ..config import Config
from ..engine import CQSError, Entry, Put, Reason, Structure, StructurePair, parse_qtype
from ..engine.qtypes import check_name
from ..engine.structure import Op
from ..smds import (
    PAGE,
    BufferPool,
    DataMap,
    DataSetDamage,
    ExpandFailed,
    NoSpace,
    Range,
    SmdsError,
    SpaceMap,
)
from ..smds.dataset import DataSet, path_of
from ..storage import repository
from .limits import Limits, offload_bound
from .registry import Registry

log = structlog.get_logger()
Key = tuple[str, str]  # (structure, owner)


class DataSets:
    def __init__(self, config: Config, data_dir: Path, repository_path: Path,
                 registry: Registry, limits: Limits) -> None:
        self.config = config
        self.limits = limits
        self.data_dir = data_dir
        self.repository = repository_path
        self.registry = registry
        self._open: dict[Key, DataSet] = {}
        self._pools: dict[str, BufferPool] = {}
        self._broken: dict[Key, str] = {}  # unavailable data sets, and why
        self._expand_off: set[Key] = set()  # dsexpand turned off by a failed expansion
        self._dirty: set[DataSet] = set()  # written since the last sync
        self.unsynced = False  # a recoverable offloaded put since the last take_unsynced

    # -- the data path -----------------------------------------------------------------

    def put(self, pair: StructurePair, owner: str, qtype: int | str, name: str, data: bytes,
            recoverable: bool) -> Entry:
        """Put a message, offloading its payload to the data set of ``owner`` (the
        configured client putting it) if the structure it goes to says so."""
        if not pair.offloading:
            return pair.put(qtype, name, data, recoverable)
        target = pair.target(qtype, name)
        if not target.offloads(len(data)):
            return pair.put(qtype, name, data, recoverable)
        key = (parse_qtype(qtype), check_name(name))
        dataset, dmap = self._place(target.name, owner, key, data)
        try:
            if recoverable:
                self.limits.check_offloaded(len(data), offload_bound(len(dmap.ranges)))
            entry = pair.put(qtype, name, data, recoverable, dmap)
        except BaseException:
            self._give_back(dataset, dmap)
            raise
        self._write(dataset, entry, data)
        return entry

    def commit(self, pair: StructurePair, client: str, owner: str, ops: list[Op]) -> list[Entry]:
        """A commit by ``client`` (the holder of its locks) whose puts are offloaded to
        ``owner``'s data set as single puts are: all or nothing."""
        if not pair.offloading:
            return pair.commit(client, ops)
        placed: list[tuple[DataSet, DataMap]] = []
        batch: list[Op] = []
        extra = 0
        try:
            for op in ops:
                if type(op) is Put:
                    target = pair.target(op.qtype, op.name)
                    if target.offloads(len(op.data)):
                        key = (parse_qtype(op.qtype), check_name(op.name))
                        dataset, dmap = self._place(target.name, owner, key, op.data)
                        placed.append((dataset, dmap))
                        op = op._replace(dmap=dmap)
                        if op.recoverable:
                            extra += offload_bound(len(dmap.ranges))
                batch.append(op)
            if extra:
                self.limits.check_commit(batch, extra)
            results = pair.commit(client, batch)
        except BaseException:
            for dataset, dmap in placed:
                self._give_back(dataset, dmap)
            raise
        datasets = iter(placed)
        for op, entry in zip(batch, results, strict=True):
            if type(op) is Put and op.dmap is not None:
                self._write(next(datasets)[0], entry, op.data)
        return results

    def payload(self, entry: Entry) -> bytes | memoryview:
        """The message's payload, from its data set if offloaded. Raises
        SMDS_UNAVAILABLE rather than return bytes that fail their checks."""
        dmap = entry.map
        if dmap is None:
            return entry.data
        assert entry.store is not None  # set with the map
        dataset = self._dataset(entry.store, dmap.owner, create=False)
        try:
            return dataset.read(dmap, entry.entry_id)
        except SmdsError as err:
            self._unavailable((entry.store, dmap.owner), "read_failed", err)
            raise CQSError(Reason.SMDS_UNAVAILABLE,
                           f"entry {entry.entry_id}: the data set of {dmap.owner} in "
                           f"{entry.store} cannot be read ({err})") from None

    def _place(self, structure: str, owner: str, key: tuple[int, str],
               data: bytes) -> tuple[DataSet, DataMap]:
        dataset = self._dataset(structure, owner, create=True)
        return dataset, DataMap.of(owner, data, self._allocate(dataset, key, len(data)))

    def _write(self, dataset: DataSet, entry: Entry, data: bytes) -> None:
        assert entry.map is not None
        if (dataset.structure, dataset.owner) in self._broken:
            return  # an earlier write of the same request failed: reads say so
        try:
            dataset.write_message(entry.map, entry.entry_id, data)
        except SmdsError as err:  # the log has the blocks of a recoverable one: recovery
            self._unavailable((dataset.structure, dataset.owner), "write_failed", err)
            return
        if entry.recoverable:
            self._dirty.add(dataset)
            self.unsynced = True

    def _give_back(self, dataset: DataSet, dmap: DataMap) -> None:
        """Free at once the space of a put that never became an entry."""
        assert dataset.space is not None
        dataset.space.free(dmap.ranges, None)

    # -- space ------------------------------------------------------------------------

    def _allocate(self, dataset: DataSet, key: tuple[int, str], nbytes: int) -> list[Range]:
        space = dataset.space
        assert space is not None
        while True:
            try:
                ranges = space.allocate(key, nbytes)
                break
            except NoSpace as err:
                if not self._expand(dataset):
                    raise CQSError(
                        Reason.SMDS_FULL,
                        f"the data set of {dataset.owner} in {dataset.structure} has no room for "
                        f"{nbytes} bytes ({err}) and cannot expand "
                        f"({self._why_not_expand(dataset)}); delete messages, or alter-smds "
                        f"--dsexpand yes with room on disk") from None
        if space.wants_growth:
            self._expand(dataset)  # ahead of need, as MQ does at 90%
        return ranges

    def _expand(self, dataset: DataSet) -> bool:
        key = (dataset.structure, dataset.owner)
        sc = self.config.structure(dataset.structure)
        if not sc.dsexpand or key in self._expand_off:
            return False
        old = dataset.size
        try:
            dataset.expand(sc.dsmax)
        except ExpandFailed as err:
            self._expand_off.add(key)
            log.warning("smds_expand_failed", structure=dataset.structure,
                        owner=dataset.owner, size=old, dsmax=sc.dsmax, reason=err.reason,
                        error=str(err), action="dsexpand is now off for this data set; puts "
                                               "that need space get SMDS_FULL")
            return False
        except SmdsError as err:
            self._unavailable(key, "expand_failed", err)
            return False
        log.info("smds_expanded", structure=dataset.structure, owner=dataset.owner,
                 size=old, new_size=dataset.size)
        return True

    def _why_not_expand(self, dataset: DataSet) -> str:
        if not self.config.structure(dataset.structure).dsexpand:
            return "dsexpand is off"
        if (dataset.structure, dataset.owner) in self._expand_off:
            return "an expansion failed; see the smds_expand_failed event"
        return "it is at dsmax"

    def freed(self, structure: Structure, lsn: int) -> None:
        """After the record holding a request's deletes is appended at ``lsn``: the
        pages of the offloaded messages it deleted wait for it to be durable (a
        non-recoverable message's pages are free at once)."""
        for entry in structure.stamp_deleted(lsn):
            assert entry.map is not None and entry.store is not None
            dataset = self._open.get((entry.store, entry.map.owner))
            if dataset is None or dataset.space is None:
                continue  # unavailable: its space map is rebuilt when it opens again
            dataset.space.free(entry.map.ranges, lsn if entry.recoverable and lsn else None)

    def durable(self, lsn: int) -> None:
        """The log is durable up to ``lsn``: pending pages are free for reuse and the
        clean-up queues let go of their entries."""
        for dataset in self._open.values():
            if dataset.space is not None and dataset.space.pending_pages:
                dataset.space.release(lsn)
        for structure in self.registry.structures():
            if structure.offload_rules is not None:
                structure.clean_up(lsn)

    def take_unsynced(self) -> bool:
        """Whether a record appended now must wait for ``sync`` (it names blocks
        written since the last one)."""
        unsynced, self.unsynced = self.unsynced, False
        return unsynced

    async def sync(self) -> None:
        """fdatasync every data set written since the last call, in a worker thread."""
        dirty, self._dirty = self._dirty, set()
        if dirty:
            failed = await trio.to_thread.run_sync(_sync_all, list(dirty))
            for dataset, err in failed:
                self._unavailable((dataset.structure, dataset.owner), "sync_failed", err)

    def sync_now(self) -> None:
        """``sync`` on the loop, for the stop path."""
        dirty, self._dirty = self._dirty, set()
        for dataset, err in _sync_all(list(dirty)):
            self._unavailable((dataset.structure, dataset.owner), "sync_failed", err)

    # -- opening and closing ------------------------------------------------------------

    def start(self) -> None:
        """At start, after the structures are rebuilt: open every data set of an
        offloading structure, so that damage is found and named now."""
        for structure in self.registry.structures():
            if structure.offload_rules is None:
                continue
            folder = path_of(self.data_dir, structure.name, "X").parent
            owners = {p.stem for p in folder.glob("*.smds")} if folder.is_dir() else set()
            owners |= {e.map.owner for e in structure.offloaded() if e.map is not None}
            for owner in sorted(owners):
                try:
                    self._dataset(structure.name, owner, create=False)
                except CQSError:
                    pass  # named by its event; its requests get SMDS_UNAVAILABLE

    def _dataset(self, structure: str, owner: str, *, create: bool) -> DataSet:
        key = (structure, owner)
        dataset = self._open.get(key)
        if dataset is not None:
            return dataset
        if key in self._broken:
            raise CQSError(Reason.SMDS_UNAVAILABLE, f"the data set of {owner} in {structure} is "
                                                    f"unavailable: {self._broken[key]}")
        sc = self.config.structure(structure)
        pool = self._pools.get(structure)
        if pool is None:
            pool = self._pools[structure] = BufferPool(sc.dsbufs, sc.dsblock)
        known = repository.smds_dataset(self.repository, structure, owner)
        try:
            try:
                dataset = DataSet.open(self.data_dir, structure, owner, pool=pool,
                                       map_time=known["map_time"] if known else None,
                                       created=known["created"] if known else None)
                how = "saved map" if dataset.space is not None else "rebuilt"
            except FileNotFoundError:
                if known is not None or not create:
                    raise DataSetDamage("missing", f"{path_of(self.data_dir, structure, owner)} "
                                                   "does not exist") from None
                dataset = DataSet.create(self.data_dir, structure, owner, dsblock=sc.dsblock,
                                         dssize=sc.dssize, pool=pool)
                how = "created"
            if dataset.space is None:
                dataset.space = self._rebuild(dataset)
        except (SmdsError, OSError) as err:
            self._unavailable(key, "open_failed", err)
            raise CQSError(Reason.SMDS_UNAVAILABLE, f"the data set of {owner} in {structure} "
                                                    f"cannot be opened: {err}") from None
        repository.record_smds(self.repository, structure, owner, dataset.header.created, None)
        self._open[key] = dataset
        log.info("smds_opened", structure=structure, owner=owner, size=dataset.size, how=how,
                 rebuild_reason=getattr(dataset, "rebuild_reason", None))
        return dataset

    def _rebuild(self, dataset: DataSet) -> SpaceMap:
        """Restart processing: the space map from every entry naming this data set,
        then the newest block's prefix checked (down-level detection)."""
        h = dataset.header
        entries = [e for e in self._entries(dataset.structure)
                   if e.map is not None and e.map.owner == dataset.owner]
        for e in entries:
            assert e.map is not None
            e.map.check_within(h.dsblock // PAGE, h.size // h.dsblock)
        space = SpaceMap.rebuild(h.dsblock, h.size,
                                 (r for e in entries if e.map is not None for r in e.map.ranges))
        if entries:
            newest = max(entries, key=lambda e: e.entry_id)
            assert newest.map is not None
            position, nbytes = newest.map.read_sizes()[0]
            newest.map.check_newest(newest.entry_id, dataset.read_raw(position, nbytes))
        return space

    def _entries(self, structure: str) -> Iterator[Entry]:
        s = self.registry.physical(structure)
        return s.offloaded() if s is not None else iter(())

    def reopen(self, structure: str) -> None:
        """After a recovery replaced the structure: its data sets' space maps are
        rebuilt from what the new instance holds. (A rebuild copies the entries
        as they are, so the maps, pending frees included, stay right.)"""
        for key in [k for k in self._open if k[0] == structure]:
            dataset = self._open[key]
            try:
                dataset.space = self._rebuild(dataset)
            except SmdsError as err:
                self._unavailable(key, "rebuild_failed", err)

    def _unavailable(self, key: Key, event: str, err: BaseException) -> None:
        log.error(f"smds_{event}", structure=key[0], owner=key[1], error=str(err),
                  action="requests that need this data set get SMDS_UNAVAILABLE")
        self._broken[key] = f"{event}: {err}"
        dataset = self._open.pop(key, None)
        if dataset is not None:
            self._dirty.discard(dataset)
            dataset.abandon()

    def close(self) -> None:
        """Clean stop (every delete durable by now): each space map saved in its data
        set, and its timestamp in the repository (docs/smds.md, restart processing)."""
        for (structure, owner), dataset in sorted(self._open.items()):
            try:
                assert dataset.space is not None
                dataset.space.release(1 << 62)
                stamp = dataset.close()
            except SmdsError as err:
                log.error("smds_close_failed", structure=structure, owner=owner, error=str(err),
                          action="the space map is rebuilt at the next start")
                dataset.abandon()
                continue
            repository.record_smds(self.repository, structure, owner, dataset.header.created,
                                   stamp)
        self._open.clear()

    # -- displays ---------------------------------------------------------------------

    def rows(self, structure: str | None) -> list[dict[str, Any]]:
        """One row per data set: `display smds` and `display usage --type smds`."""
        out = []
        for (name, owner), dataset in sorted(self._open.items()):
            if structure is not None and name != structure:
                continue
            sc = self.config.structure(name)
            assert dataset.space is not None
            usage = dataset.space.usage()
            pool = self._pools[name].statistics()
            out.append({
                "structure": name, "owner": owner, "size": dataset.size,
                "used_percent": round(usage.used_percent, 2), "dsblock": sc.dsblock,
                "dsbufs": sc.dsbufs,
                "dsexpand": sc.dsexpand and (name, owner) not in self._expand_off,
                "status": "ACTIVE", "access": "ENABLED",
                "buffers": pool.buffers, "lru_hit_percent": round(pool.lru_hit_percent, 2),
                "waits": pool.waits, "lowest_free": pool.lowest_free,
            })
        for (name, owner), why in sorted(self._broken.items()):
            if structure is None or name == structure:
                sc = self.config.structure(name)
                out.append({"structure": name, "owner": owner, "size": 0, "used_percent": 0,
                            "dsblock": sc.dsblock, "dsbufs": sc.dsbufs, "dsexpand": sc.dsexpand,
                            "status": "FAILED", "access": "SUSPENDED", "buffers": sc.dsbufs,
                            "lru_hit_percent": 0, "waits": 0, "lowest_free": 0,
                            "reason": why})
        return out


def _sync_all(datasets: list[DataSet]) -> list[tuple[DataSet, SmdsError]]:
    failed = []
    for dataset in datasets:
        try:
            dataset.sync()
        except SmdsError as err:
            failed.append((dataset, err))
    return failed
