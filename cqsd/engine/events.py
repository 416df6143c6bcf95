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


class Altered(NamedTuple):
    """The structure's current size changed: by the operator, or grown by overflow
    processing before it resorts to selecting queues (seed 004, "Structure Alter")."""

    structure: str
    old_size: int
    new_size: int
    reason: str


class OverflowStatus(NamedTuple):
    """A queue name entered overflow status (selected as one of the structure's
    biggest users) or left it (no ready messages left in either structure)."""

    structure: str
    qtype: int
    name: str
    on: bool


class OverflowMode(NamedTuple):
    """The structure entered overflow mode (its first queue entered overflow status)
    or left it (its last queue left)."""

    structure: str
    on: bool


class ExitFailed(NamedTuple):
    """A user exit raised: the engine went on as if the exit were not there, and the
    daemon should tell the operator. ``exit`` names which one ("queue_space")."""

    structure: str
    exit: str
    error: str


Event = QueueWork | FullnessChanged | Altered | OverflowStatus | OverflowMode | ExitFailed
