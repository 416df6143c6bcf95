"""The traffic report's page drawn from tables alone (no Spark): a summary first, the
backlog of each queue over time, largest messages without rows of identical bars,
and a lock-hold chart one slow queue does not flatten."""

import re
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa

from cqsd.srds.traffic import plots
from cqsd.srds.traffic.report import Report, checkpoints

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
COUNTS = ("puts", "reads", "deletes", "redeliveries", "suspends", "moved_out", "moved_in")


def minute(n: int) -> datetime:
    return T0.replace(minute=n)


def minutes() -> pa.Table:
    """SLOW gains 10 a minute (its reader does not keep up); FAST puts and deletes 50."""
    rows = []
    for n in range(5):
        rows.append({"structure": "MSGQ01", "qtype": "TRAN", "queue": "SLOW", "minute": minute(n),
                     **dict.fromkeys(COUNTS, 0), "puts": 12, "reads": 2, "deletes": 2})
        rows.append({"structure": "MSGQ01", "qtype": "TRAN", "queue": "FAST", "minute": minute(n),
                     **dict.fromkeys(COUNTS, 0), "puts": 50, "reads": 51, "deletes": 50,
                     "redeliveries": 1})
    return pa.Table.from_pylist(rows)


def queues() -> pa.Table:
    def row(queue, puts, reads, deletes, redeliveries, largest):
        return {"structure": "MSGQ01", "qtype": "TRAN", "queue": queue,
                **dict.fromkeys(COUNTS, 0), "puts": puts, "reads": reads, "deletes": deletes,
                "redeliveries": redeliveries, "largest_bytes": largest}
    return pa.Table.from_pylist([row("FAST", 250, 255, 250, 5, 300_000),
                                 row("SLOW", 60, 10, 10, 0, 100)])


def locks() -> pa.Table:
    """FAST releases in milliseconds; SLOW holds its locks for minutes."""
    return pa.Table.from_pylist([
        {"structure": "MSGQ01", "qtype": "TRAN", "queue": "FAST", "count": 250, "p50": 0.002,
         "p90": 0.004, "p99": 0.01, "max": 0.02, "mean": 0.003},
        {"structure": "MSGQ01", "qtype": "TRAN", "queue": "SLOW", "count": 10, "p50": 120.0,
         "p90": 240.0, "p99": 290.0, "max": 300.0, "mean": 150.0}])


def largest() -> pa.Table:
    """Fifteen messages of the same 300,000 bytes on FAST, and five others."""
    rows = [{"structure": "MSGQ01", "id": i, "qtype": "TRAN", "queue": "FAST",
             "bytes": 300_000, "put_time": minute(1)} for i in range(1, 16)]
    rows += [{"structure": "MSGQ01", "id": 100 + i, "qtype": "TRAN", "queue": "SLOW",
              "bytes": 1000 * (i + 1), "put_time": minute(2)} for i in range(5)]
    return pa.Table.from_pylist(rows)


def made(tmp_path):
    tables = {"minutes": minutes(), "queues": queues(), "locks": locks(),
              "residence": locks(), "largest": largest(),
              "checkpoints": checkpoints(tmp_path / "none.db", None, None, [])}
    report = Report(tables=tables, records=1234, span=(T0.timestamp(), minute(4).timestamp()))
    page = plots.draw(report, tmp_path, data_dir=tmp_path, since=None)
    return page.read_text()


def test_the_page_opens_with_a_summary(tmp_path):
    page = made(tmp_path)
    headings = re.findall(r"<h2>([^<]+)</h2>", page)
    assert headings[:2] == ["Summary", "Queues"]
    summary = re.search(r"<ul class='summary'>(.*?)</ul>", page).group(1)
    assert "310 puts, 265 reads with a lock (5 of them redeliveries), 260 deletes" in summary
    assert "Busiest queue: MSGQ01 TRAN FAST, 250 puts." in summary
    assert "Backlog: MSGQ01 TRAN SLOW gained the most, 50 messages" in summary
    assert "Largest message: 300,000 bytes, on MSGQ01 TRAN FAST." in summary
    assert "Longest lock holds: MSGQ01 TRAN SLOW" in summary
    assert "Checkpoints: none in this period." in summary


def test_backlog_over_time_per_queue(tmp_path):
    page = made(tmp_path)
    assert "<img src='backlog.png'" in page
    assert (tmp_path / "backlog.png").read_bytes().startswith(b"\x89PNG")
    table = plots.backlog(minutes().to_pandas())
    assert list(table["MSGQ01 TRAN SLOW"]) == [10, 20, 30, 40, 50]
    assert list(table["MSGQ01 TRAN FAST"]) == [0] * 5


def test_identical_largest_messages_are_one_bar():
    bars = plots.largest_bars(largest().to_pandas())
    assert list(bars["label"]) == ["MSGQ01 TRAN FAST ×15", "MSGQ01 TRAN SLOW #104",
                                   "MSGQ01 TRAN SLOW #103", "MSGQ01 TRAN SLOW #102",
                                   "MSGQ01 TRAN SLOW #101", "MSGQ01 TRAN SLOW #100"]
    assert list(bars["messages"]) == [15, 1, 1, 1, 1, 1]


def test_one_slow_queue_puts_the_lock_chart_on_a_log_scale():
    frame = locks().to_pandas()
    values = pd.concat([frame[p] for p in ("p50", "p90", "p99")])
    assert plots.spread_scale(values) == "log"
    assert plots.spread_scale(pd.Series([0.0, 1.0, 2.0, 50.0])) == "linear"
