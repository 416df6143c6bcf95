"""Offloaded messages through a real daemon: large payloads go to the client's data
set, the structure keeps a one-element map, and every request works on them."""

import os
import random
import sys
import threading
from pathlib import Path

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .harness import STRUCTURES

KiB, MiB = 1024, 1024 * 1024
SMDS = STRUCTURES.replace('overflow = "MSGQ01OV"', 'overflow = "MSGQ01OV"\noffload = "smds"')
SIXTEEN = """
[[structure]]
name = "SMDS16"
size = "16MiB"
offload = "smds"
dssize = "8MiB"
"""


GROWING = """
[[structure]]
name = "GROW"
size = "16MiB"
offload = "smds"
dssize = "512KiB"
"""


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_48_one_mib_messages_fit_a_16_mib_structure(make_daemon):
    """48 x 1 MiB recoverable messages go into a 16 MiB structure (three times its
    size), read back byte for byte, and survive a clean restart and a SIGKILL."""
    d = make_daemon(structures=SIXTEEN).start()
    sent = {}
    with cqsclient.connect(d.address, client="BULK") as c:
        s = c.structure("SMDS16")
        for i in range(48):
            sent[s.put("BIG", payload(MiB, i))] = i
        row = c.query("structures", "SMDS16")[0]
        assert row["messages"] == 48 and row["elements_used"] <= 48
        smds = c.query("smds", "SMDS16")
        assert [(r["owner"], r["status"]) for r in smds] == [("BULK", "ACTIVE")]
        assert smds[0]["size"] >= 48 * MiB  # expanded from dssize as it filled
    d.stop()
    d.restart()
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="BULK") as c:
        s = c.structure("SMDS16")
        for _ in range(48):
            m = s.read("BIG")
            assert m.data == payload(MiB, sent[m.entry_id])
            s.delete(m.entry_id)
    assert d.proc.poll() is None


def test_random_sizes_read_back_byte_for_byte_through_every_request(make_daemon):
    """Sizes from 1 byte to 8 MiB, recoverable or not, through put, browse, read,
    unlock, move, commit and delete, come back exactly."""
    d = make_daemon('max_message = "9MiB"', structures=SMDS).start()
    rng = random.Random(7)
    sizes = [1, 64 * 1024, 256 * 1024 - 64, 256 * 1024, 3 * MiB + 5, 8 * MiB] + [
        rng.choice([rng.randrange(1, 4096), rng.randrange(32 * 1024, 2 * MiB)])
        for _ in range(20)]
    with cqsclient.connect(d.address, client="SIZES") as c:
        s = c.structure("MSGQ01")
        want = {}
        for i, n in enumerate(sizes):
            want[s.put("SIZES", payload(n, i), recoverable=i % 3 != 0)] = payload(n, i)
        assert {m.entry_id: m.data for m in s.browse_all("SIZES")} == want
        first = s.read("SIZES")
        s.unlock(first.entry_id)
        again = s.read("SIZES")
        assert (again.entry_id, again.data) == (first.entry_id, want[first.entry_id])
        s.move(again.entry_id, "MOVED")
        moved = s.read("MOVED")
        assert moved.data == want[moved.entry_id]
        with s.unit_of_work() as uow:
            uow.delete(moved.entry_id)
            uow.put("COMMITTED", payload(MiB, 99))
        got = s.read("COMMITTED")
        assert got.data == payload(MiB, 99)
        s.delete(got.entry_id)
        while (m := s.read("SIZES")) is not None:
            assert m.data == want[m.entry_id]
            s.delete(m.entry_id)
    assert d.proc.poll() is None


def test_space_freed_by_deletes_is_reused(make_daemon):
    """A steady put/delete load of 1 MiB messages does not grow the data set."""
    d = make_daemon(structures=SIXTEEN).start()
    with cqsclient.connect(d.address, client="STEADY") as c:
        s = c.structure("SMDS16")
        for i in range(200):
            eid = s.put("STEADY", payload(MiB, i))
            m = s.read("STEADY")
            assert (m.entry_id, m.data) == (eid, payload(MiB, i))
            s.delete(eid)
        row = c.query("smds", "SMDS16")[0]
        assert row["size"] == 8 * MiB
    assert d.proc.poll() is None


def test_a_full_data_set_refuses_only_puts_that_need_it(make_daemon):
    """With dsexpand off, a put that finds no room gets SMDS_FULL; small puts,
    reads and deletes go on, and a delete makes room again."""
    d = make_daemon(structures=SIXTEEN.replace('dssize = "8MiB"',
                                               'dssize = "4MiB"\ndsexpand = false')).start()
    with cqsclient.connect(d.address, client="FULL") as c:
        s = c.structure("SMDS16")
        ids = []
        with pytest.raises(CQSError) as full:
            for i in range(10):
                ids.append(s.put("FULL", payload(MiB, i)))
        assert full.value.reason == "SMDS_FULL" and "dsexpand is off" in str(full.value)
        assert 2 <= len(ids) < 4
        small = s.put("FULL", b"small")
        m = s.read("FULL")
        assert m.data == payload(MiB, 0)
        s.delete(m.entry_id)
        s.put("FULL", payload(MiB, 50))  # the freed space is reused
        assert list(s.browse_all("FULL"))[-1].data == payload(MiB, 50)
        assert small in [m.entry_id for m in s.browse_all("FULL")]
    assert d.proc.poll() is None


def test_data_sets_live_where_design_says(make_daemon):
    """One file per (structure, owning client) under <data_dir>/smds/."""
    d = make_daemon(structures=SMDS).start()
    for client in ("ONE", "TWO"):
        with cqsclient.connect(d.address, client=client) as c:
            c.structure("MSGQ01").put("Q", payload(100_000, 1))
    assert sorted(os.listdir(d.data / "smds" / "MSGQ01")) == ["ONE.smds", "TWO.smds"]


def test_a_clean_stop_saves_each_space_map_and_a_crash_rebuilds_it(make_daemon):
    """Restart processing: after a clean stop the saved space map is used (its
    timestamp matches the repository's), after a SIGKILL it is rebuilt from the
    structure, and either way the data set goes on holding every message."""
    d = make_daemon(structures=SMDS).start()
    with cqsclient.connect(d.address, client="MAPS") as c:
        ids = c.structure("MSGQ01").put_batch("Q", [payload(300_000, i) for i in range(3)])
    d.stop()
    seen = d.mark()
    d.restart()
    assert d.events("smds_opened", seen, owner="MAPS")[0]["how"] == "saved map"
    d.kill()
    seen = d.mark()
    d.restart()
    opened = d.events("smds_opened", seen, owner="MAPS")[0]
    assert (opened["how"], opened["rebuild_reason"]) == ("rebuilt", "no-map")
    with cqsclient.connect(d.address, client="MAPS") as c:
        s = c.structure("MSGQ01")
        assert [m.data for m in s.browse("Q")] == [payload(300_000, i) for i in range(3)]
        more = s.put("Q", payload(300_000, 3))  # the rebuilt map hands out free space only
        assert s.browse("Q")[-1].entry_id == more
        assert [m.entry_id for m in s.browse("Q")][:3] == ids


def test_a_down_level_data_set_is_named_and_isolated(make_daemon):
    """A data set replaced by an older copy fails the newest block's check at start:
    its messages get SMDS_UNAVAILABLE, never wrong bytes (a browse shows them with
    none, saying why), while another client's data set and messages kept in memory
    carry on."""
    d = make_daemon(structures=SMDS).start()
    with cqsclient.connect(d.address, client="OLD") as c:
        c.structure("MSGQ01").put("Q", payload(100_000, 1))
    d.stop()
    path = d.data / "smds" / "MSGQ01" / "OLD.smds"
    older = path.read_bytes()
    d.restart()
    with cqsclient.connect(d.address, client="OLD") as c:
        c.structure("MSGQ01").put("Q", payload(100_000, 2))
    with cqsclient.connect(d.address, client="NEW") as c:
        c.structure("MSGQ01").put("OTHER", payload(100_000, 3))
    d.stop()
    path.write_bytes(older)
    seen = d.mark()
    d.restart()
    failed = d.events("smds_open_failed", seen, owner="OLD")
    assert failed and "down-level" in failed[0]["error"]
    with cqsclient.connect(d.address, client="NEW") as c:
        s = c.structure("MSGQ01")
        shown = s.browse("Q")
        assert [m.data for m in shown] == [b"", b""]
        assert all("down-level" in m.unavailable for m in shown)
        with pytest.raises(CQSError) as unreadable:
            s.read("Q")
        assert unreadable.value.reason == "SMDS_UNAVAILABLE" and "down-level" in str(
            unreadable.value)
        locked = {r["queue"]: r["locked"] for r in c.query("queues", "MSGQ01")}
        assert locked["Q"] == 0  # the read's lock went back
        assert s.read("OTHER").data == payload(100_000, 3)
        small = s.put("Q2", b"kept in memory")
        assert s.read("Q2").entry_id == small
    assert d.proc.poll() is None


def test_a_recoverable_offloaded_put_larger_than_a_log_record_is_stored(make_daemon):
    """With 8 KiB blocks (2,560 ranges) a recoverable offloaded put of 20 MiB, more
    than one log record holds, is stored (its blocks logged in records before its
    entry's) and is there after a SIGKILL; non-recoverable, the same is read back."""
    d = make_daemon('max_message = "100MiB"', structures=SIXTEEN.replace(
        'dssize = "8MiB"', 'dssize = "64MiB"\ndsblock = "8KiB"')).start()
    with cqsclient.connect(d.address, client="EDGE") as c:
        s = c.structure("SMDS16")
        eid = s.put("EDGE", payload(20 * MiB, 4))
        s.put("EDGE", payload(20 * MiB, 5), recoverable=False)
        assert [m.data for m in s.browse("EDGE")] == [payload(20 * MiB, 4), payload(20 * MiB, 5)]
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="EDGE") as c:
        assert [(m.entry_id, m.data) for m in c.structure("SMDS16").browse("EDGE")] == [
            (eid, payload(20 * MiB, 4))]


def test_an_operator_session_offloads_into_its_clients_data_set(make_daemon):
    """cqsctl's sessions carry a session number in their name; what they put goes
    to the data set of the configured client they registered as."""
    d = make_daemon(structures=SMDS).start()
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        s = c.structure("MSGQ01")
        s.put("Q", payload(200_000, 1))
        assert s.read("Q").data == payload(200_000, 1)
    assert os.listdir(d.data / "smds" / "MSGQ01") == ["OPS.smds"]


def test_data_sets_are_in_the_metrics(make_daemon):
    """/metrics has each data set's size and fullness and its pool's figures."""
    from .harness import free_port
    from .test_metrics import samples, scrape
    port = free_port()
    d = make_daemon(f'metrics_listen = "127.0.0.1:{port}"', structures=SMDS).start()
    with cqsclient.connect(d.address, client="SEEN") as c:
        s = c.structure("MSGQ01")
        s.put("Q", payload(2 * MiB, 1))
        s.browse("Q")
    got = samples(scrape(port)[1])
    mine = frozenset({("structure", "MSGQ01"), ("owner", "SEEN")})
    assert got[("cqsd_smds_size_bytes", mine)] == 64 * MiB
    assert 0 < got[("cqsd_smds_used_ratio", mine)] < 1
    assert got[("cqsd_smds_available", mine)] == 1


def test_rebuild_and_alter_keep_offloaded_messages(make_daemon):
    """A structure copy (rebuild, with a new size) and an alter carry offloaded
    messages over untouched, and the data set's space stays accounted."""
    d = make_daemon(structures=SMDS).start()
    with cqsclient.connect(d.address, client="COPY") as c:
        s = c.structure("MSGQ01")
        ids = s.put_batch("Q", [payload(500_000, i) for i in range(4)])
        s.delete(s.read("Q").entry_id)
        used = c.query("smds", "MSGQ01")[0]["used_percent"]
        c.rebuild("MSGQ01", size=48 * MiB)
        c.alter("MSGQ01", 40 * MiB)
        assert [m.entry_id for m in s.browse("Q")] == ids[1:]
        assert [m.data for m in s.browse("Q")] == [payload(500_000, i) for i in range(1, 4)]
        assert c.query("smds", "MSGQ01")[0]["used_percent"] == used


def test_checkpoint_and_recover_give_offloaded_messages_back(make_daemon):
    """A checkpoint holds the offloaded data of recoverable messages (read from the
    log's B effects); a recovery from it and the log after it gives every
    recoverable offloaded message back byte for byte and drops the others, and a
    purge empties the data sets' space."""
    d = make_daemon('spark_master = "local[1]"', structures=SMDS).start()
    with cqsclient.connect(d.address, client="RECO") as c:
        s = c.structure("MSGQ01")
        before = {s.put("Q", payload(700_000, i)): payload(700_000, i) for i in range(3)}
        gone = s.put("Q", payload(100_000, 9), recoverable=False)
        c.checkpoint("MSGQ01")
        after = {s.put("Q", payload(300_000, i)): payload(300_000, i) for i in range(10, 12)}
        s.delete(s.read("Q").entry_id)  # the oldest, after the checkpoint
        del before[min(before)]
        result = c.recover("MSGQ01")
        assert result["messages"] == 4
        got = {m.entry_id: m.data for m in s.browse_all("Q")}
        assert got == {**before, **after} and gone not in got
        s.put("Q", payload(300_000, 20))  # space the recovery freed is handed out again
        c.recover("MSGQ01", purge=True)
        assert s.browse("Q") == []
        assert c.query("smds", "MSGQ01")[0]["used_percent"] == 0
    assert d.proc.poll() is None


def test_a_put_waits_for_its_data_set_to_grow_while_other_clients_are_served(make_daemon,
                                                                            tmp_path):
    """A put that finds no room in its data set waits for the data set to grow, and
    the growth's I/O runs aside (held here on an event the test controls): another
    client's put and read on another structure are answered meanwhile. Once the
    growth is durable the put is stored, and its message is read back after a
    SIGKILL and a restart."""
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    gate = Path(__file__).with_name("gated_growth.py")
    d = make_daemon(structures=STRUCTURES + GROWING,
                    prefix=(sys.executable, str(gate), str(fifo))).start()
    data, got = payload(300_000, 1), {}  # two blocks; the data set has one
    with cqsclient.connect(d.address, client="GROWER") as c:
        putting = threading.Thread(target=lambda: got.update(
            eid=c.structure("GROW").put("BIG", data)))
        putting.start()
        held = d.wait_for("test_growth_held")[0]
        assert (held["size"], held["new_size"]) == (512 * KiB, 768 * KiB)
        with cqsclient.connect(d.address, client="OTHER", timeout=10) as other:
            s = other.structure("MSGQ01")
            eid = s.put("Q", b"served meanwhile")
            assert s.read("Q").entry_id == eid
        assert putting.is_alive() and not got and not d.events("smds_expanded")
        with open(fifo, "wb"):
            pass  # go
        putting.join(30)
        assert "eid" in got
    (grown,) = d.wait_for("smds_expanded")
    assert (grown["size"], grown["new_size"]) == (512 * KiB, 768 * KiB)
    d.kill()
    d.prefix = []
    d.restart()
    with cqsclient.connect(d.address, client="GROWER") as c:
        m = c.structure("GROW").read("BIG")
        assert (m.entry_id, m.data) == (got["eid"], data)


def test_a_growth_refused_by_the_disk_leaves_the_data_set_as_it_was(make_daemon, namespace):
    """A growth the file system refuses (ENOSPC) leaves the data set at its size, and
    the put that waited for it gets SMDS_FULL naming why; what fits goes on."""
    d = make_daemon(structures=STRUCTURES + GROWING, prefix=namespace.prefix)
    namespace.small_disk(d.data / "smds" / "GROW", "640k")  # room for 512 KiB, not 768
    d.start()
    with cqsclient.connect(d.address, client="GROWER") as c:
        s = c.structure("GROW")
        kept = s.put("SMALL", payload(100_000, 2))
        with pytest.raises(CQSError) as full:
            s.put("BIG", payload(300_000, 3))
        assert full.value.reason == "SMDS_FULL" and "ENOSPC" in full.value.message
        (failed,) = d.wait_for("smds_expand_failed")
        assert (failed["reason"], failed["size"]) == ("ENOSPC", 512 * KiB)
        assert c.query("smds", "GROW")[0]["size"] == 512 * KiB
        assert s.read("SMALL").data == payload(100_000, 2) and s.put("SMALL", b"fits")
        s.delete(kept)
