"""What operators do to whole structures, and the rebuild at start.

RECOVER CFSTRUCT (``recover``), RESET CFSTRUCT ACTION(FAIL) (``fail``),
structure copy (``rebuild``, SETXCF START,REBUILD), ALTER (``alter``) and,
at start, the rebuild of every
structure from its image, its checkpoint and the log (``restart``). A
recovery runs Spark jobs for seconds or minutes; it belongs to the daemon,
not to the operator's connection (``detached``), so that a dropped
connection does not leave a structure half-recovered.
"""

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import trio

from ..config import DATA_ELEMENT, MAX_STRUCTURE_SIZE
from ..engine import CQSError, Reason, Structure, StructurePair
from ..engine.entry import ELEMENT
from ..records import rows_of
from ..recovery.keys import pair_of, remembered
from ..recovery.restart import load_recovered, rebuild_all
from ..srds import slots
from ..storage import image
from ..storage.datadir import DataDir
from . import notify
from .checkpoints import Checkpoints
from .clients import Clients
from .dedup import Dedup
from .definitions import Definition, Held
from .jobs import JobFailed, cut_args
from .journal import WRITER, Journal
from .liveconfig import LiveConfig
from .registry import Registry
from .runtime import Runtime
from .smds.datasets import DataSets
from .smds.mediarecovery import MediaRecovery, Plan
from .waiters import ReadWaiters

log = structlog.get_logger()


def copied(registry: Registry, pair: StructurePair,
           held: dict[str, Held] | None = None) -> StructurePair:
    """A new instance of ``pair`` as its definitions say (or with ``held``, by
    structure), holding every message, lock and watched queue of the old one: a
    structure copy (``rebuild``), or a warm pair given the sizes now in force."""
    new = registry.new_pair(pair.name, held)
    for old_s, new_s in zip(pair.structures(), new.structures(), strict=True):
        image.restore(new_s, rows_of(old_s))
    new.last_id = pair.last_id
    new.watched.update(pair.watched)
    return new


class Operations:
    def __init__(self, config: LiveConfig, datadir: DataDir, registry: Registry,
                 clients: Clients, journal: Journal, checkpoints: Checkpoints,
                 waiters: ReadWaiters, datasets: DataSets, runtime: Runtime,
                 dedup: Dedup | None = None) -> None:
        self.config = config
        self.datadir = datadir
        self.registry = registry
        self.clients = clients
        self.journal = journal
        self.checkpoints = checkpoints
        self.waiters = waiters
        self.datasets = datasets
        self.runtime = runtime
        self.dedup = dedup if dedup is not None else Dedup(0)
        # the structures an operator's recover is rebuilding now, each with the event
        # set when it ends
        self._recovering: dict[str, trio.Event] = {}
        self.media = MediaRecovery(datasets)

    @property
    def recovering(self) -> set[str]:
        """The structures an operator's recover is rebuilding now."""
        return set(self._recovering)

    async def recovered(self, name: str) -> None:
        """Until no recovery of ``name`` runs here. A planned move hands the pair over
        only then: the recovery goes on writing its checkpoints and data sets, and
        they would be those of a pair another node serves (a purge's empty
        checkpoint then covered records that node had served from the log)."""
        while (ended := self._recovering.get(name)) is not None:
            await ended.wait()

    def _ended(self, name: str) -> None:
        """The recovery of ``name`` is over, however it went."""
        ended = self._recovering.pop(name, None)
        if ended is not None:
            ended.set()

    def restart(self) -> tuple[set[str], set[str]]:
        """Rebuild every structure from its image and the log; returns the clients whose
        locks survived a clean stop, and those whose locks a crash left behind."""
        held: set[str] = set()
        crashed: set[str] = set()
        for r in rebuild_all(self.registry.structures(), self.datadir.images,
                             self.datadir.logstream, WRITER, self.journal.position,
                             self.datadir.srds, self._spark_recover,
                             self.config.daemon.spark_recovery_records,
                             lambda text: notify.status(text, extend=True)):
            log.info("structure_rebuilt", structure=r.structure, clean=r.clean, source=r.source,
                     messages=r.messages, records_replayed=r.replayed,
                     image_seconds=round(r.image_seconds, 3),
                     replay_seconds=round(r.replay_seconds, 3))
            if r.clean and r.replayed:
                log.warning("image_behind_log", structure=r.structure, records=r.replayed,
                            action="folded the records logged after the clean-stop image")
            (held if r.clean else crashed).update(r.lock_owners)
        for pair in self.registry.pairs.values():
            pair.derive_status()
        newest = self.journal.writer.last_timestamp
        self.dedup.install(remembered(self.datadir.logstream, {WRITER: self.journal.position},
                                      pair_of(self.registry.pairs), self.dedup.window,
                                      time.time_ns(), newest), newest)
        return held, crashed - held

    def _spark_recover(self, name: str) -> Path | None:
        """At start, before serving: the Spark recovery job folds a long log tail. On
        failure the daemon folds it itself (slower, but it starts)."""
        path = self.datadir.images / f"{name}.recovered"
        args = ["recover", "--structure", name, "--to-image", str(path)]
        log.info("spark_recovery_started", structure=name)
        try:
            result = self.checkpoints.jobs.run_before_serving(
                self.config.current, args, lambda seconds: notify.status(
                    f"recovering: {name} with the Spark job ({seconds:.0f} s)", extend=True))
        except JobFailed as err:
            log.error("spark_recovery_failed", structure=name, error=err.message)
            return None
        log.info("spark_recovery_done", structure=name, result=result)
        return path

    async def recover(self, name: str, purge: bool, why: str = "recover") -> dict[str, Any]:
        """RECOVER CFSTRUCT: mark ``name`` failed (its requests get STRUCTURE_FAILED, the
        others carry on), rebuild it — with its overflow structure, as IMS recovers
        the pair — from the newest checkpoint and the log with the recovery job, or,
        with ``purge``, empty it and make sure nothing older is ever recovered, and
        make it available again. Locks of clients still registered stay theirs; the
        others' go back as in peer recovery."""
        new, started, old = self._begin(name, why, purge)
        names = [s.name for s in new.structures()]
        plan = None
        try:
            if not purge:  # the data sets that must be restored (seed 000)
                plan = await self.media.start(names)
            replayed = await self._rebuild(new, purge, new.last_id, plan)
            if plan is not None:
                await self.media.finish(plan)
        except Exception as err:
            raise self._not_recovered(name, plan, err) from err
        finally:
            self._ended(name)
        self._still_ours(name, old)
        return await self._recovered(new, purge, why, started, replayed)

    async def recover_together(self, names: list[str]) -> dict[str, Any]:
        """RECOVER CFSTRUCT of a list (seed 002: "you can recover several CF structures
        simultaneously"): each pair failed and rebuilt as ``recover`` does, but by one
        recovery job folding every structure of them together. Returns
        ``{recovered: [what recover returns, per pair], failed: {name: why}}``: a pair
        that cannot be recovered (already recovering, its checkpoint or its log
        damaged, its image not loaded) stays failed, named with its reason, and the
        others are recovered all the same."""
        failed: dict[str, str] = {}
        if self.config.group is not None and len(set(names)) > 1:
            raise CQSError(Reason.INVALID_REQUEST, "in a group, recover one structure pair at "
                           "a time: each pair's log is read to its own seals' cuts")
        begun: dict[str, tuple[StructurePair, float, Plan]] = {}
        for name in dict.fromkeys(names):
            try:
                new, started, _ = self._begin(name, "recover", False)
            except CQSError as err:
                failed[name] = f"{err.reason}: {err.message}"
                continue
            try:
                plan = await self.media.start([s.name for s in new.structures()])
            except Exception as err:
                self._ended(name)
                failed[name] = self._not_recovered(name, None, err).message
                continue
            begun[name] = new, started, plan
        try:
            done = await self._rebuild_together([(p[0], p[2]) for p in begun.values()], failed)
        except Exception as err:
            for name, (_, _, plan) in begun.items():
                self._ended(name)
                failed[name] = self._not_recovered(name, plan, err).message
            return {"recovered": [], "failed": failed}
        recovered = []
        for name, (new, started, plan) in begun.items():
            self._ended(name)
            if name not in done:
                failed[name] = self._not_recovered(
                    name, plan, CQSError(Reason.STRUCTURE_FAILED, failed[name])).message
                continue
            await self.media.finish(plan)
            recovered.append(await self._recovered(new, False, "recover", started, done[name]))
        return {"recovered": recovered, "failed": failed}

    def _begin(self, name: str, why: str, purge: bool
               ) -> tuple[StructurePair, float, StructurePair]:
        """``name`` failed (if it is not already: by the operator, or a recovery that
        failed) and marked recovering; the empty pair it is rebuilt into, and the
        failed one."""
        if name in self._recovering:
            raise CQSError(Reason.INVALID_REQUEST, f"structure {name} is already being recovered")
        old = self.registry.failed.get(name)
        if old is None:
            old = self._fail(name, why, purge=purge)
        self._recovering[name] = trio.Event()
        new = self.registry.new_pair(name)
        new.last_id = old.last_id
        return new, time.monotonic(), old

    def _still_ours(self, name: str, old: StructurePair) -> None:
        """Raises STRUCTURE_FAILED if a group's node was fenced while recovering ``name``:
        its new owner took it over from the sealed log."""
        if self.registry.failed.get(name) is not old:
            raise CQSError(Reason.STRUCTURE_FAILED, f"recovery of {name}: this node lost "
                           "the structure while recovering it; its new owner took it over "
                           "from the sealed log")

    def _not_recovered(self, name: str, plan: Plan | None, err: Exception) -> CQSError:
        """``name`` stays failed, its restored data sets FAILED; the error to report."""
        reason = err.message if isinstance(err, CQSError) else f"{type(err).__name__}: {err}"
        if plan is not None:
            self.media.fail(plan, f"the recovery of {name} failed: {reason}")
        self.registry.definitions.failed(name, True)  # as fail's: until recovered
        log.error("structure_recovery_failed", structure=name, error=reason,
                  action="the structure stays failed; retry cqsctl recover, or --purge")
        return CQSError(Reason.STRUCTURE_FAILED, f"recovery of {name} failed, it stays "
                        f"failed: {reason}")

    async def _recovered(self, new: StructurePair, purge: bool, why: str, started: float,
                         replayed: int) -> dict[str, Any]:
        """``new`` in service in place of the failed pair; what recover returns."""
        name, names = new.name, [s.name for s in new.structures()]
        self._install(new)
        if purge:  # the data sets' contents are no longer needed: EMPTY
            await self.datasets.open_sets.purged(names, why)
        else:  # what the data sets hold is now what the log says
            await self.datasets.open_sets.reopen(names)
        for owner in sorted(set(new.client_stats()) - set(self.clients.sessions)):
            new.release_client(owner)
        self.runtime.settle()
        messages = new.stats()["messages"]
        source = "purge" if purge else "checkpoint and log"
        seconds = round(time.monotonic() - started, 3)
        log.info("structure_recovered", structure=name, source=source, messages=messages,
                 records_replayed=replayed, seconds=seconds)
        return {"structure": name, "source": source, "messages": messages,
                "records_replayed": replayed, "seconds": seconds}

    async def delete(self, name: str, force: bool) -> dict[str, Any]:
        """Structure delete (seed 004, "functional equivalent to IMS cold start"; MQ's
        DELETE CFSTRUCT, seed 000, only of an empty structure): the pair is emptied
        and its checkpoints replaced by empty ones, as ``recover --purge`` does, so
        nothing older is ever recovered; its log records stay, as history. Without
        ``force`` only a pair that holds no message is deleted: INVALID_REQUEST says
        how many it holds (or that a failed one's are unknown). Checked here, in the
        same step as the purge fails the pair, so no put slips in between."""
        held = self._held(name)
        if held and not force:
            what = ("is failed: what it holds is known only once it is recovered"
                    if held < 0 else f"holds {held} message{'s' * (held != 1)}")
            raise CQSError(Reason.INVALID_REQUEST,
                           f"structure {name} {what}; delete-structure deletes only an empty "
                           f"structure: empty it, or pass --force to delete it and its messages")
        log.warning("structure_delete", structure=name, messages=held, force=force)
        result = await self.recover(name, True, "delete structure")
        return {**result, "deleted": max(held, 0)}

    def _held(self, name: str) -> int:
        """The messages pair ``name`` holds, both structures counted; -1 if it is failed
        (its contents are the checkpoint's and the log's, unknown until recovered)."""
        if name in self.registry.failed:
            return -1
        return sum(s.stats()["messages"] for s in self.registry.structure(name).structures())

    def fail(self, name: str) -> dict[str, Any]:
        """RESET CFSTRUCT ACTION(FAIL), for recovery drills: the pair is failed as a
        lost structure is (its requests get STRUCTURE_FAILED, its waiting reads end)
        until ``recover`` rebuilds it. Raises INVALID_REQUEST for an overflow
        structure (the pair fails as one), STRUCTURE_FAILED if failed already."""
        primary = self.registry.overflow_of.get(name)
        if primary is not None:
            raise CQSError(Reason.INVALID_REQUEST, f"{name} is the overflow structure of "
                           f"{primary}: fail {primary}, which fails both")
        old = self._fail(name, "operator fail")
        self.registry.definitions.failed(name, True)  # until recovered, restarts included
        return {"structure": name, "status": "failed", "messages": old.stats()["messages"]}

    def _fail(self, name: str, why: str, **fields: Any) -> StructurePair:
        old = self.registry.fail(name)
        self.waiters.fail(old)
        log.warning("structure_failed", structure=name, why=why,
                    messages=old.stats()["messages"], **fields)
        return old

    async def _rebuild(self, new: StructurePair, purge: bool, last_id: int,
                       plan: Plan | None) -> int:
        """Fill ``new`` from the checkpoint and the log (or purge both), writing the
        blocks of the data sets ``plan`` restores; returns the records replayed.
        In a group the log is read up to the seals' cuts of the pair's earlier
        owners (``Checkpoints.covered``), as a takeover reads it (docs/group.md)."""
        replayed = 0
        position = await self._quiesced([new])
        for s in new.structures():
            if purge:
                slots.purge(self.datadir.srds, s.name, self.checkpoints.covered(s.name, position),
                            last_id)
                (self.datadir.images / f"{s.name}.base").unlink(missing_ok=True)
                continue
            path = self.datadir.images / f"{s.name}.recovered"
            cuts = self.checkpoints.covered(s.name, position)
            await self.checkpoints.jobs.run(
                self.config.current, ["recover", "--structure", s.name, "--to-image", str(path),
                                      *cut_args(cuts)])
            replayed += await self._load(s, plan)
        return replayed

    async def _quiesced(self, pairs: list[StructurePair]) -> int:
        """No checkpoint of ``pairs`` runs, and the log is durable to its end (they are
        failed: none of their records comes later); returns that end, in the series
        written now. A group node may roll to a new series while it waits (the old one
        is then acknowledged to its end, and the cuts name it there): the end is then
        the new series', whose LSNs start again. (It was the old one's, taken for the
        new series': a purge's checkpoint then covered records of the new series
        written after it, which later folds met as effects on messages not there.)"""
        for pair in pairs:
            for s in pair.structures():
                await self.checkpoints.finished(s.name)  # none starts while it is failed
        while True:
            writer, position = self.journal.writer_id, self.journal.position
            if not await self.journal.wait_durable(position, writer):
                raise CQSError(Reason.SHUTTING_DOWN, "the log failed")
            if self.journal.writer_id == writer:
                return position

    async def _load(self, s: Structure, plan: Plan | None) -> int:
        """Fill ``s`` from the image the recovery job wrote, and the log after it;
        returns the records replayed."""
        path = self.datadir.images / f"{s.name}.recovered"
        r = await trio.to_thread.run_sync(
            load_recovered, s, path, self.datadir.logstream,
            self.checkpoints.covered(s.name, self.journal.durable),
            plan.writer(s.name) if plan is not None else None)
        path.unlink()
        return r.replayed

    async def _rebuild_together(self, pairs: list[tuple[StructurePair, Plan]],
                                failed: dict[str, str]) -> dict[str, int]:
        """Fill ``pairs`` with one recovery job for all their structures, writing the
        blocks of the data sets each one's plan restores; returns the records replayed
        for each pair filled. A pair the job or its loading failed is put in
        ``failed`` with its reason; the job failing as a whole raises."""
        if not pairs:
            return {}
        position = await self._quiesced([pair for pair, _ in pairs])
        args = ["recover"]
        for pair, _ in pairs:
            for s in pair.structures():
                args += ["--structure", s.name]
        if self.config.group is not None:  # one pair (recover_together): its seals' cuts
            args += cut_args(self.checkpoints.covered(pairs[0][0].name, position))
        result = await self.checkpoints.jobs.run(self.config.current, args)
        if args.count("--structure") == 1:  # one: the job answers as recover of one does
            result = {"failed": {}}
        done: dict[str, int] = {}
        for pair, plan in pairs:
            broken = {s.name: result["failed"][s.name] for s in pair.structures()
                      if s.name in result["failed"]}
            if broken:
                failed[pair.name] = "; ".join(f"{n}: {why}" for n, why in broken.items())
                for s in pair.structures():
                    (self.datadir.images / f"{s.name}.recovered").unlink(missing_ok=True)
                continue
            try:
                done[pair.name] = sum([await self._load(s, plan) for s in pair.structures()])
            except Exception as err:  # noqa: BLE001 - this pair's failure, named
                failed[pair.name] = err.message if isinstance(err, CQSError) else \
                    f"{type(err).__name__}: {err}"
        return done

    def _install(self, new: StructurePair) -> None:
        self.registry.install(new)
        self.clients.announce(new)

    def rebuild(self, name: str, size: int | None) -> dict[str, Any]:
        """Structure copy (SETXCF START,REBUILD): every message, recoverable or not,
        locks and cold queue included, copied to a new instance while requests wait;
        nothing changes in the log. With ``size`` that is its new SIZE (and current
        size); without, a definition the config changed since is applied (the seed's
        pending policy change), keeping the current size within it."""
        pair = self.registry.pair_of(name)
        target = self.registry.physical(name)
        assert target is not None  # its pair is available
        held = self._redefined(name, size, target.elements_used * ELEMENT)
        started = time.perf_counter()
        new = copied(self.registry, pair, {name: held})
        self._install(new)
        self.registry.definitions.redefined(name, held)
        seconds = round(time.perf_counter() - started, 3)
        rebuilt = new.primary if new.primary.name == name else new.overflow
        assert rebuilt is not None  # not the primary: ``name`` is the overflow structure
        row = rebuilt.stats()
        log.info("structure_rebuilt_copy", structure=name, size=row["size"],
                 current_size=row["current_size"], messages=row["messages"], seconds=seconds)
        return {**row, **self.registry.definitions.describe(name), "seconds": seconds}

    def _redefined(self, name: str, size: int | None, used: int) -> Held:
        """What a rebuild makes of ``name``; INVALID_REQUEST if it cannot hold ``used``
        bytes."""
        definitions = self.registry.definitions
        held = definitions.held[name]
        if size is not None and not DATA_ELEMENT <= size <= MAX_STRUCTURE_SIZE:
            raise CQSError(Reason.INVALID_REQUEST,
                           f"rebuild of {name}: the size must be between {DATA_ELEMENT} and "
                           f"{MAX_STRUCTURE_SIZE} bytes, as a configured SIZE (or none, for "
                           f"the configured one), got {size}")
        if size is None:
            new = definitions.configured[name]
            current = min(max(held.current_size, new.initsize), new.size)
        else:
            new, current = Definition(size, min(held.definition.initsize, size)), size
        if current < used:
            why = f"{size} bytes" if size is not None else f"its configured size {new.size}"
            raise CQSError(Reason.INVALID_REQUEST,
                           f"rebuild of {name}: {why} is less than the {used} in use")
        return Held(new, current)

    def alter(self, name: str, size: int) -> dict[str, Any]:
        """SETXCF START,ALTER: change a structure's current size, up to its SIZE and
        never below what is in use."""
        pair = self.registry.pair_of(name)
        target = self.registry.physical(name)
        assert target is not None  # its pair is available
        (pair if name == pair.name else target).alter(size)
        self.runtime.settle()
        return target.stats()

    async def detached(self, operation: Callable[..., Awaitable[dict[str, Any]]],
                       *args: Any) -> dict[str, Any]:
        """Await ``operation`` run in the daemon's nursery rather than the caller's, so an
        operator's connection dropping does not cancel a recovery half-way."""
        done = trio.Event()
        outcome: list[dict[str, Any] | CQSError] = []

        async def run() -> None:
            try:
                outcome.append(await operation(*args))
            except CQSError as err:
                outcome.append(err)
            except Exception as err:  # the structure stays failed; the daemon goes on
                log.exception("internal_error", operation=operation.__name__)
                outcome.append(CQSError(Reason.INVALID_REQUEST, f"internal error: {err}"))
            finally:
                done.set()

        self.runtime.spawn(operation.__name__, run)
        await done.wait()
        if not outcome:
            raise CQSError(Reason.SHUTTING_DOWN, "the daemon stopped before it finished")
        if isinstance(outcome[0], CQSError):
            raise outcome[0]
        return outcome[0]
