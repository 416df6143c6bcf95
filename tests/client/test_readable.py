"""cqsctl's readable numbers: sizes, durations and times by column, and status sections;
JSON is left alone (tests/daemon/test_ctl.py)."""

from cqsclient import readable
from cqsclient.ctl import format_table


def test_sizes_durations_and_times_read_as_such():
    """Bytes in binary units, seconds by magnitude, epoch times as UTC timestamps."""
    assert [readable.size(n) for n in (0, 1023, 1024, 1536, 64 * 1024**2, 5 * 1024**4)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "64 MiB", "5 TiB"]
    assert [readable.duration(s) for s in (0.00021, 0.5, 4.25, 125, 3 * 3600 + 600,
                                           2 * 86400 + 4 * 3600)] == [
        "0.21 ms", "500 ms", "4.2 s", "2m 05s", "3h 10m", "2d 4h"]
    assert readable.moment(0) == "1970-01-01T00:00:00Z"
    assert readable.moment_ns(1_500_000_000) == "1970-01-01T00:00:01.500Z"
    assert readable.size("n/a") == "n/a" and readable.duration(None) is None


def test_rows_are_made_readable_by_column():
    """Only the columns whose unit is known change; counts stay numbers."""
    row = readable.row({"size": 2048, "messages": 2048, "started": 60.0, "seconds": 90,
                        "oldest_put_time": None})
    assert row == {"size": "2 KiB", "messages": 2048, "started": "1970-01-01T00:01:00Z",
                   "seconds": "1m 30s", "oldest_put_time": None}


def test_status_has_sections():
    """The snapshot reads like redis-cli INFO: sections, then the structures' table."""
    snapshot = {
        "version": "0.1.0", "pid": 7, "started": 0.0, "uptime_seconds": 3700.0,
        "state": "ready", "clients": 3, "max_clients": 32, "operator_sessions": 1,
        "connections": 4, "recovering": [], "jobs_running": 0,
        "log": {"bytes": 64 * 1024**2, "segments": 1, "appended_lsn": 9, "durable_lsn": 9,
                "fsync_seconds": 0.0002, "failed": None},
        "structures": [{"name": "S", "overflow_of": None, "status": "available", "size": 1024,
                        "current_size": 1024, "used_bytes": 512, "percent_full": 50.0,
                        "full": False, "messages": 1, "locked": 0, "cold": 0,
                        "overflow_mode": False, "last_checkpoint": None,
                        "checkpoint_age_seconds": None, "checkpoint_seconds": None,
                        "checkpoint_log_bytes": 100}],
    }
    text = readable.status(snapshot, format_table)
    for line in ("# Server", "uptime: 1h 01m (since 1970-01-01T00:00:00Z)",
                 "clients: 3 of 32", "log_size: 64 MiB in 1 segment files",
                 "fsync: 0.20 ms (moving average)", "recovering: none", "# Structures"):
        assert line in text
    assert "512 B of 1 KiB" in text and "50.0%" in text
