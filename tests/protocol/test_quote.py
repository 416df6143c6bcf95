"""Tests for cqsproto.quote: how error messages show a peer's values."""

from __future__ import annotations

import pytest

from cqsproto.quote import QUOTE_LIMIT, quote

MiB = 1024 * 1024


def nested(depth: int) -> object:
    """A list nested *depth* deep, as msgpack decodes arrays nested in arrays."""
    value: object = None
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value", [3, -(2**63), 2**64 - 1, 1.5, None, True, "frobnicate", b"k", [1, "a"], {"a": b"x"}]
)
def test_a_short_value_is_quoted_as_its_repr(value: object) -> None:
    """Ids, op names and field names of ordinary size read exactly as repr shows them."""
    assert quote(value) == repr(value)


@pytest.mark.parametrize(
    "value",
    [b"\x00" * 30 * MiB, "\x00" * 30 * MiB, list(range(MiB)), {i: i for i in range(MiB)}],
    ids=["bin", "str", "array", "map"],
)
def test_a_large_value_is_quoted_in_a_few_characters(value: object) -> None:
    """A value of megabytes is cut to QUOTE_LIMIT characters, marked with an ellipsis."""
    text = quote(value)
    assert len(text) <= QUOTE_LIMIT
    assert "..." in text


def test_a_deep_value_is_quoted_without_recursing_to_its_bottom() -> None:
    """Arrays nested past the recursion limit are quoted, not a RecursionError."""
    assert quote(nested(5000)) == "[[[[...]]]]"
