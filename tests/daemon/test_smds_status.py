"""Seed 000's error situations and recovery scenarios through a real daemon: data set
files damaged for real (header overwritten, blocks overwritten, deleted, replaced
by an older or a smaller copy, a read-only disk), the states each leads to as
`display cfstatus` and `display smdsconn` show them, the commands that end them,
and every acknowledged recoverable message back byte for byte, or named as lost."""

import contextlib
import io
import json

import pytest

import cqsclient
from cqsclient import ctl
from cqsclient.errors import CQSError

from .harness import STRUCTURES
from .test_smds import SIXTEEN, MiB, payload

KiB, PAGE = 1024, 4096
S = "SMDS16"
SMALL_DATA_SETS = SIXTEEN.replace('dssize = "8MiB"', 'dssize = "4MiB"')


def cqsctl(d, *argv: str) -> tuple[int, str, str]:
    """cqsctl in this process against the daemon: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = ctl.main(["--address", d.address, *argv])
    return status, out.getvalue(), err.getvalue()


def shown(d, kind: str, owner: str) -> dict:
    """The --json row of `display KIND S` for ``owner``'s data set."""
    status, out, err = cqsctl(d, "--json", "display", kind, S)
    assert status == 0, err
    return next(r for r in json.loads(out) if r["owner"] == owner)


def states(d, owner: str) -> tuple[str, str, str, str]:
    """(STATUS, ACCESS, SMDSCONN STATUS, AVAIL) of ``owner``'s data set."""
    cf, conn = shown(d, "cfstatus", owner), shown(d, "smdsconn", owner)
    return cf["status"], cf["access"], conn["status"], conn["avail"]


def path(d, owner: str):
    return d.data / "smds" / S / f"{owner}.smds"


def put(d, owner: str, items: dict[str, tuple[int, int]], recoverable: bool = True) -> dict:
    """Put payload(size, seed) for each queue name; returns {entry_id: bytes}."""
    with cqsclient.connect(d.address, client=owner) as c:
        s = c.structure(S)
        return {s.put(q, payload(n, seed), recoverable=recoverable): payload(n, seed)
                for q, (n, seed) in items.items()}


def contents(d, queue: str, client: str = "READER") -> dict:
    """{entry_id: data} of every message of ``queue``, browsed."""
    with cqsclient.connect(d.address, client=client) as c:
        return {m.entry_id: m.data for m in c.structure(S).browse_all(queue)}


def refused(d, queue: str) -> str:
    """The message of the SMDS_UNAVAILABLE a read of ``queue`` gets."""
    with cqsclient.connect(d.address, client="READER") as c, pytest.raises(CQSError) as error:
        c.structure(S).read(queue)
    assert error.value.reason == "SMDS_UNAVAILABLE"
    return str(error.value)


def changes(d, after: int, owner: str) -> list[tuple[str, str, str]]:
    """(which state, old, new) of every state change logged for ``owner`` since ``after``
    (every line the daemon wrote before its reply: the CI once read before the last)."""
    d.settle()
    names = {"smds_status_changed": "status", "smds_access_changed": "access",
             "smdsconn_status_changed": "conn", "smdsconn_avail_changed": "avail"}
    return [(names[e["event"]], e["old"], e["new"]) for e in d.lines[after:]
            if e.get("event") in names and e.get("owner") == owner]


def test_a_corrupt_header_fails_only_its_data_set_until_reset_recovered(make_daemon):
    """A header overwritten while stopped: at start the data set is FAILED and SUSPENDED,
    its connection DATAFAIL in ERROR, each change one event; its messages get
    SMDS_UNAVAILABLE, never bytes, while another owner's data set, small messages and
    the owner's own small puts carry on. Enabling it leaves it SUSPENDED; once the
    header is right again, reset-smds --status recovered makes it ACTIVE through
    restart processing, and every message is back."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    mine = put(d, "A", {"AQ": (300_000, 1)}) | put(d, "A", {"AQ": (70_000, 2)}, False)
    theirs = put(d, "B", {"BQ": (200_000, 3)})
    d.stop()
    original = path(d, "A").read_bytes()
    with open(path(d, "A"), "r+b") as f:
        f.write(b"residual data from another use" * 200)
    seen = d.mark()
    d.restart()
    assert states(d, "A") == ("FAILED", "SUSPENDED", "DATAFAIL", "ERROR")
    assert states(d, "B") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert changes(d, seen, "A") == [("conn", "CLOSED", "OPENING"), ("conn", "OPENING", "DATAFAIL"),
                                     ("avail", "NORMAL", "ERROR"), ("status", "ACTIVE", "FAILED"),
                                     ("access", "ENABLED", "SUSPENDED")]
    failed = d.events("smds_status_changed", seen, owner="A")[0]
    assert "magic" in failed["reason"] and failed["cause"] == "damage"
    assert shown(d, "cfstatus", "A")["failtime"] > 0
    assert "FAILED" in refused(d, "AQ")
    assert contents(d, "BQ") == theirs
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure(S)
        small = s.put("SMALL", b"no offload needed")
        assert s.read("SMALL").entry_id == small
        with pytest.raises(CQSError) as big:
            s.put("AQ", payload(100_000, 9))
        assert big.value.reason == "SMDS_UNAVAILABLE"
    assert cqsctl(d, "reset-smds", S, "A", "--access", "enabled")[0] == 0
    assert states(d, "A")[:2] == ("FAILED", "SUSPENDED")  # the error is still there
    path(d, "A").write_bytes(original)  # repaired: no data was lost
    status, out, _ = cqsctl(d, "reset-smds", S, "A", "--status", "recovered")
    assert (status, out) == (0, f"data set of A in {S}: STATUS(ACTIVE) ACCESS(ENABLED)\n")
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert shown(d, "cfstatus", "A")["failtime"] is None
    assert contents(d, "AQ") == mine
    assert d.proc.poll() is None


def block_of(d, owner: str, entry_id: int) -> int:
    """The byte in ``owner``'s data set where entry ``entry_id``'s first block starts
    (found by its prefix, as a person with a hex dump would)."""
    data = path(d, owner).read_bytes()
    for at in range(0, len(data), PAGE):
        if data[at:at + 4] == b"\xc1SMB" and int.from_bytes(data[at + 8:at + 16], "little") \
                == entry_id:
            return at
    raise AssertionError(f"no block of entry {entry_id}")


def test_a_damaged_block_deletes_a_non_recoverable_message_and_fails_for_a_recoverable(
        make_daemon):
    """A block overwritten under a running daemon: the read of a non-recoverable message
    gets SMDS_UNAVAILABLE, the message is deleted with an event and the data set stays
    ACTIVE; the read of a recoverable one makes the data set FAILED. Once the block is
    repaired, reset-smds --status recovered brings every message back."""
    d = make_daemon(structures=SMALL_DATA_SETS + "dsbufs = 2\n").start()
    (lost,) = put(d, "A", {"NONREC": (50_000, 1)}, recoverable=False)
    kept = put(d, "A", {"REC": (300_000, 2)})
    (rec,) = kept
    for entry_id in (lost, rec):
        at = block_of(d, "A", entry_id)
        with open(path(d, "A"), "r+b") as f:
            f.seek(at + 100)
            f.write(b"\xff" * 64)  # its data: the block's CRC no longer holds
    # the pool's two buffers hold the blocks just written; these take them, so the
    # reads below go to the disk
    put(d, "B", {"FILL1": (100_000, 3), "FILL2": (100_000, 4)})
    seen = d.mark()
    assert "has been deleted" in refused(d, "NONREC")
    (gone,) = d.wait_for("smds_message_lost", after=seen)
    assert (gone["entry_id"], gone["queue"], gone["recoverable"]) == (lost, "NONREC", False)
    assert contents(d, "NONREC") == {}
    assert states(d, "A")[:3] == ("ACTIVE", "ENABLED", "OPEN")
    assert "FAILED" in refused(d, "REC")
    assert states(d, "A") == ("FAILED", "SUSPENDED", "DATAFAIL", "ERROR")
    with open(path(d, "A"), "r+b") as f:  # the device is fixed: its data put back
        at = block_of(d, "A", rec)
        f.seek(at + 100)
        f.write(payload(300_000, 2)[100 - 64:100 - 64 + 64])
    assert cqsctl(d, "reset-smds", S, "A", "--status", "recovered")[0] == 0
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert contents(d, "REC") == kept


def test_a_data_set_deleted_while_stopped_is_allocfail_until_it_is_back(make_daemon):
    """Seed 000, "Owned data set cannot be opened": a data set file gone at start is
    SMDSCONN ALLOCFAIL, AVAIL(ERROR), ACCESS(SUSPENDED) — its status stays ACTIVE, as the
    cause may be the environment. A retry by reset-smds --access enabled while it is
    still gone suspends it again; once it is back, start-smdsconn opens it."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    mine = put(d, "A", {"AQ": (300_000, 1)})
    d.stop()
    saved = path(d, "A").read_bytes()
    path(d, "A").unlink()
    d.restart()
    assert states(d, "A") == ("ACTIVE", "SUSPENDED", "ALLOCFAIL", "ERROR")
    assert "ALLOCFAIL" in refused(d, "AQ") and "No such file" in refused(d, "AQ")
    seen = d.mark()
    assert cqsctl(d, "reset-smds", S, "A", "--access", "enabled")[0] == 0
    assert states(d, "A") == ("ACTIVE", "SUSPENDED", "ALLOCFAIL", "ERROR")
    assert changes(d, seen, "A") == [
        ("access", "SUSPENDED", "ENABLED"), ("avail", "ERROR", "NORMAL"),
        ("conn", "ALLOCFAIL", "OPENING"), ("conn", "OPENING", "ALLOCFAIL"),
        ("avail", "NORMAL", "ERROR"), ("access", "ENABLED", "SUSPENDED")]
    path(d, "A").write_bytes(saved)
    status, out, _ = cqsctl(d, "start-smdsconn", S, "A")
    assert status == 0 and "OPEN" in out and "NORMAL" in out
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert contents(d, "AQ") == mine


def test_a_read_only_disk_is_openfail_and_start_smdsconn_retries(make_daemon, namespace):
    """A data set on a disk that is read-only at start cannot be opened for update:
    OPENFAIL, AVAIL(ERROR), ACCESS(SUSPENDED); with the disk writable again,
    start-smdsconn opens it and its messages are back."""
    d = make_daemon(structures=SMALL_DATA_SETS, prefix=namespace.prefix).start()
    mine = put(d, "A", {"AQ": (300_000, 1)})
    d.stop()
    namespace.writable(path(d, "A").parent, False)
    d.restart()
    assert states(d, "A") == ("ACTIVE", "SUSPENDED", "OPENFAIL", "ERROR")
    assert "Read-only file system" in refused(d, "AQ")
    namespace.writable(path(d, "A").parent, True)
    assert cqsctl(d, "start-smdsconn", S)[0] == 0
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert contents(d, "AQ") == mine


def test_a_stopped_connection_stays_stopped_across_a_restart(make_daemon):
    """stop-smdsconn closes the data set normally (its space map saved) and keeps it
    closed across a daemon restart: its messages get SMDS_UNAVAILABLE, its owner's
    small puts and others' data sets carry on, an operator may still delete its
    messages. start-smdsconn opens it again, with the saved map if nothing was
    deleted meanwhile, else rebuilt."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    mine = put(d, "A", {"AQ": (300_000, 1)}) | put(d, "A", {"AQ": (200_000, 2)})
    theirs = put(d, "B", {"BQ": (200_000, 3)})
    seen = d.mark()
    status, out, _ = cqsctl(d, "--json", "stop-smdsconn", S, "A")
    assert status == 0 and json.loads(out) == [
        {"structure": S, "owner": "A", "status": "CLOSED", "avail": "STOPPED",
         "openmode": "NONE"}]
    assert changes(d, seen, "A") == [("conn", "OPEN", "CLOSING"), ("conn", "CLOSING", "CLOSED"),
                                     ("avail", "NORMAL", "STOPPED")]
    assert "STOPPED" in refused(d, "AQ")
    with cqsclient.connect(d.address, client="A") as c:
        c.structure(S).put("SMALL", b"kept in memory")
        with pytest.raises(CQSError) as big:
            c.structure(S).put("AQ", payload(100_000, 9))
        assert big.value.reason == "SMDS_UNAVAILABLE" and "start-smdsconn" in str(big.value)
    d.stop()
    seen = d.mark()
    d.restart()
    assert not d.events("smds_opened", seen, owner="A")
    assert states(d, "A") == ("ACTIVE", "ENABLED", "CLOSED", "STOPPED")
    assert contents(d, "BQ") == theirs
    seen = d.mark()
    assert cqsctl(d, "start-smdsconn", S, "A")[0] == 0
    assert d.wait_for("smds_opened", after=seen, owner="A")[0]["how"] == "saved map"
    assert contents(d, "AQ") == mine
    cqsctl(d, "stop-smdsconn", S)  # every data set of the structure
    assert states(d, "B")[2:] == ("CLOSED", "STOPPED")
    first = min(mine)
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        c.structure(S).operator_delete(first)
    del mine[first]
    seen = d.mark()
    cqsctl(d, "start-smdsconn", S)
    opened = d.wait_for("smds_opened", after=seen, owner="A")[0]
    assert (opened["how"], opened["rebuild_reason"]) == ("rebuilt", "timestamp")
    assert contents(d, "AQ") == mine and contents(d, "BQ") == theirs


def test_a_data_set_moved_while_disabled_and_a_copy_too_small_is_caught(make_daemon):
    """Seed 000, "Data set needs to be moved": ACCESS(DISABLED) closes it normally; a
    copy put in its place (a new file) is used once ACCESS(ENABLED) again. A copy
    smaller than its extent is fine while it holds every block in use (the space
    map is rebuilt at its size); one that cuts off a block in use is FAILED, and
    the whole copy with reset-smds --status recovered brings it back."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    mine = put(d, "A", {"AQ": (300_000, 1)}) | put(d, "A", {"AQ": (600_000, 2)})
    assert cqsctl(d, "reset-smds", S, "A", "--access", "disabled")[0] == 0
    assert states(d, "A") == ("ACTIVE", "DISABLED", "CLOSED", "NORMAL")
    assert "DISABLED" in refused(d, "AQ")
    whole = path(d, "A").read_bytes()
    path(d, "A").unlink()
    path(d, "A").write_bytes(whole)  # moved: another file, the same bytes
    seen = d.mark()
    assert cqsctl(d, "reset-smds", S, "A", "--access", "enabled")[0] == 0
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert d.wait_for("smds_opened", after=seen, owner="A")[0]["how"] == "saved map"
    assert contents(d, "AQ") == mine
    cqsctl(d, "reset-smds", S, "A", "--access", "disabled")
    path(d, "A").write_bytes(whole[:2 * MiB])  # blocks 1 to 4 in use of 15: it holds them
    cqsctl(d, "reset-smds", S, "A", "--access", "enabled")
    assert states(d, "A")[:3] == ("ACTIVE", "ENABLED", "OPEN")
    assert shown(d, "smds", "A")["size"] == 2 * MiB
    assert contents(d, "AQ") == mine
    cqsctl(d, "reset-smds", S, "A", "--access", "disabled")
    path(d, "A").write_bytes(whole[:1 * MiB])  # cuts the second message off
    seen = d.mark()
    cqsctl(d, "reset-smds", S, "A", "--access", "enabled")
    assert states(d, "A") == ("FAILED", "SUSPENDED", "DATAFAIL", "ERROR")
    assert "outside" in d.events("smds_open_failed", seen, owner="A")[0]["error"]
    path(d, "A").write_bytes(whole)
    cqsctl(d, "reset-smds", S, "A", "--status", "recovered")
    assert states(d, "A")[:3] == ("ACTIVE", "ENABLED", "OPEN")
    assert contents(d, "AQ") == mine


def test_purge_and_an_empty_close_make_data_sets_empty_and_the_next_open_resets_them(
        make_daemon):
    """A data set closed normally holding no message is EMPTY, and the next open resets
    its space map and makes it ACTIVE; recover --purge and delete-structure empty the
    structure and make every data set EMPTY (how many messages were purged is in the
    structure_failed event), and the owner's next offloaded put makes its data set
    ACTIVE again."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    put(d, "A", {"AQ": (300_000, 1)})
    (gone,) = put(d, "B", {"BQ": (300_000, 2)})
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        c.structure(S).operator_delete(gone)
    seen = d.mark()
    d.stop()
    assert ("status", "ACTIVE", "EMPTY") in changes(d, seen, "B")
    assert ("status", "ACTIVE", "EMPTY") not in changes(d, seen, "A")
    seen = d.mark()
    d.restart()
    assert d.wait_for("smds_opened", after=seen, owner="B")[0]["how"] == "reset"
    assert states(d, "B") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        assert c.recover(S, purge=True)["messages"] == 0
        assert d.events("structure_failed", structure=S)[-1]["messages"] == 1
        assert [(r["owner"], r["status"], r["used_percent"]) for r in c.query("smds", S)] == [
            ("A", "EMPTY", 0), ("B", "EMPTY", 0)]
    assert states(d, "A") == ("EMPTY", "ENABLED", "CLOSED", "NORMAL")
    assert contents(d, "AQ") == {}
    again = put(d, "A", {"AQ": (300_000, 3)})
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert contents(d, "AQ") == again
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        c.delete_structure(S, force=True)
    assert [shown(d, "cfstatus", o)["status"] for o in "AB"] == ["EMPTY", "EMPTY"]
    assert cqsctl(d, "display", "cfstatus", S, "--type", "smds")[1].count("EMPTY") == 2


def test_alter_smds_overrides_buffers_and_expansion_and_retries_a_failed_expansion(
        make_daemon):
    """alter-smds --dsbufs resizes the structure's buffer pool; --dsexpand no stops the
    data set growing (puts that need room get SMDS_FULL, nothing else); --dsexpand yes
    retries at once, and an expansion refused at dsmax sets DSEXPAND(NO) again with an
    event (seed 000, "Data set becomes full")."""
    d = make_daemon(structures=SMALL_DATA_SETS.replace('dssize = "4MiB"', 'dssize = "2MiB"\n'
                                             'dsmax = "3MiB"')).start()
    put(d, "A", {"AQ": (100_000, 1)})
    status, out, _ = cqsctl(d, "--json", "alter-smds", S, "A", "--dsbufs", "7", "--dsexpand", "no")
    assert status == 0
    assert {k: json.loads(out)[k] for k in ("dsbufs", "dsexpand", "size")} == {
        "dsbufs": 7, "dsexpand": False, "size": 2 * MiB}
    assert shown(d, "usage", "A")["buffers"] == 100  # the structure's 100 are more
    cqsctl(d, "alter-smds", S, "A", "--dsbufs", "150")
    assert shown(d, "usage", "A")["buffers"] == 150
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure(S)
        with pytest.raises(CQSError) as full:
            for i in range(10):
                s.put("AQ", payload(250_000, 10 + i))
        assert full.value.reason == "SMDS_FULL"
        s.put("SMALL", b"still fine")
    seen = d.mark()
    assert cqsctl(d, "alter-smds", S, "A", "--dsexpand", "yes")[0] == 0
    assert d.events("smds_expanded", seen, owner="A")[0]["new_size"] == 2 * MiB + 512 * KiB
    with cqsclient.connect(d.address, client="A") as c, pytest.raises(CQSError) as full:
        for i in range(10):
            c.structure(S).put("AQ", payload(250_000, 30 + i))
    assert full.value.reason == "SMDS_FULL" and "dsexpand is off" in str(full.value)
    (failed,) = d.events("smds_expand_failed", seen, owner="A")
    assert (failed["reason"], failed["size"]) == ("at-dsmax", 3 * MiB)
    seen = d.mark()
    cqsctl(d, "alter-smds", S, "A", "--dsexpand", "yes")  # retried, and refused again
    assert [e["reason"] for e in d.events("smds_expand_failed", seen, owner="A")] == [
        "at-dsmax"]
    assert shown(d, "smds", "A")["dsexpand"] is False
    cqsctl(d, "alter-smds", S, "A", "--dsexpand", "default", "--dsbufs", "default")
    row = shown(d, "smds", "A")  # DEFAULT (the structure's: yes) retries as well
    assert (row["dsexpand"], row["dsbufs"]) == (False, 100)
    assert len(d.events("smds_expand_failed", seen, owner="A")) == 2


def test_a_down_level_copy_made_recovered_loses_only_the_newer_messages_by_name(make_daemon):
    """An older copy restored under a newer structure is FAILED at start (the newest
    block's check); marked RECOVERED anyway, restart processing checks every entry's
    blocks: the messages the copy holds are back, each newer one is deleted with an
    smds_message_lost event naming it."""
    d = make_daemon(structures=SMALL_DATA_SETS).start()
    older = put(d, "A", {"AQ": (300_000, 1)})
    d.stop()
    copy = path(d, "A").read_bytes()
    d.restart()
    (newer,) = put(d, "A", {"AQ": (300_000, 2)})
    d.stop()
    path(d, "A").write_bytes(copy)
    seen = d.mark()
    d.restart()
    assert "down-level" in d.events("smds_open_failed", seen, owner="A")[0]["error"]
    assert states(d, "A")[:2] == ("FAILED", "SUSPENDED")
    seen = d.mark()
    cqsctl(d, "reset-smds", S, "A", "--status", "recovered")
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert [e["entry_id"] for e in d.events("smds_message_lost", seen, owner="A")] == [newer]
    assert contents(d, "AQ") == older


def test_recovery_interrupted_then_repeated_gives_every_message_back(make_daemon):
    """Seed 000's recovery scenarios with a zero-filled data set ("unexpectedly empty":
    FAILED): cqsctl recover takes it INRECOVER with PARTIAL_RECOVERY in its header;
    SIGKILL then leaves it FAILED; a premature reset-smds --status recovered is caught
    by the flag (FAILED again); recover repeated restores it — RECOVERED, then ACTIVE by
    restart processing — with every acknowledged recoverable message byte for byte,
    while another owner's valid data set is left as it was."""
    import subprocess
    import sys
    d = make_daemon('spark_master = "local[1]"', structures=SMALL_DATA_SETS).start()
    mine = put(d, "A", {"AQ": (300_000, 1)}) | put(d, "A", {"AQ": (600_000, 2)})
    theirs = put(d, "B", {"BQ": (200_000, 3)})
    d.stop()
    path(d, "A").write_bytes(bytes(path(d, "A").stat().st_size))
    d.restart()
    assert states(d, "A")[:2] == ("FAILED", "SUSPENDED")
    seen = d.mark()
    recover = subprocess.Popen([sys.executable, "-m", "cqsclient.ctl", "--address", d.address,
                                "recover", S], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    d.wait_for("smds_recovery_started", after=seen, owner="A", timeout=60)
    assert ("status", "FAILED", "INRECOVER") in changes(d, seen, "A")
    d.kill()
    assert recover.wait(60) != 0
    seen = d.mark()
    d.restart()
    assert ("status", "INRECOVER", "FAILED") in changes(d, seen, "A")
    assert states(d, "A")[:2] == ("FAILED", "SUSPENDED")
    seen = d.mark()
    cqsctl(d, "reset-smds", S, "A", "--status", "recovered")
    assert "partial-recovery" in d.events("smds_open_failed", seen, owner="A")[0]["error"]
    assert states(d, "A") == ("FAILED", "SUSPENDED", "DATAFAIL", "ERROR")
    seen = d.mark()
    status, _, err = cqsctl(d, "recover", S)
    assert status == 0, err
    assert [(old, new) for what, old, new in changes(d, seen, "A") if what == "status"] == [
        ("FAILED", "INRECOVER"), ("INRECOVER", "RECOVERED"), ("RECOVERED", "ACTIVE")]
    assert d.events("smds_recovered", seen, owner="A")[0]["messages"] == 2
    assert changes(d, seen, "B") == []
    assert not d.events("smds_recovery_started", seen, owner="B")
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
    assert contents(d, "AQ") == mine and contents(d, "BQ") == theirs


def test_the_async_client_has_every_smds_command_and_refusals_name_the_state(make_daemon):
    """cqsclient.aio makes the same four commands; a command the state does not allow
    is INVALID_REQUEST naming the state, a structure without data sets or an unknown
    one is refused, and nothing changes."""
    import anyio

    import cqsclient.aio
    d = make_daemon(structures=STRUCTURES + SMALL_DATA_SETS).start()
    put(d, "A", {"AQ": (100_000, 1)})

    async def main():
        async with cqsclient.aio.connect(d.address, client="OPS", operator=True) as c:
            stopped = await c.stop_smdsconn(S, "A")
            assert [(r["status"], r["avail"]) for r in stopped] == [("CLOSED", "STOPPED")]
            started = await c.start_smdsconn(S)
            assert [(r["owner"], r["status"], r["avail"]) for r in started] == [
                ("A", "OPEN", "NORMAL")]
            row = await c.reset_smds(S, "A", status="failed")
            assert (row["status"], row["access"]) == ("FAILED", "SUSPENDED")
            for bad in (c.reset_smds(S, "A", status="failed", access="bogus"),
                        c.reset_smds("MSGQ01", "A", access="disabled"),
                        c.alter_smds(S, "A", dsbufs=0)):
                with pytest.raises(CQSError) as refused:
                    await bad
                assert refused.value.reason == "INVALID_REQUEST"
            await c.reset_smds(S, "A", status="recovered")
            with pytest.raises(CQSError) as refused:
                await c.reset_smds(S, "A", status="recovered")
            assert "ACTIVE" in str(refused.value) and refused.value.reason == "INVALID_REQUEST"
            with pytest.raises(CQSError) as unknown:
                await c.stop_smdsconn("NOSUCH")
            assert unknown.value.reason == "UNKNOWN_STRUCTURE"
            row = await c.alter_smds(S, "A", dsexpand="no")
            assert (row["dsexpand"], row["status"]) == (False, "ACTIVE")

    anyio.run(main, backend="trio")
    assert states(d, "A") == ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
