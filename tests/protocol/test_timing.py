"""Leases and delays on the wire: the values they may take, and the words for the rest."""

import math

import pytest

from cqsproto import INVALID_REQUEST, ProtocolError
from cqsproto.requests import commit_ops, parse
from cqsproto.timing import MAX_DELAY, MAX_LEASE, lease_seconds, not_before_ns

NOW = 1_700_000_000 * 10**9


def refused(call, *args) -> str:
    with pytest.raises(ProtocolError) as info:
        call(*args)
    assert info.value.reason == INVALID_REQUEST
    return info.value.message


def test_a_lease_is_seconds_above_zero_up_to_twelve_hours() -> None:
    """An int or a float lease is seconds; 12 hours is the most."""
    assert lease_seconds("read", 30) == 30.0 and lease_seconds("read", MAX_LEASE) == MAX_LEASE


@pytest.mark.parametrize("lease", [0, -1, math.nan, math.inf, -math.inf, MAX_LEASE + 1, 1e300])
def test_a_lease_that_means_nothing_is_refused_by_name(lease: float) -> None:
    """Zero, negative, NaN, infinite and absurd leases are INVALID_REQUEST naming the op."""
    assert refused(lease_seconds, "renew", lease).startswith("renew: lease must be")


def test_a_delay_or_a_not_before_is_a_wall_clock_time_in_ns() -> None:
    """A delay counts from now; a not_before is epoch seconds; none, 0 or the past is no
    delay at all."""
    assert not_before_ns("put", 2.5, None, NOW) == NOW + 2_500_000_000
    assert not_before_ns("put", None, NOW / 1e9 + 10, NOW) == NOW + 10 * 10**9
    assert not_before_ns("put", None, None, NOW) is None
    assert not_before_ns("put", 0, None, NOW) is None
    assert not_before_ns("put", None, 5.0, NOW) is None


@pytest.mark.parametrize(("delay", "not_before", "words"), [
    (1, 2, "give delay or not_before, not both"),
    (-1, None, "delay must be a finite number"),
    (math.nan, None, "delay must be a finite number"),
    (None, math.inf, "not_before must be a finite number"),
    (None, -5, "not_before must be a finite number"),
    (MAX_DELAY + 1, None, "is more than"),
    (None, 1e300, "is more than"),
    (None, 2**70, "is more than"),
])
def test_a_delay_that_means_nothing_is_refused_by_name(delay, not_before, words) -> None:
    """Both at once, negative, NaN, infinite and absurdly far times are INVALID_REQUEST."""
    assert words in refused(not_before_ns, "put", delay, not_before, NOW)


def test_the_request_table_takes_numbers_only_and_renew_needs_its_lease() -> None:
    """A bool or a string lease or delay is a type error; renew without a lease is one
    too; a commit put with a delay leaves the fast path and keeps it."""
    base = {"id": 1, "op": "read", "structure": "S", "queue": "Q"}
    assert parse({**base, "lease": 2.5})[2]["lease"] == 2.5
    assert "field 'lease' must be" in refused(parse, {**base, "lease": True})
    assert "field 'delay' must be" in refused(parse, {"id": 1, "op": "put", "structure": "S",
                                                      "queue": "Q", "data": b"", "delay": "1"})
    assert "field 'lease' is required" in refused(parse, {"id": 1, "op": "renew",
                                                          "structure": "S", "entry_id": 3})
    ((_, fields),) = commit_ops([{"op": "put", "queue": "Q", "data": b"x", "delay": 3}])
    assert fields["delay"] == 3


@pytest.mark.parametrize("huge", [2**1100, -(2**1100)])
def test_an_integer_too_large_for_a_float_is_refused_not_raised(huge: int) -> None:
    """msgpack carries at most 64-bit integers, but a client of this module may pass
    any int: one past a float's range is refused like infinity, never OverflowError."""
    refused(lease_seconds, "read", huge)
    refused(not_before_ns, "put", huge, None, NOW)
    refused(not_before_ns, "put", None, huge, NOW)
