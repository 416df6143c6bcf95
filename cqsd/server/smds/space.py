"""The space of the data sets: pages handed out to puts, grown when they run short,
and freed by deletes once the delete is durable.

Design note. Pages freed by a delete stay pending under the delete's LSN, its
entry on the clean-up queue (LH 4), until that LSN is durable (``durable``,
which the journal calls after each flush): a crash before then replays the
delete's record, and must not find the pages given to another message.
A data set grows by a fifth when a put finds no room, or ahead of need at 90%
(``wants_growth``), as far as its dsexpand allows.

A growth's I/O (``posix_fallocate`` and fsync of the new extent, the header
naming it) runs in a worker thread (``_grow``), one at a time for a data set
(``OpenDataSets.growing``), while the loop serves every other request; the
space map grows on the loop once the new extent is durable, so no put is
given a page a crash could take back. A put that finds no room meanwhile
waits for it and runs again (``RunAgain``: nothing of it was done); a growth
ahead of need holds up no put at all. A failed one leaves the file, header
and map as they were.
"""

import structlog
import trio

from ...engine import CQSError, Reason, Structure
from ...smds import DataMap, ExpandFailed, NoSpace, Range, SmdsError
from ...smds.dataset import DataSet
from ...smds.spacemap import RESERVED_BLOCKS, SpaceMap, expanded_size
from ..liveconfig import LiveConfig
from ..registry import Registry
from ..runagain import RunAgain
from ..runtime import Runtime
from .availability import Availability, DataSetKey
from .opened import OpenDataSets
from .tuning import Tuning

log = structlog.get_logger()


class Space:
    def __init__(self, config: LiveConfig, registry: Registry, states: Availability,
                 tuning: Tuning, opened: OpenDataSets, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.registry = registry
        self.states = states
        self.tuning = tuning
        self.opened = opened
        self.short: set[DataSetKey] = set()  # a put found no room since the last expansion
        self.refused: dict[DataSetKey, str] = {}  # why its last expansion failed

    def allocate(self, dataset: DataSet, key: tuple[int, str], nbytes: int) -> list[Range]:
        """Pages for ``nbytes`` of a message to queue ``key``, the data set grown if it
        must be; raises SMDS_FULL if it cannot grow."""
        space = dataset.space
        assert space is not None
        self._beyond_reach(dataset, space, key, nbytes)
        try:
            ranges = space.allocate(key, nbytes)
        except NoSpace as err:
            self.short.add((dataset.structure, dataset.name))
            growth = self.grow(dataset)
            if growth is None:
                raise CQSError(
                    Reason.SMDS_FULL,
                    f"the data set of {dataset.name} in {dataset.structure} has no room for "
                    f"{nbytes} bytes ({err}) and cannot expand "
                    f"({self._why_not_expand(dataset)}); delete messages, or alter-smds "
                    f"--dsexpand yes with room on disk") from None
            raise RunAgain(growth, f"{nbytes} bytes wait for the data set of {dataset.name} "
                                   f"in {dataset.structure} to grow") from None
        if space.wants_growth:
            self.grow(dataset)  # ahead of need, as MQ does at 90%
        return ranges

    def _beyond_reach(self, dataset: DataSet, space: SpaceMap, key: tuple[int, str],
                      nbytes: int) -> None:
        """Refuse with SMDS_FULL, before any expansion, a put that needs more blocks
        than are free plus all the data set may still grow by: expanding to dsmax
        for it would only end in DSEXPAND(NO) and the same refusal."""
        needed = space.blocks_needed(key, nbytes)
        if needed <= space.free_blocks:
            return
        dsblock = space.dsblock
        dsmax = self.config.structure(dataset.structure).dsmax // dsblock * dsblock
        growth = max(0, dsmax - space.size) // dsblock \
            if self.tuning.dsexpand((dataset.structure, dataset.owner)) else 0
        if needed <= space.free_blocks + growth:
            return
        whole = dsmax // dsblock - RESERVED_BLOCKS  # data blocks of the data set at dsmax
        what = f"{nbytes} bytes need {needed} blocks of {dsblock} bytes and the data set of " \
               f"{dataset.owner} in {dataset.structure}"
        if needed > whole:
            raise CQSError(Reason.SMDS_FULL, f"{what} can never hold more than {whole} "
                                             f"(dsmax {dsmax}); nothing was changed")
        self.short.add((dataset.structure, dataset.owner))
        limit = f"it may grow by {growth} to dsmax" if growth else self._why_not_expand(dataset)
        raise CQSError(Reason.SMDS_FULL, f"{what} has {space.free_blocks} free ({limit}); "
                                         f"delete messages, or alter-smds --dsexpand yes with "
                                         f"room on disk")

    def give_back(self, dataset: DataSet, dmap: DataMap) -> None:
        """Free at once the space of a put that never became an entry."""
        assert dataset.space is not None
        dataset.space.free(dmap.ranges, None)

    def grow(self, dataset: DataSet) -> trio.Event | None:
        """Start growing the data set by a fifth in a worker thread if its dsexpand
        allows (the module note): the event set once it has grown or failed to,
        the one under way if there is one. None if it cannot grow: a refusal at
        dsmax turns its dsexpand off (seed 000: DSEXPAND(NO)) and says why."""
        key = (dataset.structure, dataset.name)
        if (growth := self.opened.growing.get(key)) is not None:
            return growth
        if not self.tuning.dsexpand(key) or self.opened.open.get(key) is not dataset:
            return None
        dsmax = self.config.structure(dataset.structure).dsmax
        new = expanded_size(dataset.size, dataset.header.dsblock, dsmax)
        if new is None:
            self._refused(key, ExpandFailed("at-dsmax", f"{dataset.path} is {dataset.size} "
                                                         f"bytes, dsmax {dsmax}",
                                            size=dataset.size, dsmax=dsmax))
            return None
        growth = self.opened.growing[key] = trio.Event()
        self.runtime.spawn(f"smds growth {key[0]} {key[1]}", self._grow, dataset, new, dsmax,
                           growth)
        return growth

    async def _grow(self, dataset: DataSet, new: int, dsmax: int, growth: trio.Event) -> None:
        key = (dataset.structure, dataset.name)
        old = dataset.size
        try:
            header = await trio.to_thread.run_sync(dataset.extend, new, dsmax)
        except ExpandFailed as err:
            self._refused(key, err)
        except (SmdsError, ValueError) as err:  # ValueError: abandoned before it began
            self.opened.damaged(key, "expand", err, dataset)
        else:
            dataset.grew(header)  # only now may its new pages be handed out
            self.short.discard(key)
            self.refused.pop(key, None)
            log.info("smds_expanded", structure=dataset.structure, owner=dataset.name,
                     size=old, new_size=dataset.size)
        finally:
            del self.opened.growing[key]
            growth.set()

    def _refused(self, key: DataSetKey, err: ExpandFailed) -> None:
        self.states.set(key, dsexpand="NO")
        self.refused[key] = str(err)
        log.warning("smds_expand_failed", structure=key[0], owner=key[1], size=err.size,
                    dsmax=err.dsmax, reason=err.reason, error=str(err),
                    action="dsexpand is now off for this data set; puts that need space "
                           "get SMDS_FULL")

    def _why_not_expand(self, dataset: DataSet) -> str:
        override = self.states.record((dataset.structure, dataset.name)).get("dsexpand")
        if override == "NO":
            if (why := self.refused.get((dataset.structure, dataset.name))) is not None:
                return f"dsexpand is off for it since its expansion failed: {why}"
            return "dsexpand is off for it (alter-smds, or a failed expansion: see the " \
                   "smds_expand_failed event)"
        if not self.tuning.dsexpand((dataset.structure, dataset.name)):
            return "dsexpand is off"
        return "it is at dsmax"

    def freed(self, structure: Structure, lsn: int) -> None:
        """After the record holding a request's deletes is appended at ``lsn``: the
        pages of the offloaded messages it deleted wait for it to be durable (a
        non-recoverable message's pages are free at once)."""
        for entry in structure.stamp_deleted(lsn):
            assert entry.map is not None and entry.store is not None
            if entry.entry_id in self.opened.lost:  # its pages were never in the map
                self.opened.lost.discard(entry.entry_id)
                continue
            key = (entry.store, entry.map.dataset)
            txid = lsn if entry.recoverable and lsn else None
            if key in self.opened.opening:  # its map is being built: freed once whole
                self.opened.opening[key].append((entry.map.ranges, txid))
                continue
            dataset = self.opened.open.get(key)
            if dataset is None or dataset.space is None:
                if self.states.record(key).get("map_time") is not None:  # saved, now stale
                    self.states.set(key, map_time=None)
                continue
            dataset.space.free(entry.map.ranges, txid)

    def durable(self, lsn: int) -> None:
        """The log is durable up to ``lsn``: pending pages are free for reuse and the
        clean-up queues let go of their entries."""
        opened = self.opened
        for dataset in opened.open.values():
            if dataset.space is not None and dataset.space.pending_pages:
                dataset.space.release(lsn)
        for structure in self.registry.structures():
            if structure.offload_rules is not None:
                structure.clean_up(lsn)
        if opened.open:  # none open, none to let go: this runs after every flush
            opened.release_inherited()
