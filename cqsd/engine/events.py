"""What the engine tells its caller besides the reply: the daemon turns these
into notifications (IMS "informs" interested subsystems) and log events."""

from typing import NamedTuple


class QueueWork(NamedTuple):
    """A queue went from empty to non-empty."""

    structure: str
    qtype: int
    name: str


class FullnessChanged(NamedTuple):
    """The structure became full (a put was refused for space) or stopped being full."""

    structure: str
    full: bool
    elements_used: int
    elements_total: int
