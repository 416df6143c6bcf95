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

import json
import os
import sys
import time
from collections.abc import Callable

import structlog
import trio

from logstream.series import list_segments

from ..config import Config
from ..engine import CQSError, Reason, Structure
from ..srds import slots
from ..storage.datadir import DataDir
from .journal import WRITER, Journal

log = structlog.get_logger()
TRIGGER_POLL = 5.0  # seconds between checks of the automatic triggers
NICE = 10  # the job's CPU priority below the daemon's


class JobFailed(CQSError):
    def __init__(self, message: str) -> None:
        super().__init__(Reason.INVALID_REQUEST, message)


def job_command(config, args: list[str]) -> list[str]:
    """``python -m cqsd.srds ARGS`` on this daemon's data directory and Spark master."""
    d = config.daemon
    return [sys.executable, "-m", "cqsd.srds", *args, "--data-dir", d.data_dir,
            "--master", d.spark_master]


def job_outcome(args: list[str], done) -> dict:
    """A finished job's result: the JSON object on the last line it printed; JobFailed
    says why there is none."""
    if done.returncode != 0:
        raise JobFailed(f"{' '.join(args[:3])} failed (exit {done.returncode}): "
                        f"{_last_error(done.stderr)}")
    try:
        return json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise JobFailed(f"{' '.join(args[:3])} printed no result") from None


def _niced() -> None:
    os.nice(NICE)


def _idle() -> None:
    """A checkpoint only gets CPU the daemon leaves idle (SCHED_IDLE, Linux): with
    nice alone, its JVM's bursts still delayed puts by milliseconds."""
    os.nice(NICE)
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


async def run_job(config, args: list[str], background: bool = False) -> dict:
    """Run ``python -m cqsd.srds ARGS`` and return its result line; JobFailed says why
    not. A ``background`` job runs on idle CPU only; otherwise it is niced."""
    d = config.daemon
    command = job_command(config, args)
    started = time.monotonic()
    with trio.move_on_after(d.job_timeout) as scope:
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                      check=False, preexec_fn=_idle if background else _niced)
    if scope.cancelled_caught:
        raise JobFailed(f"{' '.join(args[:3])}: killed after job_timeout {d.job_timeout}s")
    result = job_outcome(args, done)
    log.debug("job_done", args=args, seconds=round(time.monotonic() - started, 3))
    return result


def _last_error(stderr: bytes) -> str:
    """The job's own words for what went wrong: its last error event, else its last line."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") == "error":
            return str(event.get("error") or event.get("message") or event.get("event"))
    return lines[-1] if lines else "no output"


class Checkpoints:
    """Automatic and operator checkpoints of the daemon's structures, and log trimming."""

    def __init__(self, config: Config, datadir: DataDir, journal: Journal,
                 physical: Callable[[str], Structure | None],
                 spawn: Callable[..., None]) -> None:
        """``physical(name)`` is the live structure of that name (None while it is
        failed); ``spawn`` starts a supervised task in the daemon's nursery."""
        self.config = config
        self.journal = journal
        self.logstream = datadir.logstream
        self.srds = datadir.srds
        self.physical = physical
        self.spawn = spawn
        self.names = [sc.name for sc in config.structures]  # overflow structures too
        self.log_bytes = dict.fromkeys(self.names, 0)  # logged since the last checkpoint
        self.last_time = dict.fromkeys(self.names, time.time())
        self._running: dict[str, _Run] = {}
        self._one_job = trio.Lock()  # one JVM at a time: the daemon keeps the other core

    async def take(self, name: str, why: str) -> dict:
        """Checkpoint structure ``name`` (or join the one running) and return the job's
        result; raises JobFailed. The job belongs to the daemon, not to the caller: a
        caller that goes away does not kill it."""
        run = self._running.get(name)
        if run is None:
            run = self._running[name] = _Run()
            self.spawn(f"checkpoint of {name}", self._take, name, why, run)
        await run.done.wait()
        if isinstance(run.result, JobFailed):
            raise run.result
        return run.result

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
        journal = self.journal
        cut = journal.durable
        logged, self.log_bytes[name] = self.log_bytes[name], 0
        log.info("checkpoint_started", structure=name, why=why, cut=cut)
        try:
            async with self._one_job:
                result = await run_job(self.config, ["checkpoint", "--structure", name,
                                                     "--cut", f"{WRITER}={cut}"],
                                       background=True)
        except JobFailed as err:
            self.log_bytes[name] += logged  # still owed a checkpoint
            log.error("checkpoint_failed", structure=name, error=err.message)
            raise
        self.last_time[name] = time.time()
        log.info("checkpoint_taken", structure=name, slot=result.get("slot"),
                 rows=result.get("rows"), records=result.get("records"),
                 seconds=result.get("seconds"), lsn=result.get("lsn"))
        await self._cover_the_rest()
        self.trim()
        return result

    async def _cover_the_rest(self) -> None:
        """The log is trimmed only behind every structure's checkpoints, so give each
        structure that has none one: an empty slot at once for a structure holding no
        message (every record of it so far folds to nothing), a real checkpoint for
        the others."""
        for name in self.names:
            if name in self._running or slots.recorded_positions(self.srds, name):
                continue
            s = self.physical(name)
            if s is None:
                continue  # failed: its recovery decides
            if s.stats()["messages"]:  # a job folds it (to nothing, if none is recoverable)
                self.spawn(f"checkpoint of {name}", self._quietly, name, "first")
                continue
            # empty as of this position: once it is durable, an empty slot there is exact
            position = self.journal.position
            if await self.journal.wait_durable(position):
                slots.purge(self.srds, name, {WRITER: position}, s.last_id)
                log.info("checkpoint_taken", structure=name, slot="empty", rows=0, records=0)

    def trim(self) -> None:
        """Delete log segments that neither slot of any structure, nor a crash-recovery
        base image, still needs, once they are older than ``log_retention``."""
        keep_from = min((self._needed_from(name) for name in self.names), default=0)
        if keep_from <= 1:
            return
        cutoff = time.time() - self.config.daemon.log_retention
        directory = self.logstream
        for seg in list_segments(directory, WRITER):
            if seg.path.stat().st_mtime > cutoff:  # its last record is too recent to go
                keep_from = min(keep_from, seg.first_lsn)
                break
        gone = self.journal.writer.trim(keep_from)
        if gone:
            log.info("log_trimmed", before_lsn=keep_from, segments=len(gone))

    def _needed_from(self, name: str) -> int:
        """The first LSN a recovery of ``name`` may need: the one after its older valid
        slot; 1 (the whole log) while it has no checkpoint."""
        positions = [lsn.get(WRITER, 0) for lsn in slots.recorded_positions(self.srds, name)]
        if not positions:
            return 1
        return min(positions) + 1

    def note_logged(self, record: dict, nbytes: int) -> None:
        """Count a record's bytes against each structure it holds effects of."""
        self.log_bytes[record["s"]] += nbytes
        for name in record.get("x", ()):
            self.log_bytes[name] += nbytes

    async def run(self) -> None:
        """The automatic triggers: time since the last checkpoint, and log volume."""
        d = self.config.daemon
        if not (d.checkpoint_interval or d.checkpoint_log_volume):
            return
        while True:
            await trio.sleep(TRIGGER_POLL)
            now = time.time()
            for name in self.names:
                if name in self._running or self.physical(name) is None:
                    continue
                if d.checkpoint_log_volume and self.log_bytes[name] >= d.checkpoint_log_volume:
                    why = "log_volume"
                elif d.checkpoint_interval and now - self.last_time[name] >= d.checkpoint_interval:
                    why = "interval"
                else:
                    continue
                self.spawn(f"checkpoint of {name}", self._quietly, name, why)

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
