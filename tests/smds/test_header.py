"""The header page and the block prefix: round trips, the two copies, and damage named
rather than misread (hand-damaged bytes, docs/smds.md)."""

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from cqsd.smds import (
    BadPrefix,
    ForeignHeader,
    Header,
    IncompleteRecovery,
    Prefix,
    Recreated,
    ShortDataSet,
    TornHeader,
    Unformatted,
    UnsupportedVersion,
    pack_header,
    read_header,
    unpack_header,
    validate,
)
from cqsd.smds.header import OPEN, PARTIAL_RECOVERY, check_block, pack_prefix, unpack_prefix
from cqsd.smds.pages import PAGE

KiB, MiB = 1024, 1024 * 1024
H = Header("MSGQ01", "IMS1", 256 * KiB, 64 * MiB, created=1_700_000_000_000_000_000)


def control(*headers):
    """The first two pages of a data set holding ``headers``, each in its own copy."""
    pages = [bytes(PAGE), bytes(PAGE)]
    for h in headers:
        pages[h.copy] = pack_header(h)
    return b"".join(pages)


def flip(data, offset, mask=0x01):
    return data[:offset] + bytes([data[offset] ^ mask]) + data[offset + 1:]


def test_the_header_is_laid_out_as_documented():
    """Magic, version, page size, dsblock, names and size at the offsets of the table."""
    page = pack_header(H)
    assert len(page) == PAGE
    assert page[:8] == b"CQSSMDS\n"
    assert struct.unpack_from("<HHII", page, 8) == (1, 0, PAGE, 256 * KiB)
    assert page[32:48] == b"MSGQ01" + bytes(10) and page[48:52] == b"IMS1"
    assert struct.unpack_from("<Q", page, 72) == (64 * MiB,)
    assert struct.unpack_from("<I", page, 4092) == (crc32c(page[:4092]),)


headers = st.builds(
    lambda structure, owner, geometry, created, sequence, flags, updated, map_page, map_pages,
    map_time: Header(structure, owner, geometry[0], geometry[1], created, sequence, flags,
                     updated, map_page, map_pages, map_time),
    st.text("ABCXYZ019@#$_", min_size=1, max_size=16),
    st.from_regex(r"[A-Za-z0-9@#$_.-]{1,16}", fullmatch=True),
    st.sampled_from([8 * KiB, 256 * KiB, MiB]).flatmap(
        lambda b: st.tuples(st.just(b), st.integers(2, 1 << 20).map(lambda n: n * b))),
    st.integers(0, 2**64 - 1), st.integers(1, 2**64 - 1), st.sampled_from([0, 1, 2, 3]),
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1),
)


@given(headers)
def test_any_header_round_trips(h):
    """pack_header then unpack_header gives the same header back."""
    assert unpack_header(pack_header(h)) == h


def test_an_update_goes_to_the_other_copy_and_wins():
    """Sequence 1 is on page 0; the next header on page 1; the higher sequence is in force."""
    closed = H.next(flags=0, map_page=16384, map_pages=2, map_time=5)
    assert (H.copy, closed.copy, closed.sequence) == (0, 1, 2)
    assert read_header(control(H, closed)) == closed
    assert read_header(control(closed.next(flags=OPEN), closed)).sequence == 3


def test_a_torn_update_leaves_the_previous_header_in_force():
    """A crash while writing one copy: the other, older copy is read, not a FAILED data set."""
    newer = H.next(flags=0)
    for damage in (lambda p: flip(p, PAGE + 100), lambda p: p[:PAGE] + bytes(PAGE),
                   lambda p: p[:PAGE] + pack_header(newer)[:2000] + bytes(PAGE - 2000)):
        assert read_header(damage(control(H, newer))) == H


def test_an_empty_or_zeroed_data_set_is_unformatted():
    """Nothing written yet: Unformatted, which a NEW data set formats and an ACTIVE one fails."""
    for data in (b"", bytes(100), bytes(2 * PAGE), bytes(2 * PAGE) + b"x"):
        with pytest.raises(Unformatted):
            read_header(data)


def test_a_short_data_set_is_named():
    """Fewer than two pages that are not all zeros: ShortDataSet."""
    for data in (pack_header(H), pack_header(H)[:100], control(H)[:2 * PAGE - 1]):
        with pytest.raises(ShortDataSet):
            read_header(data)


def test_a_header_with_a_bad_crc_is_torn():
    """Every byte of the page is covered by the CRC, padding included; beside a zero
    copy it is still a torn header, not an unformatted data set."""
    for offset in (8, 24, 40, 72, 200, 4000, 4093):
        with pytest.raises(TornHeader):
            read_header(flip(control(H), offset))
        with pytest.raises(TornHeader):
            read_header(flip(control(H.next()), PAGE + offset))


def test_residual_data_from_another_use_is_foreign():
    """A page that is not ours (seed 000: "residual data from another use")."""
    junk = b"some other file's bytes".ljust(2 * PAGE, b"\xff")
    with pytest.raises(ForeignHeader) as caught:
        read_header(junk)
    assert caught.value.reason == "magic"
    for beside in (flip(control(H), 100)[:PAGE], pack_header(H)):  # torn, or even valid
        with pytest.raises(ForeignHeader):
            read_header(beside + junk[:PAGE])


def test_two_valid_copies_of_different_data_sets_are_foreign():
    """Copies naming different owners cannot both be this data set's."""
    other = Header("MSGQ01", "IMS2", 256 * KiB, 64 * MiB, created=H.created, sequence=2)
    with pytest.raises(ForeignHeader, match="copies-disagree"):
        read_header(control(H, other))


def resealed(page, offset, fmt, value):
    """A header page with one field rewritten and its CRC made good again."""
    page = bytearray(page)
    struct.pack_into(fmt, page, offset, value)
    struct.pack_into("<I", page, 4092, crc32c(bytes(page[:4092])))
    return bytes(page)


def test_a_newer_format_is_not_guessed_at():
    """Another version, or a flag this code does not know: UnsupportedVersion, also
    beside an older valid copy, which might no longer say what the data set is."""
    for offset, fmt, value in ((8, "<H", 2), (20, "<I", 4)):
        newer = resealed(pack_header(H.next()), offset, fmt, value)
        with pytest.raises(UnsupportedVersion):
            unpack_header(newer)
        with pytest.raises(UnsupportedVersion):
            read_header(pack_header(H) + newer)


def test_fixed_fields_must_hold_their_values_even_under_a_good_crc():
    """Reserved bytes, the page size, the padding and the geometry are checked."""
    for offset, fmt, value in ((10, "<H", 1), (12, "<I", 8192), (100, "<I", 1),
                               (3000, "<B", 1), (16, "<I", 5000), (24, "<Q", 0)):
        with pytest.raises(TornHeader):
            unpack_header(resealed(pack_header(H), offset, fmt, value))


def test_a_header_is_validated_against_the_data_set_expected():
    """Wrong structure or owner, a re-created data set, a short file, partial recovery."""
    validate(H, structure="MSGQ01", owner="IMS1", created=H.created, file_size=H.size)
    cases = [
        (ForeignHeader, dict(structure="EMHQ01", owner="IMS1")),
        (ForeignHeader, dict(structure="MSGQ01", owner="IMS2")),
        (Recreated, dict(structure="MSGQ01", owner="IMS1", created=H.created + 1)),
        (ShortDataSet, dict(structure="MSGQ01", owner="IMS1", file_size=H.size - PAGE)),
    ]
    for error, expected in cases:
        with pytest.raises(error):
            validate(H, **expected)
    recovering = H.next(flags=OPEN | PARTIAL_RECOVERY)
    with pytest.raises(IncompleteRecovery):
        validate(recovering, structure="MSGQ01", owner="IMS1")
    validate(recovering, structure="MSGQ01", owner="IMS1", recovering=True)


def test_values_that_do_not_fit_are_refused_when_packing():
    """Long or empty names, unknown flags, a block that is not whole pages."""
    for bad in (Header("X" * 17, "IMS1", PAGE, 2 * PAGE, 0), Header("S", "", PAGE, 2 * PAGE, 0),
                Header("S", "IMS1", PAGE, 2 * PAGE, 0, flags=8),
                Header("S", "IMS1", 5000, 10000, 0)):
        with pytest.raises(ValueError):
            pack_header(bad)


# -- the block prefix -----------------------------------------------------------------

P = Prefix(entry_id=1_795_250_297_390_000_001, owner="IMS1", length=10, offset=0, nbytes=10,
           crc=crc32c(b"0123456789"))


def block(prefix=P, data=b"0123456789"):
    return pack_prefix(prefix) + data


@given(st.builds(Prefix, st.integers(0, 2**64 - 1),
                 st.from_regex(r"[A-Za-z0-9@#$_.-]{1,16}", fullmatch=True),
                 st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                 st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
def test_any_prefix_round_trips(p):
    """pack_prefix then unpack_prefix gives the same prefix back, in 64 bytes."""
    raw = pack_prefix(p)
    assert len(raw) == 64 and raw[:4] == b"\xc1SMB"
    assert unpack_prefix(raw) == p


def check(raw, **changes):
    expected = dict(entry_id=P.entry_id, owner="IMS1", length=10, offset=0, nbytes=10)
    data, crc = check_block(raw, **{**expected, **changes})
    assert crc == crc32c(data)
    return data


def test_a_block_that_matches_gives_its_data():
    """The payload after the prefix, as a view, once every field and the CRC match."""
    assert bytes(check(block())) == b"0123456789"


@pytest.mark.parametrize(("raw", "changes", "reason"), [
    (bytes(64 + 10), {}, "unwritten"),
    (block()[:63], {}, "short"),
    (block()[:70], {}, "short"),
    (flip(block(), 3), {}, "torn"),
    (flip(block(), 20), {}, "torn"),
    (flip(block(), 70), {}, "bad-crc"),
    (block(), dict(entry_id=P.entry_id + 1), "wrong-entry"),
    (block(), dict(owner="IMS2"), "wrong-owner"),
    (block(), dict(length=11), "wrong-length"),
    (block(), dict(offset=4032), "wrong-offset"),
    (block(), dict(nbytes=9), "wrong-length"),
])
def test_a_block_that_is_not_the_one_expected_is_named(raw, changes, reason):
    """Zeros, a cut, a torn prefix, another entry's or owner's block, and bad data each
    have their reason; no byte of it is returned."""
    with pytest.raises(BadPrefix) as caught:
        check(raw, **changes)
    assert caught.value.reason == reason


def test_a_prefix_of_another_version_is_not_guessed_at():
    """An unknown prefix version is UnsupportedVersion; nonzero reserved bytes are torn."""
    raw = bytearray(pack_prefix(P))
    struct.pack_into("<H", raw, 4, 2)
    struct.pack_into("<I", raw, 60, crc32c(bytes(raw[:60])))
    with pytest.raises(UnsupportedVersion):
        unpack_prefix(bytes(raw))
    struct.pack_into("<HH", raw, 4, 1, 7)
    struct.pack_into("<I", raw, 60, crc32c(bytes(raw[:60])))
    with pytest.raises(BadPrefix, match="torn"):
        unpack_prefix(bytes(raw))
