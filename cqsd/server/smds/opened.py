"""The data sets open now: opening them (restart processing, restart.py),
finding damage in them, losing what is gone, and closing them.

Design note. Each data set has the states of seed 000 (availability.py, over
the tables of cqsd/smds/states.py). It is opened — restart processing — when
the daemon starts, at its owner's first offloaded put, and when a command or a
recovery makes it usable again; an attempt that fails names why in its states,
and a request that needs a data set not open gets SMDS_UNAVAILABLE saying which
state refuses it (``refusal``), while everything else carries on. Damage found
while it is in use makes it FAILED (``damaged``).
"""

from collections.abc import Iterator
from pathlib import Path

import structlog

from ...engine import CQSError, Entry, Reason
from ...engine.entry import DELETED, LOCKED
from ...smds import BadDataMap, SmdsError
from ...smds.dataset import DataSet, extent, path_of
from ...smds.pages import PAGE
from ...smds.states import Access, Avail, Event, IllegalTransition, Status
from ..liveconfig import LiveConfig
from ..registry import Registry
from .availability import Availability, DataSetKey
from .restart import AllocFailed, rebuild, restart
from .syncs import Syncs
from .tuning import Tuning

log = structlog.get_logger()


class OpenDataSets:
    def __init__(self, config: LiveConfig, data_dir: Path, registry: Registry, states: Availability,
                 tuning: Tuning, syncs: Syncs) -> None:
        self.config = config
        self.data_dir = data_dir
        self.registry = registry
        self.states = states
        self.tuning = tuning
        self.syncs = syncs
        self.open: dict[DataSetKey, DataSet] = {}
        self.last: dict[DataSetKey, tuple[int, float]] = {}  # size and % used when last open
        self.lost: set[int] = set()  # entries deleted because their data is gone
        self._errors: dict[DataSetKey, str] = {}  # why each last failed, for refusals

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
        offloading = {sc.name for sc in self.config.structures if sc.offload_rules}
        for key in self.states.known():  # not open: `display smds` shows what they hold
            if key not in self.open and key[0] in offloading:
                self.last[key] = self._figures(key)

    def _figures(self, key: DataSetKey) -> tuple[int, float]:
        """(size, % used) of a data set not open: its extent from the file, and the
        pages its structure's entries name, if the structure is available."""
        dsblock = self.config.structure(key[0]).dsblock
        size = extent(self.data_dir, *key, dsblock)
        total = size // PAGE - dsblock // PAGE  # the control block holds no data
        used = sum(r.pages for e in self.owned(key) if e.map is not None for r in e.map.ranges)
        return size, min(100.0, 100 * used / total) if total > 0 else 0.0

    def keys(self, structures: list[str]) -> list[DataSetKey]:
        """The data sets of ``structures``: known to the repository, on disk, or named by
        an entry."""
        keys = set()
        for name in structures:
            keys.update(self.states.known(name))
            folder = path_of(self.data_dir, name, "X").parent
            if folder.is_dir():
                keys.update((name, p.stem) for p in folder.glob("*.smds"))
            keys.update((name, e.map.owner) for e in self.entries(name) if e.map is not None)
        return sorted(keys)

    def dataset(self, structure: str, owner: str, *, create: bool) -> DataSet:
        """The open data set of (structure, owner), opened now if it may be (and
        activated at its owner's first put if ``create``); raises SMDS_UNAVAILABLE."""
        key = (structure, owner)
        dataset = self.open.get(key)
        if dataset is not None:
            return dataset
        state = self.states.state(key)
        if create and state.status == Status.NOTFOUND and state.avail == Avail.NORMAL \
                and state.access != Access.DISABLED:
            self.states.fire(key, Event.ACTIVATE, "the first offloaded put of its owner")
        if not self.states.state(key).may_open():
            raise self.refusal(key)
        return self._open_dataset(key, "needed by a request")

    def try_open(self, key: DataSetKey, why: str) -> bool:
        """Open the data set if its states allow; whether it is open now (a failure
        is named by its states and events)."""
        if key in self.open:
            return True
        if not self.states.state(key).may_open() or self.registry.physical(key[0]) is None:
            return False
        try:
            self._open_dataset(key, why)
        except CQSError:
            return False
        return True

    def refusal(self, key: DataSetKey, prefix: str = "") -> CQSError:
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
                self.config.structure(key[0]), self.tuning.pool(key[0]),
                lambda: self.owned(key))
        except (FileNotFoundError, AllocFailed) as err:
            failure, error = Event.ALLOC_FAIL, _words(err)
        except MemoryError as err:
            failure, error = Event.STORAGE_FAIL, f"no memory: {err}"
        except (SmdsError, BadDataMap) as err:
            failure, error = Event.DATA_FAIL, str(err)
        except OSError as err:
            failure, error = Event.OPEN_FAIL, str(err)
        else:
            self.open[key] = dataset
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
        raise self.refusal(key)

    def entries(self, structure: str) -> Iterator[Entry]:
        """The offloaded entries of the structure, if it is available."""
        s = self.registry.physical(structure)
        return s.offloaded() if s is not None else iter(())

    def owned(self, key: DataSetKey) -> list[Entry]:
        """The entries whose data is in the data set (the clean-up queue's included)."""
        return [e for e in self.entries(key[0]) if e.map is not None and e.map.owner == key[1]]

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
                self.lost.add(e.entry_id)
            pair.delete(e.owner if e.where == LOCKED else None, e.entry_id, operator=True)
            log.error("smds_message_lost", structure=e.store, owner=e.map.owner,
                      entry_id=e.entry_id, queue=e.name, recoverable=e.recoverable, reason=why)

    def reopen(self, structures: list[str]) -> None:
        """After a recovery replaced the structures: the space maps of their open data
        sets rebuilt from what the new instance holds, and the RECOVERED ones
        opened (restart processing, which deletes the entries whose data is lost)."""
        for key in self.keys(structures):
            dataset = self.open.get(key)
            if dataset is None:
                self.try_open(key, "restart after recovery")
                continue
            try:
                dataset.space, _ = rebuild(dataset, self.owned(key))
            except (SmdsError, BadDataMap) as err:
                self.damaged(key, "rebuild", err)

    # -- damage and closing -------------------------------------------------------------

    def damaged(self, key: DataSetKey, where: str, err: BaseException,
                dataset: DataSet | None = None) -> None:
        """A permanent error (I/O, or contents that are not what the maps say) in a
        data set in use: it is closed without its space map and goes FAILED."""
        log.error(f"smds_{where}_failed", structure=key[0], owner=key[1], error=str(err),
                  action="the data set is FAILED; requests that need it get SMDS_UNAVAILABLE")
        current = self.open.get(key)
        if current is None or (dataset is not None and current is not dataset):
            return  # closed meanwhile: nothing more to say about it
        self._drop(key).abandon()
        self._errors[key] = f"{where}: {err}"
        self.states.fire(key, Event.DATA_FAIL, f"{where}: {err}")

    def _drop(self, key: DataSetKey) -> DataSet:
        dataset = self.open.pop(key)
        self.syncs.forget(dataset)
        if dataset.space is not None:
            self.last[key] = (dataset.size, dataset.space.usage().used_percent)
        return dataset

    async def close_one(self, key: DataSetKey, why: str, *, save: bool = True) -> None:
        """Close an open data set (a stop, ACCESS(DISABLED), STATUS(FAILED), a purge):
        normally with ``save`` — its space map saved, so the next open needs no
        rebuild — else abandoned. Requests that need it get SMDS_UNAVAILABLE from
        the moment it starts."""
        if key not in self.open:
            return
        async with self.syncs.lock:  # no fdatasync of it in a worker thread meanwhile
            if key not in self.open:
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
        for key in sorted(self.open):
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
            # a failed structure's entries are not known until recovered: its data
            # sets hold what the log says they do, and an EMPTY one would be skipped
            if self.registry.physical(key[0]) is not None and not self.owned(key):
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
            self.last[key] = (self.last.get(key, (0, 0.0))[0], 0.0)


def _words(err: BaseException) -> str:
    return f"{err}: {err.__cause__}" if err.__cause__ is not None else str(err)
