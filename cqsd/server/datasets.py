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

Each data set has the states of seed 000 (availability.py, over the tables of
cqsd/smds/states.py). It is opened — restart processing — when the daemon
starts, at its owner's first offloaded put, and when a command or a recovery
makes it usable again; an attempt that fails names why in its states, and a
request that needs a data set not open gets SMDS_UNAVAILABLE saying which
state refuses it, while everything else carries on. Damage found while it is
in use makes it FAILED. Restart processing is restartprocessing.py, the
operator commands smdscommands.py, media recovery mediarecovery.py.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
import trio

from ..config import Config
from ..engine import CQSError, Entry, Put, Reason, Structure, StructurePair, parse_qtype
from ..engine.entry import DELETED, LOCKED
from ..engine.qtypes import check_name
from ..engine.structure import Op
from ..smds import (
    BadDataMap,
    BadPrefix,
    BufferPool,
    DataMap,
    ExpandFailed,
    NoSpace,
    Range,
    SmdsError,
)
from ..smds.dataset import DataSet, path_of
from ..smds.states import Access, Avail, Conn, Event, IllegalTransition, Status
from .availability import Availability, DataSetKey
from .limits import Limits, offload_bound
from .registry import Registry
from .restartprocessing import AllocFailed, rebuild, restart

log = structlog.get_logger()


class DataSets:
    def __init__(self, config: Config, data_dir: Path, repository_path: Path,
                 registry: Registry, limits: Limits) -> None:
        self.config = config
        self.limits = limits
        self.data_dir = data_dir
        self.registry = registry
        self.states = Availability(repository_path)
        self._open: dict[DataSetKey, DataSet] = {}
        self._pools: dict[str, BufferPool] = {}
        self._last: dict[DataSetKey, tuple[int, float]] = {}  # size and % used when last open
        self._lost: set[int] = set()  # entries deleted because their data is gone
        self._errors: dict[DataSetKey, str] = {}  # why each data set last failed, for refusals
        self.short: set[DataSetKey] = set()  # a put found no room since the last expansion
        self._dirty: set[DataSet] = set()  # written since the last sync
        self._syncing = trio.Lock()  # held while a worker thread fdatasyncs open data sets
        self.unsynced = False  # a recoverable offloaded put since the last take_unsynced

    # -- the data path -----------------------------------------------------------------

    def put(self, pair: StructurePair, owner: str, qtype: int | str, name: str, data: bytes,
            recoverable: bool, not_before: int | None = None) -> Entry:
        """Put a message (delayed until wall-clock ns ``not_before``, if given),
        offloading its payload to the data set of ``owner`` (the configured client
        putting it) if the structure it goes to says so."""
        if not pair.offloading:
            return pair.put(qtype, name, data, recoverable, None, not_before)
        target = pair.target(qtype, name)
        if not target.offloads(len(data)):
            return pair.put(qtype, name, data, recoverable, None, not_before)
        key = (parse_qtype(qtype), check_name(name))
        dataset, dmap = self._place(target.name, owner, key, data)
        try:
            if recoverable:
                self.limits.check_offloaded(len(data), offload_bound(len(dmap.ranges)))
            entry = pair.put(qtype, name, data, recoverable, dmap, not_before)
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
        SMDS_UNAVAILABLE rather than return bytes that fail their checks: a
        recoverable message's data set is then FAILED (recovery restores it); a
        non-recoverable message cannot be recovered, and is deleted (seed 000)."""
        dmap = entry.map
        if dmap is None:
            return entry.data
        assert entry.store is not None  # set with the map
        key = (entry.store, dmap.owner)
        dataset = self._dataset(entry.store, dmap.owner, create=False)
        try:
            return dataset.read(dmap, entry.entry_id)
        except BadPrefix as err:
            if entry.recoverable:
                self._damaged(key, "read", err)
            else:
                self.lose([entry], f"its block does not match its entry ({err})")
                raise CQSError(Reason.SMDS_UNAVAILABLE,
                               f"entry {entry.entry_id}: its data in the data set of "
                               f"{dmap.owner} in {entry.store} is damaged ({err}); it was not "
                               f"recoverable and has been deleted") from None
        except SmdsError as err:
            self._damaged(key, "read", err)
        raise self._refusal(key, f"entry {entry.entry_id}: ")

    def _place(self, structure: str, owner: str, key: tuple[int, str],
               data: bytes) -> tuple[DataSet, DataMap]:
        dataset = self._dataset(structure, owner, create=True)
        return dataset, DataMap.of(owner, data, self._allocate(dataset, key, len(data)))

    def _write(self, dataset: DataSet, entry: Entry, data: bytes) -> None:
        assert entry.map is not None
        if self._open.get((dataset.structure, dataset.owner)) is not dataset:
            return  # an earlier write of the same request failed: reads say so
        try:
            dataset.write_message(entry.map, entry.entry_id, data)
        except SmdsError as err:  # the log has the blocks of a recoverable one: recovery
            self._damaged((dataset.structure, dataset.owner), "write", err)
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
                self.short.add((dataset.structure, dataset.owner))
                if not self.expand(dataset):
                    raise CQSError(
                        Reason.SMDS_FULL,
                        f"the data set of {dataset.owner} in {dataset.structure} has no room for "
                        f"{nbytes} bytes ({err}) and cannot expand "
                        f"({self._why_not_expand(dataset)}); delete messages, or alter-smds "
                        f"--dsexpand yes with room on disk") from None
        if space.wants_growth:
            self.expand(dataset)  # ahead of need, as MQ does at 90%
        return ranges

    def expand(self, dataset: DataSet) -> bool:
        """Grow the data set by a fifth if its dsexpand allows; a failure turns its
        dsexpand off (seed 000: DSEXPAND(NO)) and says why."""
        key = (dataset.structure, dataset.owner)
        if not self.dsexpand(key):
            return False
        sc = self.config.structure(dataset.structure)
        old = dataset.size
        try:
            dataset.expand(sc.dsmax)
        except ExpandFailed as err:
            self.states.set(key, dsexpand="NO")
            log.warning("smds_expand_failed", structure=dataset.structure, owner=dataset.owner,
                        size=old, dsmax=sc.dsmax, reason=err.reason, error=str(err),
                        action="dsexpand is now off for this data set; puts that need space "
                               "get SMDS_FULL")
            return False
        except SmdsError as err:
            self._damaged(key, "expand", err)
            return False
        self.short.discard(key)
        log.info("smds_expanded", structure=dataset.structure, owner=dataset.owner,
                 size=old, new_size=dataset.size)
        return True

    def _why_not_expand(self, dataset: DataSet) -> str:
        override = self.states.record((dataset.structure, dataset.owner)).get("dsexpand")
        if override == "NO":
            return "dsexpand is off for it (alter-smds, or a failed expansion: see the " \
                   "smds_expand_failed event)"
        if not self.dsexpand((dataset.structure, dataset.owner)):
            return "dsexpand is off"
        return "it is at dsmax"

    def dsexpand(self, key: DataSetKey) -> bool:
        """Whether the data set may expand: its alter-smds override, else the structure's."""
        override = self.states.record(key).get("dsexpand")
        return override == "YES" if override else self.config.structure(key[0]).dsexpand

    def dsbufs(self, key: DataSetKey) -> int:
        """The buffers the data set asks of its structure's pool: its override, else the
        structure's dsbufs."""
        return self.states.record(key).get("dsbufs") or self.config.structure(key[0]).dsbufs

    def pool(self, structure: str) -> BufferPool:
        """The structure's buffer pool, holding the most buffers any of its data sets
        asks for (one pool serves every read of the structure)."""
        sc = self.config.structure(structure)
        want = max([sc.dsbufs, *(self.dsbufs(k) for k in self.states.known(structure))])
        pool = self._pools.get(structure)
        if pool is None:
            pool = self._pools[structure] = BufferPool(want, sc.dsblock)
        elif pool.statistics().buffers != want:
            pool.resize(want)
        return pool

    def freed(self, structure: Structure, lsn: int) -> None:
        """After the record holding a request's deletes is appended at ``lsn``: the
        pages of the offloaded messages it deleted wait for it to be durable (a
        non-recoverable message's pages are free at once)."""
        for entry in structure.stamp_deleted(lsn):
            assert entry.map is not None and entry.store is not None
            if entry.entry_id in self._lost:  # its pages were never in the map
                self._lost.discard(entry.entry_id)
                continue
            key = (entry.store, entry.map.owner)
            dataset = self._open.get(key)
            if dataset is None or dataset.space is None:
                if self.states.record(key).get("map_time") is not None:  # saved, now stale
                    self.states.set(key, map_time=None)
                continue
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
        """fdatasync every data set written since the last call, in a worker thread
        (taken once no command is closing one: a close fsyncs it itself)."""
        async with self._syncing:
            dirty, self._dirty = self._dirty, set()
            if not dirty:
                return
            failed = await trio.to_thread.run_sync(_sync_all, list(dirty))
        for dataset, err in failed:
            self._damaged((dataset.structure, dataset.owner), "sync", err, dataset)

    def sync_now(self) -> None:
        """``sync`` on the loop, for the stop path."""
        dirty, self._dirty = self._dirty, set()
        for dataset, err in _sync_all(list(dirty)):
            self._damaged((dataset.structure, dataset.owner), "sync", err, dataset)

    # -- opening: restart processing --------------------------------------------------

    def start(self) -> None:
        """At start, after the structures are rebuilt: open every data set of an
        offloading structure, so that damage is found and named now. A recovery
        the daemon stopped in leaves its data sets FAILED; a SUSPENDED one is
        tried again (seed 000)."""
        self.states.load()
        for structure in self.registry.structures():
            if structure.offload_rules is None:
                continue
            for key in self.keys([structure.name]):
                state = self.states.state(key)
                if state.status == Status.INRECOVER:
                    self.states.fire(key, Event.RECOVERY_FAIL, "the daemon stopped during its "
                                                               "recovery")
                elif state.status == Status.NOTFOUND and path_of(self.data_dir, *key).exists():
                    self.states.fire(key, Event.ACTIVATE, "found on disk, unknown to the "
                                                          "repository")
                if self.states.state(key).may_open():
                    self.try_open(key, "daemon start")

    def keys(self, structures: list[str]) -> list[DataSetKey]:
        """The data sets of ``structures``: known to the repository, on disk, or named by
        an entry."""
        keys = set()
        for name in structures:
            keys.update(self.states.known(name))
            folder = path_of(self.data_dir, name, "X").parent
            if folder.is_dir():
                keys.update((name, p.stem) for p in folder.glob("*.smds"))
            keys.update((name, e.map.owner) for e in self._entries(name) if e.map is not None)
        return sorted(keys)

    def _dataset(self, structure: str, owner: str, *, create: bool) -> DataSet:
        key = (structure, owner)
        dataset = self._open.get(key)
        if dataset is not None:
            return dataset
        state = self.states.state(key)
        if create and state.status == Status.NOTFOUND and state.avail == Avail.NORMAL \
                and state.access != Access.DISABLED:
            self.states.fire(key, Event.ACTIVATE, "the first offloaded put of its owner")
        if not self.states.state(key).may_open():
            raise self._refusal(key)
        return self._open_dataset(key, "needed by a request")

    def try_open(self, key: DataSetKey, why: str) -> bool:
        """Open the data set if its states allow; whether it is open now (a failure
        is named by its states and events)."""
        if key in self._open:
            return True
        if not self.states.state(key).may_open() or self.registry.physical(key[0]) is None:
            return False
        try:
            self._open_dataset(key, why)
        except CQSError:
            return False
        return True

    def _refusal(self, key: DataSetKey, prefix: str = "") -> CQSError:
        error = self._errors.get(key)
        return CQSError(Reason.SMDS_UNAVAILABLE,
                        f"{prefix}the data set of {key[1]} in {key[0]} is unavailable: "
                        f"{self.states.state(key).why_unavailable()}"
                        + (f"; the last error: {error}" if error else ""))

    def _open_dataset(self, key: DataSetKey, why: str) -> DataSet:
        """Open the data set for update and run restart processing; its connection
        OPEN and its status ACTIVE. Raises SMDS_UNAVAILABLE naming the failure."""
        self.states.fire(key, Event.OPEN, why)
        try:
            dataset, how, lost = restart(
                self.data_dir, key, self.states.state(key).status, self.states.record(key),
                self.config.structure(key[0]), self.pool(key[0]), lambda: self._owned(key))
        except (FileNotFoundError, AllocFailed) as err:
            failure, error = Event.ALLOC_FAIL, _words(err)
        except MemoryError as err:
            failure, error = Event.STORAGE_FAIL, f"no memory: {err}"
        except (SmdsError, BadDataMap) as err:
            failure, error = Event.DATA_FAIL, str(err)
        except OSError as err:
            failure, error = Event.OPEN_FAIL, str(err)
        else:
            self._open[key] = dataset
            self._errors.pop(key, None)
            self.states.set(key, created=dataset.header.created, map_time=None)
            self.states.fire(key, Event.OPENED, f"restart processing: {how}")
            log.info("smds_opened", structure=key[0], owner=key[1], size=dataset.size,
                     how=how, rebuild_reason=dataset.rebuild_reason)
            if lost:
                self.lose(lost, "its data is not in the data set after recovery", mapped=False)
            return dataset
        log.error("smds_open_failed", structure=key[0], owner=key[1], error=error,
                  action="requests that need this data set get SMDS_UNAVAILABLE")
        self._errors[key] = error
        self.states.fire(key, failure, error)
        raise self._refusal(key)

    def _entries(self, structure: str) -> Iterator[Entry]:
        s = self.registry.physical(structure)
        return s.offloaded() if s is not None else iter(())

    def _owned(self, key: DataSetKey) -> list[Entry]:
        """The entries whose data is in the data set (the clean-up queue's included)."""
        return [e for e in self._entries(key[0]) if e.map is not None and e.map.owner == key[1]]

    def lose(self, entries: list[Entry], why: str, *, mapped: bool = True) -> None:
        """Delete messages whose data is gone, each with an event (seed 000: a
        diagnostic message, and the entry deleted); their pages are freed as any
        delete's, unless not ``mapped`` (restart left them out of the space map)."""
        for e in entries:
            assert e.map is not None and e.store is not None
            pair = self.registry.pairs.get(self.registry.overflow_of.get(e.store, e.store))
            if pair is None or e.where == DELETED:
                continue  # failed meanwhile, or deleted already
            if not mapped:
                self._lost.add(e.entry_id)
            pair.delete(e.owner if e.where == LOCKED else None, e.entry_id, operator=True)
            log.error("smds_message_lost", structure=e.store, owner=e.map.owner,
                      entry_id=e.entry_id, queue=e.name, recoverable=e.recoverable, reason=why)

    def reopen(self, structures: list[str]) -> None:
        """After a recovery replaced the structures: the space maps of their open data
        sets rebuilt from what the new instance holds, and the RECOVERED ones
        opened (restart processing, which deletes the entries whose data is lost)."""
        for key in self.keys(structures):
            dataset = self._open.get(key)
            if dataset is None:
                self.try_open(key, "restart after recovery")
                continue
            try:
                dataset.space, _ = rebuild(dataset, self._owned(key))
            except (SmdsError, BadDataMap) as err:
                self._damaged(key, "rebuild", err)

    # -- damage and closing -------------------------------------------------------------

    def _damaged(self, key: DataSetKey, where: str, err: BaseException,
                 dataset: DataSet | None = None) -> None:
        """A permanent error (I/O, or contents that are not what the maps say) in a
        data set in use: it is closed without its space map and goes FAILED."""
        log.error(f"smds_{where}_failed", structure=key[0], owner=key[1], error=str(err),
                  action="the data set is FAILED; requests that need it get SMDS_UNAVAILABLE")
        current = self._open.get(key)
        if current is None or (dataset is not None and current is not dataset):
            return  # closed meanwhile: nothing more to say about it
        self._drop(key).abandon()
        self._errors[key] = f"{where}: {err}"
        self.states.fire(key, Event.DATA_FAIL, f"{where}: {err}")

    def _drop(self, key: DataSetKey) -> DataSet:
        dataset = self._open.pop(key)
        self._dirty.discard(dataset)
        if dataset.space is not None:
            self._last[key] = (dataset.size, dataset.space.usage().used_percent)
        return dataset

    async def close_one(self, key: DataSetKey, why: str, *, save: bool = True) -> None:
        """Close an open data set (a stop, ACCESS(DISABLED), STATUS(FAILED), a purge):
        normally with ``save`` — its space map saved, so the next open needs no
        rebuild — else abandoned. Requests that need it get SMDS_UNAVAILABLE from
        the moment it starts."""
        if key not in self._open:
            return
        async with self._syncing:  # no fdatasync of it in a worker thread meanwhile
            if key not in self._open:
                return  # closed by another command while this one waited
            self.states.fire(key, Event.CLOSE, why)
            dataset = self._drop(key)
            pending = dataset.space is not None and dataset.space.pending_pages
            stamp = None
            if save:
                try:
                    stamp = dataset.close()
                except SmdsError as err:
                    log.error("smds_close_failed", structure=key[0], owner=key[1],
                              error=str(err), action="the space map is rebuilt at the next open")
            dataset.abandon()
            # pages freed by deletes not yet durable stay marked in the saved map: rebuild
            self.states.set(key, map_time=None if pending else stamp)
            self.states.fire(key, Event.CLOSED, why)

    def close(self) -> None:
        """Clean stop (every delete durable by now): each space map saved in its data
        set, and its timestamp in the repository (docs/smds.md, restart processing);
        one holding no message is EMPTY (seed 000)."""
        for key in sorted(self._open):
            dataset = self._drop(key)
            self.states.fire(key, Event.CLOSE, "daemon stop")
            try:
                assert dataset.space is not None
                dataset.space.release(1 << 62)
                stamp = dataset.close()
            except SmdsError as err:
                log.error("smds_close_failed", structure=key[0], owner=key[1], error=str(err),
                          action="the space map is rebuilt at the next start")
                dataset.abandon()
                stamp = None
            self.states.set(key, map_time=stamp)
            self.states.fire(key, Event.CLOSED, "daemon stop")
            if not any(e.map is not None and e.map.owner == key[1]
                       for e in self._entries(key[0])):
                self.states.fire(key, Event.CLOSE_EMPTY, "closed holding no message")

    async def purged(self, structures: list[str], why: str) -> None:
        """The structures were emptied (recover --purge, delete-structure): their data
        sets' contents are no longer needed, so each is EMPTY, and the next open
        resets its space map (seed 000)."""
        for key in self.keys(structures):
            await self.close_one(key, why, save=False)
            try:
                self.states.fire(key, Event.PURGE, why)
            except IllegalTransition:
                continue  # NOTFOUND: nothing to empty
            self.states.set(key, map_time=None)
            self._last[key] = (self._last.get(key, (0, 0.0))[0], 0.0)

    # -- displays ---------------------------------------------------------------------

    def rows(self, structure: str | None) -> list[dict[str, Any]]:
        """One row per activated data set: `display smds` and `display usage --type smds`."""
        return [self.row(k) for k in self._activated(structure)]

    def cfstatus(self, structure: str | None) -> list[dict[str, Any]]:
        """`display cfstatus --type smds`: each activated data set's shared state."""
        return [self.cfstatus_row(k) for k in self._activated(structure)]

    def smdsconn(self, structure: str | None) -> list[dict[str, Any]]:
        """`display smdsconn`: the daemon's connection to each activated data set."""
        return [self.smdsconn_row(k) for k in self._activated(structure)]

    def _activated(self, structure: str | None) -> list[DataSetKey]:
        """Data sets shown by the displays: NOTFOUND ones are not (seed 000)."""
        return [k for k in self.states.known(structure)
                if self.states.state(k).status != Status.NOTFOUND]

    def row(self, key: DataSetKey) -> dict[str, Any]:
        state = self.states.state(key)
        dataset = self._open.get(key)
        if dataset is not None and dataset.space is not None:
            size, used = dataset.size, dataset.space.usage().used_percent
        else:
            size, used = self._last.get(key, (0, 0.0))
        pool = self.pool(key[0]).statistics()
        return {
            "structure": key[0], "owner": key[1], "size": size,
            "used_percent": round(used, 2), "dsblock": self.config.structure(key[0]).dsblock,
            "dsbufs": self.dsbufs(key), "dsexpand": self.dsexpand(key),
            "status": str(state.status), "access": str(state.access),
            "buffers": pool.buffers, "lru_hit_percent": round(pool.lru_hit_percent, 2),
            "waits": pool.waits, "lowest_free": pool.lowest_free, "available": state.usable,
        }

    def cfstatus_row(self, key: DataSetKey) -> dict[str, Any]:
        state, record = self.states.state(key), self.states.record(key)
        return {"structure": key[0], "owner": key[1], "status": str(state.status),
                "access": str(state.access), "rcvtime": record.get("rcvtime"),
                "failtime": record.get("failtime")}

    def smdsconn_row(self, key: DataSetKey) -> dict[str, Any]:
        state = self.states.state(key)
        return {"structure": key[0], "owner": key[1], "status": str(state.conn),
                "avail": str(state.avail),
                "openmode": "UPDATE" if state.conn == Conn.OPEN else "NONE"}

    def opened(self, key: DataSetKey) -> DataSet | None:
        """The data set, if it is open."""
        return self._open.get(key)


def _words(err: BaseException) -> str:
    return f"{err}: {err.__cause__}" if err.__cause__ is not None else str(err)


def _sync_all(datasets: list[DataSet]) -> list[tuple[DataSet, Exception]]:
    failed: list[tuple[DataSet, Exception]] = []
    for dataset in datasets:
        try:
            dataset.sync()
        except (SmdsError, ValueError) as err:  # ValueError: abandoned after damage meanwhile
            failed.append((dataset, err))
    return failed
