"""Group commit: concurrent flushes share fsyncs, appends and flushes run in parallel."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from logstream import Writer, read

THREADS = 16
ROUNDS = 20


def test_concurrent_flushes_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen threads flushing at once need far fewer fdatasyncs than flushes, each covered."""
    w = Writer.open(tmp_path, "alpha")
    fsyncs: list[int] = []
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        fsyncs.append(fd)
        time.sleep(0.002)  # long enough that callers pile up behind it
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def worker(n: int) -> None:
        try:
            barrier.wait()
            for i in range(ROUNDS):
                lsn = w.append({"thread": n, "i": i})
                results.append((lsn, w.flush(lsn)))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    flushes = THREADS * ROUNDS
    assert len(results) == flushes
    assert all(durable >= lsn for lsn, durable in results)
    assert len(fsyncs) < flushes / 4, (len(fsyncs), flushes)
    assert w.stats().group_commits == len(fsyncs)
    w.close()
    assert sorted(r.lsn for r in read(tmp_path)) == list(range(1, flushes + 1))


def test_appends_and_flushes_from_many_threads_keep_lsns_dense(tmp_path: Path) -> None:
    """Appends racing flushes and rotations lose nothing and give each record one LSN."""
    w = Writer.open(tmp_path, "alpha", segment_size=8192)
    stop = threading.Event()
    got: list[list[int]] = [[] for _ in range(4)]

    def appender(n: int) -> None:
        for i in range(300):
            got[n].append(w.append([n, i]))

    def flusher() -> None:
        while not stop.is_set():
            w.flush()

    flushers = [threading.Thread(target=flusher) for _ in range(2)]
    appenders = [threading.Thread(target=appender, args=(n,)) for n in range(4)]
    for t in flushers + appenders:
        t.start()
    for t in appenders:
        t.join()
    stop.set()
    for t in flushers:
        t.join()
    assert w.flush() == 1200
    w.close()
    assert sorted(lsn for lsns in got for lsn in lsns) == list(range(1, 1201))
    records = list(read(tmp_path))
    assert [r.lsn for r in records] == list(range(1, 1201))
    for n in range(4):  # each thread's records are in its own order
        assert [r.body[1] for r in records if r.body[0] == n] == list(range(300))


def test_a_group_commit_is_an_fdatasync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flush syncs data only, as the preallocated size does not change; fsync is the fallback."""
    w = Writer.open(tmp_path, "alpha")
    calls: list[str] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append("fdatasync"))
    w.append(1)
    w.flush()
    assert calls == ["fdatasync"]
    monkeypatch.delattr(os, "fdatasync")
    w.append(2)
    w.flush()
    assert calls == ["fdatasync", "fsync"]
    monkeypatch.undo()
    w.close()
