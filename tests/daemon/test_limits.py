"""Requests past a limit are refused with a reason that names it, and the daemon serves on."""

import pytest

import cqsclient
from cqsclient.errors import CQSError
from cqsd.server.limits import RECORD_BUDGET

MiB = 1024 * 1024
BIG = 'max_message = "100MiB"'


def test_a_recoverable_put_too_large_for_one_log_record_is_refused(make_daemon):
    """A 20 MiB recoverable put gets MESSAGE_TOO_LARGE naming the log record; as
    non-recoverable it is stored, and the daemon serves on."""
    d = make_daemon(BIG).start()
    with cqsclient.connect(d.address, client="BIG") as c:
        s = c.structure("MSGQ01")
        with pytest.raises(CQSError) as refused:
            s.put("LARGE", b"r" * (20 * MiB))
        assert refused.value.reason == "MESSAGE_TOO_LARGE"
        assert "log record" in str(refused.value)
        eid = s.put("LARGE", b"n" * (20 * MiB), recoverable=False)
        m = s.read("LARGE")
        assert (m.entry_id, len(m.data)) == (eid, 20 * MiB)
        s.delete(eid)
    assert d.proc.poll() is None


def test_a_message_larger_than_the_initial_size_grows_the_structure_before_it_is_full(
        make_daemon):
    """MSGQ01 starts at 32 MiB of its 64: a 32 MiB message, which its staging segments
    make a little larger, alters it (INITSIZE toward SIZE) and goes in; one that even
    64 MiB cannot hold is STRUCTURE_FULL and grows nothing."""
    d = make_daemon(BIG).start()
    with cqsclient.connect(d.address, client="BIG") as c:
        s = c.structure("MSGQ01")
        eid = s.put("LARGE", b"g" * (32 * MiB), recoverable=False)
        [grew] = d.wait_for("structure_altered", reason="put does not fit")
        assert (grew["structure"], grew["old_size"]) == ("MSGQ01", 32 * MiB)
        assert 33 * MiB < grew["new_size"] <= 64 * MiB
        with pytest.raises(CQSError) as full:
            s.put("LARGE", b"f" * (40 * MiB), recoverable=False)
        assert full.value.reason == "STRUCTURE_FULL" and "maximum size" in str(full.value)
        [row] = [r for r in c.query("structures") if r["name"] == "MSGQ01"]
        # above the threshold at its new size, overflow processing may grow it on
        assert row["current_size"] == d.events("structure_altered")[-1]["new_size"]
        m = s.read("LARGE")
        assert (m.entry_id, len(m.data), m.data[-1:]) == (eid, 32 * MiB, b"g")


def test_the_embedded_default_takes_a_recoverable_message_of_its_max_message():
    """On the embedded default config, a recoverable message of max_message (100 MiB)
    goes to MSGQ01, offloaded to its data set (grown to hold it); kept in memory (in
    EMHQ01, or in MSGQ01 without offload) the largest recoverable message, what one
    log record holds, goes in; all read back whole."""
    from cqsd.config import DEFAULT_TOML, load
    from cqsd.server.limits import Limits

    from .harness import Daemon

    largest = load(None).daemon.max_message
    in_memory = Limits(largest).recoverable
    keys, structures = DEFAULT_TOML.split("[[structure]]", 1)
    keys = "\n".join(k for k in keys.splitlines()[1:] if not k.startswith(("data_dir", "socket")))
    for layout, puts in (
            ("[[structure]]" + structures, {"MSGQ01": largest, "EMHQ01": in_memory}),
            ("[[structure]]" + structures.replace('offload = "smds"', 'offload = "none"'),
             {"MSGQ01": in_memory})):
        d = Daemon(keys, layout).start()
        try:
            with cqsclient.connect(d.address, client="MAX") as c:
                for name, size in puts.items():
                    s = c.structure(name)
                    eid = s.put("LARGEST", b"m" * size)
                    m = s.read("LARGEST")
                    assert (m.entry_id, len(m.data)) == (eid, size)
                    s.delete(eid)
        finally:
            d.cleanup()


def test_a_commit_too_large_for_one_log_record_is_refused_whole(make_daemon):
    """A commit of 30 x 1 MiB recoverable puts is refused and stores nothing; one of
    10 x 1 MiB commits, and survives a SIGKILL."""
    d = make_daemon(BIG).start()
    with cqsclient.connect(d.address, client="UOW") as c:
        s = c.structure("MSGQ01")
        with pytest.raises(CQSError) as refused:
            s.put_batch("UOW", [bytes([i]) * MiB for i in range(30)])
        assert refused.value.reason == "MESSAGE_TOO_LARGE"
        assert "split the unit of work" in str(refused.value)
        assert s.browse("UOW") == []
        ids = s.put_batch("UOW", [bytes([i]) * MiB for i in range(10)])
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="UOW") as c:
        got = c.structure("MSGQ01").browse("UOW")
    assert [(m.entry_id, m.data[:1]) for m in got] == [(e, bytes([i])) for i, e in enumerate(ids)]


def test_a_batch_read_stops_at_the_reply_budget_and_leaves_the_rest(make_daemon):
    """read_batch locks no more than one reply may carry (max_message and one
    message more); browse pages the same way, its cursor going on from there."""
    d = make_daemon('max_message = "1MiB"').start()
    with cqsclient.connect(d.address, client="RB") as c:
        s = c.structure("MSGQ01")
        ids = [s.put("RB", b"%d" % i * (600 * 1024)) for i in range(5)]
        assert [m.entry_id for m in s.browse_all("RB")] == ids
        first = s.browse("RB", limit=100)
        assert [m.entry_id for m in first] == ids[:2]
        got = s.read_batch("RB", 5)
        assert [m.entry_id for m in got] == ids[:2]
        assert [m.entry_id for m in s.read_batch("RB", 5)] == ids[2:4]
    assert d.proc.poll() is None


def test_a_reply_of_more_large_messages_than_one_sendmsg_takes_arrives_whole(make_daemon):
    """A read of 600 messages of 64 KiB: a reply of 1,201 parts, more buffers than one
    sendmsg takes (IOV_MAX), goes out joined, every payload intact."""
    d = make_daemon(BIG).start()
    with cqsclient.connect(d.address, client="IOV") as c:
        s = c.structure("MSGQ01")
        sent = {s.put("IOV", bytes([i % 251]) * (64 * 1024), recoverable=False): i % 251
                for i in range(600)}
        got = s.read_batch("IOV", 600)
        assert len(got) == 600
        assert all(m.data == bytes([sent[m.entry_id]]) * (64 * 1024) for m in got)
    assert d.proc.poll() is None


def test_the_record_budget_holds_a_recoverable_message_of_15_mib():
    """A recoverable message kept in a structure may be 15 MiB, as the README says."""
    from cqsd.server.limits import Limits

    assert 15 * MiB <= Limits(100 * MiB).recoverable < RECORD_BUDGET
