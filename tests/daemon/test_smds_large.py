"""Recoverable messages larger than a log record (MQ's MAXMSGL of 100 MiB with SMDS,
seed 001): an offloaded put's blocks are logged in records of their own before its
entry's, acknowledged once all are durable, carried by restart, checkpoints and
recovery, and a crash before the entry's record leaves nothing of the put."""

import msgpack
import pytest

import cqsclient
from cqsd.records import BLOCK, EFFECTS, PUT
from logstream.scan import SegmentScan
from logstream.series import list_segments

from .harness import Daemon
from .test_smds import payload

MiB = 1024 * 1024
LARGE = """
[[structure]]
name = "BIG"
size = "16MiB"
offload = "smds"
dssize = "160MiB"
"""


@pytest.fixture(scope="module")
def daemon():
    """One daemon for the module, with the embedded default's max_message (100 MiB)."""
    d = Daemon('spark_master = "local[1]"', structures=LARGE).start()
    yield d
    d.cleanup()


def records(d: Daemon) -> list[tuple[int, list]]:
    """(file offset, effects) of every record of the daemon's log, oldest first."""
    found = []
    for seg in list_segments(d.data / "logstream", "cqsd"):
        scan = SegmentScan(seg, last=False)
        for frame in scan:
            found.append((seg.path, scan.frame_offset, msgpack.unpackb(frame.body)[EFFECTS]))
    return found


def used(c, owner: str) -> float:
    [row] = [r for r in c.query("smds", "BIG") if r["owner"] == owner]
    return row["used_percent"]


def test_a_recoverable_100_mib_put_is_logged_over_records_and_survives_a_kill(daemon):
    """A recoverable put of max_message (100 MiB) is logged as block records and then
    its entry's, reads back whole, and is there after a SIGKILL and a restart."""
    d = daemon
    data = payload(100 * MiB, 1)
    with cqsclient.connect(d.address, client="LARGE") as c:
        assert c.max_message == 100 * MiB  # the embedded default (docs/robustness.md)
        eid = c.structure("BIG").put("L", data)
        assert c.structure("BIG").browse("L")[0].data == data
    kinds = [{e[0] for e in effects} for _, _, effects in records(d)]
    assert kinds.count({BLOCK}) >= 7  # 100 MiB in records of at most 16 MiB
    assert PUT in kinds[-1] and BLOCK not in kinds[-1]  # the entry's record comes last
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="LARGE") as c:
        [m] = c.structure("BIG").browse("L")
        assert (m.entry_id, m.data == data) == (eid, True)


def test_a_crash_before_the_entrys_record_leaves_nothing_of_the_put(daemon):
    """A put killed after its block records are in the log but before its entry's
    (the log cut there, as a crash between the two writes leaves it) is gone after
    the restart and its space free again; a checkpoint and a recovery from it drop
    its blocks and carry a 100 MiB message put before it."""
    d = daemon
    data = payload(100 * MiB, 2)
    with cqsclient.connect(d.address, client="HALF") as c:
        s = c.structure("BIG")
        kept = s.put("H", data)
        before = used(c, "HALF")
        s.put("H", payload(40 * MiB, 3))
    d.kill()
    path, offset, effects = records(d)[-1]
    assert PUT in {e[0] for e in effects}
    with open(path, "r+b") as f:  # the entry's record never reached the disk
        f.truncate(offset)
    d.restart()
    with cqsclient.connect(d.address, client="HALF") as c:
        s = c.structure("BIG")
        assert [m.entry_id for m in s.browse("H")] == [kept]
        # the space map, rebuilt from the entries, frees its 25% (a current block's tail,
        # not recorded, aside)
        assert before <= used(c, "HALF") <= before + 1
        c.checkpoint("BIG")
        c.recover("BIG")
        [m] = s.browse("H")
        assert (m.entry_id, m.data == data) == (kept, True)
    assert d.proc.poll() is None
