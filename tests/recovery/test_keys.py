"""Reading the keys of the dedup window back from real log segments (cqsd/recovery/keys.py)
when the clocks disagree: the node's that reads them, the writers' that stamped the
records, and the file system's that set the segments' times."""

import os

import pytest

import logstream
from cqsd.dedup import key_field, key_of
from cqsd.records import KEY
from cqsd.recovery.keys import remembered
from logstream.series import list_segments

SECOND = 10**9
T = 1_800_000_000 * SECOND  # the writer's clock at its first record
WRITER = "NODE1-1"
PUTS = 200  # one a second, T to T + 199 s
WINDOW = 120


def write_log(log_dir, files_skew: int) -> list:
    """A series of a put a second, each with its key, over several segments, each
    segment's time set as a file system whose clock is ``files_skew`` ns off the
    writer's would set it: at its last record."""
    w = logstream.Writer.open(log_dir, WRITER, segment_size=4096)
    for i in range(PUTS):
        w.append({"s": "MSGQ01", "e": [], KEY: key_field("APP", ("inc", i), [i + 1])},
                 T + i * SECOND)
    w.flush()
    w.close()
    segments = list_segments(log_dir, WRITER)
    assert len(segments) >= 3
    firsts = [seg.first_lsn for seg in segments[1:]] + [PUTS + 1]
    for seg, following in zip(segments, firsts, strict=True):
        last_stamp = T + (following - 2) * SECOND + files_skew
        os.utime(seg.path, ns=(last_stamp, last_stamp))
    return segments


def recall(memory, i: int, now: int):
    return memory.recall(key_of("APP", "inc", i), now)


CLOCKS = [(0, 0), (300, 0), (0, -1000 * SECOND), (0, 1000 * SECOND), (300, -1000 * SECOND)]
CLOCK_IDS = ["clocks agree", "node 5 minutes ahead", "files' clock behind",
             "files' clock ahead", "both"]


@pytest.mark.parametrize("newest_known", [True, False], ids=["takeover", "standby loading"])
@pytest.mark.parametrize(("node_ahead", "files_skew"), CLOCKS, ids=CLOCK_IDS)
def test_a_takeover_remembers_the_window_whatever_the_clocks(tmp_path, node_ahead, files_skew,
                                                             newest_known):
    """The keys stamped in the window before the newest record are read back and kept
    a window from their stamps, counted on the writer's clock up to that record and
    on the node's from then; older keys are not. (Measured on the node's clock
    against the stamps and the files' times, a node minutes ahead read none back,
    and a resend across its takeover would have been applied twice.) A warm standby
    loading knows no newest stamp: the newest record read is that stamp, and its
    takeover catches the memory up to the seal's."""
    write_log(tmp_path, files_skew)
    newest = T + (PUTS - 1) * SECOND
    now = newest + node_ahead * SECOND
    memories = remembered(tmp_path, {WRITER: PUTS}, {"MSGQ01": "MSGQ01"}, WINDOW, now,
                          newest if newest_known else 0)
    memory = memories["MSGQ01"]
    memory.catch_up(newest, now)
    oldest = PUTS - 1 - WINDOW  # stamped exactly a window before the newest
    assert recall(memory, oldest, now) == ([oldest + 1], 0)
    assert recall(memory, PUTS - 1, now) == ([PUTS], 0)
    assert recall(memory, oldest - 1, now) is None
    # a window after its stamp, counted from the newest record as if written now
    assert recall(memory, PUTS - 1, now + WINDOW * SECOND) is not None
    assert recall(memory, PUTS - 1, now + (WINDOW + 1) * SECOND) is None


def test_segments_older_than_the_window_on_the_files_clock_are_not_opened(tmp_path):
    """Only the segments written to in the window (by the files' own clock) are read:
    an older one is not even opened, though this node's clock says it is recent."""
    segments = write_log(tmp_path, -1000 * SECOND)
    segments[0].path.write_bytes(b"not a segment")  # damage, were it read
    newest = T + (PUTS - 1) * SECOND
    memory = remembered(tmp_path, {WRITER: PUTS}, {"MSGQ01": "MSGQ01"}, WINDOW,
                        newest - 3600 * SECOND, newest)["MSGQ01"]
    assert len(memory) > WINDOW
