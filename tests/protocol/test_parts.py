"""Packing around large binaries (``cqsproto.codec.pack_parts``): the bytes msgpack
makes, with each large binary left where it is, for a vectored write or one copy."""

from __future__ import annotations

import gc
import sys

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cqsproto import LARGE
from cqsproto.codec import pack_parts
from tests.msgpack_values import keys, scalars

MAX = 1 << 30
large_binaries = st.builds(
    lambda size, kind: kind(bytes(range(256)) * (size // 256) + b"x" * (size % 256)),
    st.integers(min_value=LARGE - 2, max_value=LARGE + 300),
    st.sampled_from([bytes, bytearray, memoryview]),
)
bodies_with_large = st.recursive(
    scalars | large_binaries,
    lambda inner: (st.lists(inner, max_size=5) | st.lists(inner, max_size=5).map(tuple)
                   | st.dictionaries(keys, inner, max_size=5)),
    max_leaves=12,
)


@given(bodies_with_large)
def test_packing_around_large_binaries_gives_the_bytes_of_packb(body: object) -> None:
    """Joined, the parts are exactly what msgpack packs of the body."""
    assert b"".join(pack_parts(body, MAX)) == msgpack.packb(body, use_bin_type=True)


def test_large_binaries_are_left_where_they_are() -> None:
    """Each binary of LARGE bytes or more is a part of its own, a view of the caller's bytes."""
    block = bytearray(b"b" * LARGE)
    parts = pack_parts({"e": [["B", 1, 2, block], ["B", 1, 3, memoryview(block)], "P"]}, MAX)
    views = [p for p in parts if isinstance(p, memoryview)]
    assert len(views) == 2 and all(v.obj is block for v in views)
    assert len(parts) == 5


def test_packed_parts_let_go_of_the_payload_as_soon_as_they_go() -> None:
    """No reference cycle keeps the parts, or the payload they view, for the collector."""
    payload = bytearray(LARGE)
    held = sys.getrefcount(payload)
    gc.disable()
    try:
        parts = pack_parts({"e": [["B", 1, 2, payload]]}, MAX)
        assert sys.getrefcount(payload) > held
        del parts
        assert sys.getrefcount(payload) == held
    finally:
        gc.enable()


def test_packing_in_parts_refuses_too_much_and_what_msgpack_refuses() -> None:
    """Past its limit, an int beyond 64 bits (ValueError), an object msgpack cannot
    pack (TypeError)."""
    with pytest.raises(ValueError):
        pack_parts([b"x" * LARGE] * 3, 3 * LARGE)
    with pytest.raises(ValueError):
        pack_parts({"n": 2**64}, MAX)
    with pytest.raises(TypeError):
        pack_parts([object()], MAX)


@pytest.mark.parametrize("depth", [1000, 1024, 1025, 100_000])
def test_packing_in_parts_nests_as_deep_as_msgpack_and_no_deeper(depth: int) -> None:
    """Nests packb packs come out the same; deeper ones are packb's ValueError, never a
    RecursionError or, compiled, a crash of the C stack."""
    body: object = b"x" * LARGE
    for _ in range(depth):
        body = [body]
    try:
        packed = msgpack.packb(body, use_bin_type=True)
    except ValueError:
        with pytest.raises(ValueError, match="recursion limit exceeded"):
            pack_parts(body, MAX)
    else:
        assert b"".join(pack_parts(body, MAX)) == packed
