"""Engine objects as they travel in replies (docs/protocol.md, "Messages")."""

from ..engine import Entry, QueueType

TYPE_NAMES = [None] + [t.name for t in QueueType]  # by number, without an enum lookup


def message(entry: Entry) -> dict:
    return {
        "entry_id": entry.entry_id,
        "queue": entry.name,
        "qtype": TYPE_NAMES[entry.qtype],
        "data": entry.data,
        "recoverable": entry.recoverable,
        "put_time": entry.put_time,
        "delivery_count": entry.delivery_count,
    }


def browsed(entry: Entry) -> dict:
    out = message(entry)
    out["where"] = entry.where
    out["owner"] = entry.owner
    if entry.home is not None:
        out["home"] = [TYPE_NAMES[entry.home[0]], entry.home[1]]
    return out


def lock(structure: str, entry: Entry) -> dict:
    return {"structure": structure, "entry_id": entry.entry_id, "queue": entry.name,
            "qtype": TYPE_NAMES[entry.qtype], "delivery_count": entry.delivery_count}
