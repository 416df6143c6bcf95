"""Warm standbys (cqsd/group/standby.py): the tail keeps a pair's rows equal to the
owner's structure, honours seals, and makes a takeover fold only the last records."""

import itertools
import time
import uuid

import pytest

import cqsclient
import logstream
from cqsd.dedup import key_of
from cqsd.engine import QueueType, Structure, StructurePair
from cqsd.group.ownership import Owner, Seal, View
from cqsd.group.standby import END, Follower, Tailer, limits, load
from cqsd.records import DATA, DELETE, EFFECTS, KEY, LOCK, PUT, STRUCTURE, rows_of
from cqsd.srds import slots
from logstream.series import list_series

from ..daemon.harness import Raw
from .checker import QUEUE, owner_messages, reference_messages
from .cluster import Node, shared_data

PAIR = ("MSGQ01", "MSGQ01OV")
PREFER = 'prefer = ["NODE1", "NODE2"]'


def payloads(structure):
    """A live structure's messages as the checker's: id -> payload."""
    return {eid: row[DATA] for eid, row in rows_of(structure).items()}


def new_pair(name):
    """An empty pair as a daemon's registry would make it (Tailer's ``new_pair``)."""
    return StructurePair(Structure(name, 1 << 30), Structure(name + "OV", 1 << 30))


def owner_of(writer):
    """The owner of MSGQ01 writing ``writer``, as limits() takes it."""
    return Owner("MSGQ01", "NODE1", "", writer, 1, 1)


def paths(data):
    return data / "images", data / "srds", data / "logstream"


@pytest.fixture
def owner(etcd_server):
    """NODE1 alone, owning MSGQ01, in a group of its own."""
    node = Node("NODE1", shared_data(), etcd_server.endpoint,
                group="W" + uuid.uuid4().hex[:6].upper(), prefer=PREFER)
    node.start()
    node.wait_for("takeover_done", structure="MSGQ01", timeout=30)
    yield node
    node.cleanup()


def test_a_warm_standbys_rows_follow_the_serving_owner(owner):
    """Loaded while the owner serves, then tailed pass by pass: after each pass the rows
    are the owner's structure and the reference fold, locks, deletes and moves included."""
    data = owner.data
    with cqsclient.connect(owner.address, client="W1", timeout=10) as c:
        s = c.structure("MSGQ01")
        first = s.put_batch(QUEUE, [b"a%d" % i for i in range(200)])
        (writer,) = list_series(data / "logstream")
        warm, follower = load(new_pair("MSGQ01").structures(), *paths(data),
                              limits(owner_of(writer), {}))
        assert payloads(warm.structures["MSGQ01"]) == owner_messages(owner.address)
        for i in range(5):  # the owner appends while the standby tails
            s.put_batch(QUEUE, [b"b%d-%d" % (i, n) for n in range(100)])
            for m in s.read_batch(QUEUE, 30):
                s.delete(m.entry_id)
            s.read(QUEUE)  # one stays locked
            s.move(first[-1 - i], "TRANY")  # by id, not yet read
            seen = [r.lsn for r in follower.read(limits(owner_of(writer), {})) if warm.apply(r)]
            assert seen, "the pass folded none of the owner's new records"
            live = owner_messages(owner.address)
            assert payloads(warm.structures["MSGQ01"]) == live == reference_messages(data)
    assert warm.folded[writer] == follower.next[writer] - 1


def put(writer, eids, structure="MSGQ01", at=None):
    return writer.append({STRUCTURE: structure, EFFECTS: [
        [PUT, e, int(QueueType.TRAN), QUEUE, b"m%d" % e, 0] for e in eids]}, at)


def test_a_seal_set_by_a_third_node_is_honoured(tmp_path):
    """The standby folds the owner's series to its end; a third node then seals it
    below that (records the owner wrote were not durable, or came late): the next
    pass finds the rows past the seal, loads them again, and folds the new owner's."""
    log_dir = tmp_path / "logstream"
    (tmp_path / "images").mkdir()
    with logstream.Writer.open(log_dir, "NODE1-1") as a:
        put(a, range(1, 11))
        a.append({STRUCTURE: "MSGQ01", EFFECTS: [[LOCK, 3, "IMS1"], [DELETE, 4]]})
        a.flush()
        tailer = Tailer(None, {"MSGQ01": PAIR}, tmp_path / "images", tmp_path / "srds",
                        log_dir, 0.1, new_pair)
        owned_by_1 = View(owners={"MSGQ01": Owner("MSGQ01", "NODE1", "", "NODE1-1", 5, 1)},
                          seals={"MSGQ01": [Seal("MSGQ01", 5, "NODE1-1", {}, 0)]})
        tailer._pass("MSGQ01", owned_by_1)  # loads
        sealed_at = a.append({STRUCTURE: "MSGQ01", EFFECTS: [[DELETE, 5]]})
        late = put(a, [11, 12])  # beyond the seal to come
        a.flush()
        tailer._pass("MSGQ01", owned_by_1)
        warm = tailer.standing["MSGQ01"].warm
        assert set(payloads(warm.structures["MSGQ01"])) == {1, 2, 3, 6, 7, 8, 9, 10, 11, 12}
        assert warm.folded["NODE1-1"] == late
        tailer._pass("MSGQ01", View())  # the owner gone, its seal still to come:
        assert tailer.standing["MSGQ01"].warm is warm  # nothing to judge yet, no reload
        a.append({STRUCTURE: "EMHQ01", EFFECTS: []})  # another pair's: not folded
        a.flush()
    with logstream.Writer.open(log_dir, "NODE3-1") as c:  # the third node takes it
        c.stamp_after(time.time_ns() + 10**9)
        put(c, [20])
        c.append({STRUCTURE: "MSGQ01", EFFECTS: [[DELETE, 1]]})
        c.flush()
    owned_by_3 = View(
        owners={"MSGQ01": Owner("MSGQ01", "NODE3", "", "NODE3-1", 9, 2)},
        seals={"MSGQ01": [Seal("MSGQ01", 9, "NODE3-1", {"NODE1-1": sealed_at}, 0)]})
    tailer._pass("MSGQ01", owned_by_3)
    warm = tailer.standing["MSGQ01"].warm
    assert set(payloads(warm.structures["MSGQ01"])) == {2, 3, 6, 7, 8, 9, 10, 20}
    assert warm.folded == {"NODE1-1": sealed_at, "NODE3-1": 2}


def tailer_in(data):
    """A Tailer of MSGQ01 over ``data``, its passes run by hand with hand-made views."""
    (data / "images").mkdir()
    return Tailer(None, {"MSGQ01": PAIR}, data / "images", data / "srds",
                  data / "logstream", 0.1, new_pair)


def owned(writer, epoch, sealed=None, rolled=None):
    """A view of MSGQ01 owned at ``epoch`` by the node writing ``writer``, with the
    seal of epoch ``sealed`` (the owner's by default) and the series it ``rolled`` from."""
    node = writer.split("-")[0]
    return View(owners={"MSGQ01": Owner("MSGQ01", node, "", writer, epoch, 1, rolled or {})},
                seals={"MSGQ01": [Seal("MSGQ01", sealed or epoch, writer, {}, 0)]})


def test_an_owners_roll_is_followed_through_the_old_series_to_its_end(tmp_path):
    """The owner rolls to a new series while it owns the pair (taking back another one):
    the records it wrote in the old one after the last pass are folded before the
    new series' (the old one was not read again once the owner key named the new
    one, and a lock there then met a message the rows lacked)."""
    log_dir, tailer = tmp_path / "logstream", tailer_in(tmp_path)
    with logstream.Writer.open(log_dir, "NODE1-1") as old:
        put(old, [1, 2])
        old.flush()
        tailer._pass("MSGQ01", owned("NODE1-1", 5))  # loads
        end = put(old, [3])  # after the pass, before the roll
        old.flush()
    with logstream.Writer.open(log_dir, "NODE1-2") as new:
        new.stamp_after(time.time_ns())
        new.append({STRUCTURE: "MSGQ01", EFFECTS: [[LOCK, 3, "IMS1"], [DELETE, 1]]})
        new.flush()
    tailer._pass("MSGQ01", owned("NODE1-2", 5, rolled={"NODE1-1": end}))
    warm = tailer.standing["MSGQ01"].warm
    assert set(payloads(warm.structures["MSGQ01"])) == {2, 3}
    assert warm.structures["MSGQ01"].entry(3).owner == "IMS1"
    assert warm.folded == {"NODE1-1": end, "NODE1-2": 1}


def test_a_new_owners_series_is_not_read_before_the_view_holds_its_seal(tmp_path):
    """A view read between a new owner's key and its seal: the pass reads the files
    later, when the new owner may have served the pair. Its records wait for the
    view with the seal, and are then folded after the sealed ones they follow (they
    were folded first, and a delete met a message the rows did not hold yet)."""
    log_dir, tailer = tmp_path / "logstream", tailer_in(tmp_path)
    with logstream.Writer.open(log_dir, "NODE1-1") as a:
        put(a, [1, 2])
        a.flush()
        tailer._pass("MSGQ01", owned("NODE1-1", 5))  # loads
        sealed_at = put(a, [3])  # the old owner's last record, not read yet
        a.flush()
    with logstream.Writer.open(log_dir, "NODE2-1") as b:
        b.stamp_after(time.time_ns())
        b.append({STRUCTURE: "MSGQ01", EFFECTS: [[DELETE, 3]]})
        b.flush()
    tailer._pass("MSGQ01", owned("NODE2-1", 9, sealed=5))  # the seal of 9 not seen yet
    warm = tailer.standing["MSGQ01"].warm
    assert set(payloads(warm.structures["MSGQ01"])) == {1, 2}
    assert "NODE2-1" not in warm.folded
    seal = Seal("MSGQ01", 9, "NODE2-1", {"NODE1-1": sealed_at}, 0)
    tailer._pass("MSGQ01", View(owners=owned("NODE2-1", 9).owners, seals={"MSGQ01": [seal]}))
    assert tailer.standing["MSGQ01"].warm is warm  # tailed, not loaded again
    assert set(payloads(warm.structures["MSGQ01"])) == {1, 2}
    assert warm.folded == {"NODE1-1": sealed_at, "NODE2-1": 1}


def test_a_tail_stopped_at_any_record_goes_on_from_there(tmp_path):
    """A pass that stops early (a takeover claims the pair) leaves the cursors after
    the last record it handed over, across writers and segments: nothing is skipped."""
    log_dir = tmp_path / "logstream"
    with logstream.Writer.open(log_dir, "A-1", segment_size=8192) as a, \
            logstream.Writer.open(log_dir, "B-1", segment_size=8192) as b:
        for n in range(60):
            (a if n % 3 else b).append({STRUCTURE: "MSGQ01", EFFECTS: [], "n": n,
                                        "pad": bytes(300)})
        a.flush()
        b.flush()
        assert len(list_series(log_dir)["A-1"]) > 1  # the tail crosses segments
        follower = Follower(log_dir, lambda writer: 1)
        until = {"A-1": END, "B-1": END}
        got = []
        while batch := [r.body["n"] for r in itertools.islice(follower.read(until), 7)]:
            got += batch
        assert got == list(range(60))
        a.append({STRUCTURE: "MSGQ01", EFFECTS: [], "n": 60})
        a.flush()
        assert [r.body["n"] for r in follower.read(until)] == [60]


def test_a_warm_standby_keeps_the_idempotency_keys_of_the_window(tmp_path):
    """A warm standby reads the keys of the records its base covers from the log when
    it loads, and keeps those it folds after: a takeover finds every one."""
    images, srds, log_dir = paths(tmp_path)
    with logstream.Writer.open(log_dir, "A-1", segment_size=8192) as a:
        def keyed(n):
            a.append({STRUCTURE: "MSGQ01", EFFECTS: [], KEY: ["C", "i", n, [100 + n]]})
            a.flush()

        for n in range(1, 11):
            keyed(n)
        for name in PAIR:
            slots.empty_checkpoint(srds, name, {"A-1": 5}, 0)
        warm, follower = load(new_pair("MSGQ01").structures(), images, srds, log_dir,
                              {"A-1": END}, window=120)
        assert warm.covered["MSGQ01"] == {"A-1": 5}
        keyed(11)
        for rec in follower.read({"A-1": END}):
            warm.apply(rec)
    now = time.time_ns()
    assert [warm.keys.recall(key_of("C", "i", n), now) for n in range(1, 12)] == [
        ([100 + n], 0) for n in range(1, 12)]
    cold, _ = load(new_pair("MSGQ01").structures(), images, srds, log_dir,
                   {"A-1": END})  # no window: no keys
    assert len(cold.keys) == 0


def standby_lag(address, node, timeout=20):
    """``node``'s entry in ``display owners`` of MSGQ01 once its lag is published."""
    deadline = time.monotonic() + timeout
    with cqsclient.connect(address, client="OPS", timeout=10) as c:
        while time.monotonic() < deadline:
            row = {r["structure"]: r for r in c.query("owners")}["MSGQ01"]
            (entry,) = [e for e in row["standbys"] if e["node"] == node]
            if entry["behind_records"] is not None:
                return entry
            time.sleep(0.1)  # polling the group through its public query
    raise AssertionError(f"{node} published no lag within {timeout} s: {row}")


def big(node):
    """``node`` with room for 10^5 messages of 1 KiB in MSGQ01 (and no EMHQ01)."""
    config = node.config.read_text()
    start, end = config.index("[[structure]]"), config.index("[group]")
    node.config.write_text(config[:start] + f"""
[[structure]]
name = "MSGQ01"
size = "512MiB"
initsize = "512MiB"
{PREFER}

""" + config[end:])
    return node


def kill_and_take(etcd_server, standby, messages):
    """NODE1 owns MSGQ01 holding ``messages`` acknowledged puts, NODE2 (``standby``)
    stands by; NODE1 is killed. NODE2's takeover_done event, what it serves, the
    reference fold and what was acknowledged. Two puts with idempotency keys, one
    before NODE2 starts and one while it stands by, are sent again to NODE2 after
    its takeover: each gets its first entry id (exactly-once puts, docs/group.md)."""
    data = shared_data()
    group = "W" + uuid.uuid4().hex[:6].upper()
    one, two = (big(Node(name, data, etcd_server.endpoint, group=group, prefer=PREFER,
                         standby=mode))
                for name, mode in (("NODE1", "cold"), ("NODE2", standby)))
    try:
        one.start()
        one.wait_for("takeover_done", structure="MSGQ01", timeout=30)
        acked, keyed = {}, {}
        raw = Raw(one.socket)
        raw.register("KEYS")

        def keyed_put(n):  # its reply is the one "lost": the put is sent again later
            put = {"structure": "MSGQ01", "queue": "KEYQ", "data": b"k%d" % n, "key": ["i", n]}
            keyed[n] = (put, raw.request("put", **put)["result"]["entry_id"])
            acked[keyed[n][1]] = put["data"]

        keyed_put(1)
        with cqsclient.connect(one.address, client="W2", timeout=30) as c:
            s = c.structure("MSGQ01")

            def put(start, stop):
                for at in range(start, stop, 1000):
                    batch = [b"%07d" % n + bytes(1017) for n in range(at, at + 1000)]
                    acked.update(zip(s.put_batch(QUEUE, batch), batch, strict=True))

            put(0, messages - 1000)
            two.start()  # loads what is there, then tails what comes
            if standby == "warm":
                two.wait_for("warm_standby_loaded", structure="MSGQ01", timeout=60)
            put(messages - 1000, messages)
            keyed_put(2)
            for m in s.read_batch(QUEUE, 10):
                s.delete(m.entry_id)
                del acked[m.entry_id]
        lag = standby_lag(one.address, "NODE2") if standby == "warm" else None
        mark = two.mark()
        one.kill()
        (done,) = two.wait_for("takeover_done", after=mark, structure="MSGQ01", timeout=60)
        raw = Raw(two.socket)
        raw.register("KEYS")
        for put, entry_id in keyed.values():
            assert raw.request("put", **put)["result"]["entry_id"] == entry_id
        if lag is not None:  # display owners, answered by the owner: the warm node's lag
            assert isinstance(lag["behind_records"], int) and lag["behind_records"] >= 0
            assert isinstance(lag["behind_seconds"], float) and lag["behind_seconds"] >= 0
        return done, owner_messages(two.address), reference_messages(data), acked
    finally:
        one.cleanup()
        two.cleanup()


def test_a_warm_takeover_loses_nothing_and_loads_far_faster_than_a_cold_one(etcd_server):
    """The same pair of 100,000 1 KiB messages taken over after a SIGKILL, the last
    1,000 put while the standby runs: the warm node folds only the records it has
    not tailed yet, the cold one reads its base and the whole log."""
    warm, served, reference, acked = kill_and_take(etcd_server, "warm", 100_000)
    assert served == reference == acked
    cold, served, reference, acked = kill_and_take(etcd_server, "cold", 100_000)
    assert served == reference == acked
    assert {"tail", "restore"} <= set(warm["phases"]) and "load" not in warm["phases"], warm
    assert "load" in cold["phases"], cold
    # what the warm node saves: reading and folding the log (the rows' restore into
    # the engine is the same work for both)
    print("warm", warm["phases"], "cold", cold["phases"])
    assert warm["phases"]["tail"] * 3 < cold["phases"]["load"], (warm, cold)
