"""The offload decision: MQ's three rules by structure usage, and entry_max always."""

import pytest

from cqsd.smds import DEFAULT_RULES, offloads

KiB = 1024
ENTRY_MAX = 32 * KiB


@pytest.mark.parametrize(("nbytes", "used", "expected"), [
    (ENTRY_MAX + 1, 0, True),  # over entry_max: always
    (ENTRY_MAX, 70, False),  # rule 1 wants usage above 70
    (ENTRY_MAX, 70.1, True),
    (ENTRY_MAX - 1, 75, False),  # below rule 1's size
    (4 * KiB, 80, False),
    (4 * KiB, 81, True),  # rule 2
    (4 * KiB - 1, 89, False),
    (0, 90, False),
    (0, 90.5, True),  # rule 3: everything
])
def test_the_default_rules_offload_more_as_the_structure_fills(nbytes, used, expected):
    """70%/32 KiB, 80%/4 KiB, 90%/0, each strictly above its threshold."""
    assert offloads(nbytes, used, ENTRY_MAX) is expected


def test_a_threshold_of_100_turns_its_rule_off():
    """Usage never exceeds 100%, so such a rule never applies; entry_max still does."""
    rules = ((100, 0), (100, 0), (100, 0))
    assert not offloads(ENTRY_MAX, 100, ENTRY_MAX, rules)
    assert offloads(ENTRY_MAX + 1, 0, ENTRY_MAX, rules)
    assert DEFAULT_RULES == ((70, 32 * KiB), (80, 4 * KiB), (90, 0))
