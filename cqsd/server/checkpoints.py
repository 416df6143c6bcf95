"""Structure checkpoints (SRDS) from the daemon's side: when to take one, running
the Spark job, and trimming the log behind the slots.

Design note. The daemon never hosts a JVM: a checkpoint is ``python -m
cqsd.srds checkpoint`` in a child process that only gets CPU the daemon
leaves idle (SCHED_IDLE: Linux still gives it a sliver when none is idle, so
it is slowed, never stopped). It folds the current slot with the log up to a
cut the daemon chooses (its durable LSN, so the job never reads a record
still being written) and reports one JSON line. The structure is not paused:
records logged after the cut are simply the next checkpoint's tail. One job
per structure at a time; an operator asking while one runs joins it.
"""

import functools
import os
import time
from collections.abc import Callable, Iterator

import structlog
import trio

import logstream
from logstream.durable import fsync_dir
from logstream.segment import lock_name
from logstream.series import bytes_between, list_segments, list_series

from ..engine import Structure
from ..recovery.sealed import starting_point
from ..srds import slots
from ..srds.manifest import ManifestError
from ..srds.slots import SlotError
from ..storage import image, repository
from ..storage.datadir import DataDir
from ..storage.image import ImageError
from ..storage.repository import RepositoryError
from .dedup import window_of
from .jobs import JobFailed, Jobs, cut_args
from .journal import Journal
from .liveconfig import LiveConfig
from .runtime import Runtime

log = structlog.get_logger()
TRIGGER_POLL = 5.0  # seconds between checks of the automatic triggers
RETRY_MAX = 300.0  # seconds: a failing automatic checkpoint is retried after 5, 10, ... 300
NEVER = 1 << 62  # a byte count the log never reaches
# seconds a dead series is kept at least after its last write, whatever the windows: a
# node that has opened a new series and not yet said so in etcd writes it already
RETIRE_AFTER = 300.0


class Checkpoints:
    """Automatic and operator checkpoints of the daemon's structures, and log trimming.

    The volume trigger counts, per structure, the log a crash restart of it would
    read and that it keeps from being trimmed: every record after the cut of its
    newest checkpoint, whoever's it is. That is known at start from the log on
    disk and the slots' manifests, so a daemon restarted often still checkpoints
    (and a checkpoint a crash interrupted starts again at once), and a structure
    with little traffic of its own cannot hold the log back for ever."""

    def __init__(self, config: LiveConfig, datadir: DataDir, journal: Journal,
                 physical: Callable[[str], Structure | None], runtime: Runtime) -> None:
        """``physical(name)`` is the live structure of that name (None while it is
        failed); ``runtime`` starts a checkpoint as a supervised task."""
        self.config = config
        self.datadir = datadir
        self.journal = journal
        self.physical = physical
        self.runtime = runtime
        self.srds = datadir.srds
        self.jobs = Jobs()  # checkpoint and recovery jobs, for display jobs
        self.names = [sc.name for sc in self.config.structures]  # overflow structures too
        self.overflow_of = {sc.name: sc.overflow for sc in self.config.structures if sc.overflow}
        self.primary_of = {sc.overflow: sc.name for sc in self.config.structures if sc.overflow}
        # a group's sealed series of a pair, by writer (docs/group.md); none alone
        self.sealed: Callable[[str], dict[str, int]] = _none
        # a group's series still written: every live node's current one (none alone;
        # it says None until the node has read its group)
        self.live_series: Callable[[], set[str] | None] | None = None
        # (pair, series): the pairs this node has owned while writing its series
        self._held_in: set[tuple[str, str]] = set()
        # what a structure is owed is ``logged - mark``: the log after its newest cut
        self.mark: dict[str, int] = {}
        self.last_time: dict[str, float] = {}  # when its newest cut was taken
        self.last_seconds: dict[str, float] = {}  # how long its last checkpoint took
        # structures with no checkpoint at all: their last_time is the log's oldest record
        self.none_yet: set[str] = set()
        self._folded: dict[str, int] = {}  # log bytes a crash restart now folds for it
        writer = journal.writer
        for name in self.names:
            position, self.last_time[name] = self._newest(name)
            self.mark[name] = -writer.bytes_after(position)
            self._folded[name] = writer.bytes_after(max(position, self._imaged(name)))
        self._retry: dict[str, tuple[float, float]] = {}  # failed: (retry from, next delay)
        self._running: dict[str, _Run] = {}
        self._one_job = trio.Lock()  # one JVM at a time: the daemon keeps the other core
        self._over = trio.Event()  # set when a structure may owe a checkpoint by volume
        self._basing = trio.Lock()  # one base image save at a time
        # ``logged`` at which the next structure reaches the volume: the journal calls
        # note_logged once its writer has written that much (run sets it)
        journal.written_due = NEVER
        for name, why in self._due():
            log.info("checkpoint_due", structure=name, why=why, log_bytes=self.owed(name),
                     since=round(self.last_time[name], 3))
        for name in self._bases_due():
            log.info("base_image_due", structure=name, folded_bytes=self._folded[name])

    def covered(self, name: str, position: int) -> dict[str, int]:
        """The log a checkpoint of ``name`` at ``position`` of this daemon's series
        covers: with the cuts of a group's sealed series (docs/group.md)."""
        return {**self._seals(name), self.journal.writer_id: position}

    def _pair(self, name: str) -> str:
        """The pair ``name`` belongs to: its primary structure's name."""
        return self.primary_of.get(name, name)

    def _seals(self, name: str) -> dict[str, int]:
        """The cuts of the sealed series of ``name``'s pair (none for a daemon alone)."""
        return self.sealed(self._pair(name))

    def owed(self, name: str) -> int:
        """Log bytes after the cut of ``name``'s newest checkpoint."""
        return self.logged - self.mark[name]

    def _newest(self, name: str) -> tuple[int, float]:
        """The log position and time of ``name``'s newest checkpoint; with none, the
        whole log is owed, since its oldest record."""
        recorded = None
        try:
            recorded = slots.newest_recorded(self.srds, name)
        except ManifestError as err:  # the restart refuses it if it needs it
            log.warning("srds_manifest_unreadable", structure=name, error=str(err))
        if recorded is not None:
            return recorded[0].get(self.journal.writer_id, 0), recorded[1]
        self.none_yet.add(name)
        journal = self.journal
        try:
            first = next(logstream.read(journal.directory,
                                        cut={journal.writer_id: journal.position}), None)
        except logstream.LogstreamError:  # the restart reports it
            first = None
        return 0, first.timestamp / 1e9 if first is not None else time.time()

    def _imaged(self, name: str) -> int:
        """The log position of ``name``'s clean-stop image or crash-recovery base
        image, whichever is newer (0 if none)."""
        images, covered, writer = self.datadir.images, 0, self.journal.writer_id
        for path in (image.path_for(images, name), images / f"{name}.base"):
            try:
                covered = max(covered, image.read_header(path, name)["lsn"].get(writer, 0))
            except ImageError:
                pass  # none, or damaged: the restart refuses it if it needs it
        return covered

    def held(self, pair: str) -> None:
        """This node owns pair ``pair`` now (a group's takeover): its records go into
        this node's series, which the pair needs once another node owns it, until a
        slot of the pair names the series (``_needed_from``)."""
        me = self.journal.writer_id
        self._held_in = {(p, series) for p, series in self._held_in if series == me}
        self._held_in.add((pair, me))

    async def taken_over(self, pair: str, cut: dict[str, int]) -> None:
        """This node took pair ``pair`` over (docs/group.md) at the sealed series' ``cut``:
        what it owes is counted from the log of every earlier owner, not from this
        node's series alone. The sealed series after the pair's newest checkpoint are
        owed a checkpoint by volume as a restart's log would be, and if a cold rebuild
        would now fold checkpoint_log_volume bytes or more, the pair is saved as its
        base image at once, as after a crash restart: without that, in a group whose
        owners come and go faster than the volume fills one series, nothing was ever
        checkpointed and each cold takeover read the whole history of the pair."""
        names = [pair, *([self.overflow_of[pair]] if pair in self.overflow_of else [])]
        try:
            owed = await trio.to_thread.run_sync(self._owed_by_seals, names, cut)
        except (OSError, ImageError, ManifestError) as err:
            log.warning("takeover_log_not_counted", structure=pair, error=str(err))
            return
        for name, (since_slot, since_base) in owed.items():
            self.mark[name] = self.logged - since_slot
            self._folded[name] = since_base
        self._over.set()  # the volume trigger counts again
        await self._save_bases()

    def _owed_by_seals(self, names: list[str], cut: dict[str, int]
                       ) -> dict[str, tuple[int, int]]:
        """For each structure, the bytes of the sealed series ``cut`` after its newest
        checkpoint, and after its base (the newer of that and its base image)."""
        owed, series = {}, list_series(self.datadir.logstream)  # one listing of them all
        for name in names:
            recorded = slots.newest_recorded(self.srds, name)
            slot = recorded[0] if recorded is not None else {}
            base_path = self.datadir.images / f"{name}.base"
            based = image.read_header(base_path, name)["lsn"] if base_path.exists() else None
            chosen = starting_point(slot if recorded is not None else None, based, cut)
            base = based if chosen == "base" and based is not None else slot
            since_slot, since_base = (sum(
                bytes_between(series.get(writer, []), start.get(writer, 0), lsn + 1)
                for writer, lsn in cut.items()) for start in (slot, base))
            owed[name] = since_slot, since_base
        return owed

    async def _save_bases(self) -> None:
        """A crash restart (or takeover) that folded checkpoint_log_volume bytes of log
        or more for a structure saves it at once as its crash-recovery base image: a
        daemon killed again before a checkpoint job can finish (a JVM takes ten
        seconds or more) then folds only what was logged after this start."""
        if self._bases_due():  # none: not even a schedule point
            async with self._basing:
                await self._save_due_bases()

    async def _save_due_bases(self) -> None:
        journal = self.journal
        writer, position = journal.writer_id, journal.position
        structures = {name: s for name in self._bases_due()
                      if (s := self.physical(name)) is not None}
        # what each covers, as of the snapshot: the node may roll to a new series, or
        # hear of new seals, before its records are durable
        taken = {name: (image.snapshot(s), s.last_id, self.covered(name, position))
                 for name, s in structures.items()}
        if not taken or not await journal.wait_durable(position, writer):
            return
        for name, (rows, last_id, covered) in taken.items():
            if self.physical(name) is not structures[name]:
                continue  # no longer served here (released, or this node was fenced)
            started = time.monotonic()
            path = self.datadir.images / f"{name}.base"
            try:
                await trio.to_thread.run_sync(image.write_rows, path, name, rows, len(rows),
                                              covered, last_id)
            except (OSError, ImageError) as err:
                log.error("base_image_failed", structure=name, error=str(err))
                continue
            log.info("base_image_saved", structure=name, messages=len(rows), lsn=position,
                     folded_bytes=self._folded[name],
                     seconds=round(time.monotonic() - started, 3))
            self._folded[name] = 0

    def _bases_due(self) -> list[str]:
        volume = self.config.daemon.checkpoint_log_volume
        return [name for name in self.names if volume and self._folded[name] >= volume]

    async def take(self, name: str, why: str) -> dict:
        """Checkpoint structure ``name`` (or join the one running) and return the job's
        result; raises JobFailed. The job belongs to the daemon, not to the caller: a
        caller that goes away does not kill it.

        A primary's overflow structure is checkpointed with it (seed 004: the
        checkpoint is of "the structure pair"), started at the same moment so that
        neither stays on an older slot; its result is the primary's ``overflow``."""
        overflow = self.overflow_of.get(name)
        run = self._start(name, why)
        runs = [run] if overflow is None else [run, self._start(overflow, why)]
        for each in runs:
            await each.done.wait()
        ours = _outcome(name, run)
        if overflow is None:
            return ours
        try:
            theirs = _outcome(overflow, runs[1])
        except JobFailed as err:
            raise JobFailed(f"{name} was checkpointed in {ours.get('slot')}, but its "
                            f"overflow structure {overflow} was not: {err.message}") from None
        return {**ours, "overflow": theirs}

    def _start(self, name: str, why: str) -> "_Run":
        """The checkpoint of ``name`` running now, started if none is."""
        run = self._running.get(name)
        if run is None:
            run = self._running[name] = _Run()
            self.runtime.spawn(f"checkpoint of {name}", self._take, name, why, run)
        return run

    async def finished(self, name: str) -> None:
        """Wait for a checkpoint of ``name`` that is running, if any (a recovery must
        not race one: the job holds the slots' lock, and would install older content)."""
        run = self._running.get(name)
        if run is not None:
            await run.done.wait()

    async def _take(self, name: str, why: str, run: "_Run") -> None:
        try:
            run.result = await self._checkpoint(name, why)
        except JobFailed as err:
            run.result = err
        finally:
            del self._running[name]
            run.done.set()

    async def _checkpoint(self, name: str, why: str) -> dict:
        # acknowledged, not durable: a deposed owner that has not yet heard of it may
        # have fsynced records past its seal, which no checkpoint may cover
        cut, started = self.journal.acknowledged, time.time()
        mark, self.mark[name] = self.mark[name], self.logged
        log.info("checkpoint_started", structure=name, why=why, cut=cut)
        try:
            result = await self._make_slot(name, cut)
        except JobFailed as err:
            self.mark[name] = mark  # still owed a checkpoint
            clock, delay = time.monotonic(), self._retry.get(name, (0.0, TRIGGER_POLL))[1]
            self._retry[name] = (clock + delay, min(2 * delay, RETRY_MAX))
            log.error("checkpoint_failed", structure=name, error=err.message,
                      retry_in=round(delay, 1))
            raise
        self._retry.pop(name, None)
        self.last_time[name] = started
        self.none_yet.discard(name)
        self.last_seconds[name] = round(time.time() - started, 3)
        log.info("checkpoint_taken", structure=name, slot=result.get("slot"),
                 rows=result.get("rows"), records=result.get("records"),
                 seconds=result.get("seconds"), lsn=result.get("lsn"))
        await self._cover_the_rest()
        # off the loop: listing, unlinking and a directory fsync, on a network or FUSE
        # file system seconds at times, and a group may checkpoint every few seconds
        # the series and position as they are now: a group node may roll to a new
        # series meanwhile, and this trim is of the one they name
        await trio.to_thread.run_sync(self._trim, self.journal.writer, self.journal.position,
                                      self._live(), time.time())
        return result

    async def _make_slot(self, name: str, cut: int) -> dict:
        """The checkpoint itself: an empty slot, at once, for a structure holding no
        message (every record of it so far folds to nothing), else the Spark job."""
        s = self.physical(name)
        if s is not None and not s.stats()["messages"]:
            return await self._empty(name, self.journal.position, s.last_id)
        covered = self.covered(name, cut)  # before any await: the series may roll
        async with self._one_job:
            return await self.jobs.run(self.config.current,
                                       ["checkpoint", "--structure", name,
                                        *cut_args(covered)], background=True)

    async def _empty(self, name: str, position: int, last_id: int) -> dict:
        """An empty slot at ``position``, where ``name`` held no message: exact once
        ``position`` is durable. Recorded in the repository as a job's would be."""
        started = time.time()
        writer, lsn = self.journal.writer_id, self.covered(name, position)
        if not await self.journal.wait_durable(position, writer):
            raise JobFailed("the log failed")
        try:
            base = slots.newest_recorded(self.srds, name)
            slot = slots.empty_checkpoint(self.srds, name, lsn, last_id)
            await trio.to_thread.run_sync(functools.partial(
                repository.record_backup, self.datadir.repository, structure=name,
                slot=slot.name, lsn_from=base[0] if base else {}, lsn_to=lsn, started=started,
                finished=time.time(), rows=0, records=0, status="ok"))
        except (SlotError, ManifestError, RepositoryError, OSError) as err:
            raise JobFailed(f"empty checkpoint of {name}: {err}") from err
        return {"structure": name, "slot": slot.name, "lsn": slot.lsn, "rows": 0,
                "last_id": slot.last_id, "records": 0, "seconds": round(time.time() - started, 3)}

    async def _cover_the_rest(self) -> None:
        """The log is trimmed only behind every structure's checkpoints, so give each
        structure that has none one: an empty slot at once (before the trim that
        follows) for a structure holding no message, a job for the others. The
        empty slot is of that structure alone: taken with its pair, it waited for
        the checkpoint running this (an overflow structure's), which waited for it
        in turn, for ever, and the log was never trimmed again."""
        clock = time.monotonic()
        for name in self.names:
            s = self.physical(name)
            if name in self._running or s is None or self._positions(name) != []:
                continue  # running, failed (its recovery decides), or covered
            if self._retry.get(name, (0.0,))[0] > clock:
                continue  # its last job failed: it waits out its back-off
            if s.stats()["messages"]:
                self.runtime.spawn(f"checkpoint of {name}", self._quietly, name, "first")
            else:  # an error is logged, and the next checkpoint tries again
                await self._start(name, "first").done.wait()

    def trim(self) -> None:
        """Delete log segments that no slot of any structure still needs, once they are
        older than ``log_retention`` and than ``dedup_window`` (a start reads the keys
        of that window back from the log, cqsd/recovery/keys.py). (A crash restart
        starts from a base image only when it is newer than the slots.) A failure to
        delete one is logged, and the next checkpoint tries again."""
        self._trim(self.journal.writer, self.journal.position, self._live(),
                   min(time.time(), self._files_now()))

    def _files_now(self) -> float:
        """Now on the clock that sets the log's file times (a shared file system's
        server's), read by touching this series' lock file. Segments' ages are
        counted on it: on this node's clock, minutes ahead of it, every segment of
        the window would look old enough to go (docs/group.md, "Clocks")."""
        path = self.datadir.logstream / lock_name(self.journal.writer.writer_id)
        try:
            os.utime(path)
            return path.stat().st_mtime
        except OSError:
            return time.time()

    def _live(self) -> set[str] | None:
        """The series a group's live nodes write, read on the loop; None alone, or
        before the node has read its group (nothing is retired then)."""
        return None if self.live_series is None else self.live_series()

    def _trim(self, writer: logstream.Writer, position: int, live: set[str] | None,
              now: float) -> None:
        """``trim`` of series ``writer``, appended up to ``position``, at wall-clock time
        ``now``; in a group, the dead series (not in ``live``) are retired too."""
        me = writer.writer_id
        cutoff = now - max(self.config.daemon.log_retention, window_of(self.config.current))
        if live is not None:
            self._retire(me, live, min(cutoff, now - RETIRE_AFTER))
        keep_from = min((self._needed_from(name, me) for name in self.names), default=0)
        keep_from = min(keep_from, position + 1)
        if keep_from <= 1:
            return
        try:
            for seg in list_segments(self.datadir.logstream, me):
                if seg.path.stat().st_mtime > cutoff:  # its last record is too recent to go
                    keep_from = min(keep_from, seg.first_lsn)
                    break
            gone = writer.trim(keep_from)
        except OSError as err:
            log.error("log_trim_failed", before_lsn=keep_from, error=str(err))
            return
        if gone:
            log.info("log_trimmed", before_lsn=keep_from, segments=len(gone))

    def _retire(self, me: str, live: set[str], cutoff: float) -> None:
        """In a group: delete the whole of every dead series that no recovery can need
        any more (docs/group.md, "Dead series"). Every takeover, fence and restart
        leaves one, and each costs every later takeover a listing and its seal's cut.
        A series is dead when no live node writes it, and needed no more when every
        slot, base image and clean image of every structure names it at the cut a
        seal of the structure's pair made of it, or past it (what lies past a cut is
        a deposed owner's and never counts; a slot its own writer took while it was
        live names it short of its cut, and a job starting from that slot reads on
        to the cut), and its last record is older than ``log_retention``, the
        ``dedup_window`` and RETIRE_AFTER."""
        series = list_series(self.datadir.logstream)
        dead = set(series) - live - {me}
        if not dead:
            return
        for name in self.names:
            named = self._positions(name)
            if not named:  # no checkpoint, or a manifest unreadable: every record counts
                return
            for path in (self.datadir.images / f"{name}.base",
                         image.path_for(self.datadir.images, name)):
                if not path.exists():
                    continue
                try:
                    named.append(image.read_header(path, name)["lsn"])
                except (OSError, ImageError):
                    return  # a rebuild reports it
            cut = self._seals(name)
            for lsn in named:
                dead &= {writer for writer, at in lsn.items() if at >= cut.get(writer, at)}
        for writer in sorted(dead):
            segments = series[writer]
            try:
                if segments[-1].path.stat().st_mtime > cutoff:
                    continue
            except FileNotFoundError:  # every node retires: another one did, since the listing
                continue
            try:
                for seg in segments:
                    seg.path.unlink(missing_ok=True)
                (self.datadir.logstream / lock_name(writer)).unlink(missing_ok=True)
                fsync_dir(self.datadir.logstream)
            except OSError as err:
                log.error("series_retire_failed", writer=writer, error=str(err))
                return
            log.info("series_retired", writer=writer, segments=len(segments))

    def _needed_from(self, name: str, me: str) -> int:
        """The first LSN of this daemon's series ``me`` a recovery of ``name`` may need:
        the one after its older valid slot; 1 (the whole log) while it has no checkpoint,
        or its manifest is unreadable. In a group, a pair another node owns needs this
        series where its slots name it, and, until one does, all of it if this node
        owned the pair while writing it, or a seal of the pair cut it: the series holds
        the pair's records from then (a planned move keeps the series, and so does a
        fence until the node rolls), and only a slot taken since holds them elsewhere
        (docs/group.md, "Trimming")."""
        slots_of = self._positions(name)
        if slots_of is not None and self.physical(name) is None and self.sealed is not _none:
            slots_of = [lsn for lsn in slots_of if me in lsn]
            if not slots_of:
                held = (self._pair(name), me) in self._held_in
                return 1 if held or self._seals(name).get(me, 0) else NEVER
        positions = [lsn.get(me, 0) for lsn in slots_of or ()]
        if not positions:
            return 1
        return min(positions) + 1

    def _positions(self, name: str) -> list[dict[str, int]] | None:
        """The log positions of ``name``'s slots; None if its manifest is unreadable."""
        try:
            return slots.recorded_positions(self.srds, name)
        except ManifestError as err:
            log.warning("srds_manifest_unreadable", structure=name, error=str(err))
            return None

    @property
    def logged(self) -> int:
        """Log bytes appended in this run: owed by every structure, whichever records
        they are, since a crash restart of any of them reads them."""
        return self.journal.writer.bytes_written

    def note_logged(self) -> None:
        """Records were appended: wake the trigger if one is owed a checkpoint now."""
        if self.logged >= self.journal.written_due:
            self._over.set()

    async def run(self) -> None:
        """The automatic triggers: log volume, and time since the last checkpoint. They
        are checked at once (a checkpoint a crash interrupted is owed again), whenever
        a structure reaches the volume, and every TRIGGER_POLL seconds."""
        self.trim()  # behind checkpoints taken before the restart
        await self._save_bases()
        d = self.config.daemon
        if not (d.checkpoint_interval or d.checkpoint_log_volume):
            return
        while True:
            for name, why in list(self._due()):
                self.runtime.spawn(f"checkpoint of {name}", self._quietly, name, why)
            volume = d.checkpoint_log_volume
            self.journal.written_due = min((self.mark[name] + volume for name in self._waiting()),
                                           default=NEVER) if volume else NEVER
            with trio.move_on_after(TRIGGER_POLL):
                await self._over.wait()
            self._over = trio.Event()

    def _waiting(self) -> list[str]:
        """The structures a trigger may start a checkpoint of now: available, none of
        theirs running, and not waiting to retry a failed one."""
        clock = time.monotonic()
        return [name for name in self.names
                if name not in self._running and self.physical(name) is not None
                and self._retry.get(name, (0.0,))[0] <= clock]

    def _due(self) -> Iterator[tuple[str, str]]:
        """The structures owed a checkpoint now, and why."""
        d, now = self.config.daemon, time.time()
        for name in self._waiting():
            if d.checkpoint_log_volume and self.owed(name) >= d.checkpoint_log_volume:
                yield name, "log_volume"
            elif d.checkpoint_interval and now - self.last_time[name] >= d.checkpoint_interval:
                yield name, "interval"

    async def _quietly(self, name: str, why: str) -> None:
        try:
            await self.take(name, why)
        except JobFailed:
            pass  # logged; the trigger fires again


class _Run:
    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: dict | JobFailed | None = None


def _outcome(name: str, run: _Run) -> dict:
    """A finished checkpoint's result; raises its JobFailed. No result at all means
    its task died, which stops the daemon (Runtime.spawn): the caller is told so."""
    if isinstance(run.result, JobFailed):
        raise run.result
    if run.result is None:
        raise JobFailed(f"checkpoint of {name}: its task died; the daemon is stopping")
    return run.result


def _none(name: str) -> dict[str, int]:
    """A daemon on its own: no series is sealed."""
    return {}
