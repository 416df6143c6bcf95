"""The daemon tunes glibc's heap for large payloads, unless the operator has."""

from cqsd.server import heap


def test_the_thresholds_are_set_on_glibc(monkeypatch):
    """With no MALLOC_ variables in the environment, glibc's mallopt takes both thresholds."""
    for name in heap._OPERATOR_KNOBS:
        monkeypatch.delenv(name, raising=False)
    assert heap.tune()


def test_an_operators_malloc_variable_wins(monkeypatch):
    """A MALLOC_ threshold in the environment leaves glibc's heap as the operator set it."""
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert not heap.tune()
