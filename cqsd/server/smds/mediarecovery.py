"""Media recovery of data sets: what ``cqsctl recover`` does to them (seed 000,
"Shared message data set recovery", "Recovery scenarios"; docs/smds.md).

Design note. A recovery rebuilds the structure from its newest checkpoint and
the log; the offloaded payloads of its recoverable messages come back with it,
materialised from the checkpoint's data and the log's ``B`` effects. A data set
is restored from them only if it needs it: it is FAILED, or recovery finds it
unexpectedly empty, gone or otherwise invalid when it opens it. An ACTIVE data
set that passes its checks keeps its bytes, and only its space map is rebuilt
afterwards; an EMPTY one holds nothing to restore.

Each data set selected goes INRECOVER and is opened for recovery (made anew if
it has no valid header), with PARTIAL_RECOVERY set in its header before any
block is written. Every recoverable offloaded row's blocks are then written
at its map's pages as the structure is loaded, the data set fsynced, the flag
cleared, and it is RECOVERED; restart processing, when the structure is back,
rebuilds its space map, deletes the entries whose data is still missing and
makes it ACTIVE. If the recovery cannot finish — the job fails, a write fails,
the daemon stops — the data set goes back to FAILED with the flag still set,
so that a premature ``reset-smds --status recovered`` is caught at the next
open and the recovery can simply be repeated.

The writes run in the worker thread that loads the structure, on data set
objects of their own: no request can touch a failed structure's data sets.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from ...records import DATA, ID, MAP
from ...smds import BufferPool, DataMap, DataSetDamage, SmdsError
from ...smds.dataset import DataSet
from ...smds.pages import PAGE
from ...smds.states import Access, Avail, Event, Status
from .availability import DataSetKey
from .datasets import DataSets

log = structlog.get_logger()


@dataclass
class Plan:
    """The data sets one recovery restores, each open for recovery, and those whose
    restoring failed (and why)."""

    datasets: dict[DataSetKey, DataSet] = field(default_factory=dict)
    failed: dict[DataSetKey, str] = field(default_factory=dict)
    written: dict[DataSetKey, int] = field(default_factory=dict)  # messages written back

    def writer(self, structure: str) -> Callable[[list[Any]], None]:
        """What the loading of ``structure`` calls with each offloaded row, in its
        worker thread: the row's blocks written back if its data set is restored."""
        return lambda row: self._write(structure, row)

    def _write(self, structure: str, row: list[Any]) -> None:
        dmap = DataMap.decode(row[MAP])
        key = (structure, dmap.dataset)
        dataset = self.datasets.get(key)
        if dataset is None or key in self.failed or len(row[DATA]) != dmap.length:
            return  # not restored, or its data is not in the log: restart deletes it
        try:
            end = max(r.page + r.pages for r in dmap.ranges) * PAGE
            if end > dataset.size:
                dataset.grow_to(end)
            dsblock = dataset.header.dsblock
            dmap.check_within(dsblock // PAGE, dataset.size // dsblock)
            dataset.write_message(dmap, row[ID], row[DATA])
        except (SmdsError, ValueError) as err:
            self.failed[key] = f"entry {row[ID]}: {err}"
            return
        self.written[key] = self.written.get(key, 0) + 1


class MediaRecovery:
    def __init__(self, datasets: DataSets) -> None:
        self.ds = datasets
        self.states = datasets.states

    async def start(self, structures: list[str]) -> Plan:
        """Select the data sets of ``structures`` (failed by now) that need restoring,
        each INRECOVER and open for recovery with PARTIAL_RECOVERY set; the others'
        saved space maps are no longer current."""
        plan = Plan()
        for key in self.ds.open_sets.keys(structures):
            await self.ds.open_sets.grown(key)  # one abandoned may still be growing
            state = self.states.state(key)
            if self.ds.open_sets.open.get(key) is None and state.status in (Status.ACTIVE,
                                                                      Status.RECOVERED) \
                    and state.access != Access.DISABLED and state.avail != Avail.STOPPED:
                problem = await trio.to_thread.run_sync(self._probe, key)
                if problem is not None:
                    self.states.fire(key, Event.FOUND_INVALID, problem)
            if self.states.record(key).get("map_time") is not None:
                self.states.set(key, map_time=None)  # rebuilt after recovery (seed 000)
            if self.states.state(key).status != Status.FAILED:
                continue
            self.states.fire(key, Event.RECOVERY_START, "cqsctl recover")
            try:
                plan.datasets[key] = await trio.to_thread.run_sync(
                    self._prepare, key, self.ds.tuning.pool(key[0]))
            except (SmdsError, OSError) as err:
                self.states.fire(key, Event.RECOVERY_FAIL, f"cannot be opened for recovery: "
                                                           f"{err}")
                continue
            log.info("smds_recovery_started", structure=key[0], owner=key[1],
                     size=plan.datasets[key].size)
        return plan

    def _probe(self, key: DataSetKey) -> str | None:
        """Why recovery finds the data set invalid when it opens it, or None when it
        passes its checks (or cannot be opened for a reason not its own)."""
        created = self.states.record(key).get("created") or None
        owner, writer = self.ds.open_sets.split(key[1])
        try:
            if self.ds.open_sets.inherited(key[1]):  # read, never written, unless restored
                DataSet.inherit(self.ds.data_dir, key[0], owner, writer or "",
                                created=created).abandon()
            else:
                DataSet.open(self.ds.data_dir, key[0], owner, writer=writer, map_time=None,
                             created=created).abandon()
        except FileNotFoundError:
            return "recovery found it gone"
        except DataSetDamage as err:
            return f"recovery found it invalid: {err}"
        except OSError:
            return None  # not allowed to open it: the operator's to look at
        return None

    def _prepare(self, key: DataSetKey, pool: BufferPool) -> DataSet:
        """Open for recovery (made anew without a valid header), PARTIAL_RECOVERY set;
        its writes go past ``pool``, forgetting what it holds of them."""
        structure = key[0]
        owner, writer = self.ds.open_sets.split(key[1])
        try:
            dataset = DataSet.open(self.ds.data_dir, structure, owner, map_time=None,
                                   recovering=True, pool=pool, writer=writer)
        except (FileNotFoundError, DataSetDamage) as err:
            sc = self.ds.config.structure(structure)
            dataset = DataSet.create(self.ds.data_dir, structure, owner, dsblock=sc.dsblock,
                                     dssize=sc.dssize, pool=pool, replace=True, writer=writer)
            log.warning("smds_recovery_formatted", structure=structure, owner=key[1],
                        reason=str(err))
        try:
            dataset.mark_recovery(True)
        except SmdsError:
            dataset.abandon()
            raise
        return dataset

    async def finish(self, plan: Plan) -> None:
        """Every block written: each data set fsynced, its flag cleared, RECOVERED; a
        data set whose restoring failed goes back to FAILED."""
        for key, dataset in sorted(plan.datasets.items()):
            if key in plan.failed:
                dataset.abandon()
                self.states.fire(key, Event.RECOVERY_FAIL, plan.failed[key])
                continue
            try:
                await trio.to_thread.run_sync(_finish_one, dataset)
            except SmdsError as err:
                dataset.abandon()
                self.states.fire(key, Event.RECOVERY_FAIL, f"{err}")
                continue
            self.states.set(key, created=dataset.header.created, map_time=None)
            log.info("smds_recovered", structure=key[0], owner=key[1],
                     messages=plan.written.get(key, 0), size=dataset.size)
            self.states.fire(key, Event.RECOVERY_DONE, "its messages were written back")

    def fail(self, plan: Plan, why: str) -> None:
        """The recovery did not finish: each data set FAILED, its flag left set."""
        for key, dataset in sorted(plan.datasets.items()):
            dataset.abandon()
            self.states.fire(key, Event.RECOVERY_FAIL, why)


def _finish_one(dataset: DataSet) -> None:
    dataset.sync()
    dataset.mark_recovery(False)
    dataset.abandon()
