"""Jepsen's total-queue checker for a group, and the clients whose history it checks.

Producers put unique payloads and note what was acknowledged and what is in
doubt; consumers read with a lock and delete, noting each delivery and each
acknowledged delete. At the end the queue is drained and the verdict says
what was **lost** (acknowledged, never deleted, not there at the end),
**unexpected** (seen, never put), **resurrected** (its delete acknowledged,
yet there at the end), **duplicated** (delivered more than once: allowed
only as the redelivery of a message locked and not deleted) and **put twice**
(one payload under two entry ids: a put applied again when it was resent,
which exactly-once puts rule out, docs/group.md).

The clients follow the owner by hand (NOT_OWNER names it; a lost connection
tries every node), so the checker needs no more of the SDK than one connection.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import cqsclient
from cqsclient.errors import ConnectionLost, CQSError, NotOwner, RequestTimeout

STRUCTURE, QUEUE = "MSGQ01", "TRANX"
SETTLE = 0.05  # seconds a client waits before trying again while a pair has no owner
QUIET = 5.0  # seconds after a request in doubt before the drain believes an empty queue


def why_in_doubt(err: BaseException) -> str:
    """A put's error as the verdict counts it: its reason code, else its type."""
    reason = getattr(err, "reason", None)
    return type(err).__name__ if reason is None else str(getattr(reason, "value", reason))


@dataclass
class History:
    put_ok: dict[bytes, int] = field(default_factory=dict)  # payload -> entry id
    put_unknown: set[bytes] = field(default_factory=set)
    # why each put in doubt was: most are refusals while a pair has no owner (say,
    # STRUCTURE_FAILED naming etcd), which the checker still counts as in doubt
    doubts: Counter = field(default_factory=Counter)
    delivered: Counter = field(default_factory=Counter)  # payload -> deliveries seen
    deleted_ok: set[bytes] = field(default_factory=set)
    deleted_unknown: set[bytes] = field(default_factory=set)
    entry_ids: dict[bytes, set[int]] = field(default_factory=dict)  # payload -> ids seen
    # (the test's monotonic time, the node that acknowledged): compared with the time the
    # test saw each node event (cluster.py stamps them ``seen``)
    acks: list[tuple[float, str | None]] = field(default_factory=list)
    # held to change any of the above; notified at each acknowledged put (``wait_for_puts``)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def acknowledged(self, payload: bytes, entry_id: int) -> None:
        """A producer's put of ``payload`` was acknowledged (call with ``lock`` held)."""
        self.put_ok[payload] = entry_id
        self.lock.notify_all()

    def wait_for_puts(self, count: int, why: object = "the clients made no progress",
                      timeout: float = 60) -> None:
        """Wait until ``count`` puts in all are acknowledged; AssertionError saying
        ``why`` (a callable: the message, built only then) if not within ``timeout``."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.put_ok) >= count, timeout):
                raise AssertionError(why() if callable(why) else why)

    def verdict(self, final: list[bytes]) -> dict[str, object]:
        there = Counter(final)
        put = set(self.put_ok) | self.put_unknown
        lost = {p for p in self.put_ok
                if p not in there and p not in self.deleted_ok and p not in self.deleted_unknown}
        return {
            "acknowledged": len(self.put_ok), "in_doubt": len(self.put_unknown),
            "in_doubt_why": dict(self.doubts.most_common()),
            "in_doubt_stored": sum(1 for p in self.put_unknown
                                   if p in there or p in self.delivered),
            "lost": sorted(lost),
            "unexpected": sorted((set(self.delivered) | set(there)) - put),
            "resurrected": sorted(p for p in self.deleted_ok if p in there),
            "duplicated_at_end": sorted(p for p, n in there.items() if n > 1),
            "redelivered": sum(1 for n in self.delivered.values() if n > 1),
            "put_twice": sorted(p for p, ids in self._ids().items() if len(ids) > 1),
        }

    def saw(self, payload: bytes, entry_id: int) -> None:
        """A delivery of ``payload`` as ``entry_id`` (under the lock)."""
        self.delivered[payload] += 1
        self.entry_ids.setdefault(payload, set()).add(entry_id)

    def _ids(self) -> dict[bytes, set[int]]:
        ids = {p: set(seen) for p, seen in self.entry_ids.items()}
        for p, eid in self.put_ok.items():
            ids.setdefault(p, set()).add(eid)
        return ids


class Follower:
    """One client of the group that goes wherever its structure's owner is."""

    def __init__(self, name: str, addresses: list[str], timeout: float = 5.0) -> None:
        self.name = name
        self.addresses = addresses
        self.timeout = timeout
        self.client: cqsclient.Client | None = None
        self.address: str | None = None

    def connect(self, prefer: str | None = None) -> None:
        """Connect to ``prefer``, else to each node in turn, the last one tried last."""
        last = self.address
        self.close()
        rest = [a for a in self.addresses if a not in (prefer, last)]
        order = ([prefer] if prefer else []) + rest + ([last] if last and last != prefer else [])
        for address in order:
            try:
                self.client = cqsclient.connect(address, client=self.name, timeout=self.timeout)
                self.address = address
                return
            except (CQSError, OSError):
                continue
        raise ConnectionLost("no node of the group answered", applied=False)

    def close(self) -> None:
        if self.client is not None:
            self.client.abort()
            self.client = None

    def call(self, op, deadline: float):
        """Run ``op(structure_handle)`` on the owner; NOT_OWNER and refusals before
        anything was applied are retried until ``deadline``; ConnectionLost with
        applied=None and a fenced reply are raised (in doubt)."""
        prefer = None
        while True:
            try:
                if self.client is None:
                    self.connect(prefer)
                result = op(self.client.structure(STRUCTURE))
                self.address = self.client.address  # the SDK may have followed NOT_OWNER
                return result
            except NotOwner as err:  # nothing applied: to the owner it names, at once
                self.close()  # (a connect that fails there is no doubt either: retried)
                prefer = err.owner
                if time.monotonic() < deadline:
                    continue
            except ConnectionLost as err:
                self.close()
                if err.applied is not False:
                    raise
            except RequestTimeout:  # a silent node (paused): try the others next time
                self.close()
                raise
            except CQSError as err:
                if err.reason != "STRUCTURE_FAILED" or "not acknowledged" in err.message:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no owner of {STRUCTURE} in time")
            time.sleep(SETTLE)


class Producer(threading.Thread):
    def __init__(self, n: int, addresses: list[str], history: History, stop: threading.Event,
                 size: int = 0):
        """``size``: each payload padded to that many bytes (say, to be offloaded)."""
        super().__init__(daemon=True, name=f"producer{n}")
        self.n, self.history, self.stop_event, self.size = n, history, stop, size
        self.follower = Follower(f"PUT{n}", addresses)
        self.error: BaseException | None = None
        self.last_error: BaseException | None = None  # of the last put in doubt

    def run(self) -> None:
        i = 0
        try:
            while not self.stop_event.is_set():
                payload = (b"p%d-%d " % (self.n, i)).ljust(self.size, b"%d" % (i % 10))
                i += 1
                try:
                    eid = self.follower.call(lambda s, p=payload: s.put(QUEUE, p),
                                             time.monotonic() + 60)
                except (ConnectionLost, CQSError) as err:
                    self.last_error = err
                    with self.history.lock:
                        self.history.put_unknown.add(payload)
                        self.history.doubts[why_in_doubt(err)] += 1
                    continue
                with self.history.lock:
                    self.history.acknowledged(payload, eid)
                    # the node that answered: the SDK follows NOT_OWNER on its own
                    answered = self.follower.client.address if self.follower.client else None
                    self.history.acks.append((time.monotonic(), answered))
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            self.follower.close()


class ResendingProducer(threading.Thread):
    """A producer on the SDK alone: one client of the whole group with ``reconnect``,
    which follows the owner and sends an in-doubt put again with its key."""

    def __init__(self, n: int, addresses: list[str], history: History, stop: threading.Event):
        super().__init__(daemon=True, name=f"resender{n}")
        self.n, self.addresses, self.history, self.stop_event = n, addresses, history, stop
        self.error: BaseException | None = None

    def run(self) -> None:
        policy = cqsclient.Reconnect(first_delay=0.05, max_delay=0.5)
        try:
            with cqsclient.connect(",".join(self.addresses), client=f"ONCE{self.n}",
                                   reconnect=policy, keepalive=1.0, timeout=30) as c:
                s = c.structure(STRUCTURE)
                i = 0
                while not self.stop_event.is_set():
                    payload = b"r%d-%d" % (self.n, i)
                    i += 1
                    try:
                        eid = s.put(QUEUE, payload)
                    except (ConnectionLost, CQSError) as err:
                        with self.history.lock:
                            self.history.put_unknown.add(payload)
                            self.history.doubts[why_in_doubt(err)] += 1
                        continue
                    with self.history.lock:
                        self.history.acknowledged(payload, eid)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


class Consumer(threading.Thread):
    def __init__(self, n: int, addresses: list[str], history: History, stop: threading.Event):
        super().__init__(daemon=True, name=f"consumer{n}")
        self.n, self.history, self.stop_event = n, history, stop
        self.follower = Follower(f"GET{n}", addresses)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    m = self.follower.call(lambda s: s.read(QUEUE, wait=0.2),
                                           time.monotonic() + 60)
                except (ConnectionLost, CQSError):
                    continue
                if m is None:
                    continue
                with self.history.lock:
                    self.history.saw(m.data, m.entry_id)
                try:
                    self.follower.call(lambda s, eid=m.entry_id: s.delete(eid),
                                       time.monotonic() + 60)
                except (ConnectionLost, CQSError) as err:
                    if getattr(err, "reason", None) in ("LOCK_NOT_HELD", "ENTRY_NOT_FOUND"):
                        continue  # the lock went back (its session died): not deleted
                    with self.history.lock:
                        self.history.deleted_unknown.add(m.data)
                    continue
                with self.history.lock:
                    self.history.deleted_ok.add(m.data)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            self.follower.close()


def drain(addresses: list[str], history: History | None = None) -> list[bytes]:
    """Every payload left in the queue, read and deleted by a fresh client (its entry
    id noted in ``history``, if given, for the put-twice check). A request in doubt
    (the owner fenced under load, a takeover) is tried again: a message read twice by
    its id counts once, and an empty queue counts only ``QUIET`` seconds after the
    last doubt (a lock of ours may be going back to the queue)."""
    follower = Follower("DRAIN", addresses)
    left: dict[int, bytes] = {}
    doubt = float("-inf")
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                m = follower.call(lambda s: s.read(QUEUE), deadline)
                if m is not None:
                    left[m.entry_id] = m.data
                    if history is not None:
                        history.entry_ids.setdefault(m.data, set()).add(m.entry_id)
                    follower.call(lambda s, eid=m.entry_id: s.delete(eid), deadline)
                elif time.monotonic() > doubt + QUIET:
                    return list(left.values())
                else:
                    time.sleep(SETTLE)
            except (ConnectionLost, RequestTimeout, CQSError) as err:
                if isinstance(err, CQSError) and err.reason in ("LOCK_NOT_HELD",
                                                                "ENTRY_NOT_FOUND"):
                    continue  # our lock went back at a takeover: read again
                if time.monotonic() > deadline:
                    raise
                doubt = time.monotonic()
                follower.close()
    finally:
        follower.close()


def reference_messages(data_dir, structure: str = STRUCTURE) -> dict[int, bytes]:
    """What the reference fold of the sealed log makes of ``structure``'s pair: entry
    id -> payload, from the images, checkpoints and log in ``data_dir`` alone."""
    from cqsd.config import loads
    from cqsd.recovery.sealed import cut_of, rebuild_pair
    from cqsd.server.liveconfig import LiveConfig
    from cqsd.server.registry import Registry

    config = loads(f'[[structure]]\nname = "{structure}"\nsize = "64MiB"\n'
                   f'overflow = "{structure}OV"\n[[structure]]\nname = "{structure}OV"\n'
                   'size = "16MiB"\n')
    pair = Registry(LiveConfig(config)).new_pair(structure)
    rebuild_pair(pair.structures(), data_dir / "images", data_dir / "logstream",
                 data_dir / "srds", cut_of(data_dir / "logstream", structure))
    return {e.entry_id: bytes(e.data) for s in pair.structures() for e in s}


def owner_messages(address: str, structure: str = STRUCTURE) -> dict[int, bytes]:
    with cqsclient.connect(address, client="CHECKER", timeout=10) as c:
        return {m.entry_id: m.data for m in c.structure(structure).browse_all()}


def spark_messages(data_dir, jobs_under, structure: str = STRUCTURE) -> dict[int, bytes]:
    """What the Spark checkpoint job folds of ``structure`` from the whole multi-node
    log, cut as the reference fold is: entry id -> payload of the slot it writes.
    First the SRDS jobs the nodes run on data under ``jobs_under`` end: the nodes of a
    FaultyGroup each see the data through their own lazyfs mount, where a job's
    `flock` of the slots excludes nobody outside it (docs/datadir.md asks a shared
    file system for locks that do), and a node's job starting beside this one
    cleared its staging directory as a killed job's leftovers."""
    import subprocess
    import sys

    from cqsd.recovery.sealed import cut_of
    from cqsd.server.jobs import cut_args
    from cqsd.srds import slots

    cut = cut_of(data_dir / "logstream", structure)
    for pid in _srds_jobs(jobs_under):
        _wait_for_exit(pid)
    job = subprocess.run([sys.executable, "-m", "cqsd.srds", "checkpoint", "--data-dir",
                          str(data_dir), "--structure", structure, "--master", "local[2]",
                          *cut_args(cut)], capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, f"the Spark checkpoint job failed: {job.stderr[-3000:]}"
    slot = slots.newest_valid(data_dir / "srds", structure)
    return {i: bytes(r[3]) for i, r in slots.read_rows(slot, offloaded_data=True).items()}


def _wait_for_exit(pid: int, timeout: float = 600) -> None:
    """Block until process ``pid`` (not a child of ours) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], timeout)[0], f"process {pid} did not end"
    finally:
        os.close(fd)


def _srds_jobs(under) -> list[int]:
    """The processes running an SRDS job (``python -m cqsd.srds``) on a data directory
    under ``under``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or ended meanwhile
            continue
        if b"cqsd.srds" in args and any(a.startswith(str(under).encode()) for a in args):
            found.append(int(proc.name))
    return found
