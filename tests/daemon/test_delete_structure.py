"""delete-structure as the seeds allow it: only an empty structure (MQ's DELETE
CFSTRUCT), unless the operator says --force; then nothing in it is recovered,
crash or not."""

import contextlib
import io

import cqsclient
from cqsclient import ctl


def cqsctl(d, *argv: str) -> tuple[int, str, str]:
    """cqsctl in this process against the daemon: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = ctl.main(["--address", d.address, *argv])
    return status, out.getvalue(), err.getvalue()


def test_a_structure_holding_messages_is_deleted_only_with_force(make_daemon):
    """A delete of a pair holding messages (one in its overflow structure's count too) is
    refused, naming how many and --force, and changes nothing; with --force it is
    emptied and stays empty after a crash; an empty one needs no --force."""
    d = make_daemon().start()
    with cqsclient.connect(d.address, client="APP") as c:
        s = c.structure("MSGQ01")
        s.put("Q", b"recoverable")
        s.put("Q", b"not logged", recoverable=False)
        locked = s.read("Q")
        status, _, err = cqsctl(d, "delete-structure", "MSGQ01", "--yes")
        assert status == 1
        assert "INVALID_REQUEST" in err and "holds 2 messages" in err and "--force" in err
        s.delete(locked.entry_id)  # nothing was taken from it: its lock still holds
        assert [m.data for m in s.browse()] == [b"not logged"]
    status, out, err = cqsctl(d, "delete-structure", "MSGQ01", "--yes", "--force")
    assert status == 0, err
    assert "1 messages deleted" in out
    assert d.events("structure_delete", structure="MSGQ01", messages=1, force=True)
    d.kill()
    d.restart()
    with cqsclient.connect(d.address, client="APP") as c:
        assert c.structure("MSGQ01").browse() == []
        assert c.delete_structure("MSGQ01")["deleted"] == 0  # empty: no --force needed


def test_a_failed_structure_is_deleted_only_with_force(make_daemon):
    """What a failed structure holds is known only once recovered: its delete needs
    --force, which also ends the failure."""
    d = make_daemon().start()
    with cqsclient.connect(d.address, client="OPS", operator=True) as c:
        c.structure("SMALL").put("Q", b"m")
        c.fail_structure("SMALL")
        status, _, err = cqsctl(d, "delete-structure", "SMALL", "--yes")
        assert status == 1 and "is failed" in err and "--force" in err
        assert cqsctl(d, "delete-structure", "SMALL", "--yes", "--force")[0] == 0
        assert c.structure("SMALL").browse() == []
