"""SMDS states that stay true across stops (issue 28), through a real daemon and
cqsctl: a failed structure's data sets keep their status at a clean stop, a failed
recover stays failed, a command naming no data set writes nothing, `display smds`
shows a closed data set's size, and a put that can never fit changes nothing."""

import json

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .test_smds import MiB, payload
from .test_smds_status import cqsctl

S = "TINY"
TINY = f"""
[[structure]]
name = "{S}"
size = "16MiB"
offload = "smds"
dsblock = "8KiB"
dssize = "128KiB"
"""


def rows(d, kind: str) -> dict[str, dict]:
    """{owner: row} of `display KIND S --json`."""
    status, out, err = cqsctl(d, "--json", "display", kind, S)
    assert status == 0, err
    return {r["owner"]: r for r in json.loads(out)}


def put(d, client: str, n: int, seed: int, recoverable: bool = True) -> int:
    with cqsclient.connect(d.address, client=client) as c:
        return c.structure(S).put("Q", payload(n, seed), recoverable=recoverable)


def test_a_failed_structures_data_set_stays_active_across_a_clean_stop(make_daemon):
    """fail, then SIGTERM: the data set holding the failed structure's message is not
    marked EMPTY (its entries are unknown until a recover), so after a restart it is
    still ACTIVE, and `display smds` shows its 128 KiB though it was not opened."""
    d = make_daemon(structures=TINY).start()
    put(d, "IMSA", 40_000, 1)
    assert cqsctl(d, "fail", S)[0] == 0
    seen = d.mark()
    d.stop()
    assert not d.events("smds_status_changed", seen, new="EMPTY")
    d.restart()
    assert rows(d, "cfstatus")["IMSA"]["status"] == "ACTIVE"
    row = rows(d, "smds")["IMSA"]
    assert (row["size"], row["status"]) == (128 * 1024, "ACTIVE")


def test_a_failed_recover_stays_failed_across_a_restart_and_a_recover_ends_it(make_daemon):
    """recover killed by job_timeout: STRUCTURE_FAILED, and after SIGTERM and a restart
    the structure still refuses requests, its data set is not EMPTY; a recover
    with time enough brings the message back byte for byte."""
    d = make_daemon('spark_master = "local[1]"\njob_timeout = 1', structures=TINY).start()
    entry = put(d, "IMSA", 40_000, 2)
    status, _, err = cqsctl(d, "recover", S)
    assert status != 0 and "STRUCTURE_FAILED" in err
    seen = d.mark()
    d.stop()
    assert not d.events("smds_status_changed", seen, new="EMPTY")
    d.restart()
    with cqsclient.connect(d.address, client="IMSB") as c, pytest.raises(CQSError) as failed:
        c.structure(S).browse_all("Q")
    assert failed.value.reason == "STRUCTURE_FAILED"
    assert rows(d, "cfstatus")["IMSA"]["status"] != "EMPTY"
    d.stop()
    d.config.write_text(d.config.read_text().replace("job_timeout = 1", "job_timeout = 600"))
    d.restart()
    status, _, err = cqsctl(d, "recover", S)
    assert status == 0, err
    with cqsclient.connect(d.address, client="IMSB") as c:
        assert {m.entry_id: m.data for m in c.structure(S).browse_all("Q")} == {
            entry: payload(40_000, 2)}


def test_a_command_naming_an_owner_without_a_data_set_is_refused_and_writes_nothing(
        make_daemon):
    """reset-smds, alter-smds, start-smdsconn and stop-smdsconn naming an owner that has
    put nothing offloaded exit non-zero with INVALID_REQUEST naming the data sets there
    are, and no row for it appears, then or after a restart."""
    d = make_daemon(structures=TINY).start()
    put(d, "IMSA", 40_000, 3)
    for argv in (["reset-smds", S, "NOSUCH", "--access", "enabled"],
                 ["reset-smds", S, "NOSUCH", "--status", "failed"],
                 ["alter-smds", S, "NOSUCH", "--dsexpand", "no"],
                 ["start-smdsconn", S, "NOSUCH"], ["stop-smdsconn", S, "NOSUCH"]):
        status, out, err = cqsctl(d, *argv)
        assert status != 0 and "INVALID_REQUEST" in err and "IMSA" in err, (argv, out, err)
        assert "NOTFOUND" in err
    d.stop()
    d.restart()
    assert list(rows(d, "cfstatus")) == list(rows(d, "smds")) == ["IMSA"]


def test_a_put_that_can_never_fit_is_refused_before_the_data_set_grows(make_daemon):
    """A 20 MiB non-recoverable put to a data set of dsmax 8 MiB is SMDS_FULL at once:
    the data set keeps its size and its DSEXPAND, and a 1 MiB put then grows it."""
    d = make_daemon('max_message = "21MiB"', structures=TINY + 'dsmax = "8MiB"\n').start()
    put(d, "IMSA", 40_000, 4)
    before = rows(d, "smds")["IMSA"]
    with cqsclient.connect(d.address, client="IMSA") as c, pytest.raises(CQSError) as full:
        c.structure(S).put("Q", payload(20 * MiB, 5), recoverable=False)
    assert full.value.reason == "SMDS_FULL" and "never" in str(full.value)
    after = rows(d, "smds")["IMSA"]
    assert (after["size"], after["dsexpand"]) == (before["size"], True)
    assert not d.events("smds_expanded") and not d.events("smds_expand_failed")
    put(d, "IMSA", MiB, 6, recoverable=False)
    assert rows(d, "smds")["IMSA"]["size"] > MiB


def test_reads_pass_over_a_message_whose_data_set_is_failed_or_stopped(make_daemon):
    """The first message of a queue has its data in a FAILED data set, the third in a
    STOPPED one: reads deliver the others, in order, leaving those two where they
    are, untouched; a browse shows all four, those two with no data and why; with
    nothing else left a read is SMDS_UNAVAILABLE; once the data sets are back, both
    are read in order, byte for byte, delivered once."""
    d = make_daemon(structures=TINY).start()
    first = put(d, "IMSA", 40_000, 7)
    with cqsclient.connect(d.address, client="IMSC") as c:
        small = c.structure(S).put("Q", b"kept in the structure")
    third = put(d, "IMSB", 50_000, 8)
    with cqsclient.connect(d.address, client="IMSC") as c:
        fourth = c.structure(S).put("Q", b"after them")
    assert cqsctl(d, "reset-smds", S, "IMSA", "--status", "failed")[0] == 0
    assert cqsctl(d, "stop-smdsconn", S, "IMSB")[0] == 0
    with cqsclient.connect(d.address, client="READER") as c:
        s = c.structure(S)
        shown = list(s.browse_all("Q"))
        assert [(m.entry_id, m.data if m.unavailable is None else None) for m in shown] == [
            (first, None), (small, b"kept in the structure"), (third, None),
            (fourth, b"after them")]
        assert "FAILED" in shown[0].unavailable and "STOPPED" in shown[2].unavailable
        delivered = s.read_batch("Q", 10)
        assert [m.entry_id for m in delivered] == [small, fourth]
        for m in delivered:
            s.delete(m.entry_id)
        with pytest.raises(CQSError) as refused:
            s.read("Q")
        assert refused.value.reason == "SMDS_UNAVAILABLE" and str(first) in str(refused.value)
    status, out, _ = cqsctl(d, "browse", S, "Q")
    assert status == 0 and "UNAVAILABLE" in out
    assert cqsctl(d, "reset-smds", S, "IMSA", "--status", "recovered")[0] == 0
    assert cqsctl(d, "start-smdsconn", S, "IMSB")[0] == 0
    with cqsclient.connect(d.address, client="READER2") as c:
        got = c.structure(S).read_batch("Q", 10)
    assert [(m.entry_id, m.data, m.delivery_count) for m in got] == [
        (first, payload(40_000, 7), 1), (third, payload(50_000, 8), 1)]


def test_a_structure_at_80_percent_takes_a_put_that_fits_and_is_full_only_past_its_size(
        make_daemon):
    """Issue 28, item 5 (FULL with 20% free): a put's cost is its segments of entry_max,
    each with 64 bytes of entry controls in whole 512-byte elements (a 5 MiB put is
    10,400 elements, 5.08 MiB). At 80% of SIZE, grown there from INITSIZE, a 5 MiB
    put fits and FULL stays no; the next one needs more than SIZE has free and is
    STRUCTURE_FULL naming both figures, FULL yes; a put that fits clears it."""
    d = make_daemon(structures='[[structure]]\nname = "BIG"\nsize = "32MiB"\n'
                               'initsize = "8MiB"\noverflow_threshold = 100\n').start()
    with cqsclient.connect(d.address, client="FILL") as c:
        s = c.structure("BIG")
        for i in range(25):
            s.put("Q", payload(MiB, i), recoverable=False)
        row = c.query("structures", "BIG")[0]
        assert row["elements_used"] == 25 * 2080 and row["elements_used"] >= 0.79 * 65536
        s.put("Q", payload(5 * MiB, 30), recoverable=False)
        row = c.query("structures", "BIG")[0]
        assert (row["full"], row["current_size"]) == (False, 32 * MiB)
        with pytest.raises(CQSError) as full:
            s.put("Q", payload(5 * MiB, 31), recoverable=False)
        assert full.value.reason == "STRUCTURE_FULL"
        assert "10400 data elements" in str(full.value) and "3136 elements" in str(full.value)
        assert c.query("structures", "BIG")[0]["full"] is True
        s.put("Q", payload(MiB, 32), recoverable=False)
        assert c.query("structures", "BIG")[0]["full"] is False
