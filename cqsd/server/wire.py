"""Engine objects as they travel in replies (docs/protocol.md, "Messages")."""

from cqsproto import LARGE

from ..engine import Entry, QueueType

TYPE_NAMES = [None] + [t.name for t in QueueType]  # by number, without an enum lookup


def message(entry: Entry, data: bytes | memoryview) -> dict:
    """``data``: the payload, which an offloaded entry does not hold itself."""
    return {
        "entry_id": entry.entry_id,
        "queue": entry.name,
        "qtype": TYPE_NAMES[entry.qtype],
        "data": data,
        "recoverable": entry.recoverable,
        "put_time": entry.put_time,
        "delivery_count": entry.delivery_count,
    }


def browsed(entry: Entry, data: bytes | memoryview) -> dict:
    out = message(entry, data)
    out["where"] = entry.where
    out["owner"] = entry.owner
    if entry.home is not None:
        out["home"] = [TYPE_NAMES[entry.home[0]], entry.home[1]]
    return out


def lock(structure: str, entry: Entry) -> dict:
    return {"structure": structure, "entry_id": entry.entry_id, "queue": entry.name,
            "qtype": TYPE_NAMES[entry.qtype], "delivery_count": entry.delivery_count}


def interest(structure: str, qtype: int, queue: str) -> dict:
    return {"structure": structure, "qtype": TYPE_NAMES[qtype], "queue": queue}


class Large(dict):
    """A result carrying a payload of LARGE bytes or more: its reply is encoded
    around it (``encode_frame(..., large=True)``)."""


def messages(items: list[dict], **more) -> dict:
    """The result ``{"messages": items, **more}``, a Large one if a payload is large."""
    result = {"messages": items, **more}
    for item in items:
        if len(item["data"]) >= LARGE:
            return Large(result)
    return result
