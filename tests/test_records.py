"""The record and row formats: the reply rule and an entry as a row."""

from cqsd.engine import Structure
from cqsd.records import COUNT, HOME, ROW_FIELDS, WHERE, row_of, waits_for_log


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
