"""The Spark fold against the reference fold and the live engine (one contract suite: docs/srds.md).

Hand-written cases run against both folds through one interface; generated
engine histories are folded by Spark all in one job, each history under its
own structure names, and must give exactly the engine's recoverable rows.
"""

import copy
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqsd.records import LEASE, MAP, NOT_BEFORE, FoldError
from cqsd.recovery.fold import fold as reference_fold
from cqsd.smds import DataMap, Range
from cqsd.smds.pages import room
from cqsd.srds.fold import EVENTS, LogEvents

from .folds import log_order, python_fold, spark_fold
from .histories import Drawn, History

FOLDS = {"python": python_fold, "spark": spark_fold}


@pytest.fixture(params=sorted(FOLDS))
def fold(request):
    """Each hand-written case runs on both folds; the Spark one shares the session's JVM."""
    spark = request.getfixturevalue("spark") if request.param == "spark" else None
    return lambda images, records, structures: FOLDS[request.param](
        spark, images, records, structures)


def row(eid, qtype=1, name="Q", data=b"m", put_time=5, count=0, where="ready", owner=None,
        home=None, datamap=None, lease=None, not_before=None):
    return [eid, qtype, name, data, True, put_time, count, where, owner, home, datamap, lease,
            not_before]


# An offloaded payload in two ranges, the second at a lower page than the first,
# so that map order and page order differ.
PAYLOAD = b"".join(i.to_bytes(2, "big") for i in range(2100))
FIRST, REST = PAYLOAD[:room(1)], PAYLOAD[room(1):]
DMAP = DataMap.of("IMS1", PAYLOAD, [Range(200, 1), Range(100, 1)]).encode()
PUT = [["P", 7, 1, "Q", b"", 3], ["M", 7, DMAP]]


def offloaded(**kw):
    """The materialised row of entry 7 as PUT puts it."""
    return row(7, data=PAYLOAD, put_time=3, datamap=DMAP, **kw)


def test_put_lock_unlock_elsewhere_and_relock_count_deliveries(fold):
    """A put is ready with count 0; each lock adds one; R sets place, home and count."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["P", 7, 1, "Q", b"hi", 3], ["L", 7, "IMS1"]]}),
        ("b", 1, 11, {"s": "S", "e": [["R", 7, 3, "Q", [1, "Q"], 1]]}),
        ("a", 2, 12, {"s": "S", "e": [["L", 7, "IMS2"]]}),
    ]
    got = fold({}, records, ["S"])
    assert got == {"S": {7: row(7, 3, "Q", b"hi", 3, 2, "locked", "IMS2", [1, "Q"])}}


def test_order_is_timestamp_then_writer_then_lsn_whatever_the_input_order(fold):
    """Records are merged by (timestamp, writer, LSN), not taken as listed."""
    records = [
        ("b", 2, 20, {"s": "S", "e": [["D", 1]]}),
        ("b", 1, 10, {"s": "S", "e": [["P", 1, 1, "Q", b"x", 1]]}),
        ("a", 1, 10, {"s": "S", "e": [["P", 2, 1, "Q", b"y", 1]]}),
        ("a", 2, 20, {"s": "S", "e": [["C", 2, "IMS1"]]}),
    ]
    assert fold({}, records, ["S"]) == {"S": {2: row(2, data=b"y", put_time=1, where="cold",
                                                       owner="IMS1")}}


def test_a_tie_in_time_is_broken_by_writer_so_a_lock_before_its_put_fails(fold):
    """At equal timestamps writer "a" comes before "b": its lock precedes the put."""
    records = [
        ("b", 1, 10, {"s": "S", "e": [["P", 1, 1, "Q", b"x", 1]]}),
        ("a", 1, 10, {"s": "S", "e": [["L", 1, "IMS1"]]}),
    ]
    with pytest.raises(FoldError, match=r"structure S: effect L on entry 1\b"):
        fold({}, records, ["S"])


def test_the_x_map_applies_after_the_record_s_own_effects(fold):
    """Within a record, e comes before x[S]: a delete in e then a put in x leaves it."""
    records = [("a", 1, 10, {"s": "S", "e": [["D", 4]], "x": {"S": [["P", 4, 1, "Q", b"n", 9]]}})]
    got = fold({"S": {4: row(4)}}, records, ["S"])
    assert got == {"S": {4: row(4, data=b"n", put_time=9)}}


def test_overflow_moves_a_message_out_of_one_structure_into_another(fold):
    """O removes the row from the primary; I adds it to the overflow keeping id, put time,
    count and home; later effects on the overflow apply to it there."""
    records = [
        ("a", 1, 10, {"s": "P1", "e": [["O", 7]],
                      "x": {"OV": [["I", 7, 3, "Q", b"m", 5, 2, [1, "Q"]]]}}),
        ("a", 2, 11, {"s": "OV", "e": [["L", 7, "IMS1"]]}),
        ("a", 3, 12, {"s": "OTHER", "e": [["D", 99]]}),
    ]
    images = {"P1": {7: row(7, count=2), 8: row(8)}}
    got = fold(images, records, ["P1", "OV"])
    assert got == {"P1": {8: row(8)},
                   "OV": {7: row(7, 3, count=3, where="locked", owner="IMS1", home=[1, "Q"])}}


def test_a_requeue_from_the_cold_queue_resets_the_count(fold):
    """C puts a message on the cold queue with its owner; R brings it back with count 0."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["C", 1, "IMS1"]]}),
        ("a", 2, 11, {"s": "S", "e": [["R", 1, 1, "Q", None, 0]]}),
    ]
    assert fold({"S": {1: row(1, count=3, where="locked", owner="IMS1")}}, records, ["S"]) == {
        "S": {1: row(1)}}


def test_image_rows_no_record_touches_are_kept_as_they_are(fold):
    """A locked row of the image stays locked, with its owner and count."""
    image = {"S": {1: row(1, count=2, where="locked", owner="IMS9", home=[4, "T"])}}
    assert fold(copy.deepcopy(image), [], ["S"]) == image


@pytest.mark.parametrize("effects", [
    [["L", 42, "IMS1"]],
    [["P", 42, 1, "Q", b"x", 1], ["D", 42], ["D", 42]],
    [["P", 42, 1, "Q", b"x", 1], ["O", 42], ["R", 42, 1, "Q", None, 0]],
    [["C", 42, "IMS1"]],
])
def test_an_effect_on_an_entry_that_is_not_there_is_a_fold_error(fold, effects):
    """Effects on an id never put, or already gone, mean image and log do not belong
    together: the error names the structure and the entry."""
    records = [("a", i + 1, 10 + i, {"s": "S", "e": [e]}) for i, e in enumerate(effects)]
    with pytest.raises(FoldError, match=r"structure S: effect [LDRCO] on entry 42\b"):
        fold({}, records, ["S"])


def test_an_entry_put_into_another_structure_is_unknown_here(fold):
    """An I for the overflow does not make the id known to the primary."""
    records = [("a", 1, 10, {"s": "S", "e": [], "x": {"T": [["I", 5, 1, "Q", b"", 1, 0, None]]}}),
               ("a", 2, 11, {"s": "S", "e": [["D", 5]]})]
    with pytest.raises(FoldError, match=r"structure S: effect D on entry 5\b"):
        fold({}, records, ["S", "T"])


def test_an_offloaded_put_gets_its_payload_in_map_order_whatever_the_blocks_order(fold):
    """B, P with no data, M: the row holds the map and the blocks' bytes joined in the
    order of the map's ranges, not of their pages nor of the B effects."""
    records = [("a", 1, 10, {"s": "S", "e": [["B", 7, 100, REST], ["B", 7, 200, FIRST], *PUT]})]
    assert fold({}, records, ["S"]) == {"S": {7: offloaded()}}


def test_blocks_in_earlier_records_of_the_same_writer_wait_for_their_entry(fold):
    """A message's blocks may come in records of their own before its entry's record,
    with other writers' records between."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["B", 7, 200, FIRST]]}),
        ("b", 1, 11, {"s": "S", "e": [["P", 8, 1, "Q", b"m", 5]]}),
        ("a", 2, 12, {"s": "S", "e": [["B", 7, 100, REST]]}),
        ("a", 3, 13, {"s": "S", "e": PUT}),
    ]
    assert fold({}, records, ["S"]) == {"S": {7: offloaded(), 8: row(8)}}


def test_an_offloaded_message_is_locked_unlocked_and_deleted_like_any_other(fold):
    """L, R and C change an offloaded row's place and keep its payload and map; D
    removes it; a row of the start image keeps its bytes and map too."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["B", 7, 200, FIRST], ["B", 7, 100, REST], *PUT]}),
        ("a", 2, 11, {"s": "S", "e": [["L", 7, "IMS2"], ["L", 9, "IMS2"]]}),
        ("a", 3, 12, {"s": "S", "e": [["R", 7, 3, "Z", [1, "Q"], 1], ["C", 9, "IMS2"]]}),
        ("a", 4, 13, {"s": "S", "e": [["D", 6]]}),
    ]
    image = {"S": {6: row(6, data=b"six", datamap=DMAP), 9: row(9, data=b"nine", datamap=DMAP)}}
    assert fold(image, records, ["S"]) == {"S": {
        7: row(7, 3, "Z", PAYLOAD, 3, 1, home=[1, "Q"], datamap=DMAP),
        9: row(9, data=b"nine", count=1, where="cold", owner="IMS2", datamap=DMAP)}}


def test_blocks_of_a_put_that_never_completed_are_dropped(fold):
    """B effects with no M, in the middle of the log or at its end, leave nothing."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["B", 5, 200, FIRST]]}),
        ("a", 2, 11, {"s": "S", "e": [["P", 6, 1, "Q", b"m", 5]]}),
        ("a", 3, 12, {"s": "S", "e": [["B", 7, 200, FIRST], ["B", 7, 100, REST]]}),
    ]
    assert fold({}, records, ["S"]) == {"S": {6: row(6)}}


BAD_MAP = ["IMS1", 5000, 0, [64, 1]]  # one page cannot hold 5000 bytes


@pytest.mark.parametrize(("effects", "error"), [
    ([["B", 7, 200, FIRST], *PUT], r"effect M on entry 7: no B effect holds its block at page 100"),
    ([["B", 7, 200, FIRST], ["B", 7, 100, REST], *PUT, ["B", 7, 100, REST]],
     r"effect B on entry 7 at page 100 comes after the entry's M"),
    ([["B", 7, 200, FIRST], ["B", 7, 100, REST], ["B", 7, 300, b"x"], *PUT],
     r"effect M on entry 7: a B effect holds a block at page 300, where none of its ranges"),
    ([["B", 7, 200, FIRST], ["B", 7, 200, FIRST]],
     r"effect B on entry 7 at page 200 is the second block of that page"),
    ([["B", 7, 200, FIRST], ["B", 7, 100, REST[:-1] + b"?"], *PUT],
     r"effect M on entry 7: its blocks fail the map's CRC-32C"),
    ([["B", 7, 200, FIRST], ["B", 7, 100, REST + b"?"], *PUT],
     rf"effect M on entry 7: its block at page 100 holds {len(REST) + 1} bytes, the map says "
     rf"{len(REST)}\b"),
    ([["B", 7, 200, FIRST], ["B", 7, 100, REST], PUT[1]],
     r"effect M on entry 7\b.*which the image does not hold"),
    ([["P", 7, 1, "Q", b"", 3], ["M", 7, BAD_MAP]], r"effect M on entry 7 has a bad data map"),
])
def test_blocks_that_do_not_make_their_payload_are_a_fold_error(fold, effects, error):
    """A missing, late, stray, second, damaged or wrong-sized block, an M for an entry
    that is not there and a map that is not one are refused, naming the entry."""
    records = [("a", i + 1, 10 + i, {"s": "S", "e": [e]}) for i, e in enumerate(effects)]
    with pytest.raises(FoldError, match=rf"structure S: {error}"):
        fold({}, records, ["S"])


def test_a_lease_lasts_until_its_lock_ends_and_a_delay_stays_with_its_message(fold):
    """T gives a lock its lease, a later T renews it, L (a lock without one), R and
    C clear it; N gives a put its not_before, which stays after reads and unlocks."""
    records = [
        ("a", 1, 10, {"s": "S", "e": [["P", 7, 1, "Q", b"hi", 3], ["N", 7, 99],
                                      ["P", 8, 1, "Q", b"ho", 4]]}),
        ("a", 2, 11, {"s": "S", "e": [["L", 7, "IMS1"], ["T", 7, 5, 40], ["L", 8, "IMS2"],
                                      ["T", 8, 5, 41]]}),
        ("a", 3, 12, {"s": "S", "e": [["T", 7, 9, 60], ["R", 8, 1, "Q", None, 1]]}),
    ]
    got = fold({}, records, ["S"])
    assert got == {"S": {7: row(7, data=b"hi", put_time=3, count=1, where="locked",
                                owner="IMS1", lease=[9, 60], not_before=99),
                         8: row(8, data=b"ho", put_time=4, count=1)}}
    records.append(("a", 4, 13, {"s": "S", "e": [["C", 7, "IMS1"], ["L", 8, "IMS1"]]}))
    got = fold({}, records, ["S"])
    assert got["S"][7] == row(7, data=b"hi", put_time=3, count=1, where="cold", owner="IMS1",
                              not_before=99)
    assert got["S"][8][LEASE] is None


def test_a_start_image_s_lease_and_delay_carry_on_until_an_effect_changes_them(fold):
    """Base rows keep their lease and not_before; an R clears the lease only."""
    images = {"S": {7: row(7, count=1, where="locked", owner="IMS1", lease=[5, 40],
                           not_before=2), 8: row(8, not_before=50)}}
    got = fold(images, [("a", 1, 10, {"s": "S", "e": [["R", 7, 1, "Q", None, 1]]})], ["S"])
    assert got == {"S": {7: row(7, count=1, not_before=2), 8: row(8, not_before=50)}}


def test_the_maps_only_fold_skips_blocks_and_keeps_maps_without_data():
    """The restart's fold: B effects are not even looked at (the bytes are in the data
    set), M sets the map, an offloaded row's data stays empty; a bad map is still
    refused."""
    rows: dict = {}
    bodies = [{"s": "S", "e": [["B", 7, 200, FIRST], ["B", 7, 200, b"again"], *PUT]},
              {"s": "S", "e": [["B", 8, 1, b"never completed"]]}]
    assert reference_fold(rows, bodies, "S") == 7
    assert rows == {7: row(7, data=b"", put_time=3, datamap=DMAP)}
    with pytest.raises(FoldError, match="effect M on entry 7 has a bad data map"):
        reference_fold({}, [{"s": "S", "e": [PUT[0], ["M", 7, BAD_MAP]]}], "S")


def test_spark_folds_generated_engine_histories_exactly_like_the_engine(spark):
    """Random histories through the real engine (every request kind, SERIAL queues,
    long messages, offloaded ones and abandoned blocks, overflow moves, several
    writers), each folded from a random split point of its log (the part before
    it folded by the reference fold into a start image): Spark gives exactly the
    live recoverable rows, payloads materialised, as the reference fold does,
    for every history in one Spark job; the maps-only fold gives them without
    the offloaded bytes."""
    cases = []

    @settings(max_examples=80, deadline=None, database=None, print_blob=True, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def generate(data):
        h = History(f"H{len(cases)}", Drawn(data)).run(data.draw(st.integers(20, 60)))
        split = h.safe(data.draw(st.integers(0, len(h.records))))
        images = python_fold(None, {}, h.records[:split], h.names)
        rest = h.records[split:]
        # The reference fold is checked here, where Hypothesis can shrink a failure.
        assert python_fold(None, images, rest, h.names) == h.expected()
        bodies = [body for *_, body in sorted(h.records, key=log_order)]
        for s, rows in h.expected(materialised=False).items():
            maps_only: dict = {}
            reference_fold(maps_only, bodies, s)
            assert maps_only == rows
        cases.append((h, images, rest))

    generate()
    images = {s: rows for _, imgs, _ in cases for s, rows in imgs.items()}
    records = [r for _, _, rest in cases for r in rest]
    names = [s for h, _, _ in cases for s in h.names]
    folded = spark_fold(spark, images, records, names)
    for h, _, rest in cases:
        for s, rows in h.expected().items():
            assert folded[s] == rows, (s, sorted(rest, key=log_order))
    kinds = {e[0] for h, _, _ in cases for *_, body in h.records
             for e in [*body["e"], *itertools.chain(*body.get("x", {}).values())]}
    assert kinds == set("PLDRCOIBMTN"), "the histories no longer exercise every effect"
    rows = [r for h, _, _ in cases for by_id in h.expected().values() for r in by_id.values()]
    assert any(r[LEASE] for r in rows), "no leased lock is left to fold"
    assert any(r[NOT_BEFORE] for r in rows), "no delayed put is left to fold"
    assert any(h.unsafe for h, _, _ in cases), "no blocks in records of their own"
    assert any(r[MAP] for h, _, _ in cases for rows in h.expected().values()
               for r in rows.values()), "no offloaded message is left to materialise"
    assert sum(len(h.records) for h, _, _ in cases) > 600


def test_a_plan_with_no_log_tasks_reads_the_log_with_no_spark_tasks(spark):
    """A checkpoint with nothing new in the log folds the slot alone: the log's side
    has no partitions, so it starts no Python workers (an empty list, made a Python
    RDD, started a worker daemon and workers of its own)."""
    events = LogEvents(spark, [], {"MSGQ01"})
    assert events.frame.rdd.getNumPartitions() == 0
    assert events.frame.schema == EVENTS and events.frame.count() == 0
