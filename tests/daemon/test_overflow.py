"""Overflow processing, structure full, alter, rebuild and delete through a real
daemon (seed 004, "Structure Overflow" to "Structure Delete")."""

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .test_crash import check, start_workers, survivors

# 400-byte messages use one 512-byte data element each.
PAIR = """
[[structure]]
name = "PRIM"
size = "256KiB"
initsize = "128KiB"
entry_max = "4KiB"
overflow = "PRIMOV"

[[structure]]
name = "PRIMOV"
size = "{ov}"
entry_max = "4KiB"

[[structure]]
name = "ALONE"
size = "64KiB"
overflow_threshold = 50

[[structure]]
name = "MSGQ01"
size = "64MiB"
"""
BODY = b"x" * 390
KiB = 1024


def flood(s, queue, n, start=0):
    return [s.put(queue, b"%06d" % i + BODY) for i in range(start, start + n)]


def test_flooding_one_queue_grows_then_moves_it_to_overflow(make_daemon):
    """Grow (alter) first, then select the biggest queue at full size, move its messages
    to the overflow structure, keep FIFO across both, and leave overflow when empty."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("PRIM")
        others = {f"Q{i}": flood(s, f"Q{i}", 5) for i in range(5)}
        put = flood(s, "FLOOD", 400)
        d.wait_for("overflow_moved")
        grew = d.events("structure_altered")
        assert [e["reason"] for e in grew] == ["overflow threshold"] * len(grew) and grew
        assert grew[-1]["new_size"] == 256 * 1024  # grown to its maximum first
        selected = d.events("overflow_selected")[0]
        assert [q["queue"] for q in selected["queues"]] == ["FLOOD"]
        assert d.events("overflow_mode")[0]["on"] is True
        put += flood(s, "FLOOD", 50, start=400)  # now straight to the overflow structure
        rows = {r["name"]: r for r in c.query("structures")}
        assert rows["PRIMOV"]["messages"] >= 50 and rows["PRIM"]["overflow_mode"] is True
        queues = {q["queue"]: q for q in c.query("queues", "PRIM")}
        assert queues["FLOOD"]["overflow"] is True and queues["FLOOD"]["depth"] == 450
        assert queues["Q0"]["overflow"] is False
        got = s.read_batch("FLOOD", 450)
        assert [m.entry_id for m in got] == put  # FIFO across primary and overflow
        for m in got:
            s.delete(m.entry_id)
        d.wait_for("overflow_mode", count=2)
        assert d.events("overflow_mode")[-1]["on"] is False
        assert [m.entry_id for m in s.browse("Q3")] == others["Q3"]


def test_without_an_overflow_structure_selected_queues_are_refused(make_daemon):
    """No overflow structure: the chosen queue stays, its puts get OVERFLOW_REJECTED,
    the others' puts go on."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("ALONE")
        flood(s, "SMALLQ", 3)
        with pytest.raises(CQSError) as refused:
            flood(s, "FLOOD", 200)
        assert refused.value.reason == "OVERFLOW_REJECTED"
        assert [q["queue"] for q in d.wait_for("overflow_selected")[0]["queues"]] == ["FLOOD"]
        assert s.put("SMALLQ", b"still fine")
        assert not d.events("overflow_moved")


def test_a_full_overflow_structure_refuses_only_overflow_queues(make_daemon):
    """The overflow structure fills: puts to overflow names are refused, the primary
    takes the rest until it is full itself (STRUCTURE_FULL), and reads go on."""
    d = make_daemon(structures=PAIR.format(ov="16KiB")).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("PRIM")
        with pytest.raises(CQSError) as refused:
            flood(s, "FLOOD", 2000)
        assert refused.value.reason == "OVERFLOW_REJECTED"
        with pytest.raises(CQSError) as full:  # fresh names, never in overflow status
            for i in range(2000):
                s.put(f"N{i}", BODY)
        assert full.value.reason == "STRUCTURE_FULL"
        assert d.events("structure_full")
        s.delete(s.read("FLOOD").entry_id)  # reads and deletes go on; this frees overflow
        s.delete(s.read("N0").entry_id)  # and this the primary
        assert s.put(f"N{i}", b"fits again")


def test_a_crash_during_overflow_moves_recovers_a_consistent_placement(make_daemon):
    """SIGKILL right after the selection, with moves under way: at restart every
    acknowledged message is there once, in FIFO order, and the name is in overflow."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    c = cqsclient.connect(d.address, client="A")
    s = c.structure("PRIM")
    put = flood(s, "FLOOD", 380)
    d.wait_for("overflow_selected")
    d.kill()
    c.close()
    d.restart()
    with cqsclient.connect(d.address, client="B") as c:
        rows = {r["name"]: r for r in c.query("structures")}
        assert rows["PRIM"]["messages"] + rows["PRIMOV"]["messages"] == len(put)
        got = c.structure("PRIM").read_batch("FLOOD", 1000)
        assert [m.entry_id for m in got] == put


def test_alter_by_hand(make_daemon):
    """cqsctl alter: up to SIZE, never below what is in use."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    with cqsclient.connect(d.address, client="A") as c:
        assert c.alter("PRIM", 200 * 1024)["current_size"] == 200 * 1024
        with pytest.raises(CQSError, match="INVALID_REQUEST"):
            c.alter("PRIM", 512 * 1024)
        flood(c.structure("PRIM"), "Q", 20)
        with pytest.raises(CQSError, match="in use"):
            c.alter("PRIM", 1024)
    assert d.events("structure_altered")[0]["reason"] == "operator"


def test_what_operators_change_survives_a_restart_and_the_config_seeds_only(make_daemon):
    """Sizes set by alter and rebuild --size are kept in the repository: a clean stop or
    a crash keeps them, display structures says where each definition comes from, and
    a config that disagrees later is reported, not applied, until a rebuild applies it
    (the seed's CFRM policy change, "pending until structure is rebuilt")."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    with cqsclient.connect(d.address, client="OPER") as c:
        c.alter("PRIM", 200 * KiB)
        c.rebuild("ALONE", 128 * KiB)
        with pytest.raises(CQSError, match="the size must be between"):
            c.rebuild("ALONE", 0)
    for restart in (d.stop, d.kill):
        restart()
        d.restart()
        with cqsclient.connect(d.address, client="OPER") as c:
            rows = {r["name"]: r for r in c.query("structures")}
        assert (rows["PRIM"]["current_size"], rows["PRIM"]["definition"],
                rows["PRIM"]["pending"]) == (200 * KiB, "config", None)
        assert (rows["ALONE"]["size"], rows["ALONE"]["current_size"],
                rows["ALONE"]["definition"], rows["ALONE"]["pending"]) == (
            128 * KiB, 128 * KiB, "repository", {"size": 64 * KiB})
    d.config.write_text(d.config.read_text().replace('size = "256KiB"', 'size = "384KiB"'))
    d.stop()
    before = d.mark()
    d.restart()
    [differs] = d.events("structure_config_differs", before, structure="PRIM")
    assert differs["config"] == {"size": 384 * KiB} and differs["repository"] == {
        "size": 256 * KiB}
    with cqsclient.connect(d.address, client="OPER") as c:
        row = {r["name"]: r for r in c.query("structures")}["PRIM"]
        assert (row["size"], row["current_size"], row["pending"]) == (
            256 * KiB, 200 * KiB, {"size": 384 * KiB})
        rebuilt = c.rebuild("PRIM")
        assert (rebuilt["size"], rebuilt["current_size"], rebuilt["definition"],
                rebuilt["pending"]) == (384 * KiB, 200 * KiB, "config", None)


def test_rebuild_and_delete_structure_under_load(make_daemon):
    """Workers keep going while the structure is copied (with a new size) and nothing
    acknowledged is lost; delete-structure then empties it for good, crash or not."""
    d = make_daemon(structures=PAIR.format(ov="512KiB")).start()
    procs, journals, stop = start_workers(d, 3, seed=11)
    try:
        d.wait_for("register", count=3)
        with cqsclient.connect(d.address, client="OPER") as c:
            for size in (128 * 1024**2, 96 * 1024**2):
                assert c.rebuild("MSGQ01", size)["size"] == size
    finally:
        stop.touch()
        for p in procs:
            p.wait(60)
    check(journals, survivors(d))
    with cqsclient.connect(d.address, client="OPER") as c:
        marker = c.structure("MSGQ01").put("Q0", b"before the delete")
        c.delete_structure("MSGQ01", force=True)
        assert c.structure("MSGQ01").browse() == []
        after = c.structure("MSGQ01").put("Q0", b"after")
    assert after > marker
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="OPER") as c:
        assert [m.entry_id for m in c.structure("MSGQ01").browse()] == [after]
