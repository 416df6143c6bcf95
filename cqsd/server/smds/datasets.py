"""Shared message data sets as the daemon runs them (docs/smds.md): the data path.

Design note. A structure with ``offload = "smds"`` keeps only the data map of
an offloaded payload; the payload lives in the data set of (structure, owner).
This room puts and reads the message blocks, and is made of the rooms that
keep the rest: the data sets' states (availability.py), which are open
(opened.py, running restart processing, restart.py), their space (space.py),
their fdatasyncs (syncs.py), what alter-smds overrides (tuning.py) and the
displays (displays.py); the operator commands are commands.py, media recovery
mediarecovery.py. It is the journal's ``DataSync`` (journal.py): a record
naming blocks reaches the log only after the blocks are fsynced, so a durable
entry never points at blocks a power failure could take back.

Writes and reads are positioned calls made on the event loop. They copy to and
from the page cache, as the log's appends do, so a put keeps its place in
request order without a thread hand-off per message; only the fdatasyncs,
one per data set for every put waiting on it (group commit), go to a worker
thread.
"""

from pathlib import Path
from typing import Any

import structlog

from ...engine import CQSError, Entry, Put, Reason, Structure, StructurePair, parse_qtype
from ...engine.qtypes import check_name
from ...engine.structure import Op
from ...smds import BadPrefix, DataMap, SmdsError
from ...smds.datamap import dataset_name
from ...smds.dataset import DataSet
from .. import wire
from ..limits import Limits, offload_bound
from ..liveconfig import LiveConfig
from ..registry import Registry
from ..runtime import Runtime
from .availability import Availability
from .displays import Displays
from .opened import OpenDataSets
from .space import Space
from .syncs import Failures, Syncs
from .tuning import Tuning

log = structlog.get_logger()


class DataSets:
    def __init__(self, config: LiveConfig, data_dir: Path, repository_path: Path,
                 registry: Registry, limits: Limits, runtime: Runtime) -> None:
        self.config = config
        self.limits = limits
        self.data_dir = data_dir
        self.states = Availability(repository_path)
        self.tuning = Tuning(config, self.states)
        self.syncs = Syncs()
        self.open_sets = OpenDataSets(config, data_dir, registry, self.states, self.tuning,
                                      self.syncs)
        self.space = Space(config, registry, self.states, self.tuning, self.open_sets, runtime)
        self.displays = Displays(config, self.states, self.tuning, self.open_sets)

    # -- the data path -----------------------------------------------------------------

    def put(self, pair: StructurePair, owner: str, qtype: int | str, name: str, data: bytes,
            recoverable: bool, not_before: int | None = None) -> Entry:
        """Put a message (delayed until wall-clock ns ``not_before``, if given),
        offloading its payload to the data set of ``owner`` (the configured client
        putting it) if the structure it goes to says so."""
        target = pair.target(qtype, name) if pair.offloading else None
        if target is None or not target.offloads(len(data)):
            if recoverable:  # kept in the structure, it is logged in one record
                self.limits.check_record(len(data))
            return pair.put(qtype, name, data, recoverable, None, not_before)
        key = (parse_qtype(qtype), check_name(name))
        dataset, dmap = self._place(target.name, owner, key, data)
        try:  # a recoverable one's blocks are logged in records before its entry's (split)
            entry = pair.put(qtype, name, data, recoverable, dmap, not_before)
        except BaseException:
            self.space.give_back(dataset, dmap)
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
                self.space.give_back(dataset, dmap)
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
        key = (entry.store, dmap.dataset)
        dataset = self.open_sets.dataset(entry.store, dmap.dataset, create=False)
        try:
            return dataset.read(dmap, entry.entry_id)
        except BadPrefix as err:
            if entry.recoverable:
                self.open_sets.damaged(key, "read", err)
            else:
                self.open_sets.lose([entry], f"its block does not match its entry ({err})")
                raise CQSError(Reason.SMDS_UNAVAILABLE,
                               f"entry {entry.entry_id}: its data in the data set of "
                               f"{dmap.dataset} in {entry.store} is damaged ({err}); it was not "
                               f"recoverable and has been deleted") from None
        except SmdsError as err:
            self.open_sets.damaged(key, "read", err)
        raise self.open_sets.refusal(key, f"entry {entry.entry_id}: ")

    def undeliverable(self, entry: Entry) -> bool:
        """Whether a read passes over the message (docs/smds.md, "Read"): its data is in
        a data set that is not open and that no request may open now (FAILED,
        STOPPED, DISABLED, in error), so the messages after it are delivered."""
        dmap = entry.map
        if dmap is None:
            return False
        assert entry.store is not None  # set with the map
        key = (entry.store, dmap.dataset)
        return key not in self.open_sets.open and not self.states.state(key).may_open()

    def unavailable(self, entry: Entry) -> CQSError:
        """SMDS_UNAVAILABLE naming the state of the offloaded message's data set."""
        assert entry.map is not None and entry.store is not None
        return self.open_sets.refusal((entry.store, entry.map.dataset), f"entry {entry.entry_id}: ")

    def browsed(self, entry: Entry) -> dict[str, Any]:
        """The message as a browse shows it: with its payload, or, if its data set
        cannot give it now, with none and ``unavailable`` saying why."""
        try:
            if self.undeliverable(entry):
                raise self.unavailable(entry)
            return wire.browsed(entry, self.payload(entry))
        except CQSError as err:
            if err.reason != Reason.SMDS_UNAVAILABLE:
                raise
            return wire.browsed(entry, b"") | {"unavailable": err.message}

    def _place(self, structure: str, owner: str, key: tuple[int, str],
               data: bytes) -> tuple[DataSet, DataMap]:
        """Space for ``data`` in ``owner``'s data set: in a group, always the one of this
        node's incarnation, never one it inherited (docs/smds.md)."""
        writer = self.open_sets.writer()
        dataset = self.open_sets.dataset(structure, dataset_name(owner, writer), create=True)
        return dataset, DataMap.of(owner, data, self.space.allocate(dataset, key, len(data)),
                                   writer)

    def _write(self, dataset: DataSet, entry: Entry, data: bytes) -> None:
        assert entry.map is not None
        if self.open_sets.open.get((dataset.structure, dataset.name)) is not dataset:
            return  # an earlier write of the same request failed: reads say so
        try:
            dataset.write_message(entry.map, entry.entry_id, data, entry.recoverable)
        except SmdsError as err:  # the log has the blocks of a recoverable one: recovery
            self.open_sets.damaged((dataset.structure, dataset.name), "write", err)
            return
        if entry.recoverable:
            self.syncs.wrote(dataset)

    # -- the journal's DataSync ------------------------------------------------------

    def take_unsynced(self) -> bool:
        """Whether a record appended now must wait for ``sync`` (syncs.py)."""
        return self.syncs.take_unsynced()

    async def sync(self) -> None:
        """fdatasync every data set written since the last call; one that fails is
        FAILED."""
        self._failed(await self.syncs.sync())

    def sync_now(self) -> None:
        """``sync`` on the loop, for the stop path."""
        self._failed(self.syncs.sync_now())

    def durable(self, lsn: int) -> None:
        """The log is durable up to ``lsn`` (space.py)."""
        self.space.durable(lsn)

    def _failed(self, failed: Failures) -> None:
        for dataset, err in failed:
            self.open_sets.damaged((dataset.structure, dataset.name), "sync", err, dataset)

    # -- what the rest of the daemon asks of the data sets -------------------------------

    def freed(self, structure: Structure, lsn: int) -> None:
        """The pages a request's deletes freed wait for ``lsn`` (space.py)."""
        self.space.freed(structure, lsn)

    def rows(self, structure: str | None) -> list[dict[str, Any]]:
        """`display smds` and `display usage --type smds` (displays.py)."""
        return self.displays.rows(structure)
