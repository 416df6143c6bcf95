"""The structure engine: pure, synchronous, no I/O (docs/architecture.md)."""

from .entry import ELEMENT, ENTRY_CONTROLS, Entry, elements
from .errors import CQSError, Reason
from .events import Altered, ExitFailed, FullnessChanged, OverflowMode, OverflowStatus, QueueWork
from .overflow import Relief
from .pair import StructurePair
from .qtypes import QueueKey, QueueType, parse_qtype
from .structure import Delete, Move, Put, Structure, Unlock

__all__ = [
    "ELEMENT", "ENTRY_CONTROLS", "Altered", "CQSError", "Delete", "Entry", "ExitFailed",
    "FullnessChanged", "Move", "OverflowMode", "OverflowStatus", "Put", "QueueKey", "QueueType",
    "QueueWork", "Reason", "Relief", "Structure", "StructurePair", "Unlock", "elements",
    "parse_qtype",
]
