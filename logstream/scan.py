"""Reading one segment file record by record, and judging how it ends.

The scan streams the file through a buffer of about `CHUNK` bytes, so reading
a series never holds more than a chunk (or one record) per writer. When it
meets bad bytes it decides, with the whole context, between the two outcomes
in docs/logstream.md: a torn tail (only in the last segment of a series, and
only if no good record follows) or corruption (anything else).
"""

from __future__ import annotations

from collections.abc import Iterator

from . import record, segment
from .errors import CorruptLog, Damage, TornTail
from .record import Frame, NeedData
from .series import SegmentFile, check_header

CHUNK = 1 << 20  # big enough that refills are rare, small enough to hold per writer


class SegmentScan:
    """Iterates the frames of one segment; afterwards says where and how it ended.

    After the iteration `end_offset` is the file offset just past the last
    good record, `next_lsn` the LSN the next record must have,
    `last_timestamp` the timestamp of the last good record (None if the
    segment holds none) and `torn` a TornTail if the file ends in one.
    Iterating raises CorruptLog for corruption. A scan reads a snapshot: if
    a live writer is appending, it ends where the file ended when it got there.
    """

    def __init__(self, seg: SegmentFile, *, last: bool):
        self.segment = seg
        self.last = last
        self.end_offset = segment.HEADER_SIZE
        self.next_lsn = seg.first_lsn
        self.last_timestamp: int | None = None
        self.torn: TornTail | None = None
        self.frame_offset = 0  # file offset of the frame just yielded

    def __iter__(self) -> Iterator[Frame]:
        with open(self.segment.path, "rb") as f:
            check_header(self.segment, f.read(segment.HEADER_SIZE))
            buf, pos, base, eof = b"", 0, segment.HEADER_SIZE, False
            while True:
                found = record.decode(buf, pos)
                if isinstance(found, Frame):
                    if found.lsn != self.next_lsn:
                        raise CorruptLog(
                            self.segment.path,
                            base + pos,
                            Damage.LSN_MISMATCH,
                            f"expected LSN {self.next_lsn}, found {found.lsn}",
                        )
                    self.frame_offset = base + pos
                    yield found
                    pos = found.end
                    self.end_offset = base + pos
                    self.next_lsn += 1
                    self.last_timestamp = found.timestamp
                    continue
                if isinstance(found, NeedData) and not eof:
                    more = f.read(max(CHUNK, found.size - (len(buf) - pos)))
                    if more:
                        buf, base, pos = buf[pos:] + more, base + pos, 0
                    else:
                        eof = True
                    continue
                if isinstance(found, NeedData) and pos == len(buf):
                    return  # a clean end
                damage = Damage.SHORT_RECORD if isinstance(found, NeedData) else found
                f.seek(base + pos)
                self._judge(base + pos, damage, f.read())
                return

    def _judge(self, offset: int, damage: Damage, rest: bytes) -> None:
        """Call the bad bytes at `offset` a torn tail, or raise CorruptLog."""
        path = self.segment.path
        if not self.last:
            raise CorruptLog(path, offset, damage, "not the last segment of its series")
        now = record.decode(rest, 0)
        if isinstance(now, Frame):
            # The file grew while we read it (a live writer): what we saw was
            # a record still being written. Our snapshot ends here.
            if now.lsn == self.next_lsn:
                return
            raise CorruptLog(path, offset, Damage.LSN_MISMATCH, f"expected LSN {self.next_lsn}")
        follower = record.find_frame(rest, 1, self.next_lsn)
        if follower is not None:
            raise CorruptLog(path, offset, damage, f"a good record follows at {offset + follower}")
        if not rest.strip(b"\0"):
            damage = Damage.ZERO_FILL
        self.torn = TornTail(path, offset, len(rest), damage)


def scan_to_end(seg: SegmentFile, *, last: bool) -> SegmentScan:
    """Scan a whole segment for its end, checking every record on the way."""
    scan = SegmentScan(seg, last=last)
    for _ in scan:
        pass
    return scan
