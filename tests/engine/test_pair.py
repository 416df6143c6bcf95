"""A primary structure and its overflow structure: overflow processing, step by step."""

import itertools

import msgpack
import pytest

from cqsd.engine import (
    CQSError,
    Delete,
    FullnessChanged,
    Move,
    Put,
    QueueType,
    QueueWork,
    Structure,
)
from cqsd.engine.events import Altered, ExitFailed, OverflowMode, OverflowStatus
from cqsd.engine.overflow import MAX_CANDIDATES, grown_size, select
from cqsd.engine.pair import StructurePair
from cqsd.records import RECOVERABLE, rows_of
from cqsd.recovery.fold import fold

EL = 512
TRAN, SERIAL = QueueType.TRAN, QueueType.TRAN_SERIAL


def make(size=100, initsize=None, overflow=200, threshold=70, **kw):
    """A pair; sizes in data elements, ``overflow=None`` for none."""
    ticks = itertools.count(1000)
    clock = lambda: next(ticks)  # noqa: E731
    primary = Structure("MSGQ", size * EL, initsize=initsize and initsize * EL, clock=clock)
    over = Structure("MSGQOV", overflow * EL, clock=clock) if overflow else None
    return StructurePair(primary, over, threshold=threshold, **kw)


def raises(reason):
    return pytest.raises(CQSError, match=f"^{reason}")


def ids(entries):
    return [e.entry_id for e in entries]


def fill(pair, name, n, qtype="TRAN"):
    return [pair.put(qtype, name, b"x").entry_id for _ in range(n)]  # one data element each


def selected(pair, flood=60, other=10, qtype="TRAN"):
    """70 of 100 elements used, FLOOD (60) selected; returns FLOOD's ids."""
    fill(pair, "OTHER", other)
    put = fill(pair, "FLOOD", flood, qtype)
    assert pair.pressure
    relief = pair.relieve()
    assert [c["queue"] for c in relief.selected] == ["FLOOD"]
    return put


def drain(pair, qtype, name, client="IMS1"):
    got = []
    while True:
        try:
            e = pair.read(client, qtype, name)
        except CQSError as err:
            assert err.reason == "NO_MESSAGE"
            return got
        got.append(e.entry_id)
        pair.delete(client, e.entry_id)


def flood_until(pair, name, want):
    """Put one-element messages on ``name``, relieving whenever pressure is raised,
    until a relief does ``want`` ("grew" or "selected"); returns the reliefs."""
    reliefs = []
    while True:
        pair.put("TRAN", name, b"x")
        if pair.pressure:
            reliefs.append((pair.primary.elements_used, pair.relieve()))
            if getattr(reliefs[-1][1], want):
                return reliefs


# -- the steps, in order --------------------------------------------------------


def test_flooding_one_queue_grows_then_selects_then_moves_then_selects_again():
    """Below maximum size the structure grows to bring use 20 points down; at maximum
    size the flooding queue is selected and moved; a second flood selects another."""
    pair = make(size=1000, initsize=500, overflow=2000)
    for i in range(10):
        fill(pair, f"Q{i}", 1)
    pair.take_events()
    reliefs = flood_until(pair, "FLOOD", "selected")
    assert [(used, r.grew) for used, r in reliefs[:3]] == [
        (350, (500 * EL, 700 * EL)),  # 70% of 500 -> 50% of 700
        (490, (700 * EL, 980 * EL)),  # 70% of 700 -> 50% of 980
        (686, (980 * EL, 1000 * EL)),  # would be 1,372: capped at the maximum size
    ]
    used, relief = reliefs[3]
    assert used == 700 and relief.grew is None
    assert relief.selected == [{"qtype": "TRAN", "queue": "FLOOD", "elements": 690}]
    events = pair.take_events()
    assert [e for e in events if type(e) is Altered][0] == Altered(
        "MSGQ", 500 * EL, 700 * EL, "overflow threshold")
    assert events[-2:] == [OverflowMode("MSGQ", True), OverflowStatus("MSGQ", TRAN, "FLOOD", True)]
    assert pair.moving
    batches = []
    while n := pair.move_some(200):
        batches.append(n)
    assert batches == [200, 200, 200, 90] and not pair.moving
    assert (pair.primary.elements_used, pair.overflow.elements_used) == (10, 690)
    assert pair.overflow.holds(pair.put("TRAN", "FLOOD", b"x").entry_id)
    assert not pair.pressure
    reliefs = flood_until(pair, "FLOOD2", "selected")
    assert [r.selected for _, r in reliefs] == [
        [{"qtype": "TRAN", "queue": "FLOOD2", "elements": 690}]]
    assert {n["queue"] for n in pair.overflow_names()} == {"FLOOD", "FLOOD2"}


def test_a_put_that_does_not_fit_grows_the_primary_and_moves_the_threshold_with_it():
    """A put too big for the primary's current size grows it first (no STRUCTURE_FULL,
    no selection), and the threshold then counts from the new size."""
    pair = make(size=1000, initsize=100, threshold=90)
    fill(pair, "Q", 60)
    pair.take_events()
    pair.put("TRAN", "BIG", b"x" * (50 * EL - 64))  # 110 of 100
    assert pair.take_events()[0] == Altered("MSGQ", 100 * EL, 138 * EL, "put does not fit")
    assert not pair.pressure, "79.7% of the new size is below 90%"
    fill(pair, "Q", 14)  # 124 of 138: 89.9%
    assert not pair.pressure
    fill(pair, "Q", 1)
    assert pair.pressure


def test_a_put_to_a_queue_in_overflow_status_grows_the_overflow_structure_first():
    """The overflow structure grows toward its size too before it refuses a put."""
    ticks = itertools.count(1000)
    clock = lambda: next(ticks)  # noqa: E731
    pair = StructurePair(Structure("MSGQ", 100 * EL, clock=clock),
                         Structure("MSGQOV", 100 * EL, initsize=10 * EL, clock=clock))
    selected(pair)
    while pair.move_some():
        pass
    assert pair.overflow.elements_used == 60 and pair.overflow.current_size > 60 * EL
    pair.put("TRAN", "FLOOD", b"x" * (20 * EL - 64))
    assert pair.overflow.elements_used == 80
    with raises("OVERFLOW_REJECTED"):
        pair.put("TRAN", "FLOOD", b"x" * (21 * EL - 64))


def test_grown_size_brings_use_down_twenty_points():
    """70% of 1,000 elements becomes 50% of 1,400; at 20% or below only the maximum will do."""
    assert grown_size(700, 1000, 10_000 * EL) == 1400 * EL
    assert grown_size(900, 1000, 10_000 * EL) == 1286 * EL  # 90% -> 70%: 900/1286
    assert grown_size(700, 1000, 1200 * EL) == 1200 * EL
    assert grown_size(100, 1000, 3000 * EL) == 3000 * EL


def test_selection_takes_the_biggest_names_until_they_cover_20_percent():
    """Names are taken biggest first until 20% of the structure's elements are covered."""
    pair = make(size=1000)
    for n in [60, 120, 20, 110, 100, 90, 80, 70, 50]:
        fill(pair, f"Q{n}", n)
    relief = pair.relieve()
    assert [(c["queue"], c["elements"]) for c in relief.selected] == [("Q120", 120), ("Q110", 110)]


def test_candidates_are_counted_by_every_element_they_hold_staging_segments_included():
    """A queue holding half the structure in two long messages outweighs one of many
    small messages: its staging segments count, not only the heads on its queue."""
    pair = make(size=1000)
    long_ = [pair.put("TRAN", "LONG", b"L" * (128 * 1024)) for _ in range(2)]
    assert sum(e.total_elements for e in long_) == 520 and long_[0].elements == 65
    fill(pair, "SMALL", 200)
    relief = pair.relieve()
    assert [(c["queue"], c["elements"]) for c in relief.selected] == [("LONG", 520)]
    assert pair.queue_stats("TRAN", "LONG")["elements"] == 520


def test_the_candidate_share_and_the_name_limit_are_settings():
    """overflow_share and overflow_candidates replace the seed's 20% and 512 names."""
    for kw, want in [({"share": 50}, ["Q120", "Q110", "Q100", "Q90", "Q80"]),
                     ({"share": 50, "candidates": 2}, ["Q120", "Q110"])]:
        pair = make(size=1000, **kw)
        for n in [60, 120, 20, 110, 100, 90, 80, 70, 50]:
            fill(pair, f"Q{n}", n)
        assert [c["queue"] for c in pair.relieve().selected] == want


def test_selection_takes_at_most_512_names_and_not_those_already_selected():
    """600 one-element queues at a 10% threshold: 512 names, and the next pass the rest."""
    pair = make(size=3000, overflow=3000, threshold=10)
    for i in range(600):
        fill(pair, f"Q{i:03d}", 1)
    first = pair.relieve()
    assert len(first.selected) == MAX_CANDIDATES
    while pair.move_some():
        pass
    fill(pair, "LAST", 300)  # with the 88 left: 388 elements, 10% reached, under 20%
    second = pair.relieve()
    assert {c["queue"] for c in second.selected} == (
        {"LAST"} | {f"Q{i:03d}" for i in range(600)} - {c["queue"] for c in first.selected})


def test_select_is_a_pure_function_of_sizes():
    """The selection itself: exclusion, the 20% budget and the 512 cap."""
    rows = [(n, (1, f"Q{n}")) for n in range(1, 1001)]
    assert select(rows, 1000, set()) == [((1, "Q1000"), 1000)]
    assert select(rows, 5000, {(1, "Q1000")}) == [((1, "Q999"), 999), ((1, "Q998"), 998)]
    assert len(select(rows, 10**9, set())) == MAX_CANDIDATES


def test_without_an_overflow_structure_puts_are_refused_and_the_threshold_not_checked():
    """Selected names stay in the primary and refuse puts; other queues may fill it up."""
    pair = make(overflow=None)
    put = selected(pair)
    with raises("OVERFLOW_REJECTED") as err:
        pair.put("TRAN", "FLOOD", b"x")
    assert "no overflow structure" in str(err.value)
    with raises("OVERFLOW_REJECTED"):
        pair.commit("IMS1", [Put("TRAN", "OTHER", b"x"), Put("TRAN", "FLOOD", b"x")])
    assert pair.move_some() == 0
    fill(pair, "OTHER", 30)
    assert not pair.pressure and pair.relieve() is None
    with raises("STRUCTURE_FULL"):
        pair.put("TRAN", "OTHER", b"x")
    assert drain(pair, "TRAN", "FLOOD") == put
    assert not pair.overflow_mode
    pair.take_events()
    drain(pair, "TRAN", "OTHER")
    fill(pair, "OTHER", 70)
    assert pair.pressure, "the threshold is checked again once overflow mode ends"


# -- reading across both -----------------------------------------------------------


def test_reads_are_fifo_across_both_structures_while_a_move_is_half_done():
    """Reads interleaved with moves and puts take messages in entry-id order."""
    pair = make()
    put = selected(pair)
    got = []
    assert pair.move_some(7) == 7
    got += [pair.read("IMS1", "TRAN", "FLOOD").entry_id for _ in range(3)]
    put += fill(pair, "FLOOD", 3)  # these go to the overflow structure
    assert pair.move_some(20) == 20
    first = pair.read("IMS1", "TRAN", "FLOOD")
    pair.unlock("IMS1", first.entry_id)  # back to its place, in the overflow structure
    got += [pair.read("IMS1", "TRAN", "FLOOD").entry_id for _ in range(10)]
    while pair.move_some(4):
        got.append(pair.read("IMS1", "TRAN", "FLOOD").entry_id)
    got += [pair.read("IMS1", "TRAN", "FLOOD").entry_id for _ in range(len(put) - len(got))]
    assert got == put


def test_a_message_locked_during_the_move_stays_and_returns_to_its_place():
    """A locked message is not moved; its unlock puts it back first in the primary."""
    pair = make()
    put = selected(pair)
    first = pair.read("IMS1", "TRAN", "FLOOD")
    while pair.move_some():
        pass
    assert pair.primary.holds(first.entry_id) and pair.overflow.holds(put[1])
    pair.unlock("IMS1", first.entry_id)
    assert pair.primary.head_id((TRAN, "FLOOD")) == first.entry_id
    assert drain(pair, "TRAN", "FLOOD") == put


def test_serial_queue_has_one_message_in_flight_across_both():
    """A SERIAL name spread over both structures still yields one message at a time."""
    pair = make()
    put = selected(pair, qtype="TRAN_SERIAL")
    pair.move_some(30)
    key = (SERIAL, "FLOOD")
    pair.watched.add(key)
    m = pair.read("IMS1", "TRAN_SERIAL", "FLOOD")
    assert m.entry_id == put[0] and pair.overflow.holds(m.entry_id)
    assert pair.primary.has_ready(key)
    with raises("NO_MESSAGE"):
        pair.read("IMS2", "TRAN_SERIAL", "FLOOD")
    pair.readable.clear()
    pair.delete("IMS1", m.entry_id)
    assert key in pair.readable
    assert pair.read("IMS2", "TRAN_SERIAL", "FLOOD").entry_id == put[1]


def test_serial_in_flight_in_the_overflow_structure_holds_back_the_primary():
    """After a SERIAL name leaves overflow status, its message in flight there still counts."""
    pair = make()
    put = selected(pair, qtype="TRAN_SERIAL")
    assert pair.move_some() == 60
    for _ in put[:-1]:
        pair.delete("IMS1", pair.read("IMS1", "TRAN_SERIAL", "FLOOD").entry_id)
    m = pair.read("IMS1", "TRAN_SERIAL", "FLOOD")
    assert pair.overflow.holds(m.entry_id) and m.entry_id == put[-1]
    assert not pair.overflow_mode, "no ready message left: the name left overflow status"
    later = pair.put("TRAN_SERIAL", "FLOOD", b"x")
    assert pair.primary.holds(later.entry_id)
    with raises("NO_MESSAGE"):
        pair.read("IMS2", "TRAN_SERIAL", "FLOOD")
    pair.watched.add((SERIAL, "FLOOD"))
    pair.delete("IMS1", m.entry_id)
    assert (SERIAL, "FLOOD") in pair.readable
    assert pair.read("IMS2", "TRAN_SERIAL", "FLOOD").entry_id == later.entry_id


def test_browse_merges_both_structures_page_by_page():
    """Browse pages through both structures in list-header, name, id order with one cursor."""
    pair = make()
    selected(pair)
    pair.move_some(25)
    fill(pair, "FLOOD", 2)
    pair.read("IMS1", "TRAN", "OTHER")
    pair.read("IMS1", "TRAN", "FLOOD")
    everything = pair.browse(limit=1000)[0]
    assert sorted(ids(everything)) == ids(pair) and len(everything) == 72
    assert [e.where for e in everything[:2]] == ["locked", "locked"]
    for query in [(), ("TRAN",), ("TRAN", "FLOOD")]:
        whole = pair.browse(*query, limit=1000)[0]
        paged, cursor = [], None
        while True:
            page, cursor = pair.browse(*query, after=cursor, limit=7)
            paged += page
            if cursor is None:
                break
        assert paged == whole
    assert ids(pair.browse("TRAN", "FLOOD", limit=1000)[0]) == sorted(
        e.entry_id for e in pair if e.name == "FLOOD" and e.where == "ready")


# -- where puts go, and what refuses them --------------------------------------------


def test_overflow_exit_may_drop_candidates():
    """The exit sees the candidates and keeps some; the dropped ones are reported."""
    seen = []

    def exit_(structure, candidates):
        seen.append((structure, candidates))
        return [c for c in candidates if c["queue"] != "Q120"]

    pair = make(size=1000, overflow_exit=exit_)
    for n in [120, 110, 100, 90, 80, 70, 60, 50, 20]:
        fill(pair, f"Q{n}", n)
    relief = pair.relieve()
    assert seen[0][0] == "MSGQ" and [c["queue"] for c in seen[0][1]] == ["Q120", "Q110"]
    assert [c["queue"] for c in relief.selected] == ["Q110"]
    assert relief.dropped == [{"qtype": "TRAN", "queue": "Q120", "elements": 120}]
    assert [n["queue"] for n in pair.overflow_names()] == ["Q110"]


def test_an_overflow_exit_that_raises_keeps_every_candidate():
    """A broken exit does not stop overflow processing; the result says what went wrong."""
    def exit_(structure, candidates):
        raise RuntimeError("exit is broken")

    pair = make(overflow_exit=exit_)
    selected(pair)
    assert pair.overflow_names() == [{"qtype": "TRAN", "queue": "FLOOD"}]
    pair2 = make(overflow_exit=exit_)
    fill(pair2, "FLOOD", 70)
    assert pair2.relieve().exit_error == "RuntimeError: exit is broken"


def test_queue_space_exit_may_refuse_puts_to_queues_in_overflow_status():
    """The queue space exit is asked about puts to overflow queues only."""
    asked = []

    def hook(structure, qtype, queue, nbytes):
        asked.append((structure, qtype, queue, nbytes))
        return nbytes < 100

    pair = make(queue_space_exit=hook)
    selected(pair)
    asked.clear()
    pair.put("TRAN", "OTHER", b"y" * 200)
    pair.put("TRAN", "FLOOD", b"y" * 10)
    with raises("OVERFLOW_REJECTED") as err:
        pair.put("TRAN", "FLOOD", b"y" * 200)
    assert "queue space exit" in str(err.value)
    with raises("OVERFLOW_REJECTED"):
        pair.commit("IMS1", [Put("TRAN", "FLOOD", b"y" * 200)])
    assert asked == [("MSGQ", "TRAN", "FLOOD", 10), ("MSGQ", "TRAN", "FLOOD", 200),
                     ("MSGQ", "TRAN", "FLOOD", 200)]


def test_a_queue_space_exit_that_raises_lets_the_put_through_and_is_reported():
    """A failing queue space exit is an event, not a refused put."""
    def hook(structure, qtype, queue, nbytes):
        raise ValueError("no")

    pair = make(queue_space_exit=hook)
    selected(pair)
    pair.take_events()
    assert pair.overflow.holds(pair.put("TRAN", "FLOOD", b"x").entry_id)
    assert pair.take_events() == [ExitFailed("MSGQ", "queue_space", "ValueError: no")]


def test_a_full_overflow_structure_rejects_overflow_puts_while_the_primary_carries_on():
    """Overflow queues get OVERFLOW_REJECTED; other queues fill the primary to
    STRUCTURE_FULL; reads, browses and deletes work throughout."""
    pair = make(overflow=50)
    put = selected(pair)
    assert sum(iter(pair.move_some, 0)) == 50, "the move stops where the overflow is full"
    assert pair.take_events()[-1] == FullnessChanged("MSGQOV", True, 50, 50)
    with raises("OVERFLOW_REJECTED") as err:
        pair.put("TRAN", "FLOOD", b"x")
    assert "MSGQOV is full" in str(err.value)
    fill(pair, "OTHER", 80)
    with raises("STRUCTURE_FULL"):
        pair.put("TRAN", "OTHER", b"x")
    assert len(pair.browse("TRAN", "FLOOD", limit=1000)[0]) == 60
    assert drain(pair, "TRAN", "FLOOD") == put
    pair.put("TRAN", "OTHER2", b"x")  # FLOOD's 10 left in the primary made room


def test_puts_to_names_in_overflow_status_go_to_the_overflow_structure():
    """Once selected, a name's puts land in the overflow structure and others in the primary;
    new work is reported under the primary's name, only when the queue was empty."""
    pair = make()
    selected(pair)
    while pair.move_some():
        pass
    drain(pair, "TRAN", "FLOOD")
    assert not pair.overflow_mode
    pair.take_events()
    fill(pair, "FLOOD", 1)
    assert pair.take_events() == [QueueWork("MSGQ", TRAN, "FLOOD")]
    put = selected(pair, flood=70 - pair.primary.elements_used + 1, other=0)
    pair.move_some(10)
    pair.take_events()
    e = pair.put("TRAN", "FLOOD", b"x")
    assert pair.overflow.holds(e.entry_id) and pair.take_events() == []
    assert e.entry_id > put[-1]


def test_leaving_overflow_status_and_mode():
    """A name leaves overflow status when neither structure has a ready message for it;
    the structure leaves overflow mode with its last name."""
    pair = make(size=1000)
    for n in [120, 110, 100, 90, 80, 70, 60, 50, 20]:
        fill(pair, f"Q{n}", n)
    pair.relieve()
    pair.move_some(150)
    pair.take_events()
    got = drain(pair, "TRAN", "Q120")
    assert len(got) == 120
    assert pair.take_events() == [OverflowStatus("MSGQ", TRAN, "Q120", False)]
    locked = [pair.read("IMS1", "TRAN", "Q110") for _ in range(110)]
    assert pair.take_events() == [OverflowStatus("MSGQ", TRAN, "Q110", False),
                                  OverflowMode("MSGQ", False)]
    assert pair.stats()["overflow_mode"] is False and pair.move_some() == 0
    pair.unlock("IMS1", locked[0].entry_id)  # ready again in the overflow structure
    assert pair.take_events() == [QueueWork("MSGQ", TRAN, "Q110"), OverflowMode("MSGQ", True),
                                  OverflowStatus("MSGQ", TRAN, "Q110", True)]


# -- commits ---------------------------------------------------------------------


def test_a_commit_spans_both_structures():
    """Deletes, moves and unlocks apply where each entry is, puts where their queue's go,
    and the one log record carries both structures' effects."""
    pair = make()
    put = selected(pair)
    pair.move_some(30)
    a = pair.read("IMS1", "TRAN", "OTHER")
    b = pair.read("IMS1", "TRAN", "FLOOD")
    c = pair.read("IMS1", "TRAN", "FLOOD")
    assert pair.primary.holds(a.entry_id) and pair.overflow.holds(b.entry_id)
    pair.take_record()
    out = pair.commit("IMS1", [Put("TRAN", "FLOOD", b"f"), Delete(a.entry_id), Delete(b.entry_id),
                               Put("LTERM", "REPLY", b"r"), Move(c.entry_id, "TRAN", "ELSE")])
    assert pair.overflow.holds(out[0].entry_id) and pair.primary.holds(out[3].entry_id)
    assert ids(out[1:3]) == [a.entry_id, b.entry_id] and out[4].name == "ELSE"
    record = pair.take_record()
    assert [e[0] for e in record["e"]] == ["D", "P"]
    assert [e[0] for e in record["x"]["MSGQOV"]] == ["D", "R", "P"]
    assert put[0] not in ids(pair)


def test_a_commit_with_a_refused_put_is_refused_whole():
    """A put the overflow structure has no room for refuses the commit; nothing changes."""
    pair = make(overflow=30)
    selected(pair)
    while pair.move_some():
        pass
    a = pair.read("IMS1", "TRAN", "OTHER")
    b = pair.read("IMS1", "TRAN", "FLOOD")
    before = [(e.entry_id, e.where, e.owner) for e in pair]
    for ops, reason in [
        ([Delete(a.entry_id), Delete(b.entry_id), Put("TRAN", "FLOOD", b"x" * 2000)],
         "OVERFLOW_REJECTED"),
        ([Delete(a.entry_id), Put("TRAN", "FLOOD", b"x"), Delete(b.entry_id + 10**9)],
         "ENTRY_NOT_FOUND"),
        ([Put("TRAN", "OTHER", b"x" * 50_000), Delete(b.entry_id)], "STRUCTURE_FULL"),
        ([Delete(b.entry_id), Delete(b.entry_id)], "INVALID_REQUEST"),
    ]:
        with raises(reason):
            pair.commit("IMS1", ops)
        assert [(e.entry_id, e.where, e.owner) for e in pair] == before
    pair.commit("IMS1", [Delete(b.entry_id), Put("TRAN", "FLOOD", b"x")])


# -- the log, restart and queries ----------------------------------------------------


def test_take_record_folds_to_each_structures_recoverable_rows():
    """Folding the records, through msgpack, rebuilds both structures' recoverable messages."""
    pair = make()
    selected(pair)
    pair.put("TRAN", "FLOOD", b"n", recoverable=False)
    pair.put("TRAN", "FLOOD", b"r")
    images = {"MSGQ": {}, "MSGQOV": {}}
    record = msgpack.unpackb(msgpack.packb(pair.take_record()), raw=False)
    assert [e[0] for e in record["x"]["MSGQOV"]] == ["P"]
    for name, image in images.items():
        fold(image, [record], name)
    while pair.move_some(9):
        record = msgpack.unpackb(msgpack.packb(pair.take_record()), raw=False)
        for name, image in images.items():
            fold(image, [record], name)
    assert pair.take_record() is None
    for s in (pair.primary, pair.overflow):
        assert images[s.name] == {i: r for i, r in rows_of(s).items() if r[RECOVERABLE]}


def test_status_is_derived_again_after_a_restart():
    """Restored into both structures directly, names with ready messages in the overflow
    structure are in overflow status again, and pressure is raised if use is high."""
    pair = make()
    selected(pair)
    pair.move_some(20)
    rows = {s.name: rows_of(s) for s in (pair.primary, pair.overflow)}
    again = make()
    again.primary.load(rows["MSGQ"].values())
    again.overflow.load(rows["MSGQOV"].values())
    again.derive_status()
    assert again.overflow_names() == [{"qtype": "TRAN", "queue": "FLOOD"}]
    assert not again.pressure, "50 of 100 elements in the primary"
    high = make()
    high.primary.load(list(rows["MSGQ"].values()) + list(rows["MSGQOV"].values()))
    high.derive_status()
    assert high.pressure and not high.overflow_mode
    assert drain(again, "TRAN", "FLOOD") == drain(pair, "TRAN", "FLOOD")


def test_queries_cover_both_structures():
    """Queue, list header and client queries add both structures up; stats shows overflow."""
    pair = make()
    selected(pair)
    pair.move_some(50)
    pair.read("IMS1", "TRAN", "FLOOD")
    pair.read("IMS2", "TRAN", "OTHER")
    q = pair.queue_stats("TRAN", "FLOOD")
    assert (q["depth"], q["elements"], q["locked"], q["overflow"]) == (59, 59, 1, True)
    assert q["oldest_put_time"] == min(
        e.put_time for e in pair if e.name == "FLOOD" and e.where == "ready")
    assert [(r["queue"], r["overflow"]) for r in pair.queues(also=[(TRAN, "IDLE")])] == sorted(
        [("FLOOD", True), ("OTHER", False), ("IDLE", False)],
        key=lambda r: [x["queue"] for x in pair.queues(also=[(TRAN, "IDLE")])].index(r[0]))
    assert sum(h["elements"] for h in pair.header_stats()) == 70
    assert pair.client_stats() == {"IMS1": 1, "IMS2": 1}
    st = pair.stats()
    assert (st["name"], st["overflow"], st["overflow_mode"], st["overflow_names"],
            st["threshold"]) == ("MSGQ", "MSGQOV", True, 1, 70)
    assert [s["name"] for s in pair.structure_stats()] == ["MSGQ", "MSGQOV"]
    assert sum(s["elements_used"] for s in pair.structure_stats()) == 70


def test_alter_changes_the_current_size_within_bounds():
    """Alter refuses sizes below what is in use or above the maximum, and is an event."""
    pair = make(size=100, initsize=50)
    fill(pair, "Q", 30)
    with raises("INVALID_REQUEST"):
        pair.alter(29 * EL)
    with raises("INVALID_REQUEST"):
        pair.alter(101 * EL)
    pair.take_events()
    assert pair.alter(40 * EL) == Altered("MSGQ", 50 * EL, 40 * EL, "operator")
    assert pair.take_events() == [Altered("MSGQ", 50 * EL, 40 * EL, "operator")]
    assert pair.primary.stats()["elements_total"] == 40
    assert pair.put("TRAN", "Q", b"x") and pair.pressure, "70% of the new size"


def test_threshold_100_turns_overflow_processing_off():
    """At 100 percent the structure simply fills."""
    pair = make(threshold=100)
    fill(pair, "Q", 100)
    assert not pair.pressure and pair.relieve() is None
    with raises("STRUCTURE_FULL"):
        pair.put("TRAN", "Q", b"x")


def test_a_relief_that_frees_nothing_waits_for_one_percent_more():
    """When every candidate is kept out, the next selection waits for use to grow."""
    pair = make(size=1000, overflow_exit=lambda s, c: [])
    fill(pair, "Q", 700)
    assert pair.relieve().selected == []
    fill(pair, "Q", 9)
    assert not pair.pressure
    fill(pair, "Q", 1)
    assert pair.pressure


def test_a_structure_restored_over_full_grows_to_hold_its_content():
    """Recovery loads a structure at its initial size, which its content may exceed:
    relief counts it as 100% used and grows it to hold the content at 80%."""
    assert grown_size(1258, 1000, 10_000 * EL) == 1573 * EL
    pair = make(size=1000, initsize=100)
    rows = [[i, int(TRAN), "Q", b"x", True, 0, 0, "ready", None, None, None, None, None]
            for i in range(1, 301)]
    pair.primary.load(rows)
    pair.derive_status()
    assert pair.pressure
    assert pair.relieve().grew == (100 * EL, 375 * EL)
    assert pair.primary.stats()["elements_total"] == 375


def test_an_overflow_move_batch_stops_at_move_bytes():
    """One move_some logs at most MOVE_BYTES of payload (and one message more), so
    its record stays within what the log takes whatever the message sizes."""
    from cqsd.engine import pair as pair_module

    MiB = 1024 * 1024
    primary = Structure("P", 64 * MiB, entry_max=2 * MiB)
    p = StructurePair(primary, Structure("OV", 64 * MiB, entry_max=2 * MiB), threshold=1)
    for _ in range(10):
        p.put("TRAN", "BIG", b"m" * MiB)
    p.relieve()
    moved = p.move_some()
    record = p.take_record()
    assert moved == pair_module.MOVE_BYTES // MiB
    assert sum(len(e[4]) for e in record["x"]["OV"]) == moved * MiB


def test_a_read_passes_over_what_it_cannot_deliver_in_both_structures_in_id_order():
    """``passed`` skips messages in place, across the primary and its overflow structure
    in id order; the skipped ones stay first, undelivered, and a SERIAL queue is
    never read past its first."""
    pair = make()
    put = selected(pair)
    pair.move_some(10)  # the ten oldest of FLOOD now in the overflow structure
    assert pair.overflow.holds(put[0]) and not pair.overflow.holds(put[-1])
    held = {put[0], put[1], put[12]}
    got = [pair.read("IMS1", "TRAN", "FLOOD", passed=lambda e: e.entry_id in held).entry_id
           for _ in range(11)]
    assert got == put[2:12] + put[13:14]
    assert pair.read("IMS1", "TRAN", "FLOOD").entry_id == put[0]
    assert pair.overflow.entry(put[1]).delivery_count == 0
    assert pair.primary.entry(put[12]).delivery_count == 0
    first, _ = (pair.put("TRAN_SERIAL", "S", b"x").entry_id for _ in range(2))
    with raises("NO_MESSAGE"):
        pair.read("IMS1", "TRAN_SERIAL", "S", passed=lambda e: e.entry_id == first)
    assert pair.read("IMS1", "TRAN_SERIAL", "S").entry_id == first
