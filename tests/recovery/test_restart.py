"""Restart and recovery with offloaded messages, over real log segments, slots and images.

A crash restart folds maps only: an offloaded message comes back with its data
map and no bytes, which stay in its data set. Loading a recovery job's image
materialises: the engine is handed each offloaded row's bytes with its map, to
rebuild a data set from.
"""

import pyarrow.parquet as pq

import logstream
from cqsd.engine import Structure
from cqsd.recovery.restart import load_recovered, rebuild_all
from cqsd.smds import DataMap, Range
from cqsd.srds import slotfiles, slots
from cqsd.storage import image

S = "MSGQ01"
PAYLOADS = {6: b"six" * 2000, 7: b"seven" * 1000, 8: b"eight" * 1000}  # two pages each
MAPS = {eid: DataMap.of("IMS1", p, [Range(64 + 8 * eid, 2)]) for eid, p in PAYLOADS.items()}


def put(eid: int) -> list:
    """The effects of a recoverable offloaded put, as the daemon logs them."""
    return [["B", eid, 64 + 8 * eid, PAYLOADS[eid]], ["P", eid, 1, "Q", b"", eid],
            ["M", eid, MAPS[eid].encode()]]


def row(eid: int, data: bytes) -> list:
    return [eid, 1, "Q", data, True, eid, 0, "ready", None, None, MAPS[eid].encode(), None, None]


def write_log(log_dir, bodies: list[dict]) -> None:
    with logstream.Writer.open(log_dir, "cqsd") as w:
        for body in bodies:
            w.append(body)


class Observed:
    """A structure that keeps the rows a restart loads into it: a wrapper, since a
    compiled engine class takes no interpreted subclass (docs/native.md)."""

    def __init__(self, *args):
        self.structure = Structure(*args)

    def load(self, rows):
        self.loaded = list(rows)
        return self.structure.load(self.loaded)

    def __getattr__(self, name):
        return getattr(self.structure, name)

    def __iter__(self):
        return iter(self.structure)


def test_a_crash_restart_from_a_checkpoint_holds_maps_not_offloaded_bytes(tmp_path):
    """The slot's offloaded row (bytes and map) and the log's offloaded put after it
    come back with their maps and no data; blocks of a put that never completed
    are dropped, and ids continue above the last put."""
    srds = tmp_path / "srds"
    with slots.locked(srds, S) as directory:
        staged = slots.staging_dir(directory, "test")
        staged.mkdir()
        pq.write_table(slotfiles.table_of([row(6, PAYLOADS[6])]), staged / "part-0.parquet")
        slots.install(directory, staged, "SRDS1", {"cqsd": 1}, 6, 1.0)
    write_log(tmp_path / "log", [{"s": S, "e": put(6)}, {"s": S, "e": put(7)},
                                 {"s": S, "e": put(8)[:1]}])
    s = Observed(S, 1 << 22)
    (report,) = rebuild_all([s], tmp_path / "images", tmp_path / "log", "cqsd", 3, srds)
    assert (report.source, report.messages, report.replayed) == ("srds", 2, 2)
    assert s.loaded == [row(6, b""), row(7, b"")]
    assert [(e.entry_id, e.map, bytes(e.data)) for e in s] == [(6, MAPS[6], b""),
                                                              (7, MAPS[7], b"")]
    assert s.last_id == 7


def test_loading_a_recovery_image_hands_over_offloaded_bytes_then_keeps_the_maps(tmp_path):
    """A recovery job's image holds offloaded rows with their bytes; the log after it
    is folded the same way, blocks in records before their entry's included. Each
    offloaded row goes to ``offloaded`` with its bytes (for its data set), and the
    engine gets it with its map only."""
    path = tmp_path / f"{S}.recovered"
    write_log(tmp_path / "log", [{"s": S, "e": put(6)}, {"s": S, "e": put(7)[:1]},
                                 {"s": S, "e": put(7)[1:]}, {"s": S, "e": put(8)[:1]}])
    image.write_rows(path, S, iter([row(6, PAYLOADS[6])]), 1, {"cqsd": 1}, 6)
    s = Observed(S, 1 << 22)
    handed = []
    report = load_recovered(s, path, tmp_path / "log", {"cqsd": 4},
                            lambda r: handed.append(list(r)))
    assert (report.messages, report.replayed) == (2, 3)
    assert handed == [row(6, PAYLOADS[6]), row(7, PAYLOADS[7])]
    assert s.loaded == [row(6, b""), row(7, b"")]
    assert s.last_id == 7
