"""How an error message shows a value the peer sent: briefly, whatever its size or depth.

The values in a request are the peer's. ``repr`` of a 30 MiB bin is a 120 MB string,
more than the error reply that carries it may hold, so encoding that reply raised;
``repr`` of arrays nested a thousand deep (a 1 KB frame) exceeds the interpreter's
recursion limit and raised RecursionError. Either way a bad request was answered
with an exception the daemon did not expect, and it stopped. reprlib cuts strings
and containers *before* formatting them and stops at a small depth, so a quote
costs the same for any value.
"""

from __future__ import annotations

import reprlib
from itertools import islice
from typing import Final

# Enough to recognise a value, short enough that a message quoting a few of them
# stays one readable line.
QUOTE_LIMIT: Final = 40


class _Brief(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxlong = self.maxother = QUOTE_LIMIT

    # reprlib has no case for bytes, so it would format all of them and then cut;
    # its str case slices first and works for bytes unchanged.
    repr_bytes = reprlib.Repr.repr_str

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        # reprlib sorts every key to show the first few; taking them in order
        # (one more than it shows, so it still marks the cut) costs the same for
        # a map of any size.
        return super().repr_dict(dict(islice(x.items(), self.maxdict + 1)), level)


_BRIEF: Final = _Brief()


def quote(value: object) -> str:
    """``repr(value)`` cut to at most QUOTE_LIMIT characters, computed in bounded time."""
    text = _BRIEF.repr(value)
    if len(text) > QUOTE_LIMIT:
        text = text[: QUOTE_LIMIT - 3] + "..."
    return text
