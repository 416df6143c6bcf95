"""The structure engine: pure, synchronous, no I/O (STYLE §1)."""

from .entry import ELEMENT, ENTRY_CONTROLS, Entry, elements
from .errors import CQSError, Reason
from .events import FullnessChanged, QueueWork
from .qtypes import QueueType, parse_qtype
from .structure import Delete, Move, Put, Structure, Unlock

__all__ = [
    "ELEMENT", "ENTRY_CONTROLS", "CQSError", "Delete", "Entry", "FullnessChanged", "Move",
    "Put", "QueueType", "QueueWork", "Reason", "Structure", "Unlock", "elements", "parse_qtype",
]
