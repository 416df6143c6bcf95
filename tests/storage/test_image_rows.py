"""Images written from streamed rows (the recovery job's output) read back like any other."""

import pytest

from cqsd.storage import image


def rows():
    return [[1, 1, "Q", b"a", True, 5, 0, "ready", None, None],
            [2, 3, "S", b"b" * 70_000, True, 6, 2, "locked", "IMS1", [1, "Q"]]]


def test_streamed_rows_read_back_with_their_header(tmp_path):
    """write_rows + read_rows round-trip: rows, log position and last id."""
    path = tmp_path / "S.recovered"
    assert image.write_rows(path, "S", iter(rows()), 2, {"cqsd": 9, "b": 2}, 40) == 2
    header, read = image.read_rows(path, "S")
    assert read == {r[0]: r for r in rows()}
    assert (header["lsn"], header["last_id"], header["count"]) == ({"cqsd": 9, "b": 2}, 40, 2)
    assert image.read_header(path, "S")["last_id"] == 40


def test_a_count_that_does_not_match_the_rows_leaves_no_file(tmp_path):
    """The count is written first; a stream that disagrees is an error, not an image."""
    path = tmp_path / "S.recovered"
    with pytest.raises(image.ImageError, match="1 rows were streamed for an image of 2"):
        image.write_rows(path, "S", iter(rows()[:1]), 2, {}, 0)
    assert list(tmp_path.iterdir()) == []
