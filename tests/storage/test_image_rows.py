"""Images written from streamed rows (the recovery job's output) read back like any other."""

import pytest

from cqsd.storage import image

DATAMAP = ["IMS1", 70_000, 12345, [64, 16, 128, 2]]


def rows():
    return [[1, 1, "Q", b"a", True, 5, 0, "ready", None, None, None, None, 9 * 10**18],
            [2, 3, "S", b"b" * 70_000, True, 6, 2, "locked", "IMS1", [1, "Q"], DATAMAP,
             [30 * 10**9, 7 * 10**18], None]]


def test_streamed_rows_read_back_with_their_header(tmp_path):
    """write_rows + read_rows round-trip: rows (data maps included), log position and
    last id."""
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


@pytest.mark.parametrize(("version", "fields"), [(3, 11), (2, 10)])
def test_an_image_of_an_earlier_version_loads_with_nil_for_what_it_lacks(
        tmp_path, monkeypatch, version, fields):
    """A version-3 image (eleven fields a row, before leases and delayed puts) and a
    version-2 one (ten, before SMDS) still load, their rows given nil for the fields
    they lack; an image of another version is refused by name."""
    path = tmp_path / "S.img"
    monkeypatch.setattr(image, "VERSION", version)
    image.write_rows(path, "S", iter(r[:fields] for r in rows()), 2, {}, 0)
    monkeypatch.undo()
    assert image.read_rows(path, "S")[1] == {
        r[0]: [*r[:fields], *[None] * (13 - fields)] for r in rows()}
    monkeypatch.setattr(image, "VERSION", 1)
    image.write_rows(path, "S", iter(rows()), 2, {}, 0)
    monkeypatch.undo()
    with pytest.raises(image.ImageError, match="S.img: image version 1 is not 4"):
        image.read_rows(path, "S")


@pytest.mark.parametrize(("damage", "error"), [
    ("flip", "rows fail their CRC32C check"),
    ("short rows", "a message row is malformed"),
])
def test_a_damaged_image_is_an_image_error_naming_the_file(tmp_path, damage, error):
    """Damage found in the rows is reported as ImageError, never as the memory map's
    BufferError (the rows' view is released before the map closes)."""
    path = tmp_path / "S.img"
    written = rows() if damage == "flip" else [r[:-1] for r in rows()]
    image.write_rows(path, "S", iter(written), 2, {}, 0)
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[-image.FOOTER.size - 10] ^= 1
        path.write_bytes(bytes(raw))
    with pytest.raises(image.ImageError, match=f"S.img: {error}"):
        image.read_rows(path, "S")
