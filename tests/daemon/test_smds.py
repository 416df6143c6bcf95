"""Offloaded messages through a real daemon: large payloads go to the client's data
set, the structure keeps a one-element map, and every request works on them."""

import os
import random

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .harness import STRUCTURES

MiB = 1024 * 1024
SMDS = STRUCTURES.replace('overflow = "MSGQ01OV"', 'overflow = "MSGQ01OV"\noffload = "smds"')
SIXTEEN = """
[[structure]]
name = "SMDS16"
size = "16MiB"
offload = "smds"
dssize = "8MiB"
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
