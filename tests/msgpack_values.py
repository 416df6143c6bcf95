"""Hypothesis strategies for the values msgpack packs, shared by the tests of the
log record codec and of packing around large binaries."""

from hypothesis import strategies as st

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
keys = st.text() | st.binary() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
