"""The Spark jobs the daemon runs (``python -m cqsd.srds checkpoint|recover``), as the
operator sees them: their output in the daemon log, their stages as they go,
and a failed job's own words in the reply.

Design note. A job prints structlog JSON events on stderr (one ``srds_stage``
as each stage ends, an ``srds_job_failed`` naming the error if it fails) and
its result as the last line of stdout. The daemon reads stderr line by line
while the job runs: every line goes into the daemon's own log as a
``job_output`` event (at the job's level), and each stage becomes the job's
``stage`` in the table ``cqsctl display jobs`` shows, and joins the job's
``stages`` with its own seconds, which is how ``cqsctl checkpoint`` and
``recover`` report progress while they wait. The
table keeps the last ``KEEP`` jobs.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from subprocess import PIPE

import structlog
import trio

from ..engine import CQSError, Reason

log = structlog.get_logger()
KEEP = 50  # finished jobs the table remembers
TAIL = 40  # stderr lines kept to say why a job failed
MAX_LINE = 64 * 1024  # longer stderr lines are cut (a JVM can print anything)
STATUS_EVERY = 15.0  # seconds between progress reports of a job run before serving


def cut_args(cuts: dict[str, int]) -> list[str]:
    """A job's ``--cut WRITER=LSN`` arguments: the log it folds, by writer."""
    return [a for w, n in cuts.items() for a in ("--cut", f"{w}={n}")]


class JobFailed(CQSError):
    def __init__(self, message: str) -> None:
        super().__init__(Reason.INVALID_REQUEST, message)


def job_command(config, args: list[str]) -> list[str]:
    """``python -m cqsd.srds ARGS`` on this daemon's data directory and Spark master,
    ending if the daemon does."""
    d = config.daemon
    return [sys.executable, "-m", "cqsd.srds", *args, "--data-dir", d.data_dir,
            "--master", d.spark_master, "--parent", str(os.getpid())]


def outcome(args: list[str], returncode: int, stdout: bytes, stderr: list[str],
            stage: str | None = None) -> dict:
    """A finished job's result: the JSON object on the last line it printed; JobFailed
    says why there is none, in the job's own words (its last error event)."""
    what = " ".join(args[:3])
    if returncode != 0:
        where = f" after stage {stage}" if stage else ""
        raise JobFailed(f"{what} failed{where} (exit {returncode}): {last_error(stderr)}")
    try:
        return json.loads(stdout.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise JobFailed(f"{what} printed no result") from None


def last_error(lines: list[str]) -> str:
    """The job's own words for what went wrong: its last error event, else its last line."""
    for line in reversed(lines):
        event = _event(line)
        if event is not None and event.get("level") == "error":
            words = str(event.get("error") or event.get("message") or event.get("event"))
            return f"{event['kind']}: {words}" if event.get("kind") else words
    return lines[-1] if lines else "no output"


def _event(line: str) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _end(proc) -> None:
    """SIGKILL a job and the JVM it started: its process group, once the job leads one
    (cqsd/srds/__main__.py, ``--parent``); killed alone, its JVM lived on."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
            return
    except ProcessLookupError:
        pass
    proc.kill()


@dataclass
class Job:
    id: int
    kind: str  # checkpoint, recover
    structure: str
    started: float  # epoch seconds
    state: str = "running"  # running, done, failed
    stage: str | None = None  # the last stage the job finished
    # every stage finished, in order, with its own seconds: what cqsctl shows as it goes
    stages: list[dict] = field(default_factory=list)
    finished: float | None = None
    seconds: float | None = None
    error: str | None = None

    def row(self) -> dict:
        return asdict(self)


class Jobs:
    """The jobs of this run of the daemon: running, and the last KEEP finished."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.running: dict[int, Job] = {}
        self.finished: deque[Job] = deque(maxlen=KEEP)

    def start(self, args: list[str]) -> Job:
        # a recovery of several structures names each (--structure A --structure B)
        structure = ",".join(a for a, flag in zip(args[1:], args, strict=False)
                             if flag == "--structure")
        job = Job(next(self._ids), args[0], structure, time.time())
        self.running[job.id] = job
        log.info("job_started", job=job.id, kind=job.kind, structure=structure)
        return job

    def end(self, job: Job, error: str | None = None) -> None:
        job.finished = time.time()
        job.seconds = round(job.finished - job.started, 3)
        job.state, job.error = ("failed", error) if error else ("done", None)
        del self.running[job.id]
        self.finished.append(job)

    def rows(self) -> list[dict]:
        """Running jobs, then finished ones, newest first."""
        return [j.row() for j in sorted(self.running.values(), key=lambda j: -j.id)] + [
            j.row() for j in reversed(self.finished)]

    def heard(self, job: Job, line: str, tail: deque[str]) -> None:
        """One line of the job's stderr: into the daemon log, and the job's stage."""
        line = line[:MAX_LINE]
        tail.append(line)
        event = _event(line)
        if event is None:
            log.info("job_output", job=job.id, kind=job.kind, structure=job.structure, text=line)
            return
        if event.get("event") == "srds_stage":
            job.stage = str(event.get("stage"))
            job.stages.append({"stage": job.stage, "seconds": event.get("seconds")})
        level = event.pop("level", "info")
        event.pop("timestamp", None)
        getattr(log, level if level in ("debug", "warning", "error") else "info")(
            "job_output", job=job.id, kind=job.kind, structure=job.structure, output=event)

    def finish(self, job: Job, args: list[str], returncode: int, stdout: bytes,
               tail: list[str]) -> dict:
        """Close ``job``'s row with its outcome; its result, or JobFailed."""
        try:
            result = outcome(args, returncode, stdout, tail, job.stage)
        except JobFailed as err:
            self.end(job, err.message)
            raise
        self.end(job)
        return result

    async def run(self, config, args: list[str], background: bool = False) -> dict:
        """Run ``python -m cqsd.srds ARGS`` and return its result line; JobFailed says why
        not. A ``background`` job runs on idle CPU only; otherwise it is niced. The job
        lowers its own priority (``--priority``): a ``preexec_fn`` would make the
        daemon fork, not vfork, with its threads (the fsync thread, pyarrow's pools)
        running, and Python documents that the child may then deadlock before exec,
        the daemon's loop with it, waiting for the exec."""
        d = config.daemon
        job, stdout = self.start(args), bytearray()
        tail: deque[str] = deque(maxlen=TAIL)
        try:
            proc = await trio.lowlevel.open_process(
                [*job_command(config, args), "--priority", "idle" if background else "nice"],
                stdout=PIPE, stderr=PIPE)
        except OSError as err:
            self.end(job, f"cannot start the job: {err}")
            raise JobFailed(f"{' '.join(args[:3])}: cannot start the job: {err}") from err
        completed = False
        try:
            with trio.move_on_after(d.job_timeout) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_drain, proc.stdout, stdout)
                    nursery.start_soon(self._follow, proc.stderr, job, tail)
                await proc.wait()
            completed = True
        finally:
            if proc.returncode is None:
                _end(proc)
                with trio.CancelScope(shield=True):
                    await proc.wait()
            if not completed:
                self.end(job, "cancelled: the daemon is stopping")
        if scope.cancelled_caught:
            self.end(job, f"killed after job_timeout {d.job_timeout}s")
            raise JobFailed(f"{' '.join(args[:3])}: killed after job_timeout {d.job_timeout}s")
        assert proc.returncode is not None  # waited for above, killed or not
        return self.finish(job, args, proc.returncode, bytes(stdout), list(tail))

    def run_before_serving(self, config, args: list[str], progress) -> dict:
        """Run a job and wait, blocking (at start, before the daemon serves: nothing
        else runs meanwhile), calling ``progress(seconds)`` every STATUS_EVERY
        seconds; its output goes into the log when it ends. JobFailed says why not."""
        job, started = self.start(args), time.monotonic()
        try:
            proc = subprocess.Popen(job_command(config, args), stdout=PIPE, stderr=PIPE)
        except OSError as err:
            self.end(job, f"cannot start the job: {err}")
            raise JobFailed(f"{' '.join(args[:3])}: cannot start the job: {err}") from err
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=STATUS_EVERY)
                break
            except subprocess.TimeoutExpired:
                seconds = time.monotonic() - started
                if seconds > config.daemon.job_timeout:
                    _end(proc)
                    proc.communicate()
                    self.end(job, f"killed after job_timeout {config.daemon.job_timeout}s")
                    raise JobFailed(f"{' '.join(args[:3])}: killed after job_timeout "
                                    f"{config.daemon.job_timeout}s") from None
                progress(seconds)
        tail: deque[str] = deque(maxlen=TAIL)
        for line in stderr.decode(errors="replace").splitlines():
            self.heard(job, line, tail)
        return self.finish(job, args, proc.returncode, stdout, list(tail))

    async def _follow(self, stream, job: Job, tail: deque[str]) -> None:
        pending = b""
        while chunk := await stream.receive_some(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self.heard(job, line.decode(errors="replace"), tail)
            pending = pending[-MAX_LINE:]
        if pending:
            self.heard(job, pending.decode(errors="replace"), tail)


async def _drain(stream, into: bytearray) -> None:
    while chunk := await stream.receive_some(65536):
        into += chunk
