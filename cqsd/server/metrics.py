"""The monitoring listener (``metrics_listen``): Prometheus ``/metrics`` and
``/healthz`` over plain HTTP/1.0, with no client slot.

Design note. Prometheus scrapes are rare (seconds apart) and the figures live
in the engine, which only the event loop may touch, so the listener is a few
lines of Trio on the daemon's own loop rather than prometheus-client's
threaded server: a scrape runs the collector below on the loop, between two
requests, and reads everything as it is at that instant. Histograms the
journal feeds (fsync latency, records per fsync) are prometheus-client
objects; everything else is read at scrape time. Queue depths are exported
for the queues that hold or lend out messages, the same set ``display
queues`` shows. A connection gets ``READ_TIMEOUT`` to send its request and at
most ``MAX_SCRAPERS`` are served at once; others are closed unanswered.
"""

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import psutil
import structlog
import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..engine import QueueType
from ..engine.entry import ELEMENT
from . import status
from .rooms import Rooms

log = structlog.get_logger()
T = TypeVar("T")
READ_TIMEOUT = 5.0  # seconds a scraper has to send its request head
MAX_HEAD = 8192  # bytes of request head read; a longer one is refused
MAX_SCRAPERS = 8  # connections served at once
# fsync latency buckets: from a fast NVMe flush (~50 µs) to a disk in trouble (seconds)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1.0, 2.5)
RECORD_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)  # group commit sizes
COUNTS = {"puts": "messages put", "reads": "messages read with a lock",
          "redeliveries": "messages read again after an earlier delivery",
          "deletes": "messages deleted",
          "suspends": "failed deliveries that sent a message to its suspend queue",
          "expiries": "leased locks that expired unrenewed"}


class Fsyncs:
    """The metrics registry, with the histograms the journal feeds (made before the
    journal, which reports each fsync to ``flushed``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.fsync_seconds = Histogram(
            "cqsd_fsync_seconds", "Time one group-commit fsync of the log took",
            buckets=FSYNC_BUCKETS, registry=self.registry)
        self.fsync_records = Histogram(
            "cqsd_fsync_records", "Log records one fsync made durable (acknowledgements "
            "per fsync: group commit)", buckets=RECORD_BUCKETS, registry=self.registry)

    def flushed(self, seconds: float, records: int) -> None:
        """The journal's report of one fsync."""
        self.fsync_seconds.observe(seconds)
        self.fsync_records.observe(records)


class Monitor:
    """The daemon's metrics registry and its HTTP listener."""

    def __init__(self, d: Rooms, fsyncs: Fsyncs) -> None:
        self.d = d
        self.registry = fsyncs.registry
        self.registry.register(_Collector(d))
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds …:
        # the names every Prometheus dashboard for a process expects
        ProcessCollector(registry=self.registry)
        self._slots = trio.Semaphore(MAX_SCRAPERS)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def health(self) -> tuple[int, bytes]:
        """200 while the daemon serves, 503 while it starts, stops or after a log failure."""
        now = status.state(self.d)
        body = {"status": now, "pid": os.getpid()}
        return (200 if now == "ready" else 503), json.dumps(body).encode()

    async def serve(self, listeners: list[trio.SocketListener]) -> None:
        await trio.serve_listeners(self._handle, listeners)

    async def serve_during(self, listeners: list[trio.SocketListener], work: Callable[[], T]) -> T:
        """Serve ``listeners`` while ``work`` (the start's recovery, which does not await)
        runs in a thread; its result. Probes get ``503 starting`` and scrapes the
        daemon-wide families rather than "connection refused" while a long recovery
        runs; the listeners stay open for ``serve``, which takes over afterwards."""
        failed: Exception | None = None
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            try:
                result = await trio.to_thread.run_sync(work)
            except Exception as err:  # raised as it is, not in an exception group
                failed = err
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return result

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:  # not trio.serve_listeners: it would close the listener when cancelled
            nursery.start_soon(self._handle, await listener.accept())

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            if self._slots.value == 0:
                return
            async with self._slots:
                await self._answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a scrape must never cost the daemon
            log.exception("metrics_request_failed")
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SocketStream) -> None:
        head = b""
        with trio.move_on_after(READ_TIMEOUT):
            while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_HEAD:
                chunk = await stream.receive_some(MAX_HEAD)
                if not chunk:
                    break
                head += chunk
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) < 2:
            return
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            code, ctype, body = 405, "text/plain", b"only GET\n"
        elif path == b"/metrics":
            code, ctype, body = 200, CONTENT_TYPE_LATEST, self.render()
        elif path == b"/healthz":
            code, body = self.health()
            ctype = "application/json"
        else:
            code, ctype, body = 404, "text/plain", b"/metrics or /healthz\n"
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                  503: "Service Unavailable"}[code]
        header = (f"HTTP/1.0 {code} {reason}\r\nContent-Type: {ctype}\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        await stream.send_all(header + (b"" if method == b"HEAD" else body))


class _Collector(Collector):
    """Everything read at scrape time."""

    def __init__(self, d: Rooms) -> None:
        self.d = d
        self.process = psutil.Process(os.getpid())

    def collect(self) -> Iterator[Metric]:
        d = self.d
        yield _gauge("cqsd_info", "The daemon's version", {"version": __version__}, 1)
        yield _gauge("cqsd_uptime_seconds", "Seconds since the daemon started", {},
                     round(time.time() - d.life.started, 3))
        yield _gauge("cqsd_ready", "1 while the daemon serves requests", {},
                     int(status.state(d) == "ready"))
        if not d.life.ready:
            # recovery may be rebuilding the structures in its thread: only what
            # does not touch them (serve_during)
            yield from _jobs(self.process)
            return
        snap = status.snapshot(d)
        clients = GaugeMetricFamily("cqsd_clients", "Registered sessions", labels=["kind"])
        clients.add_metric(["application"], snap["clients"])
        clients.add_metric(["operator"], snap["operator_sessions"])
        yield clients
        yield _gauge("cqsd_max_clients", "Application clients allowed at once", {},
                     snap["max_clients"])
        yield _gauge("cqsd_connections", "Open connections", {}, snap["connections"])
        yield from _structures(d, snap["structures"])
        yield from _queues(d)
        yield from _smds(d)
        yield from _log(snap["log"])
        running = GaugeMetricFamily("cqsd_jobs_running", "Spark jobs running", labels=[])
        running.add_metric([], snap["jobs_running"])
        yield running
        yield from _group(snap["group"])
        yield from _jobs(self.process)


def _group(role: dict | None) -> Iterator[Metric]:
    """This node of a group (docs/group.md): fenced, lease left, takeovers, what it owns."""
    yield _gauge("cqsd_node_fenced", "1 when this node of a group cannot renew its lease "
                 "and stops acknowledging; 0 otherwise (always 0 alone)", {},
                 int(bool(role and role["fenced"])))
    if role is None:
        return
    yield _gauge("cqsd_node_lease_left_seconds", "Seconds this node may still acknowledge "
                 "without renewing its etcd lease", {}, role["lease_left"])
    takeovers = CounterMetricFamily("cqsd_node_takeovers", "Structure pairs this node took "
                                    "over since it started", labels=[])
    takeovers.add_metric([], role["takeovers"])
    yield takeovers
    owner = GaugeMetricFamily("cqsd_structure_owned", "1 for a pair this node owns, 0 for one "
                              "it stands by for", labels=["structure"])
    for name in role["owns"]:
        owner.add_metric([name], 1)
    for name in role["stands_by"]:
        owner.add_metric([name], 0)
    yield owner


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), value)
    return g


# (family, help, the status row's field, scale): gauges of an available structure
STRUCTURE_GAUGES = (
    ("cqsd_structure_size_bytes", "Current size", "current_size", 1),
    ("cqsd_structure_max_size_bytes", "Maximum size (SIZE)", "size", 1),
    ("cqsd_structure_used_bytes", "Bytes of data elements in use", "used_bytes", 1),
    ("cqsd_structure_fullness_ratio", "Data elements in use over those available",
     "percent_full", 0.01),
    ("cqsd_structure_full", "1 while puts are refused", "full", 1),
    ("cqsd_structure_messages", "Messages held", "messages", 1),
    ("cqsd_locks_in_flight", "Messages locked by readers", "locked", 1),
    ("cqsd_overflow_mode", "1 while the primary structure is in overflow mode",
     "overflow_mode", 1),
)
# and of any structure, failed or not, when known
CHECKPOINT_GAUGES = (
    ("cqsd_checkpoint_age_seconds", "Seconds since the newest checkpoint's cut",
     "checkpoint_age_seconds", 1),
    ("cqsd_checkpoint_duration_seconds", "How long the last checkpoint took",
     "checkpoint_seconds", 1),
    ("cqsd_checkpoint_log_bytes", "Log bytes after the newest checkpoint (what a crash "
     "restart folds)", "checkpoint_log_bytes", 1),
)


def _structures(d: Rooms, rows: list[dict]) -> Iterator[Metric]:
    labels = ["structure"]
    available = GaugeMetricFamily("cqsd_structure_available",
                                  "1 if available, 0 while failed or being recovered",
                                  labels=labels)
    gauges = [(GaugeMetricFamily(name, doc, labels=labels), field, scale, always)
              for table, always in ((STRUCTURE_GAUGES, False), (CHECKPOINT_GAUGES, True))
              for name, doc, field, scale in table]
    counters = {k: CounterMetricFamily(f"cqsd_{k}", f"{doc.capitalize()}, by structure",
                                       labels=labels) for k, doc in COUNTS.items()}
    recovering = set(d.operations.recovering)
    for row in rows:
        up = row["status"] == "available"
        available.add_metric([row["name"]], int(up and row["name"] not in recovering))
        for family, field, scale, always in gauges:
            if (up or always) and row.get(field) is not None:
                family.add_metric([row["name"]], row[field] * scale)
        s = d.registry.physical(row["name"]) if up else None
        for k, counter in counters.items():
            if s is not None:
                counter.add_metric([row["name"]], getattr(s.counts, k))
    yield available
    yield from (family for family, *_ in gauges)
    yield from counters.values()


def _queues(d: Rooms) -> Iterator[Metric]:
    labels = ["structure", "qtype", "queue"]
    depth = GaugeMetricFamily("cqsd_queue_depth", "Ready messages on a queue", labels=labels)
    locked = GaugeMetricFamily("cqsd_queue_locked", "Messages of a queue locked by readers",
                               labels=labels)
    used = GaugeMetricFamily("cqsd_queue_bytes", "Bytes of data elements a queue's ready "
                             "messages use", labels=labels)
    overflow = GaugeMetricFamily("cqsd_queue_overflow",
                                 "1 while a queue is in overflow status", labels=labels)
    waiting = GaugeMetricFamily("cqsd_queue_waiting_reads", "Reads waiting on a queue",
                                labels=labels)
    oldest = GaugeMetricFamily("cqsd_queue_oldest_age_seconds", "Age of a queue's oldest "
                               "ready message (0 with none ready): the backlog's age",
                               labels=labels)
    delayed = GaugeMetricFamily("cqsd_queue_delayed", "Messages of a queue put with a delay "
                                "that has not ended yet", labels=labels)
    now_ns = time.time_ns()
    for pair in d.registry.pairs.values():
        for q in pair.queues(also=pair.watched):
            key = [pair.name, q["qtype"], q["queue"]]
            put = q["oldest_put_time"]
            oldest.add_metric(key, 0 if put is None else max(0, now_ns - put) / 1e9)
            delayed.add_metric(key, q["delayed"])
            depth.add_metric(key, q["depth"])
            locked.add_metric(key, q["locked"])
            used.add_metric(key, q["elements"] * ELEMENT)
            overflow.add_metric(key, int(q["overflow"]))
            waiting.add_metric(key, d.waiters.count(pair.name, (QueueType[q["qtype"]], q["queue"])))
    yield from (depth, locked, used, overflow, waiting, oldest, delayed)


def _smds(d: Rooms) -> Iterator[Metric]:
    """Each data set's size and fullness, and its structure's buffer pool (docs/smds.md)."""
    labels = ["structure", "owner"]
    families: list[tuple[GaugeMetricFamily | CounterMetricFamily, str, float]] = [
        (kind(name, doc, labels=labels), field, scale)
        for kind, name, field, scale, doc in (
            (GaugeMetricFamily, "cqsd_smds_size_bytes", "size", 1,
             "Bytes a shared message data set is formatted to"),
            (GaugeMetricFamily, "cqsd_smds_used_ratio", "used_percent", 0.01,
             "Share of a data set's pages not available to a put (0 to 1)"),
            (GaugeMetricFamily, "cqsd_smds_lru_hit_ratio", "lru_hit_percent", 0.01,
             "Share of reads served by the structure's buffer pool (0 to 1)"),
            (CounterMetricFamily, "cqsd_smds_buffer_waits", "waits", 1,
             "Reads that found every buffer of the pool in use"),
            (GaugeMetricFamily, "cqsd_smds_lowest_free_buffers", "lowest_free", 1,
             "Fewest free buffers seen in the structure's pool"))]
    available = GaugeMetricFamily("cqsd_smds_available", "1 while a data set can be used",
                                  labels=labels)
    for row in d.datasets.rows(None):
        key = [row["structure"], row["owner"]]
        for family, field, scale in families:
            family.add_metric(key, row[field] * scale)
        available.add_metric(key, int(row["available"]))
    yield available
    yield from (family for family, _, _ in families)


def _log(row: dict) -> Iterator[Metric]:
    yield _gauge("cqsd_log_bytes", "Bytes of logstream segment files on disk", {}, row["bytes"])
    yield _gauge("cqsd_log_segments", "Logstream segment files", {}, row["segments"])
    yield _gauge("cqsd_log_appended_lsn", "Last log record appended", {}, row["appended_lsn"])
    yield _gauge("cqsd_log_durable_lsn", "Last log record known durable", {}, row["durable_lsn"])
    yield _gauge("cqsd_log_failed", "1 once a log write failed (the daemon stops)", {},
                 int(row["failed"] is not None))


def _jobs(p: psutil.Process) -> Iterator[Metric]:
    """The daemon's threads, and its jobs' memory (a Spark JVM and its workers); the
    daemon's own CPU, memory and files are the standard ``process_*`` families."""
    yield _gauge("cqsd_threads", "Threads of the daemon process", {}, p.num_threads())
    rss = 0
    for child in p.children(recursive=True):
        try:
            rss += child.memory_info().rss
        except psutil.Error:
            pass  # it ended meanwhile
    yield _gauge("cqsd_jobs_resident_memory_bytes",
                 "Resident memory of the daemon's child processes (Spark jobs)", {}, rss)
