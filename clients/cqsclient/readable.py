"""How cqsctl shows numbers to people: sizes as ``1.5 MiB``, times as UTC
timestamps, durations as ``2m 05s``, and ``cqsctl status`` as sections like
``redis-cli INFO``. Only tables and text change; ``--json`` keeps every number
in its one unit (bytes, seconds, epoch seconds or nanoseconds as the daemon
sends them).

The daemon's rows name their units by column (``docs/operations.md``): the
sets below say which column is which.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Final

SIZE_COLUMNS: Final = frozenset({
    "size", "current_size", "used_bytes", "bytes", "max_message", "checkpoint_log_bytes",
})
TIME_NS_COLUMNS: Final = frozenset({  # epoch nanoseconds
    "put_time", "oldest_put_time", "rcvtime", "failtime",
})
TIME_COLUMNS: Final = frozenset({"started", "finished", "last_checkpoint"})  # epoch seconds
DURATION_COLUMNS: Final = frozenset({
    "seconds", "uptime_seconds", "checkpoint_age_seconds", "checkpoint_seconds", "lease_left",
})
_BINARY: Final = ("KiB", "MiB", "GiB", "TiB")


def size(n: Any) -> Any:
    """Bytes as ``512 B``, ``1.5 MiB``; anything else unchanged."""
    if not isinstance(n, int) or isinstance(n, bool):
        return n
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _BINARY:
        value /= 1024
        if abs(value) < 1024 or unit == _BINARY[-1]:
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
    raise AssertionError("unreachable")


def duration(seconds: Any) -> Any:
    """Seconds as ``0.21 ms``, ``850 ms``, ``4.2 s``, ``2m 05s``, ``3h 10m`` or ``2d 4h``."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return seconds
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def moment(seconds: Any) -> Any:
    """Epoch seconds as a UTC timestamp to the second, ``2026-05-01T12:00:00Z``."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return seconds
    when = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def moment_ns(ns: Any) -> Any:
    """Epoch nanoseconds as a UTC timestamp to the millisecond."""
    if not isinstance(ns, int) or isinstance(ns, bool):
        return ns
    when = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def standbys(nodes: Any) -> Any:
    """``display owners``' standbys as ``NODE2 (12 behind, 0.3 s)``, or the node alone
    while its lag is not known; anything else unchanged."""
    if not isinstance(nodes, list):
        return nodes
    shown = []
    for n in nodes:
        if not isinstance(n, dict):
            return nodes
        records, seconds = n.get("behind_records"), n.get("behind_seconds")
        lag = [] if records is None else [f"{records} behind"]
        lag += [] if seconds is None else [duration(seconds)]
        shown.append(f"{n.get('node')} ({', '.join(lag)})" if lag else str(n.get("node")))
    return ", ".join(shown) or None


def _rule(column: str) -> Callable[[Any], Any] | None:
    if column == "standbys":
        return standbys
    if column in SIZE_COLUMNS:
        return size
    if column in TIME_NS_COLUMNS:
        return moment_ns
    if column in TIME_COLUMNS:
        return moment
    if column in DURATION_COLUMNS:
        return duration
    return None


def row(values: dict[str, Any]) -> dict[str, Any]:
    """A daemon row with its sizes, times and durations made readable."""
    out = {}
    for column, value in values.items():
        if column == "stages" and isinstance(value, list):  # a job's: each with its time
            out[column] = ", ".join(f"{s.get('stage')} {duration(s.get('seconds'))}"
                                    for s in value if isinstance(s, dict)) or None
            continue
        rule = _rule(column)
        out[column] = rule(value) if rule is not None and value is not None else value
    return out


def status(s: dict[str, Any], table: Callable[[list[dict[str, Any]]], str]) -> str:
    """``cqsctl status``: the daemon's snapshot in sections; ``table`` lays out rows."""
    log = s["log"]
    lines = [
        "# Server",
        f"version: {s['version']}",
        f"pid: {s['pid']}",
        f"state: {s['state']}",
        f"uptime: {duration(s['uptime_seconds'])} (since {moment(s['started'])})",
        "",
        "# Clients",
        f"clients: {s['clients']} of {s['max_clients']}",
        f"operator_sessions: {s['operator_sessions']}",
        f"connections: {s['connections']}",
        "",
        "# Log",
        f"log_size: {size(log['bytes'])} in {log['segments']} segment files",
        f"appended_lsn: {log['appended_lsn']}",
        f"durable_lsn: {log['durable_lsn']}",
        f"fsync: {duration(log['fsync_seconds'])} (moving average)",
    ]
    if log.get("failed"):
        lines.append(f"log_failed: {log['failed']}")
    lines += ["", "# Recovery",
              f"recovering: {', '.join(s['recovering']) or 'none'}",
              f"jobs_running: {s['jobs_running']}",
              "", "# Structures", table([_structure(r) for r in s["structures"]])]
    return "\n".join(lines)


def _structure(r: dict[str, Any]) -> dict[str, Any]:
    used = f"{size(r['used_bytes'])} of {size(r['current_size'])}" if "used_bytes" in r else None
    return {
        "name": r["name"], "status": r["status"], "overflow_of": r.get("overflow_of"),
        "full": f"{r['percent_full']}%" if "percent_full" in r else None, "used": used,
        "messages": r.get("messages"), "locked": r.get("locked"),
        "overflow_mode": r.get("overflow_mode"),
        "last_checkpoint": ("no checkpoint yet" if r["last_checkpoint"] is None
                            and r.get("status") != "failed" else moment(r["last_checkpoint"])),
        "age": duration(r["checkpoint_age_seconds"]) if r["last_checkpoint"] is not None else None,
        "took": duration(r["checkpoint_seconds"]),
        "log_since": size(r["checkpoint_log_bytes"]),
    }
