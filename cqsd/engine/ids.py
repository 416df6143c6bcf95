"""The entry-id clock: where new entry ids come from.

Entry ids are clock-based, strictly increasing and never reused (docs/architecture.md).
A primary structure and its overflow structure share one clock: a message keeps
its id when overflow processing moves it, and a queue whose messages are spread
over the two is read in id order, so the two must never hand out the same id or
go back on each other.
"""

import time
from collections.abc import Callable


class Ids:
    """The last id handed out and the clock new ids (and put times) come from."""

    __slots__ = ("clock", "last")

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self.last = 0
