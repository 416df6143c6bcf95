"""``cqsd fscheck DIR``: does this file system qualify as a group's shared data directory?

Why it exists. The nodes of a group share one data directory (docs/datadir.md,
"Shared data directories for a group"), and what keeps them safe is what the
file system does across processes and hosts: a lock taken by one node excludes
the other, an fsync persists and the other node then sees it, and the records
one node appends and fsyncs are read whole and in order by another while it
goes on appending. Plenty of file systems mount and pass a quick `touch` but
fail one of these (NFSv3 without its lock manager, SMB, FUSE stores that ignore
fsync), and the failure only shows in a takeover. IBM MQ ships `amqmfsck` for
the same reason; this is ours.

How. Two processes (one per node; or `--single`, which forks its own partner)
run the same checks against DIR at the same time and meet through files in
``DIR/.cqsd-fscheck/``: each prepares a directory holding the step files and
renames it into place; the rename that wins makes its process party "a", the
other finds the directory there and is party "b". A party writes the number of
the step it has reached into its own step file and polls the other's, opening
it anew each time: close-to-open consistency is what NFS promises, so it is all
this rendezvous assumes, and no network between the nodes is needed.

Not checked: O_DIRECT (cqsd never uses it), and durability across a power cut,
which no program sees from inside the machine (tests/faults/lazyfs.py plays
that fault for the test suite).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import secrets
import shutil
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import crc32c

from logstream import durable

RENDEZVOUS = ".cqsd-fscheck"
POLL = 0.005  # seconds between looks at the other party's step file
# A step is a few fsyncs; 30 s covers a slow NFS server, and a dead partner is
# reported within it rather than after the operator's whole --wait.
STEP_TIMEOUT = 30.0
# Records one node announced as fsynced must be readable by the other within this.
VISIBLE_WITHIN = 10.0
ABORTED = -2  # step number of a party that gave up (its reason in <role>.abort)
RECORD = struct.Struct("<4sQII")  # magic, sequence number, payload length, CRC-32C
RECORD_MAGIC = b"FSCK"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the final NUL


@dataclasses.dataclass(frozen=True)
class Result:
    """One check's verdict, printed as ``PASS|FAIL|WARN name: detail``."""

    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


class PartnerLost(Exception):
    """The other party did not reach a step in time, or gave up; the message says which."""


def _say(path: Path, line: str) -> None:
    """Append `line` to `path` and close it: closing is what flushes to an NFS server, and
    a file that grows is seen to change even where timestamps are coarse."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:  # opened anew each time: close-to-open
        return f.read()


def _last(path: Path) -> str:
    """The last whole line `_say` appended to `path` ("" if none yet); raises OSError."""
    with open(path, "rb") as f:  # opened anew each time: close-to-open
        f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))  # lines are short; files grow
        lines = f.read().decode(errors="replace").split("\n")
    return lines[-2] if len(lines) > 1 else ""


class Session:
    """This party's side of the rendezvous in ``DIR/.cqsd-fscheck``."""

    def __init__(self, directory: Path, role: str, run: str, timeout: float) -> None:
        self.dir = directory / RENDEZVOUS
        self.role, self.other = role, "b" if role == "a" else "a"
        self.run = run
        self.timeout = timeout  # for the next meeting only: the partner's arrival
        self.step = 0
        self.partner = "?"

    def mine(self, name: str) -> Path:
        return self.dir / f"{self.role}.{name}"

    def theirs(self, name: str) -> Path:
        return self.dir / f"{self.other}.{name}"

    def _put_step(self, step: int) -> None:
        _say(self.mine("step"), str(step))

    def _their_step(self) -> int | None:
        try:
            return int(_last(self.theirs("step")))
        except (OSError, ValueError):
            return None  # not readable yet or caught mid-write: look again

    def meet(self, step: int) -> None:
        """Say this party reached `step`; wait until the other has too. Raises PartnerLost."""
        self._put_step(step)
        deadline = time.monotonic() + self.timeout
        while (theirs := self._their_step()) is None or (theirs != ABORTED and theirs < step):
            if time.monotonic() > deadline:
                raise PartnerLost(f"the other party did not reach step {step} within"
                                  f" {self.timeout:g} s (is it running? if a killed fscheck"
                                  f" left {self.dir}, remove it)")
            time.sleep(POLL)
        if theirs == ABORTED:
            reason = _last(self.theirs("abort"))
            raise PartnerLost(f"the other party gave up: {reason}")
        self.timeout = STEP_TIMEOUT

    def sync(self) -> None:
        """The next meeting: both parties have finished everything before it."""
        self.step += 1
        self.meet(self.step)

    def abort(self, reason: str) -> None:
        with contextlib.suppress(OSError):
            _say(self.mine("abort"), reason)
            self._put_step(ABORTED)

    def leave(self) -> None:
        """After the last meeting: "b" says it is gone, then "a" removes the directory."""
        if self.role == "b":
            self._put_step(self.step + 1)
            return
        with contextlib.suppress(PartnerLost):
            self.meet(self.step + 1)
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def join(directory: Path, wait: float) -> Session:
    """Meet the other party in `directory`, waiting `wait` s for it. Raises PartnerLost."""
    run = secrets.token_hex(8)
    me = f"{socket.gethostname()} pid {os.getpid()}"
    temp = directory / f"{RENDEZVOUS}.{run}"
    temp.mkdir()
    (temp / "run").write_text(f"{run}\n{me}\n")
    _say(temp / "a.step", "0")
    _say(temp / "b.step", "-1")
    try:
        os.rename(temp, directory / RENDEZVOUS)
        role = "a"
    except OSError as err:  # ENOTEMPTY or EEXIST: the other party's directory is there
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(temp)
        role = "b"
    if role == "a":
        session = Session(directory, "a", run, wait)
    else:
        run, partner = _read(directory / RENDEZVOUS / "run").decode().split("\n")[:2]
        session = Session(directory, "b", run, wait)
        session.partner = partner
        if session._their_step() != 0 or _last(session.mine("step")) != "-1":
            raise PartnerLost(f"{session.dir} was left by an earlier fscheck: remove it")
        _say(session.mine("who"), me)
    session._put_step(0)
    try:
        session.meet(0)
    except PartnerLost:
        if role == "a":
            session.remove()  # nobody came: leave no rendezvous behind
        raise
    if role == "a":
        session.partner = _last(session.theirs("who"))
    return session


# -- (a) locks -----------------------------------------------------------------------


def _flock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unflock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def _lockf(fd: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlockf(fd: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN)


def _attempt(lock: Callable[[int], None], fd: int) -> bool:
    """True if the lock was taken, False if it is held elsewhere; raises other OSErrors."""
    try:
        lock(fd)
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def check_lock(s: Session, name: str, lock: Callable[[int], None],
               unlock: Callable[[int], None]) -> Result:
    """Each party in turn holds the lock; the other must be refused, then let in."""
    problems: list[str] = []
    fd = os.open(s.dir / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        for holder in ("a", "b"):
            problems += _lock_round(s, fd, lock, unlock, holding=s.role == holder)
    finally:
        os.close(fd)
    if problems:
        return Result("FAIL", name, "; ".join(problems))
    return Result("PASS", name, "held by each node in turn, refused to the other, then released")


def _lock_round(s: Session, fd: int, lock: Callable[[int], None],
                unlock: Callable[[int], None], holding: bool) -> list[str]:
    """One holder's round; every party meets at every step whatever it saw."""
    problems = []

    def step(what: str, expect: bool) -> None:
        try:
            if _attempt(lock, fd) != expect:
                problems.append(what)
            if not holding:
                unlock(fd)  # the waiting side never keeps what it took
        except OSError as err:
            problems.append(f"{what}: {err}")

    if holding:
        step("the free lock was refused", expect=True)
    s.sync()
    if not holding:
        step("the lock held by the other node was granted (no exclusion)", expect=False)
    s.sync()
    if holding:
        with contextlib.suppress(OSError):
            unlock(fd)
    s.sync()
    if not holding:
        step("the lock the other node released was still refused", expect=True)
    s.sync()
    return problems


# -- (b) fsync -----------------------------------------------------------------------

def _pattern(run: str, role: str, size: int = 64 * 1024 + 123) -> bytes:
    """Bytes only this run and party write, so a stale or foreign file cannot pass."""
    seed = f"{run}/{role}/".encode()
    return (seed * (size // len(seed) + 1))[:size]


def check_fsync(s: Session) -> list[Result]:
    """Write, fsync, rename, fsync the directory, read back; then read the partner's."""
    results = []
    data = _pattern(s.run, s.role)
    try:
        start = time.monotonic()
        fd = durable.create_file(s.mine("durable"), data)  # the log's own recipe
        os.close(fd)
        took = (time.monotonic() - start) * 1000
        back = _read(s.mine("durable"))
        if back != data:
            results.append(Result("FAIL", "fsync", f"read back {len(back)} bytes that differ"
                                  f" from the {len(data)} written"))
        else:
            results.append(Result("PASS", "fsync", f"{len(data)} bytes written, fsynced, renamed,"
                                  f" directory fsynced, read back whole ({took:.1f} ms)"))
    except OSError as err:
        results.append(Result("FAIL", "fsync", str(err)))
    s.sync()
    try:
        seen = _read(s.theirs("durable"))
        want = _pattern(s.run, s.other)
        results.append(Result("PASS", "fsync-seen", "the other node's fsynced file read whole")
                       if seen == want else
                       Result("FAIL", "fsync-seen", f"the other node's fsynced file reads"
                              f" {len(seen)} bytes, not its {len(want)}"))
    except OSError as err:
        results.append(Result("FAIL", "fsync-seen", f"the other node's fsynced file: {err}"))
    s.sync()
    return results


# -- (c) records appended by one node, read by the other ---------------------------------

def encode_record(seq: int) -> bytes:
    """Record `seq`: sizes vary (1 B to ~6 KiB) so records straddle pages and blocks."""
    payload = seq.to_bytes(8, "little") * (1 + seq * 7919 % 760)
    payload = payload[: max(1, len(payload) - seq % 8)]
    head = struct.pack("<QI", seq, len(payload))
    return RECORD.pack(RECORD_MAGIC, seq, len(payload), crc32c.crc32c(head + payload)) + payload


def decode_record(buf: bytes, offset: int) -> tuple[int, int] | str:
    """(seq, next offset) of the whole record at `offset`, or why there is none yet."""
    if len(buf) - offset < RECORD.size:
        return "incomplete header"
    magic, seq, length, crc = RECORD.unpack_from(buf, offset)
    if magic == b"\0\0\0\0":
        return "zeros (not written yet)"
    if magic != RECORD_MAGIC:
        return f"bad magic {magic!r}"
    end = offset + RECORD.size + length
    if end > len(buf):
        return "incomplete payload"
    if crc32c.crc32c(struct.pack("<QI", seq, length) + buf[offset + RECORD.size:end]) != crc:
        return "bad CRC"
    return seq, end


class _Appender(threading.Thread):
    """Appends `count` records in batches (pwrite, fdatasync), announcing each durable batch."""

    def __init__(self, s: Session, count: int) -> None:
        super().__init__(name="fscheck-appender", daemon=True)
        self.s, self.count = s, count
        self.error: OSError | None = None
        self.fsync_ms: list[float] = []

    def announce(self, durable_seq: int, state: str) -> None:
        _say(self.s.mine("progress"), f"{durable_seq} {state}")

    def run(self) -> None:
        fd = -1
        try:
            fd = os.open(self.s.mine("records"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            with contextlib.suppress(OSError):  # preallocated like a log segment, if it can be
                os.posix_fallocate(fd, 0, 4 * 1024 * self.count)
            offset, seq = 0, 0
            while seq < self.count:
                n = min(seq % 7 + 1, self.count - seq)  # batches of 1 to 7 records
                batch = b"".join(encode_record(k) for k in range(seq + 1, seq + n + 1))
                seq += n
                os.pwrite(fd, batch, offset)
                offset += len(batch)
                start = time.monotonic()
                os.fdatasync(fd)
                self.fsync_ms.append((time.monotonic() - start) * 1000)
                self.announce(seq, "going")
            self.announce(seq, "done")
        except OSError as err:
            self.error = err
            with contextlib.suppress(OSError):
                self.announce(0, "failed")
        finally:
            if fd >= 0:
                os.close(fd)


def _their_progress(s: Session) -> tuple[int, str]:
    try:
        seq, state = _last(s.theirs("progress")).split()
        return int(seq), state
    except (OSError, ValueError):
        return 0, "going"  # not announced yet


def _tail(s: Session) -> tuple[int, float, str | None]:
    """Read the other party's records as it appends: (records read, worst lag s, problem)."""
    offset, next_seq, worst = 0, 1, 0.0
    behind_since: float | None = None
    last_change, last_announced = time.monotonic(), -1
    while True:
        announced, state = _their_progress(s)  # first, so the data read next holds all of it
        try:
            with open(s.theirs("records"), "rb") as f:
                f.seek(offset)
                buf = f.read(1 << 20)
        except FileNotFoundError:
            buf = b""
        at = 0
        while isinstance(found := decode_record(buf, at), tuple):
            seq, at = found
            if seq != next_seq:
                return next_seq - 1, worst, f"record {seq} found where {next_seq} was due"
            next_seq += 1
        why = found
        offset += at
        now = time.monotonic()
        if next_seq > announced:
            if behind_since is not None:
                worst = max(worst, now - behind_since)
            behind_since = None
            if state == "done":
                return next_seq - 1, worst, None
            if state == "failed":
                return next_seq - 1, worst, "the other node stopped appending (see its output)"
        elif behind_since is None:
            behind_since = now
        elif now - behind_since > VISIBLE_WITHIN:
            return next_seq - 1, worst, (f"record {next_seq}, announced fsynced, still not"
                                         f" readable after {VISIBLE_WITHIN:g} s ({why})")
        if announced != last_announced:
            last_change, last_announced = now, announced
        elif now - last_change > STEP_TIMEOUT:
            return next_seq - 1, worst, f"the other node announced nothing for {STEP_TIMEOUT:g} s"
        if at == 0:
            time.sleep(POLL)


def check_records(s: Session, count: int) -> list[Result]:
    """Each party appends `count` records while reading the other's, both at once."""
    for name in ("records", "progress"):  # before the other looks: no cached "no such file"
        os.close(os.open(s.mine(name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    s.sync()
    appender = _Appender(s, count)
    start = time.monotonic()
    appender.start()
    read, worst, problem = _tail(s)
    appender.join()
    took = time.monotonic() - start
    results = []
    if appender.error is not None:
        results.append(Result("FAIL", "records-append", f"appending: {appender.error}"))
    else:
        fs = sorted(appender.fsync_ms)
        results.append(Result("PASS", "records-append", f"{count} records in {len(fs)} fdatasyncs"
                              f" (median {fs[len(fs) // 2]:.2f} ms, max {fs[-1]:.2f} ms)"))
    if problem is not None:
        results.append(Result("FAIL", "records-read", f"after {read} good records: {problem}"))
    else:
        results.append(Result("PASS", "records-read", f"the other node's {read} records read whole"
                              f" and in order while it appended ({took:.2f} s; longest wait for an"
                              f" fsynced record {worst * 1000:.0f} ms)"))
    s.sync()
    return results


# -- (d) what the daemon needs besides ---------------------------------------------------

def _fallocate(fd: int, offset: int, length: int) -> int:
    """fallocate(2) mode 0 itself: 0 or an errno (os.posix_fallocate hides EOPNOTSUPP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return 0 if libc.fallocate(fd, 0, offset, length) == 0 else ctypes.get_errno()


def check_fallocate(s: Session) -> Result:
    """fallocate(2); on EOPNOTSUPP, whether glibc's fallback works on a write-only fd."""
    path = s.mine("fallocate")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, b"x" * 10000)  # past glibc's first probe, like a log segment reopened
        err = _fallocate(fd, 0, 1 << 20)
        if err == 0:
            return Result("PASS", "fallocate", "1 MiB preallocated")
        if err != errno.EOPNOTSUPP:
            return Result("FAIL", "fallocate", f"fallocate(2): {os.strerror(err)}")
        try:  # glibc emulates by writing a byte per block; the log's fd is write-only
            os.posix_fallocate(fd, 0, 1 << 20)
            fallback = "glibc's posix_fallocate emulation works (a write per block)"
        except OSError as error:
            fallback = f"and posix_fallocate on a write-only fd fails: {error.strerror}"
        return Result("WARN", "fallocate", f"not supported (EOPNOTSUPP): the daemon must cope;"
                      f" {fallback}")
    finally:
        os.close(fd)


def check_unix_socket(s: Session, directory: Path) -> Result:
    """The daemon's default socket lives in the data directory: can one be made here?"""
    default = directory.resolve() / "cqsd.sock"
    if len(os.fsencode(default)) > SOCKET_PATH_MAX:
        return Result("WARN", "unix-socket", f"{default} is longer than {SOCKET_PATH_MAX} bytes:"
                      " set `socket` to a shorter path")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # through /proc so the rendezvous' longer path is never the problem
        dirfd = os.open(s.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sock.bind(f"/proc/self/fd/{dirfd}/{s.role}.sock")
        finally:
            os.close(dirfd)
    except OSError as err:
        return Result("WARN", "unix-socket", f"cannot create a Unix socket here ({err.strerror}):"
                      " set `socket` outside the data directory")
    finally:
        sock.close()
    return Result("PASS", "unix-socket", "a Unix socket can be created in the directory")


# -- running -------------------------------------------------------------------------------

def run_checks(s: Session, directory: Path, records: int) -> list[Result]:
    """Every check, in the same order on both parties (they meet between steps)."""
    results = [check_lock(s, "flock", _flock, _unflock),
               check_lock(s, "fcntl-lock", _lockf, _unlockf)]
    results += check_fsync(s)
    results += check_records(s, records)
    results += [check_fallocate(s), check_unix_socket(s, directory)]
    s.sync()
    return results


def check(directory: Path, wait: float, records: int) -> list[Result]:
    """Meet the other party in `directory` and run every check; a lost partner is a FAIL."""
    try:
        s = join(directory, wait)
    except PartnerLost as err:
        return [Result("FAIL", "partner", str(err))]
    except OSError as err:
        return [Result("FAIL", "rendezvous", f"{directory}: {err}")]
    try:
        results = [Result("PASS", "partner", f"met {s.partner} (this node is party {s.role})")]
        results += run_checks(s, directory, records)
        failed = sum(r.status == "FAIL" for r in results)
        _say(s.mine("failed"), str(failed))
        s.sync()
        theirs = int(_last(s.theirs("failed")))
        if theirs:
            results.append(Result("FAIL", "partner", f"{theirs} checks failed on the other node"
                                  f" ({s.partner}): see its output"))
    except PartnerLost as err:
        if s.role == "a":
            s.remove()
        return [Result("FAIL", "partner", str(err))]
    except OSError as err:  # outside what a check expects: this party cannot go on
        s.abort(f"{type(err).__name__}: {err}")
        return [Result("FAIL", "io", str(err))]
    except BaseException as err:
        s.abort(f"{type(err).__name__}: {err}")
        raise
    s.leave()
    return results


def run(args: argparse.Namespace) -> int:
    """The subcommand, its arguments parsed by cqsd/__main__.py: 0 if every check passed
    (warnings allowed), 1 if one failed, 2 on bad use."""
    if not args.dir.is_dir() or args.wait <= 0 or args.records < 1:
        print(f"cqsd fscheck: {args.dir} is not a directory" if not args.dir.is_dir() else
              "cqsd fscheck: --wait and --records must be positive", file=sys.stderr)
        return 2
    start = time.monotonic()
    partner = _fork_partner(args) if args.single else None
    results = check(args.dir, args.wait, args.records)
    if partner is not None:
        results += _partner_results(*partner)
    for r in results:
        print(r.line(), flush=True)
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "WARN", "FAIL")}
    print(f"fscheck {args.dir}: {counts['PASS']} passed, {counts['WARN']} warnings,"
          f" {counts['FAIL']} failed in {time.monotonic() - start:.2f} s", flush=True)
    return 1 if counts["FAIL"] else 0


def _fork_partner(args: argparse.Namespace) -> tuple[int, int]:
    """Fork the second party; it sends its results back through a pipe: (pid, read end)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the partner: never returns into the caller's code
        code = 1
        try:
            os.close(read_end)
            lines = [r.line() for r in check(args.dir, args.wait, args.records)]
            os.write(write_end, "\n".join(lines).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _partner_results(pid: int, read_end: int) -> list[Result]:
    """The forked partner's non-PASS results, named as the partner's."""
    with os.fdopen(read_end, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return [Result("FAIL", "partner", f"the forked partner died ({status})")]
    out = []
    for line in text.splitlines():
        verdict, _, rest = line.partition(" ")
        name, _, detail = rest.partition(": ")
        if verdict != "PASS":
            out.append(Result(verdict, f"partner-{name}", detail))
    return out
