"""Each request of the structure engine, and each reason code it raises."""

import itertools

import pytest

from cqsd.engine import (
    Altered,
    CQSError,
    Delete,
    FullnessChanged,
    Move,
    Put,
    QueueType,
    QueueWork,
    Structure,
    Unlock,
    elements,
)
from cqsd.engine.qtypes import LOCK_LH, list_header
from cqsd.engine.structure import DEFAULT_ENTRY_MAX, IDLE_QUEUES


def make(size=1 << 20, **kw):
    ticks = itertools.count(1000)
    return Structure("MSGQ01", size, clock=lambda: next(ticks), **kw)


def raises(reason):
    return pytest.raises(CQSError, match=f"^{reason}")


def ids(entries):
    return [e.entry_id for e in entries]


def test_put_then_read_gives_fifo_order():
    """Messages on one queue are read in the order they were put."""
    s = make()
    put = [s.put("TRAN", "TRANX", bytes([i])).entry_id for i in range(5)]
    got = [s.read("IMS1", "TRAN", "TRANX").entry_id for _ in range(5)]
    assert got == put


def test_entry_ids_strictly_increase_even_when_the_clock_stands_still():
    """Ids come from the clock but never repeat or go back."""
    s = Structure("S", 1 << 20, clock=lambda: 7)
    a, b = s.put(1, "Q", b"a"), s.put(1, "Q", b"b")
    assert a.entry_id == 7 and b.entry_id == 8


def test_read_of_empty_queue_is_no_message():
    """Reading an empty queue names it in a NO_MESSAGE error."""
    with raises("NO_MESSAGE") as err:
        make().read("IMS1", "TRAN", "NOTHING")
    assert "TRAN:NOTHING" in str(err.value)


def test_read_locks_and_counts_delivery():
    """A read moves the entry to the lock queue, owned by the reader."""
    s = make()
    eid = s.put("TRAN", "Q", b"x").entry_id
    m = s.read("IMS1", "TRAN", "Q")
    assert (m.entry_id, m.owner, m.delivery_count) == (eid, "IMS1", 1)
    assert s.client_locks("IMS1") == [m]
    assert s.queue_stats("TRAN", "Q")["depth"] == 0 and s.queue_stats("TRAN", "Q")["locked"] == 1
    with raises("NO_MESSAGE"):
        s.read("IMS2", "TRAN", "Q")


def test_queue_names_are_validated():
    """Names longer than 15 bytes, empty, non-ASCII or not strings are refused."""
    s = make()
    for bad in ["", "X" * 16, "QUEUÉ", "A\nB", 42, b"Q"]:
        with raises("INVALID_REQUEST"):
            s.put("TRAN", bad, b"x")
    assert s.put("TRAN", "X" * 15, b"x")


def test_queue_types_are_validated():
    """Unknown types, booleans and the internal staging types are refused."""
    s = make()
    for bad in [0, 12, "NOPE", True, 2, "LTERM_STAGING", None]:
        with raises("INVALID_REQUEST"):
            s.put(bad, "Q", b"x")
    assert s.put("OTMA", "Q", b"x").qtype == QueueType.OTMA


def test_names_in_a_list_header_are_in_collating_order():
    """Browsing a queue type returns names in byte order, each FIFO."""
    s = make()
    names = [f"T{i:02d}" for i in range(40)]
    for n in reversed(names):
        s.put("TRAN", n, b"1")
        s.put("TRAN", n, b"2")
    found, _ = s.browse("TRAN", limit=1000)
    by_lh = {}
    for e in found:
        by_lh.setdefault(list_header(e.qtype, e.name), []).append((e.name, e.data))
    assert sorted(by_lh) == list(by_lh)
    for rows in by_lh.values():
        assert rows == sorted(rows)


def test_delete_requires_the_callers_lock():
    """A client deletes only what it holds; others get LOCK_NOT_HELD."""
    s = make()
    eid = s.put("TRAN", "Q", b"x").entry_id
    with raises("LOCK_NOT_HELD"):
        s.delete("IMS1", eid)
    s.read("IMS1", "TRAN", "Q")
    with raises("LOCK_NOT_HELD") as err:
        s.delete("IMS2", eid)
    assert "locked by IMS1" in str(err.value)
    s.delete("IMS1", eid)
    with raises("ENTRY_NOT_FOUND"):
        s.delete("IMS1", eid)
    assert s.elements_used == 0 and s.entries_used == 0


def test_operator_delete_takes_unlocked_but_not_locked_entries():
    """The operator deletes any entry by id unless a client holds it."""
    s = make()
    a = s.put("TRAN", "Q", b"a").entry_id
    b = s.put("TRAN", "Q", b"b").entry_id
    s.delete(None, b)
    s.read("IMS1", "TRAN", "Q")
    with raises("LOCK_NOT_HELD"):
        s.delete(None, a)


def test_move_to_another_name_and_type():
    """Move puts the entry on another queue at its place by id, releasing a held lock."""
    s = make()
    a = s.put("TRAN", "A", b"a").entry_id
    b = s.put("LTERM", "B", b"b").entry_id
    s.move(None, a, "LTERM", "B")
    assert ids(s.browse("LTERM", "B")[0]) == [a, b]
    s.read("IMS1", "LTERM", "B")
    with raises("LOCK_NOT_HELD"):
        s.move("IMS2", a, "TRAN", "A")
    s.move("IMS1", a, "TRAN", "C")
    assert s.client_locks("IMS1") == [] and ids(s.browse("TRAN", "C")[0]) == [a]
    with raises("ENTRY_NOT_FOUND"):
        s.move(None, 12345, "TRAN", "A")
    with raises("INVALID_REQUEST"):
        s.move(None, a, "TRAN_STAGING", "A")


def test_unlock_returns_to_original_place():
    """An unlocked message goes back in front of later ones, by entry id."""
    s = make()
    first, second = (s.put("TRAN", "Q", bytes([i])).entry_id for i in range(2))
    s.read("IMS1", "TRAN", "Q")
    s.unlock("IMS1", first)
    assert ids(s.browse("TRAN", "Q")[0]) == [first, second]
    assert s.read("IMS2", "TRAN", "Q").delivery_count == 2


def test_unlock_to_another_queue():
    """Unlock may name another queue to put the message on."""
    s = make()
    eid = s.put("TRAN", "Q", b"x").entry_id
    s.read("IMS1", "TRAN", "Q")
    s.unlock("IMS1", eid, qtype="LTERM", name="OUT")
    assert ids(s.browse("LTERM", "OUT")[0]) == [eid]


def test_unlock_of_someone_elses_lock_fails():
    """Only the holder may unlock."""
    s = make()
    eid = s.put("TRAN", "Q", b"x").entry_id
    with raises("LOCK_NOT_HELD"):
        s.unlock("IMS1", eid)
    s.read("IMS1", "TRAN", "Q")
    with raises("LOCK_NOT_HELD"):
        s.unlock("IMS2", eid)
    with raises("ENTRY_NOT_FOUND"):
        s.unlock("IMS1", eid + 999)


def test_failed_unlock_suspends_after_max_deliveries():
    """A message failed max_deliveries times goes to the suspend queue, remembering home."""
    s = make(max_deliveries=3)
    eid = s.put("TRAN", "Q", b"poison").entry_id
    for n in range(1, 4):
        m = s.read("IMS1", "TRAN", "Q")
        assert m.delivery_count == n
        s.unlock("IMS1", eid, failed=True)
    assert s.browse("TRAN", "Q")[0] == []
    (suspended,) = s.browse("TRAN_SUSPEND", "Q")[0]
    assert suspended.entry_id == eid and suspended.home == (QueueType.TRAN, "Q")
    s.requeue(eid)
    assert s.read("IMS1", "TRAN", "Q").delivery_count == 1


def test_serial_queue_has_one_message_in_flight():
    """A SERIAL queue yields its next message only after the locked one is gone."""
    s = make()
    a, b = (s.put("TRAN_SERIAL", "S", bytes([i])).entry_id for i in range(2))
    s.watched.add((QueueType.TRAN_SERIAL, "S"))
    assert s.read("IMS1", "TRAN_SERIAL", "S").entry_id == a
    with raises("NO_MESSAGE"):
        s.read("IMS2", "TRAN_SERIAL", "S")
    s.readable.clear()
    s.delete("IMS1", a)
    assert (QueueType.TRAN_SERIAL, "S") in s.readable
    assert s.read("IMS2", "TRAN_SERIAL", "S").entry_id == b


def test_long_message_is_staged_and_read_whole():
    """A payload over entry_max is stored as segments but read and browsed whole."""
    s = make(entry_max=1024)
    data = bytes(range(256)) * 20  # 5120 bytes: head + 4 segments
    m = s.put("LTERM", "OUT", data)
    assert m.total_entries == 5
    assert s.entries_used == 5
    assert s.elements_used == 5 * elements(1024)
    assert s.browse()[0] == [m]
    assert bytes(s.read("IMS1", "LTERM", "OUT").data) == data
    staging = [h for h in s.header_stats() if 126 <= h["lh"] <= 136]
    assert sum(h["entries"] for h in staging) == 4
    s.delete("IMS1", m.entry_id)
    assert s.elements_used == 0 and s.entries_used == 0 and s.header_stats() == []


def test_staging_segments_are_placed_before_the_head():
    """The head of a long message gets the last entry id, as IMS puts the first record last."""
    s = make(entry_max=600)
    m = s.put("TRAN", "Q", b"z" * 2000)
    seg_ids = list(m.segments.entries)
    assert max(seg_ids) < m.entry_id


def test_structure_full_refuses_puts_but_not_reads_or_deletes():
    """A put that does not fit fails; reads, browses and deletes work and free space at once."""
    s = make(size=4096)  # 8 elements
    for _ in range(3):
        s.put("TRAN", "Q", b"x" * 800)  # 2 elements each: 6 in use
    with raises("STRUCTURE_FULL") as err:
        s.put("TRAN", "Q", b"x" * 1400)  # 3 elements
    assert "MSGQ01" in str(err.value)
    assert s.take_events()[-1] == FullnessChanged("MSGQ01", True, 6, 8)
    m = s.read("IMS1", "TRAN", "Q")
    assert len(s.browse("TRAN", "Q")[0]) == 2
    s.delete("IMS1", m.entry_id)
    s.put("TRAN", "Q", b"x" * 1400)
    assert s.take_events()[-1] == FullnessChanged("MSGQ01", False, 7, 8)


def test_a_put_that_does_not_fit_grows_the_structure_toward_its_size_first():
    """Below its maximum size a structure alters itself before refusing a put (INITSIZE
    toward SIZE), by the step overflow processing takes: to hold the use the put needs
    at 80%; STRUCTURE_FULL only when even SIZE cannot hold it, and then nothing grows."""
    s = make(size=100 * 512, initsize=10 * 512, entry_max=64 * 1024)
    for _ in range(9):
        s.put("TRAN", "Q", b"x")  # one element each
    big = s.put("TRAN", "BIG", b"x" * (3 * 512 - 64))  # 3 elements: 12 of 10
    assert big.elements == 3
    assert (s.current_size, s.elements_total) == (15 * 512, 15)  # 12 elements at 80%
    assert Altered("MSGQ01", 10 * 512, 15 * 512, "put does not fit") in s.take_events()
    with raises("STRUCTURE_FULL"):
        s.put("TRAN", "BIG", b"x" * (89 * 512 - 64))  # 101 of at most 100
    assert s.current_size == 15 * 512 and not any(
        type(e) is Altered for e in s.take_events())
    s.put("TRAN", "BIG", b"x" * (88 * 512 - 64))  # 100 of 100: capped at SIZE
    assert (s.current_size, s.elements_used, s.full) == (100 * 512, 100, False)


def test_a_commit_that_does_not_fit_grows_the_structure_when_it_is_applied():
    """A commit's puts grow the structure as a put's do, but only once every check has
    passed: a refused commit leaves the size as it was."""
    s = make(size=100 * 512, initsize=4 * 512)
    a = s.put("TRAN", "IN", b"a").entry_id
    s.read("IMS1", "TRAN", "IN")
    with raises("ENTRY_NOT_FOUND"):
        s.commit("IMS1", [Put("LTERM", "OUT", b"x" * 2000), Delete(a + 99)])
    assert s.current_size == 4 * 512 and s.elements_used == 1
    s.commit("IMS1", [Put("LTERM", "OUT", b"x" * 2000), Put("LTERM", "OUT", b"y"), Delete(a)])
    assert (s.elements_used, s.current_size) == (6, 8 * 512)  # 6 elements at 80%: 7.5 -> 8


def test_growth_does_not_help_a_structure_out_of_list_entries():
    """Alter adds data elements, not list entries: a put refused for entries grows nothing."""
    s = make(size=100 * 512, initsize=10 * 512, max_entries=2)
    s.put("TRAN", "Q", b"")
    s.put("TRAN", "Q", b"")
    with raises("STRUCTURE_FULL"):
        s.put("TRAN", "Q", b"")
    assert s.current_size == 10 * 512


def test_entry_bound_is_enforced():
    """max_entries bounds list entries even when data elements are free."""
    s = make(max_entries=2)
    s.put("TRAN", "Q", b"")
    s.put("TRAN", "Q", b"")
    with raises("STRUCTURE_FULL"):
        s.put("TRAN", "Q", b"")


def test_commit_applies_everything():
    """A commit puts, deletes, moves and unlocks together and returns each result."""
    s = make()
    a, b, c = (s.put("TRAN", "IN", bytes([i])).entry_id for i in range(3))
    for _ in range(3):
        s.read("IMS1", "TRAN", "IN")
    out = s.commit(
        "IMS1",
        [Put("LTERM", "OUT", b"reply"), Delete(a), Move(b, "TRAN", "OTHER"), Unlock(c)],
    )
    assert [e.entry_id for e in out[1:]] == [a, b, c]
    assert out[0].name == "OUT"
    assert ids(s.browse("TRAN", "OTHER")[0]) == [b]
    assert ids(s.browse("TRAN", "IN")[0]) == [c]
    assert s.client_locks("IMS1") == []


def test_commit_is_all_or_nothing():
    """A commit with one bad operation changes nothing."""
    s = make(size=2048)  # 4 elements
    a = s.put("TRAN", "IN", b"a").entry_id
    s.read("IMS1", "TRAN", "IN")
    before = (s.elements_used, s.entries_used, s.client_locks("IMS1"))
    for ops, reason in [
        ([Delete(a), Put("LTERM", "OUT", b"x" * 5000)], "STRUCTURE_FULL"),
        ([Delete(a), Delete(a)], "INVALID_REQUEST"),
        ([Put("LTERM", "OUT", b"x"), Delete(a + 1)], "ENTRY_NOT_FOUND"),
        ([Put("LTERM", "OUT", b"x"), Unlock(a, qtype="TRAN_STAGING")], "INVALID_REQUEST"),
        ([Delete(a), Put("LTERM", "X" * 16, b"x")], "INVALID_REQUEST"),
    ]:
        with raises(reason):
            s.commit("IMS1", ops)
        assert (s.elements_used, s.entries_used, s.client_locks("IMS1")) == before
    with raises("LOCK_NOT_HELD"):
        s.commit("IMS2", [Delete(a)])


def test_commit_puts_may_use_space_its_deletes_free():
    """Puts in a commit fit if the commit's own deletes make room."""
    s = make(size=1024)  # 2 elements
    a = s.put("TRAN", "IN", b"a" * 800).entry_id
    s.read("IMS1", "TRAN", "IN")
    s.commit("IMS1", [Put("LTERM", "OUT", b"b" * 800), Delete(a)])
    assert s.elements_used == 2


def test_browse_pages_with_a_cursor_and_locks_nothing():
    """Browse returns pages and a cursor that resumes after the last entry."""
    s = make()
    put = [s.put("TRAN", "Q", bytes([i])).entry_id for i in range(25)]
    seen, cursor = [], None
    while True:
        page, cursor = s.browse("TRAN", "Q", after=cursor, limit=10)
        seen += ids(page)
        if cursor is None:
            break
    assert seen == put
    assert s.client_locks("ANY") == [] and s.queue_stats("TRAN", "Q")["depth"] == 25
    with raises("INVALID_REQUEST"):
        s.browse("TRAN", "Q", after=("x",))
    with raises("INVALID_REQUEST"):
        s.browse("TRAN", "Q", limit=0)
    with raises("INVALID_REQUEST"):
        s.browse(None, "Q")


def test_browse_everything_includes_cold_and_lock_queues():
    """Browse with no queue walks cold, lock and every client queue, pausing anywhere."""
    s = make()
    for i in range(6):
        s.put("TRAN", f"Q{i % 3}", bytes([i]))
    s.read("IMS1", "TRAN", "Q0")
    s.read("IMS2", "TRAN", "Q1")
    s.cold_client("IMS2")
    everything = s.browse(limit=100)[0]
    assert [e.where for e in everything[:2]] == ["cold", "locked"]
    assert len(everything) == 6
    paged, cursor = [], None
    while True:
        page, cursor = s.browse(after=cursor, limit=1)
        paged += page
        if cursor is None:
            break
    assert paged == everything


def test_release_client_returns_locks_or_suspends():
    """Peer recovery puts a dead client's locks back, suspending repeat offenders."""
    s = make(max_deliveries=2)
    a = s.put("TRAN", "Q", b"a").entry_id
    b = s.put("TRAN", "Q", b"b").entry_id
    s.read("IMS1", "TRAN", "Q")
    s.release_client("IMS1")
    s.read("IMS1", "TRAN", "Q")  # a, second delivery
    s.read("IMS1", "TRAN", "Q")  # b, first delivery
    released = s.release_client("IMS1")
    assert ids(released) == [a, b]
    assert ids(s.browse("TRAN", "Q")[0]) == [b]
    assert ids(s.browse("TRAN_SUSPEND", "Q")[0]) == [a]
    assert s.client_stats() == {}


def test_release_client_that_ended_normally_suspends_nothing():
    """A client that ends normally gives its locks back: only a client that died
    counts as a failed delivery, so even a message at max_deliveries stays."""
    s = make(max_deliveries=1)
    a = s.put("TRAN", "Q", b"a").entry_id
    s.read("IMS1", "TRAN", "Q")
    assert ids(s.release_client("IMS1", failed=False)) == [a]
    assert ids(s.browse("TRAN", "Q")[0]) == [a]
    assert s.browse("TRAN_SUSPEND", "Q")[0] == []


def test_cold_client_moves_locks_to_cold_queue():
    """A cold start leaves the earlier life's locks on the cold queue for the operator."""
    s = make()
    eid = s.put("TRAN", "Q", b"a").entry_id
    s.read("IMS1", "TRAN", "Q")
    moved = s.cold_client("IMS1")
    assert ids(moved) == [eid] and moved[0].where == "cold" and s.client_locks("IMS1") == []
    with raises("NO_MESSAGE"):
        s.read("IMS1", "TRAN", "Q")
    s.requeue(eid)
    assert s.read("IMS1", "TRAN", "Q").entry_id == eid
    with raises("INVALID_REQUEST"):
        s.requeue(eid)


def test_dequeue_deletes_unlocked_messages_of_a_queue():
    """The operator's dequeue empties a queue but leaves locked messages alone."""
    s = make()
    for i in range(4):
        s.put("TRAN", "Q", bytes([i]))
    s.read("IMS1", "TRAN", "Q")
    assert len(s.dequeue("TRAN", "Q")) == 3
    assert s.stats()["messages"] == 1


def test_empty_to_non_empty_transitions_are_reported_once_each():
    """Only a put onto an empty queue is reported as new work."""
    s = make()
    s.put("TRAN", "Q", b"1")
    s.put("TRAN", "Q", b"2")
    assert s.take_events() == [QueueWork("MSGQ01", QueueType.TRAN, "Q")]
    for _ in range(2):
        s.read("IMS1", "TRAN", "Q")
    s.put("TRAN", "Q", b"3")
    assert s.take_events() == [QueueWork("MSGQ01", QueueType.TRAN, "Q")]
    m = s.read("IMS1", "TRAN", "Q")
    s.unlock("IMS1", m.entry_id)
    assert s.take_events() == [QueueWork("MSGQ01", QueueType.TRAN, "Q")]


def test_a_queue_emptied_and_put_to_again_counts_only_its_new_messages():
    """An emptied queue is kept for its name's next message (IDLE_QUEUES of them,
    the longest idle going first): put to again, it weighs and lists exactly what
    a queue made anew would, large messages' staging segments included."""
    s, fresh = make(), make()
    big = b"x" * (3 * DEFAULT_ENTRY_MAX)
    for m in s.put("TRAN", "Q", big), s.put("TRAN", "Q", b"y"):
        s.delete(None, m.entry_id)
    for data in b"z", big:
        s.put("TRAN", "Q", data)
        fresh.put("TRAN", "Q", data)
    assert s.queue_stats("TRAN", "Q") | {"oldest_put_time": 0} == fresh.queue_stats(
        "TRAN", "Q") | {"oldest_put_time": 0}
    assert [r["queue"] for r in s.queues()] == ["Q"]
    for i in range(IDLE_QUEUES + 50):
        s.delete(None, s.put("TRAN", f"E{i}", b"1").entry_id)
    assert len(s._idle) == IDLE_QUEUES
    assert [r["queue"] for r in s.queues()] == ["Q"]


def test_queries_report_usage():
    """Structure, queue, list header and client queries agree with what was put."""
    s = make()
    s.put("TRAN", "Q", b"x" * 1000)
    s.put("TRAN", "Q", b"x")
    s.read("IMS1", "TRAN", "Q")
    st = s.stats()
    assert st["elements_used"] == elements(1000) + elements(1) == 4
    assert st["entries_used"] == 2 and st["locked"] == 1
    q = s.queue_stats("TRAN", "Q")
    assert (q["depth"], q["elements"], q["locked"]) == (1, 1, 1)
    assert q["oldest_put_time"] is not None
    assert s.queues() == [q]
    assert {h["lh"] for h in s.header_stats()} == {LOCK_LH, list_header(1, "Q")}
    assert s.client_stats() == {"IMS1": 1}


def test_forget_drops_a_message_wherever_it_is_without_a_trace():
    """A ready, a locked and a long message forgotten (a warm standby replacing entries
    a log record touched): gone, their space given back, no effect, no event."""
    s = make()
    locked = s.put("TRAN", "TRANX", b"l").entry_id
    ready = s.put("TRAN", "TRANX", b"r").entry_id
    long = s.put("TRAN", "TRANY", bytes(5000)).entry_id
    assert s.read("IMS1", "TRAN", "TRANX").entry_id == locked
    s.effects.clear()
    s.take_events()
    for eid in (ready, locked, long):
        s.forget(eid)
    assert s.message_count() == 0 and not s.holds(locked)
    assert s.elements_used == 0 and s.entries_used == 0
    assert s.effects == [] and s.take_events() == [] and s.client_locks("IMS1") == []
    with raises("ENTRY_NOT_FOUND"):
        s.forget(ready)


def test_holds_unlogged_says_whether_a_non_recoverable_message_is_here():
    """Only a non-recoverable message, while it is here, makes a structure hold one
    (a planned move then saves a clean image)."""
    s = make()
    s.put("TRAN", "TRANX", b"logged")
    assert not s.holds_unlogged()
    e = s.put("TRAN", "TRANX", b"not logged", recoverable=False)
    assert s.holds_unlogged()
    s.read("IMS1", "TRAN", "TRANX")
    got = s.read("IMS1", "TRAN", "TRANX")
    assert got.entry_id == e.entry_id
    s.delete("IMS1", e.entry_id)
    assert not s.holds_unlogged()


def test_restore_takes_a_row_as_an_image_or_a_log_fold_holds_it():
    """Rows come back from Parquet and msgpack as lists, from a fold as tuples:
    a home queue and an encoded map in either shape restore the same entry, in
    the compiled build as in the source (docs/native.md)."""
    from cqsd.smds import DataMap, Range

    dmap = DataMap.of("IMS1", b"offloaded", [Range(64, 1)])
    for home, encoded in [([1, "H"], list(dmap.encode())),
                          ((1, "H"), tuple(dmap.encode()))]:
        s = make()
        entry = s.restore(7, 1, "Q", b"", True, 7, 1, "ready", None, home, encoded)
        assert (entry.home[1], entry.map, s.last_id) == ("H", dmap, 7)
