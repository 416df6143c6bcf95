"""Reading one segment file record by record, and judging how it ends.

The scan streams the file through a buffer of about `CHUNK` bytes, so reading
a series never holds more than a chunk (or one record) per writer. Where the
records stop, the rest of the file is either nothing or zeros (the unused space
of a preallocated segment, compared a chunk at a time, never held): a clean
end. Anything else it judges, with the whole context, as one of the two
outcomes in docs/logstream.md: a torn tail (only in the last segment of a
series, and only if no good record follows) or corruption (anything else).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import msgpack

from . import record, segment
from .errors import CorruptLog, Damage, TornTail
from .record import Frame, NeedData
from .series import SegmentFile, check_header

CHUNK = 1 << 20  # big enough that refills are rare, small enough to hold per writer
_ZEROS = bytes(CHUNK)
# Bad bytes are judged together with everything a record starting in them can
# reach, so a good record that follows them is found even if it ends in zeros.
_REACH = record.HEADER_SIZE + record.MAX_BODY


class SegmentScan:
    """Iterates the frames of one segment; afterwards says where and how it ended.

    After the iteration `end_offset` is the file offset just past the last
    good record, `next_lsn` the LSN the next record must have,
    `last_timestamp` the timestamp of the last good record (None if the
    segment holds none) and `torn` a TornTail if the file ends in one.
    Iterating raises CorruptLog for corruption. A scan reads a snapshot: if
    a live writer is appending, it ends where the records ended when it got
    there, before a record it saw only in part (a torn tail, to it).
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
                    # counted before it is yielded: a reader may stop at any record
                    self.frame_offset = base + pos
                    pos = found.end
                    self.end_offset = base + pos
                    self.next_lsn += 1
                    self.last_timestamp = found.timestamp
                    yield found
                    continue
                if isinstance(found, NeedData) and not eof:
                    more = f.read(max(CHUNK, found.size - (len(buf) - pos)))
                    if more:
                        buf, base, pos = buf[pos:] + more, base + pos, 0
                    else:
                        eof = True
                    continue
                damage = Damage.SHORT_RECORD if isinstance(found, NeedData) else found
                self._end(f, base + pos, damage)
                return

    def body(self, frame: Frame) -> object:
        """Unpack the body of the frame just yielded; its CRC was good, so failing
        that is a writer bug: corruption, named by file and offset."""
        try:
            return record.unpack_body(frame.body)
        except (ValueError, TypeError, msgpack.UnpackException) as error:
            raise CorruptLog(self.segment.path, self.frame_offset, Damage.BAD_BODY,
                             str(error)) from None

    def _end(self, f: BinaryIO, offset: int, damage: Damage) -> None:
        """Judge what follows the last good record, which ends at `offset`."""
        data_end, file_end = find_zero_tail(f, offset)
        if data_end == offset:
            return  # nothing, or only zeros: a clean end
        f.seek(offset)
        rest = f.read(min(file_end, data_end + _REACH) - offset)
        self._judge(offset, damage, rest, file_end - offset)

    def _judge(self, offset: int, damage: Damage, rest: bytes, length: int) -> None:
        """Call the `length` bad bytes at `offset` a torn tail, or raise CorruptLog."""
        path = self.segment.path
        if not self.last:
            raise CorruptLog(path, offset, damage, "not the last segment of its series")
        now = record.decode(rest, 0)
        if isinstance(now, Frame):
            # A live writer finished the record while we read it: what we saw
            # was a record still being written. Our snapshot ends here.
            if now.lsn == self.next_lsn:
                return
            raise CorruptLog(path, offset, Damage.LSN_MISMATCH, f"expected LSN {self.next_lsn}")
        follower = record.find_frame(rest, 1, self.next_lsn)
        if follower is not None:
            raise CorruptLog(path, offset, damage, f"a good record follows at {offset + follower}")
        self.torn = TornTail(path, offset, length, damage)


def find_zero_tail(f: BinaryIO, offset: int) -> tuple[int, int]:
    """Read `f` from `offset` to its end: (where its zero tail starts, where it ends).

    The first is `offset` if every byte from there is zero; otherwise it is
    at most a chunk past the last non-zero byte, which is as close as
    comparing whole chunks with zeros (at memory speed) can tell.
    """
    f.seek(offset)
    data_end = file_end = offset
    while chunk := f.read(CHUNK):
        file_end += len(chunk)
        if not _ZEROS.startswith(chunk):
            data_end = file_end
    return data_end, file_end


def scan_to_end(seg: SegmentFile, *, last: bool) -> SegmentScan:
    """Scan a whole segment for its end, checking every record on the way."""
    scan = SegmentScan(seg, last=last)
    for _ in scan:
        pass
    return scan
