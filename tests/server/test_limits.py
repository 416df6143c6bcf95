"""Log records stay within what the logstream takes, split only where that is safe."""

import msgpack
import pytest

from cqsd.recovery.fold import fold
from cqsd.server.limits import RecordTooLarge, bound, split
from logstream.record import MAX_BODY

MiB = 1024 * 1024


def packed(record: dict) -> int:
    return len(msgpack.packb(record, use_bin_type=True))


def test_a_small_record_is_left_whole():
    """A record within the budget comes back as itself."""
    record = {"s": "S", "e": [("P", 1, 1, "Q", b"x" * 100, 5), ("D", 2)]}
    assert split(record) == [record]


def test_the_bound_is_never_below_the_packed_size():
    """bound() over-estimates: what it lets through, the logstream takes."""
    record = {"s": "MSGQ01", "e": [("R", 2**63, 11, "Q" * 15, (11, "H" * 15), 2**40)] * 1000
              + [("P", 2**63, 1, "Q" * 15, b"d" * 70_000, 2**63)],
              "x": {"MSGQ01OV": [("I", 2**63, 1, "Q" * 15, b"i" * 1000, 2**63, 9, (1, "Q"))]}}
    assert packed(record) <= bound(record)


def test_a_dequeue_of_a_million_messages_is_split_into_records_the_log_takes():
    """Independent effects over the budget become several records, each writable,
    that fold to what the whole record would."""
    image = {i: [i, 1, "Q", b"", True, 0, 0, "ready", None, None, None, None, None]
             for i in range(1, 1_000_001)}
    record = {"s": "S", "e": [("D", i) for i in range(1, 1_000_001)]}
    parts = split(record, budget=4 * MiB)
    assert len(parts) > 1
    assert all(packed(p) <= 4 * MiB for p in parts)
    assert [e for p in parts for e in p["e"]] == record["e"]
    fold(image, parts, "S")
    assert image == {}


def test_the_overflow_half_of_a_split_record_goes_to_the_overflow_structure():
    """A split record's effects for the overflow structure keep naming it."""
    record = {"s": "P", "e": [("D", 1)] * 10, "x": {"OV": [("L", 2, "C")] * 10}}
    parts = split(record, budget=5 * 96)
    assert {p["s"] for p in parts} == {"P", "OV"}
    assert sum(len(p["e"]) for p in parts if p["s"] == "OV") == 10


@pytest.mark.parametrize("kind", ["P", "I"])
def test_payloads_over_the_budget_are_never_split(kind):
    """A put or an overflow move is atomic in the log: too large, it is refused."""
    effect = (kind, 1, 1, "Q", b"x" * MAX_BODY, 0) + ((0, None) if kind == "I" else ())
    with pytest.raises(RecordTooLarge):
        split({"s": "S", "e": [effect]})


def test_an_offloaded_puts_blocks_past_the_budget_go_in_records_of_their_own_first():
    """The B effects of a recoverable offloaded put too large for one record go in
    records of their own, each within the budget, before the record of its P and M
    (and of the overflow half); folded, they give the payload back, and without the
    last record they leave nothing."""
    from cqsd.smds import DataMap, Range

    data = bytes(range(256)) * (3 * 4096)  # 3 MiB in 12 blocks of 256 KiB
    per = 64 * 4096 - 64
    ranges = [Range(64 * (b + 1), 64) for b in range(len(data) // per)]
    ranges.append(Range(64 * (len(ranges) + 1), -(-(64 + len(data) % per) // 4096)))
    dmap = DataMap.of("C", data, ranges)
    blocks = [("B", 7, r.page, data[offset:offset + n]) for r, offset, n in dmap.pieces()]
    record = {"s": "S", "e": [*blocks, ("P", 7, 1, "Q", b"", 5), ("M", 7, dmap.encode())],
              "x": {"OV": [("D", 3)]}}
    parts = split(record, budget=MiB)
    assert len(parts) == 5 and all(packed(p) <= MiB for p in parts)
    assert [e for p in parts[:-1] for e in p["e"]] == blocks
    assert parts[-1] == {"s": "S", "e": record["e"][-2:], "x": {"OV": [("D", 3)]}}
    image: dict = {}
    fold(image, parts, "S", materialise=True)
    assert image[7][3] == data
    image = {}
    fold(image, parts[:-1], "S", materialise=True)
    assert image == {}
