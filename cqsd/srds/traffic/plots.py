"""The traffic report as a page: PNG plots (matplotlib, no display needed) and
``index.html`` showing them with the tables they were drawn from.

Nothing here reads the data directory or starts Spark: it draws a
``report.Report`` (its tables are also written as Parquet beside the page), so
the page can be redrawn, or drawn in a test, from tables alone.
"""

import html
import time
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .report import Report  # noqa: E402

LINES = 8  # queues drawn one by one in a per-minute plot; the rest are summed as "others"
BARS = 15  # queues in a percentile plot
WIDTH, HEIGHT = 10, 3.2  # inches per panel
STYLE = """body{font-family:sans-serif;margin:2em;max-width:80em;color:#222}
.wide{overflow-x:auto}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}
th{background:#eee}td:first-child,td:nth-child(2),td:nth-child(3){text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}.note{color:#666}
.problem{color:#a00}"""


def draw(report: Report, out: Path, *, data_dir: Path, since: float | None) -> Path:
    """Write the plots and ``out/index.html``; returns the page's path."""
    t = {name: table.to_pandas() for name, table in report.tables.items()}
    sections = [
        ("Puts, reads and deletes per minute", _per_minute(
            t.get("minutes"), ["puts", "reads", "deletes"], out / "traffic.png"),
         "reads are reads with a lock; browses are not logged", None),
        ("Backlog over time", _backlog(t.get("minutes"), out / "backlog.png"),
         "messages each queue gained since the period began (puts and moves in, less "
         "deletes and moves out), minute by minute: a line that keeps rising is a queue "
         "its readers do not keep up with", None),
        ("Redeliveries and suspends per minute", _per_minute(
            t.get("minutes"), ["redeliveries", "suspends"], out / "redeliveries.png"),
         "a redelivery is a read of a message read before; a suspend counts against the "
         "queue the message was suspended from", None),
        ("Residence time, put to delete", _percentiles(
            t.get("residence"), "seconds in the structure", out / "residence.png"),
         "by the queue the message was put to", t.get("residence")),
        ("Lock hold time, read to delete, unlock or move", _percentiles(
            t.get("locks"), "seconds locked", out / "locks.png"), None, t.get("locks")),
        ("Overflow moves and episodes", _overflow(
            t.get("minutes"), t.get("episodes"), out / "overflow.png"),
         None if "episodes" in t else "episodes need the daemon's event log (--events)",
         t.get("episodes")),
        ("Checkpoints", _checkpoints(t.get("checkpoints"), out / "checkpoints.png"), None,
         t.get("checkpoints")),
        ("Largest messages", _largest(t.get("largest"), out / "largest.png"), None,
         t.get("largest")),
    ]
    page = out / "index.html"
    page.write_text(_page(report, sections, t, data_dir, since))
    return page


def _label(frame: pd.DataFrame) -> pd.Series:
    return (frame["structure"].fillna("?") + " " + frame["qtype"].fillna("?") + " "
            + frame["queue"].fillna("(put before the log)"))


def _per_minute(minutes: pd.DataFrame | None, columns: list[str], path: Path) -> Path | None:
    if minutes is None or minutes.empty or not minutes[columns].to_numpy().any():
        return None
    frame = minutes.assign(label=_label(minutes))
    volume = frame.groupby("label")[columns].sum().sum(axis=1).sort_values(ascending=False)
    top = list(volume.index[:LINES])
    frame["label"] = frame["label"].where(frame["label"].isin(top), "others")
    fig, axes = plt.subplots(len(columns), 1, figsize=(WIDTH, HEIGHT * len(columns)),
                             sharex=True, squeeze=False)
    for ax, column in zip(axes[:, 0], columns, strict=True):
        table = frame.pivot_table(index="minute", columns="label", values=column,
                                  aggfunc="sum", fill_value=0)
        for label in table.columns:
            ax.plot(table.index, table[label], marker="o", markersize=3, label=label)
        ax.set_ylabel(f"{column} / min")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    axes[-1, 0].set_xlabel("minute (UTC)")
    return _save(fig, path)


def backlog(minutes: pd.DataFrame) -> pd.DataFrame:
    """Per minute (rows) and queue (columns): the messages the queue gained since the
    period began. What it held before is not in the log's effects of the period,
    so this is the backlog's growth, which is what says readers fall behind."""
    frame = minutes.assign(label=_label(minutes))
    frame["net"] = (frame["puts"] + frame["moved_in"] - frame["deletes"] - frame["moved_out"])
    return frame.pivot_table(index="minute", columns="label", values="net", aggfunc="sum",
                             fill_value=0).sort_index().cumsum()


def _backlog(minutes: pd.DataFrame | None, path: Path) -> Path | None:
    if minutes is None or minutes.empty:
        return None
    table = backlog(minutes)
    top = list(table.abs().max().sort_values(ascending=False).index[:LINES])
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    for label in top:
        ax.step(table.index, table[label], where="post", label=label)
    if len(table.columns) > len(top):
        ax.step(table.index, table.drop(columns=top).sum(axis=1), where="post", label="others")
    ax.set_ylabel("messages gained")
    ax.set_xlabel("minute (UTC)")
    ax.axhline(0, color="#888", linewidth=0.8)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
    return _save(fig, path)


def spread_scale(values: pd.Series) -> str:
    """"log" when the largest value is over a hundred times the smallest positive
    one: then one slow queue would flatten every other bar to nothing on a linear
    axis; "linear" otherwise."""
    positive = values[values > 0]
    if positive.empty or positive.max() <= 100 * positive.min():
        return "linear"
    return "log"


def _percentiles(stats: pd.DataFrame | None, unit: str, path: Path) -> Path | None:
    if stats is None or stats.empty:
        return None
    frame = stats.assign(label=_label(stats)).nlargest(BARS, "count").iloc[::-1]
    fig, ax = plt.subplots(figsize=(WIDTH, 1 + 0.45 * len(frame)))
    height = 0.25
    for i, name in enumerate(("p50", "p90", "p99")):
        ax.barh([y + (i - 1) * height for y in range(len(frame))], frame[name], height,
                label=name)
    ax.set_yticks(range(len(frame)), frame["label"])
    scale = spread_scale(pd.concat([frame[p] for p in ("p50", "p90", "p99")]))
    if scale == "log":  # each queue's bars stay readable beside a slow one
        positive = frame[["p50", "p90", "p99"]].to_numpy()
        ax.set_xscale("log")
        ax.set_xlim(left=positive[positive > 0].min() / 2)
        unit += " (log scale)"
    ax.set_xlabel(unit)
    ax.legend(fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _overflow(minutes: pd.DataFrame | None, episodes: pd.DataFrame | None,
              path: Path) -> Path | None:
    moves = minutes is not None and not minutes.empty and minutes["moved_out"].any()
    if not moves and (episodes is None or episodes.empty):
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    if moves and minutes is not None:
        per = minutes.groupby(["minute", "structure"])["moved_out"].sum().unstack(fill_value=0)
        for structure in per.columns[per.sum() > 0]:
            ax.plot(per.index, per[structure], marker="o", markersize=3,
                    label=f"{structure}: moved to overflow / min")
    if episodes is not None and not episodes.empty:
        end = episodes["end"].fillna(episodes["start"].max())
        colours = {"full": "tab:red", "overflow mode": "tab:orange", "overflow status": "tab:olive"}
        for (kind, structure), group in episodes.assign(end=end).groupby(["kind", "structure"]):
            for n, row in enumerate(group.itertuples()):
                ax.axvspan(row.start, row.end if row.end > row.start else
                           row.start + pd.Timedelta(seconds=1), alpha=0.25,
                           color=colours.get(kind, "tab:gray"),
                           label=f"{structure} {kind}" if n == 0 else None)
    ax.set_xlabel("time (UTC)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _checkpoints(frame: pd.DataFrame | None, path: Path) -> Path | None:
    if frame is None or frame.empty:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    for status, group in frame.groupby("status"):
        ax.scatter(group["started"], group["seconds"], label=status,
                   color="tab:green" if status == "ok" else "tab:red")
    ax.set_ylabel("seconds")
    ax.set_xlabel("started (UTC)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def largest_bars(frame: pd.DataFrame) -> pd.DataFrame:
    """One bar per queue and size: messages of the same size on the same queue (a
    batch of equal payloads) are one bar saying how many, not a row of identical
    bars. Largest first."""
    bars = frame.assign(label=_label(frame)).groupby(["label", "bytes"], sort=False).agg(
        messages=("id", "size"), first=("id", "min")).reset_index()
    bars["label"] = bars["label"] + bars.apply(
        lambda r: f" #{r['first']}" if r["messages"] == 1 else f" ×{r['messages']}", axis=1)
    return bars.sort_values(["bytes", "label"], ascending=[False, True]).reset_index(drop=True)


def _largest(frame: pd.DataFrame | None, path: Path) -> Path | None:
    if frame is None or frame.empty:
        return None
    bars = largest_bars(frame).iloc[::-1]
    fig, ax = plt.subplots(figsize=(WIDTH, 1 + 0.35 * len(bars)))
    ax.barh(range(len(bars)), bars["bytes"])
    ax.set_yticks(range(len(bars)), bars["label"])
    ax.set_xlabel("bytes")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary(t: dict[str, pd.DataFrame], report: Report) -> list[str]:
    """The page's first lines: what an operator asks first of a period."""
    queues, lines = t.get("queues"), []
    if queues is None or queues.empty or "puts" not in queues:
        lines.append("No recoverable traffic was logged in this period.")
    else:
        q = queues.assign(label=_label(queues))
        total = {c: int(q[c].sum()) for c in ("puts", "reads", "deletes", "redeliveries",
                                               "suspends")}
        lines.append(f"{total['puts']:,} puts, {total['reads']:,} reads with a lock "
                     f"({total['redeliveries']:,} of them redeliveries), "
                     f"{total['deletes']:,} deletes and {total['suspends']:,} suspends "
                     f"on {len(q)} queues.")
        busiest = q.loc[q["puts"].idxmax()]
        lines.append(f"Busiest queue: {busiest['label']}, {int(busiest['puts']):,} puts.")
        gained = q["puts"] + q["moved_in"] - q["deletes"] - q["moved_out"]
        if gained.max() > 0:
            lines.append(f"Backlog: {q.loc[gained.idxmax(), 'label']} gained the most, "
                         f"{int(gained.max()):,} messages over the period.")
        else:
            lines.append("Backlog: no queue gained messages over the period.")
        if q["largest_bytes"].notna().any():
            big = q.loc[q["largest_bytes"].idxmax()]
            lines.append(f"Largest message: {int(big['largest_bytes']):,} bytes, on "
                         f"{big['label']}.")
    locks = t.get("locks")
    if locks is not None and not locks.empty:
        slow = locks.assign(label=_label(locks)).sort_values("p99").iloc[-1]
        lines.append(f"Longest lock holds: {slow['label']}, 99% released within "
                     f"{slow['p99']:.3f} s (longest {slow['max']:.3f} s).")
    checkpoints = t.get("checkpoints")
    if checkpoints is not None and not checkpoints.empty:
        failed = int((checkpoints["status"] != "ok").sum())
        lines.append(f"Checkpoints: {len(checkpoints)} ({failed} failed), the longest "
                     f"{checkpoints['seconds'].max():.1f} s.")
    else:
        lines.append("Checkpoints: none in this period.")
    if report.problems:
        lines.append(f"Problems: {len(report.problems)}, listed above.")
    return lines


def _page(report: Report, sections: list, t: dict[str, pd.DataFrame], data_dir: Path,
          since: float | None) -> str:
    e = html.escape
    queues = t.get("queues")
    span = ("no logged traffic" if report.span is None else
            f"{_when(report.span[0])} to {_when(report.span[1])}")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>cqsd traffic report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>cqsd traffic report</h1><p>Data directory <code>{e(str(data_dir))}</code>; "
        f"effects {'since ' + _when(since) if since is not None else 'in the whole log'}: "
        f"{e(span)}; {report.records} log records read. Made {_when(time.time())}.</p>",
    ]
    parts += [f"<p class='problem'>{e(p)}</p>" for p in report.problems]
    parts.append("<h2>Summary</h2>")
    parts.append("<ul class='summary'>" + "".join(f"<li>{e(line)}</li>"
                                                  for line in summary(t, report)) + "</ul>")
    parts.append("<h2>Queues</h2>")
    parts.append(_table(queues) if queues is not None and not queues.empty
                 else "<p class='note'>No recoverable traffic was logged.</p>")
    for title, image, note, table in sections:
        parts.append(f"<h2>{e(title)}</h2>")
        if note:
            parts.append(f"<p class='note'>{e(note)}</p>")
        parts.append(f"<img src='{e(image.name)}' alt='{e(title)}'>" if image is not None
                     else "<p class='note'>None in this period.</p>")
        if table is not None and not table.empty:
            parts.append(_table(table))
    parts.append("<h2>Sources</h2><ul>")
    parts += [f"<li><code>{e(name)}.parquet</code>: {e(where)}</li>"
              for name, where in sorted(report.sources.items())]
    parts.append("</ul><p class='note'>Only recoverable messages are logged: non-recoverable "
                 "ones, browses and reads without a lock are not in this report.</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _table(frame: pd.DataFrame) -> str:
    """A table for people: times to the second, nothing where there is no value."""
    frame = frame.copy()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].dt.strftime("%Y-%m-%d %H:%M:%S")
        if frame[column].dtype == object:
            frame[column] = frame[column].fillna("")
    return "<div class='wide'>" + frame.to_html(
        index=False, na_rep="", float_format=lambda v: f"{v:.3f}", border=0) + "</div>"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
