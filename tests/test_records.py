"""The record and row formats: the reply rule and an entry as a row, data map included."""

from cqsd.engine import Structure
from cqsd.records import (
    ARITY,
    B_DATA,
    B_PAGE,
    BLOCK,
    COUNT,
    DATA,
    HOME,
    LEASE,
    LEASED,
    M_MAP,
    MAP,
    MAPPED,
    NOT_BEFORE,
    NOT_BEFORE_AT,
    ROW_FIELDS,
    WHERE,
    row_of,
    waits_for_log,
)
from cqsd.smds import DataMap, Range


def test_a_reply_waits_for_any_record_but_one_of_locks_alone():
    """Only a record of locks (in either half) is acknowledged before it is durable."""
    assert not waits_for_log({"s": "S", "e": [["L", 1, "C"]]})
    assert not waits_for_log({"s": "S", "e": [["L", 1, "C"]], "x": {"OV": [["L", 2, "C"]]}})
    assert waits_for_log({"s": "S", "e": [["L", 1, "C"]], "x": {"OV": [["D", 2]]}})
    assert waits_for_log({"s": "S", "e": [["D", 1]]})


def test_an_entry_becomes_the_row_an_image_holds():
    """row_of gives every field of the image row, home and delivery count included."""
    s = Structure("S", 1 << 20, max_deliveries=1)
    e = s.put("TRAN", "Q", b"data")
    s.read("C", "TRAN", "Q")
    s.unlock("C", e.entry_id, failed=True)  # delivered once already: suspended
    row = row_of(s.entry(e.entry_id))
    assert len(row) == ROW_FIELDS
    assert row[:4] == [e.entry_id, 3, "Q", b"data"]
    assert (row[COUNT], row[WHERE], row[HOME]) == (1, "ready", [1, "Q"])


def test_an_offloaded_entry_s_row_carries_its_encoded_data_map():
    """row_of gives a data map as DataMap.encode() (nil for a payload in memory), which
    DataMap.decode takes back; the entry's data is what it holds, here none."""
    s = Structure("S", 1 << 20)
    kept, offloaded = s.put("TRAN", "Q", b"data"), s.put("TRAN", "Q", b"")
    offloaded.map = DataMap.of("IMS1", b"x" * 5000, [Range(64, 2)])
    assert row_of(kept)[MAP] is None
    row = row_of(offloaded)
    assert (row[DATA], row[MAP]) == (b"", ["IMS1", 5000, offloaded.map.crc, [64, 2]])
    assert DataMap.decode(row[MAP]) == offloaded.map


def test_blocks_and_maps_make_a_record_that_waits_for_the_log():
    """B and M are not locks: a record of them, or of blocks alone, is durable before
    its reply."""
    assert waits_for_log({"s": "S", "e": [["B", 1, 64, b"x"]]})
    assert waits_for_log({"s": "S", "e": [["M", 1, ["IMS1", 1, 0, [64, 1]]]]})
    assert ARITY[BLOCK] == 4 and ARITY[MAPPED] == 3 and (B_PAGE, B_DATA, M_MAP) == (2, 3, 2)


def test_a_lease_makes_no_record_wait_and_a_delay_does():
    """T rides with its L (or stands alone for a renew) and, like a lock, is not waited
    for; N comes with a put, which is. Both rows fields are in row_of."""
    assert not waits_for_log({"s": "S", "e": [["L", 1, "C"], ["T", 1, 10**9, 5]]})
    assert not waits_for_log({"s": "S", "e": [["T", 1, 10**9, 5]]})
    assert waits_for_log({"s": "S", "e": [["P", 1, 1, "Q", b"", 0], ["N", 1, 9]]})
    assert ARITY[LEASED] == 4 and ARITY[NOT_BEFORE_AT] == 3
    s = Structure("S", 1 << 20, clock=lambda: 100, ticks=lambda: 5.0)
    delayed = s.put("TRAN", "Q", b"later", not_before=200)
    s.put("TRAN", "Q", b"now")
    leased = s.read("C", "TRAN", "Q", lease=2.5)
    assert row_of(delayed)[WHERE] == "ready" and row_of(delayed)[NOT_BEFORE] == 200
    assert row_of(leased)[LEASE] == [2_500_000_000, 2_500_000_100]
    assert row_of(leased)[NOT_BEFORE] is None
