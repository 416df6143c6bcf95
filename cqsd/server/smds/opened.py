"""The data sets open now: opening them (restart processing, restart.py),
finding damage in them, losing what is gone, and closing them.

Design note. Each data set has the states of seed 000 (availability.py, over
the tables of cqsd/smds/states.py). It is opened — restart processing — when
the daemon starts, at its owner's first offloaded put, and when a command or a
recovery makes it usable again; an attempt that fails names why in its states,
and a request that needs a data set not open gets SMDS_UNAVAILABLE saying which
state refuses it (``refusal``), while everything else carries on. Damage found
while it is in use makes it FAILED (``damaged``).

Rebuilding a space map walks every range of every message in the data set: a
4 GiB data set of 64 KiB messages held the event loop for 0.4 s
(benchmarks/smds_stall.py), every client waiting. So a command (reset-smds,
start-smdsconn) and a recovery's reopen run restart processing in a worker
thread (``open_aside``), over the entries taken on the loop. Meanwhile the
data set is not in ``open``: a request that needs it gets SMDS_UNAVAILABLE
(its connection is OPENING), never a half-built map, and the pages of its
messages deleted meanwhile are kept (``opening``) and freed once the map is
whole. The daemon's start and a request's first open still run it on the loop:
nothing is served before the first, and the second is a new data set's.
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import structlog
import trio

from logstream.durable import fsync_dir

from ...engine import CQSError, Entry, Reason
from ...engine.entry import DELETED, LOCKED
from ...smds import BadDataMap, Range, SmdsError
from ...smds.datamap import WRITER
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
# what restart processing raises for a data set it cannot open (``_open_failed``)
OPEN_ERRORS = (AllocFailed, MemoryError, SmdsError, BadDataMap, OSError)


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
        # data sets whose space map a worker thread is building, with the pages of
        # their messages deleted meanwhile (ranges, txid), freed once it is whole
        self.opening: dict[DataSetKey, list[tuple[tuple[Range, ...], int | None]]] = {}
        # data sets a worker thread is growing (space.py), set when it is done: a close,
        # a rebuild or a new open waits for it, never writes the header or map under it
        self.growing: dict[DataSetKey, trio.Event] = {}
        self.last: dict[DataSetKey, tuple[int, float]] = {}  # size and % used when last open
        self.lost: set[int] = set()  # entries deleted because their data is gone
        self._errors: dict[DataSetKey, str] = {}  # why each last failed, for refusals
        # in a group, this node's incarnation (its log series): the one whose data sets
        # it allocates in (docs/smds.md, "In a group of daemons"); None alone
        self.writer: Callable[[], str | None] = lambda: None

    def split(self, name: str) -> tuple[str, str | None]:
        """A data set's name as (owner, incarnation): ``OWNER.NODE-N`` in a group, the
        owner alone in a daemon on its own (whose client names may hold dots)."""
        owner, _, writer = name.rpartition(".")
        if self.writer() is None or not owner or not WRITER.fullmatch(writer):
            return name, None
        return owner, writer

    def inherited(self, name: str) -> bool:
        """Whether the data set is another incarnation's: read, never written here."""
        writer = self.split(name)[1]
        return writer is not None and writer != self.writer()

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
            keys.update((name, e.map.dataset) for e in self.entries(name) if e.map is not None)
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

    async def open_aside(self, key: DataSetKey, why: str) -> bool:
        """``try_open`` with restart processing in a worker thread (the module note):
        whether the data set is open now."""
        await self.grown(key)  # one abandoned (damaged) may still be growing: never both
        if key in self.open:
            return True
        if key in self.opening or not self.states.state(key).may_open() \
                or self.registry.physical(key[0]) is None:
            return False
        restarting = self._restarting(key, why)
        entries = self.owned(key)  # taken on the loop: the structure changes there
        self.opening[key] = []
        try:
            opened = await trio.to_thread.run_sync(restarting, lambda: entries)
        except OPEN_ERRORS as err:
            self._open_failed(key, err)
            return False
        finally:
            freed = self.opening.pop(key)
        space = self._opened(key, *opened).space
        assert space is not None  # restart processing gives it one
        for ranges, txid in freed:
            space.free(ranges, txid)
        return True

    def _open_dataset(self, key: DataSetKey, why: str) -> DataSet:
        """Open the data set for update and run restart processing; its connection
        OPEN and its status ACTIVE. Raises SMDS_UNAVAILABLE naming the failure."""
        restarting = self._restarting(key, why)
        try:
            opened = restarting(lambda: self.owned(key))
        except OPEN_ERRORS as err:
            raise self._open_failed(key, err) from None
        return self._opened(key, *opened)

    def _restarting(self, key: DataSetKey, why: str) -> Callable[
            [Callable[[], list[Entry]]], tuple[DataSet, str, list[Entry]]]:
        """The data set's connection OPENING, and its restart processing to run (on
        the loop, or in a thread: it reads nothing of the daemon's state)."""
        self.states.fire(key, Event.OPEN, why)
        return partial(restart, self.data_dir, key, self.states.state(key).status,
                       self.states.record(key), self.config.structure(key[0]),
                       self.tuning.pool(key[0]), writer=self.split(key[1])[1],
                       inherited=self.inherited(key[1]))

    def _opened(self, key: DataSetKey, dataset: DataSet, how: str, lost: list[Entry]) -> DataSet:
        self.open[key] = dataset
        self._errors.pop(key, None)
        self.states.set(key, created=dataset.header.created, map_time=None)
        self.states.fire(key, Event.OPENED, f"restart processing: {how}")
        log.info("smds_opened", structure=key[0], owner=key[1], size=dataset.size,
                 how=how, rebuild_reason=dataset.rebuild_reason)
        if lost:
            self.lose(lost, "its data is not in the data set after recovery", mapped=False)
        return dataset

    def _open_failed(self, key: DataSetKey, err: BaseException) -> CQSError:
        """The open failed: named in the data set's states; the refusal to raise."""
        if isinstance(err, (FileNotFoundError, AllocFailed)):
            failure, error = Event.ALLOC_FAIL, _words(err)
        elif isinstance(err, MemoryError):
            failure, error = Event.STORAGE_FAIL, f"no memory: {err}"
        elif isinstance(err, (SmdsError, BadDataMap)):
            failure, error = Event.DATA_FAIL, str(err)
        else:
            failure, error = Event.OPEN_FAIL, str(err)
        log.error("smds_open_failed", structure=key[0], owner=key[1], error=error,
                  action="requests that need this data set get SMDS_UNAVAILABLE")
        self._errors[key] = error
        self.states.fire(key, failure, error)
        return self.refusal(key)

    def entries(self, structure: str) -> Iterator[Entry]:
        """The offloaded entries of the structure, if it is available."""
        s = self.registry.physical(structure)
        return s.offloaded() if s is not None else iter(())

    def owned(self, key: DataSetKey) -> list[Entry]:
        """The entries whose data is in the data set (the clean-up queue's included)."""
        return [e for e in self.entries(key[0]) if e.map is not None and e.map.dataset == key[1]]

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
            log.error("smds_message_lost", structure=e.store, owner=e.map.dataset,
                      entry_id=e.entry_id, queue=e.name, recoverable=e.recoverable, reason=why)

    async def reopen(self, structures: list[str]) -> None:
        """After a recovery replaced the structures: the space maps of their open data
        sets rebuilt from what the new instance holds, and the RECOVERED ones
        opened (restart processing, which deletes the entries whose data is lost),
        each in a worker thread (the module note)."""
        for key in self.keys(structures):
            await self.grown(key)
            dataset = self.open.pop(key, None)  # no request uses its old map meanwhile
            if dataset is None:
                await self.open_aside(key, "restart after recovery")
                continue
            entries = self.owned(key)
            self.opening[key] = []
            try:
                space, _ = await trio.to_thread.run_sync(rebuild, dataset, entries)
            except (SmdsError, BadDataMap) as err:
                self.open[key] = dataset
                self.damaged(key, "rebuild", err)
                continue
            finally:
                freed = self.opening.pop(key)
            dataset.space, self.open[key] = space, dataset
            for ranges, txid in freed:
                space.free(ranges, txid)

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

    async def grown(self, key: DataSetKey) -> None:
        """Wait until no growth of the data set is under way."""
        while (growth := self.growing.get(key)) is not None:
            await growth.wait()

    async def close_one(self, key: DataSetKey, why: str, *, save: bool = True) -> None:
        """Close an open data set (a stop, ACCESS(DISABLED), STATUS(FAILED), a purge):
        normally with ``save`` — its space map saved, so the next open needs no
        rebuild — else abandoned. Requests that need it get SMDS_UNAVAILABLE from
        the moment it starts."""
        while True:
            await self.grown(key)  # its header write and the close's must not cross
            async with self.syncs.lock:  # no fdatasync of it in a worker thread meanwhile
                if key not in self.open:
                    return  # closed by another command while this one waited
                if key in self.growing:
                    continue  # began while this one waited for the lock
                self._close_now(key, why, save)
                return

    def _close_now(self, key: DataSetKey, why: str, save: bool) -> None:
        self.states.fire(key, Event.CLOSE, why)
        dataset = self._drop(key)
        pending = dataset.space is not None and dataset.space.pending_pages
        stamp = None
        if save and not dataset.inherited:
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
            if dataset.inherited:  # never written here: its next owner rebuilds its map
                dataset.abandon()
                self.states.fire(key, Event.CLOSED, "daemon stop")
                continue
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

    # -- in a group of daemons (docs/smds.md) --------------------------------------------

    def taken_over(self, structures: list[str]) -> None:
        """A takeover installed ``structures``: their data sets' states as the earlier
        owners left them in the repository, then each opened (an inherited one
        read-only, its map rebuilt from the entries naming it), or deleted if it
        is another incarnation's and no entry names it any more."""
        structures = [name for name in structures if (s := self.registry.physical(name))
                      is not None and s.offload_rules is not None]
        if not structures:
            return
        self.states.load(structures, keep=set(self.open))
        for key in self.keys(structures):
            if key in self.open:
                continue
            if self.inherited(key[1]) and not self.owned(key):
                self.discard(key, "taken over holding no message")
            elif self.states.state(key).may_open():
                self.try_open(key, "takeover")

    def drop(self, structures: list[str]) -> None:
        """This node lost ``structures`` (fenced): their data sets closed at once, with
        no write at all, since the new owner may be reading them."""
        for key in [k for k in self.open if k[0] in structures]:
            self.states.fire(key, Event.CLOSE, "the node lost the structure")
            self._drop(key).abandon()
            self.states.fire(key, Event.CLOSED, "the node lost the structure")

    def release_inherited(self) -> None:
        """After a flush: an inherited data set whose last message's delete is durable
        (and acknowledged: the journal says so only within the lease) is deleted."""
        for key, dataset in list(self.open.items()):
            space = dataset.space
            if dataset.inherited and space is not None and not space.pending_pages \
                    and not space.usage().used_pages:
                self.states.fire(key, Event.CLOSE, "its last message is gone")
                self._drop(key).abandon()
                self.states.fire(key, Event.CLOSED, "its last message is gone")
                self.discard(key, "its last message is gone")

    def discard(self, key: DataSetKey, why: str) -> None:
        """Delete another incarnation's data set that holds no message any more, with
        its repository row: nothing will ever read it again."""
        path = path_of(self.data_dir, key[0], *self.split(key[1]))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            fsync_dir(path.parent)
        self.states.forget(key)
        self.last.pop(key, None)
        log.info("smds_inherited_deleted", structure=key[0], owner=key[1], reason=why)


def _words(err: BaseException) -> str:
    return f"{err}: {err.__cause__}" if err.__cause__ is not None else str(err)
