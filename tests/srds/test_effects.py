"""Record bodies as effect rows: which effects, in which order, and what is refused."""

import msgpack
import pytest

from cqsd.records import FoldError
from cqsd.srds import effects


def test_own_effects_come_before_the_x_map_each_with_its_index():
    """e is part 0 and x[S] part 1; the index is the place in its list."""
    body = {"s": "S", "e": [["P", 1, 1, "Q", b"a", 7], ["L", 1, "C"]],
            "x": {"S": [["D", 1]], "T": [["D", 2]]}}
    rows = effects.rows_of(body, {"S"}, 100, "w", 3)
    assert [(r[0], r[1], r[5], r[6], r[7]) for r in rows] == [
        ("S", 1, 0, 0, "P"), ("S", 1, 0, 1, "L"), ("S", 1, 1, 0, "D")]
    assert all(r[2:5] == (100, "w", 3) for r in rows)


def test_each_kind_carries_what_the_fold_needs():
    """P and I carry payload and place; R place, home and count; L and C the client;
    B its page and bytes; M its data map, packed."""
    datamap = ["IMS1", 1, 7, [64, 1]]
    body = {"s": "S", "e": [["I", 5, 3, "Q", b"d", 9, 2, [1, "H"]], ["R", 5, 1, "Q", None, 0],
                            ["C", 5, "IMS1"], ["O", 5], ["B", 6, 64, b"x"], ["M", 6, datamap]]}
    i, r, c, o, b, m = (row[8:] for row in effects.rows_of(body, {"S"}, 0, "w", 1))
    untimed = (None, None, None)  # lease, deadline, not_before
    assert i == (3, "Q", b"d", 9, 2, "ready", None, 1, "H", None, None, *untimed, None)
    assert r == (1, "Q", None, None, 0, "ready", None, None, None, None, None, *untimed, None)
    assert c == (None, None, None, None, None, "cold", "IMS1", None, None, None, None, *untimed,
                 None)
    assert o == (None,) * 15
    assert b == (None, None, b"x", *(None,) * 6, 64, None, *untimed, None)
    assert m == (*(None,) * 10, msgpack.packb(datamap), *untimed, None)


def test_read_from_a_segment_p_and_i_carry_where_their_record_is_not_their_data():
    """With ``at``, a P or I row leaves its data to be read back; other rows keep theirs."""
    body = {"s": "S", "e": [["P", 5, 3, "Q", b"d", 9], ["I", 6, 3, "Q", b"e", 9, 0, None],
                            ["B", 7, 64, b"x"]]}
    p, i, b = effects.rows_of(body, {"S"}, 0, "w", 1, at=77)
    assert (p[effects.DATA_COLUMN], p[-1]) == (None, 77)
    assert (i[effects.DATA_COLUMN], i[-1]) == (None, 77)
    assert (b[effects.DATA_COLUMN], b[-1]) == (b"x", None)


def test_a_lease_and_a_delay_carry_their_times_and_nothing_else():
    """T carries its lease and deadline, N its not_before, in the three columns before ``at``."""
    body = {"s": "S", "e": [["T", 5, 30 * 10**9, 7 * 10**18], ["N", 6, 8 * 10**18],
                            ["D", 5]]}
    t, n, d = effects.rows_of(body, {"S"}, 0, "w", 1)
    assert (t[8:-4], t[-4:]) == ((None,) * 11, (30 * 10**9, 7 * 10**18, None, None))
    assert (n[8:-4], n[-4:]) == ((None,) * 11, (None, None, 8 * 10**18, None))
    assert d[-4:] == (None, None, None, None)
    assert effects.batch([t, n, d]).num_rows == 3


def test_records_of_other_structures_and_bodies_that_are_not_maps_give_nothing():
    """Only the structures being folded count; other record kinds are skipped."""
    assert effects.rows_of({"s": "T", "e": [["D", 1]]}, {"S"}, 0, "w", 1) == []
    assert effects.rows_of(["not", "a", "map"], {"S"}, 0, "w", 1) == []


@pytest.mark.parametrize("effect", [["Z", 1], ["P", 1, 1, "Q"], ["L"], "P", ["D", 1, 2],
                                    ["B", 1, 64], ["M", 1]])
def test_an_effect_that_is_not_one_is_a_fold_error_naming_the_record(effect):
    """Unknown kinds and wrong arities are refused, naming writer and LSN."""
    with pytest.raises(FoldError, match=r"structure S: effect .* \(writer w LSN 4\)"):
        effects.rows_of({"s": "S", "e": [effect]}, {"S"}, 0, "w", 4)


def test_a_value_of_the_wrong_type_is_a_fold_error():
    """A queue type that is not a number cannot become a row."""
    rows = effects.rows_of({"s": "S", "e": [["P", 1, "TRAN", "Q", b"", 0]]}, {"S"}, 0, "w", 4)
    with pytest.raises(FoldError, match="writer w from LSN 4 to 4 has a value of the wrong type"):
        effects.batch(rows)


def test_batches_split_long_logs():
    """Rows go out in batches of at most BATCH_ROWS."""
    records = [("w", i, i, {"s": "S", "e": [["D", i]]}) for i in range(1, effects.BATCH_ROWS + 2)]
    sizes = [b.num_rows for b in effects.batches(records, {"S"})]
    assert sizes == [effects.BATCH_ROWS, 1]


def test_batches_of_large_blocks_end_at_batch_bytes():
    """Offloaded blocks are MiBs each: a batch ends once its payloads reach BATCH_BYTES,
    whatever its row count, so an Arrow binary column never nears its 2 GiB limit."""
    block = bytes(effects.BATCH_BYTES // 3 + 1)
    records = [("w", i, i, {"s": "S", "e": [["B", i, 64, block]]}) for i in range(1, 8)]
    sizes = [b.num_rows for b in effects.batches(records, {"S"})]
    assert sizes == [3, 3, 1]
