"""The engine's events that operators care about, as structured log events
(docs/architecture.md, "The rules": every state change an operator acts on is
one event)."""

import structlog

from ..engine import (
    Altered,
    ExitFailed,
    FullnessChanged,
    OverflowMode,
    OverflowStatus,
    QueueType,
)
from ..engine.events import Event

log = structlog.get_logger()


def log_event(event: Event) -> None:
    # isinstance, not `type(event) is`, so that mypy narrows the union; the
    # events are NamedTuples nothing subclasses, so the two tests agree.
    if isinstance(event, FullnessChanged):
        log.warning("structure_full" if event.full else "structure_not_full",
                    structure=event.structure, elements_used=event.elements_used,
                    elements_total=event.elements_total)
    elif isinstance(event, Altered):
        log.info("structure_altered", structure=event.structure, old_size=event.old_size,
                 new_size=event.new_size, reason=event.reason)
    elif isinstance(event, OverflowStatus):
        log.info("overflow_status", structure=event.structure, qtype=QueueType(event.qtype).name,
                 queue=event.name, on=event.on)
    elif isinstance(event, OverflowMode):
        log.warning("overflow_mode", structure=event.structure, on=event.on)
    elif isinstance(event, ExitFailed):
        log.error("exit_failed", structure=event.structure, exit=event.exit, error=event.error)
