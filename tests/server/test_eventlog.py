"""The engine's events that operators act on (eventlog.py) each become one named
log event, at the level the operator's attention needs, carrying the event's
fields; a queue's new work is a notification, not a log event."""

import pytest
from structlog.testing import capture_logs

from cqsd.engine import Altered, ExitFailed, FullnessChanged, OverflowMode, OverflowStatus
from cqsd.engine.events import QueueWork
from cqsd.server.eventlog import log_event


def logged(event):
    """What log_event made of ``event``: every captured log entry."""
    with capture_logs() as logs:
        log_event(event)
    return logs


@pytest.mark.parametrize(("event", "expected"), [
    (FullnessChanged("MSGQ01", True, 990, 1000),
     {"event": "structure_full", "log_level": "warning", "structure": "MSGQ01",
      "elements_used": 990, "elements_total": 1000}),
    (FullnessChanged("MSGQ01", False, 10, 1000),
     {"event": "structure_not_full", "log_level": "warning", "structure": "MSGQ01",
      "elements_used": 10, "elements_total": 1000}),
    (Altered("MSGQ01", 1 << 20, 2 << 20, "overflow"),
     {"event": "structure_altered", "log_level": "info", "structure": "MSGQ01",
      "old_size": 1 << 20, "new_size": 2 << 20, "reason": "overflow"}),
    (OverflowStatus("MSGQ01", 5, "LTERM1", True),
     {"event": "overflow_status", "log_level": "info", "structure": "MSGQ01",
      "qtype": "LTERM", "queue": "LTERM1", "on": True}),
    (OverflowMode("MSGQ01", False),
     {"event": "overflow_mode", "log_level": "warning", "structure": "MSGQ01", "on": False}),
    (ExitFailed("MSGQ01", "queue_space", "ValueError: planted"),
     {"event": "exit_failed", "log_level": "error", "structure": "MSGQ01",
      "exit": "queue_space", "error": "ValueError: planted"}),
], ids=["full", "not full", "altered", "overflow status", "overflow mode", "exit failed"])
def test_each_event_is_one_named_log_event_with_its_fields(event, expected):
    """An engine event is logged once, under its own name and level, with every field
    the event carries (a queue type by its name, not its number)."""
    assert logged(event) == [expected]


def test_new_work_on_a_queue_is_not_logged():
    """QueueWork goes to interested sessions as a notification; the log stays quiet."""
    assert logged(QueueWork("MSGQ01", 1, "Q")) == []
