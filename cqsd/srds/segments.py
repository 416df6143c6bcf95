"""Reading the logstream in parallel: which segments, one task each, and proof
afterwards that the tasks together read every record in range.

Design note. ``logstream.read`` reads each writer's series as one stream and
checks continuity as it goes. Here each segment is decoded by its own Spark
task, which checks what it can see alone (via ``SegmentScan``: header, CRCs,
LSNs within the segment, a torn tail only in the last segment of a series)
and reports a summary: the LSN after the last record it read, and any damage.
The driver then checks what no task can see: that each writer's segments
follow each other without a gap from the start position to the cut. A task
never raises for damage (the driver could only guess which task's error is
the cause); it stops and says so in its summary.
"""

import mmap
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from crc32c import crc32c

from logstream import CorruptLog, Damage, LogstreamError, Trimmed, record
from logstream.scan import SegmentScan
from logstream.series import SegmentFile, list_series

from ..records import ADDS, E_DATA, EFFECTS, OTHERS, FoldError
from . import effects


class LogTooShort(LogstreamError):
    """A writer's records end before the cut: records the cut promises are gone."""


@dataclass(frozen=True)
class Task:
    """Read one segment's records with start < LSN <= cut."""

    path: str
    writer: str
    first_lsn: int
    last: bool  # the last segment of its series: a torn tail is allowed here
    start: int  # the last LSN already folded (the slot's), 0 for none
    cut: int


def plan(directory: Path, start: dict[str, int], cut: dict[str, int]) -> list[Task]:
    """The segments holding records after ``start`` up to ``cut``, per writer.

    Writers not in ``cut`` are not read (as in ``logstream.read``); segments
    wholly before the start or after the cut are never opened. Raises Trimmed
    if records after the start were trimmed away, LogTooShort if a writer the
    cut names has no segments at all.
    """
    series = list_series(directory) if Path(directory).is_dir() else {}
    tasks = []
    for writer, upto in sorted(cut.items()):
        after = start.get(writer, 0)
        if upto <= after:
            continue
        segs = series.get(writer)
        if not segs:
            raise LogTooShort(f"{directory}: no records of writer {writer!r}, "
                              f"but the cut asks for LSN {after + 1} to {upto}")
        if segs[0].first_lsn > after + 1:
            raise Trimmed(f"{segs[0].path}: writer {writer!r} starts at LSN {segs[0].first_lsn}, "
                          f"records from {after + 1} were trimmed")
        for i, seg in enumerate(segs):
            following = segs[i + 1].first_lsn if i + 1 < len(segs) else None
            if following is not None and following <= after + 1:
                continue  # wholly before the start
            if seg.first_lsn > upto:
                break
            tasks.append(Task(str(seg.path), writer, seg.first_lsn, following is None, after, upto))
    return tasks


def scan(task: Task, structures: Container[str], summary: dict,
         number: int | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the effect rows of one segment's records in range, as Arrow batches.

    With ``number``, the task's place in its plan, P and I rows carry where
    their record is instead of their data, for ``Payloads`` to read back.
    Fills ``summary`` (see ``check``) as it goes; damage ends the scan and is
    recorded there, never raised.
    """
    summary.update(writer=task.writer, first_lsn=task.first_lsn, next_lsn=task.first_lsn,
                   records=0, matched=0, last_ids={}, problem=None)
    seg = SegmentFile(Path(task.path), task.writer, task.first_lsn)
    reader = SegmentScan(seg, last=task.last)
    gathered = effects.Batches()
    try:
        for frame in reader:
            if frame.lsn > task.cut:
                break
            if frame.lsn <= task.start:
                continue
            summary["records"] += 1
            at = None if number is None else number << effects.AT_TASK_SHIFT | reader.frame_offset
            found = effects.rows_of(reader.body(frame), structures, frame.timestamp,
                                    task.writer, frame.lsn, at)
            if found:
                summary["matched"] += 1
                _note_ids(summary["last_ids"], found)
                yield from gathered.add(found, len(frame.body))
            if frame.lsn == task.cut:
                break  # not on through the preallocated tail of a live segment
        yield from gathered.flush()
    except CorruptLog as err:
        summary["problem"] = {"type": "corrupt", "path": err.path, "offset": err.offset,
                              "reason": err.reason.value, "detail": err.detail}
    except FileNotFoundError:
        summary["problem"] = {"type": "trimmed", "message": f"{seg.path} was trimmed while "
                              "being read"}
    except FoldError as err:
        summary["problem"] = {"type": "fold", "message": str(err)}
    summary["next_lsn"] = reader.next_lsn
    summary["ended"] = time.time()


_OFFSET_MASK = (1 << effects.AT_TASK_SHIFT) - 1
_CRC_FROM = 8  # the record CRC covers the header after itself, then the body


class Payloads:
    """Reads back the data of the P and I rows that carry where their record is
    (``scan`` with a task number), from the plan's segments, mapped into memory."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self._maps: dict[int, mmap.mmap] = {}

    def read(self, wanted: list[tuple[int, int, int, int, str]]) -> list[bytes]:
        """The data of each ``(at, lsn, part, idx, structure)`` row, in that order.

        Raises CorruptLog if the record is no longer the one the scan read there.
        """
        found: list[bytes] = [b""] * len(wanted)
        for k in sorted(range(len(wanted)), key=lambda k: wanted[k][0]):  # in file order
            at, lsn, part, idx, structure = wanted[k]
            number, offset = at >> effects.AT_TASK_SHIFT, at & _OFFSET_MASK
            mapped = self._map(number)
            # The scan checked this record whole; the header and CRC say it is still it.
            magic, crc, length, was, _ = record.HEADER.unpack_from(mapped, offset)
            packed = mapped[offset + record.HEADER_SIZE:offset + record.HEADER_SIZE + length]
            tail = mapped[offset + _CRC_FROM:offset + record.HEADER_SIZE]
            if magic != record.MAGIC or was != lsn or crc32c(packed, crc32c(tail)) != crc:
                raise CorruptLog(self.tasks[number].path, offset, Damage.LSN_MISMATCH,
                                 f"record {lsn} changed since the job read it")
            body = record.unpack_body(packed)
            found[k] = (body[EFFECTS] if part == 0 else body[OTHERS][structure])[idx][E_DATA]
        return found

    def _map(self, number: int) -> mmap.mmap:
        if number not in self._maps:
            with open(self.tasks[number].path, "rb") as f:
                self._maps[number] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[number]

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()


def _note_ids(last_ids: dict[str, int], rows: list[tuple]) -> None:
    for row in rows:
        if row[effects.KIND_COLUMN] in ADDS:
            s = row[0]
            last_ids[s] = max(last_ids.get(s, 0), row[1])


@dataclass
class Coverage:
    """What the tasks of one plan read, once ``check`` has found it complete."""

    records: int  # records in range
    matched: int  # of those, records with effects on the structures folded
    last_ids: dict[str, int]  # per structure, the highest id a P or I put
    read_ended: float | None  # epoch seconds when the last task ended (None: no tasks)


def check(tasks: list[Task], summaries: list[dict]) -> Coverage:
    """Raise the first problem the tasks reported or that only their sum shows.

    CorruptLog for damage (including a gap between segments), Trimmed for a
    segment that went away, FoldError for an effect that is not one, and
    LogTooShort when a writer's records end before the cut.
    """
    seen = {(s["writer"], s["first_lsn"]): s for s in summaries}  # a retried task counts once
    by_writer: dict[str, list[Task]] = {}
    for task in tasks:
        by_writer.setdefault(task.writer, []).append(task)
    for writer, group in sorted(by_writer.items()):
        expected: int | None = None
        for task in group:
            summary = seen.get((writer, task.first_lsn))
            if summary is None:
                raise LogstreamError(f"{task.path}: no task reported reading it")
            _raise_problem(summary)
            if expected is not None and task.first_lsn != expected:
                raise CorruptLog(task.path, 0, Damage.LSN_GAP, f"expected first LSN {expected}")
            expected = summary["next_lsn"]
        assert expected is not None, "a writer's group holds a segment at least"
        if expected - 1 < group[-1].cut:
            raise LogTooShort(f"{group[-1].path}: writer {writer!r} ends at LSN {expected - 1}, "
                              f"before the cut at LSN {group[-1].cut}")
    last_ids: dict[str, int] = {}
    for s in seen.values():
        for name, eid in s["last_ids"].items():
            last_ids[name] = max(last_ids.get(name, 0), eid)
    return Coverage(sum(s["records"] for s in seen.values()),
                    sum(s["matched"] for s in seen.values()), last_ids,
                    max((s["ended"] for s in seen.values()), default=None))


def raise_reported(summaries: list[dict]) -> None:
    """Raise the first problem a task reported, if any (for when the action failed)."""
    for summary in sorted(summaries, key=lambda s: (s["writer"], s["first_lsn"])):
        _raise_problem(summary)


def _raise_problem(summary: dict) -> None:
    problem = summary["problem"]
    if problem is None:
        return
    if problem["type"] == "corrupt":
        raise CorruptLog(problem["path"], problem["offset"], Damage(problem["reason"]),
                         problem["detail"])
    if problem["type"] == "trimmed":
        raise Trimmed(problem["message"])
    raise FoldError(problem["message"])
