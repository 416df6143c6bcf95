"""Writer ids, segment file names and the segment header."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstream import CorruptLog, Damage, Writer, read, segment
from logstream.segment import HEADER_SIZE, decode_header, encode_header

from .ondisk import segments, write_series


@pytest.mark.parametrize("writer", ["a", "CQS1", "job_7.run-2", "x" * 32, "...", "0"])
def test_good_writer_ids_are_accepted(writer: str) -> None:
    """Ids of 1..32 characters from [A-Za-z0-9_.-] are valid."""
    assert segment.check_writer_id(writer) == writer


@pytest.mark.parametrize("writer", ["", "x" * 33, "a b", "a/b", "é", "a\0", "tab\t", 7])
def test_bad_writer_ids_are_refused(writer: object) -> None:
    """Anything else raises ValueError, before a file is touched."""
    with pytest.raises(ValueError):
        segment.check_writer_id(writer)  # type: ignore[arg-type]


@pytest.mark.parametrize("writer", ["a", "a.b", "run.00000000000000000001", "9"])
def test_segment_names_parse_back_even_with_dots_and_digits(writer: str) -> None:
    """A name is parsed from the right, so any valid id round-trips."""
    name = segment.segment_name(writer, 42)
    assert name == f"{writer}.00000000000000000042.seg"
    assert segment.parse_segment_name(name) == (writer, 42)


@pytest.mark.parametrize(
    "name",
    ["a.lock", "a.00000000000000000001.seg.tmp", "a.00000000000000000001.seg.broken-64",
     "a.1.seg", "a.000000000000000000001.seg".replace("a.", "a b."), "notes.txt"],
)
def test_other_files_are_not_segments(name: str) -> None:
    """Locks, temp files, broken copies and strangers are ignored."""
    assert segment.parse_segment_name(name) is None


def test_the_header_round_trips_in_64_bytes() -> None:
    """A header encodes to 64 bytes and decodes back to its writer and first LSN."""
    data = encode_header("alpha", 12345)
    assert len(data) == HEADER_SIZE == 64
    assert data[:8] == b"LOGSTRM\n"
    assert data[16:24] == (12345).to_bytes(8, "little")
    assert data[24:29] == b"alpha" and data[29:56] == b"\0" * 27
    assert decode_header(data) == ("alpha", 12345)


def test_every_header_bit_flip_is_refused() -> None:
    """No single bit flip in a header decodes as a header."""
    data = encode_header("alpha", 7)
    for bit in range(HEADER_SIZE * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(decode_header(bytes(flipped)), Damage), bit


def test_another_version_is_named_as_such() -> None:
    """A header from another format version says so rather than 'bad CRC'."""
    data = bytearray(encode_header("alpha", 7))
    data[8] = 2
    assert decode_header(bytes(data)) is Damage.VERSION


def test_a_renamed_segment_is_refused_by_name(tmp_path: Path) -> None:
    """A segment renamed to another writer is a foreign file: CorruptLog names it."""
    write_series(tmp_path, "alpha", 3)
    [path] = segments(tmp_path, "alpha")
    stolen = path.rename(tmp_path / segment.segment_name("beta", 1))
    with pytest.raises(CorruptLog) as caught:
        Writer.open(tmp_path, "beta")
    assert caught.value.path == str(stolen) and caught.value.reason is Damage.FOREIGN
    with pytest.raises(CorruptLog, match="foreign"):
        list(read(tmp_path))


def test_a_file_that_is_not_a_segment_is_refused_by_name(tmp_path: Path) -> None:
    """A stranger file named like a segment raises CorruptLog naming it."""
    stranger = tmp_path / segment.segment_name("alpha", 1)
    stranger.write_bytes(b"hello, I am a text file\n" * 10)
    with pytest.raises(CorruptLog) as caught:
        Writer.open(tmp_path, "alpha")
    assert caught.value.path == str(stranger) and caught.value.reason is Damage.BAD_HEADER
