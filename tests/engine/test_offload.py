"""Offloaded messages in the engine (docs/smds.md): a data map instead of a payload,
one element whatever the size, the log's B/P/M effects, the clean-up queue (LH 4),
and overflow processing leaving them where they are."""

import itertools

from cqsd.engine import Put, Structure, StructurePair
from cqsd.engine.qtypes import DELETE_LH
from cqsd.records import BLOCK, MAPPED, PUT, rows_of
from cqsd.smds import DataMap, SpaceMap
from cqsd.smds.offload import DEFAULT_RULES

MiB = 1024 * 1024


def make(name="MSGQ01", size=1 << 20, rules=DEFAULT_RULES, **kw):
    ticks = itertools.count(1000)
    return Structure(name, size, clock=lambda: next(ticks), offload_rules=rules, **kw)


def mapped(payload, owner="IMS1", queue="Q"):
    space = SpaceMap(256 * 1024, 64 * MiB)
    return DataMap.of(owner, payload, space.allocate(queue, len(payload)))


def test_an_offloaded_message_costs_one_element_and_keeps_no_payload():
    """A 3 MiB put to a 1 MiB structure fits: the entry holds its map, not the bytes."""
    s = make()
    payload = bytes(range(256)) * (3 * MiB // 256)
    e = s.put("TRAN", "Q", payload, dmap=mapped(payload))
    assert (e.data, e.length, e.elements, e.store) == (b"", 3 * MiB, 1, "MSGQ01")
    assert s.stats()["elements_used"] == 1
    assert s.read("IMS2", "TRAN", "Q").map == e.map


def test_a_recoverable_offloaded_put_logs_its_blocks_then_the_entry_and_its_map():
    """Seed 000's recovery logging: each block, then P with no data, then M."""
    s = make()
    payload = b"x" * (600 * 1024)
    dmap = mapped(payload)
    e = s.put("TRAN", "Q", payload, dmap=dmap)
    kinds = [effect[0] for effect in s.effects]
    assert kinds == [BLOCK] * len(dmap.ranges) + [PUT, MAPPED]
    blocks = s.effects[:-2]
    assert b"".join(bytes(b[3]) for b in blocks) == payload
    assert [b[2] for b in blocks] == [r.page for r in dmap.ranges]
    assert s.effects[-2][4] == b"" and s.effects[-1] == (MAPPED, e.entry_id, dmap.encode())


def test_rows_carry_the_map_and_load_back_as_offloaded():
    """An image row of an offloaded message holds its map; loading it gives the same
    entry, and a materialised payload in the row is dropped."""
    s = make()
    payload = b"y" * 100_000
    e = s.put("TRAN", "Q", payload, dmap=mapped(payload))
    rows = rows_of(s)
    assert rows[e.entry_id][10] == e.map.encode()
    rows[e.entry_id][3] = payload  # as the Spark jobs write it
    t = make()
    t.load(rows.values())
    back = t.entry(e.entry_id)
    assert (back.map, back.data, back.elements) == (e.map, b"", 1)


def test_a_deleted_offloaded_message_waits_on_the_clean_up_queue_until_durable():
    """Its element stays charged on LH 4 until the daemon says the delete is durable."""
    s = make()
    payload = b"z" * 50_000
    e = s.put("TRAN", "Q", payload, dmap=mapped(payload))
    s.read("IMS1", "TRAN", "Q")
    s.delete("IMS1", e.entry_id)
    assert s.stats()["messages"] == 0 and s.stats()["elements_used"] == 1
    assert s.stamp_deleted(lsn=17) == [e]
    assert {"lh": DELETE_LH, "entries": 1, "elements": 1} in s.header_stats()
    assert s.clean_up(durable=16) == 0 and s.elements_used == 1
    assert s.clean_up(durable=17) == 1 and s.elements_used == 0
    assert not any(row["lh"] == DELETE_LH for row in s.header_stats())


def test_a_non_recoverable_offloaded_message_is_cleaned_up_at_once():
    """Its delete is never logged, so nothing waits for it."""
    s = make()
    payload = b"n" * 50_000
    e = s.put("TRAN", "Q", payload, recoverable=False, dmap=mapped(payload))
    assert s.effects == []
    s.delete(None, e.entry_id, operator=True)
    assert s.stamp_deleted(lsn=0) == [e] and s.elements_used == 0


def test_offload_rules_apply_as_the_structure_fills():
    """Over entry_max always; smaller payloads by offldNthr/offldNsze once use is above."""
    s = make(size=100 * 512, rules=((50, 1024), (100, 0), (100, 0)))
    assert s.offloads(40 * 1024) and not s.offloads(2000)
    for _ in range(51):
        s.put("TRAN", "F", b"f")
    assert s.offloads(2000) and not s.offloads(1000)
    assert not make(rules=None).offloads(10 * MiB)


def test_commit_puts_may_be_offloaded():
    """A unit of work's puts carry their maps like single puts."""
    s = make()
    payload = b"c" * 70_000
    dmap = mapped(payload)
    (e,) = s.commit("IMS1", [Put("TRAN", "Q", payload, True, dmap)])
    assert (e.map, e.elements) == (dmap, 1)


def test_overflow_moves_only_messages_kept_in_memory():
    """An offloaded message costs one element; overflow processing moves the others
    and leaves it in the primary, where its data set is."""
    primary = make("P", size=64 * 512)
    overflow = make("POV", size=64 * 512, rules=None)
    pair = StructurePair(primary, overflow, threshold=50)
    payload = b"o" * 40_000
    big = pair.put("TRAN", "HOT", payload, dmap=mapped(payload))
    small = [pair.put("TRAN", "HOT", b"s" * 900).entry_id for _ in range(20)]
    assert pair.pressure
    pair.relieve()
    assert pair.move_some() == 20
    assert primary.holds(big.entry_id) and all(overflow.holds(i) for i in small)
    got = [pair.read("IMS1", "TRAN", "HOT").entry_id for _ in range(21)]
    assert got == [big.entry_id, *small]


def test_a_forgotten_offloaded_message_leaves_nothing_to_clean_up():
    """A warm standby forgets the entries a record touched (docs/group.md): an
    offloaded one goes without a trace, not to the clean-up queue, so a space map
    rebuilt from the structure at takeover never counts its pages twice."""
    s = make()
    payload = b"z" * 50_000
    e = s.put("TRAN", "Q", payload, dmap=mapped(payload))
    s.forget(e.entry_id)
    assert list(s.offloaded()) == [] and s.elements_used == 0
    assert s.stamp_deleted(lsn=17) == []
