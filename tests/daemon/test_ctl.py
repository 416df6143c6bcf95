"""cqsctl against a real daemon: each subcommand of issue 3, human and JSON output."""

import json
import re
import subprocess
import sys


def ctl(daemon, *args, input=None):
    return subprocess.run(
        [sys.executable, "-m", "cqsclient.ctl", "--address", daemon.address, *args],
        capture_output=True, text=True, timeout=60, input=input)


def test_put_browse_read_and_display(daemon):
    """An operator puts, browses, reads and displays through the CLI."""
    put = ctl(daemon, "put", "MSGQ01", "TRANX", "hello operator")
    assert put.returncode == 0, put.stderr
    eid = int(put.stdout.strip())
    browsed = json.loads(ctl(daemon, "--json", "browse", "MSGQ01", "TRANX").stdout)
    assert [m["entry_id"] for m in browsed] == [eid]
    table = ctl(daemon, "display", "queues").stdout
    assert "TRANX" in table
    oldest = json.loads(ctl(daemon, "--json", "display", "queues").stdout)[0]["oldest_put_time"]
    assert isinstance(oldest, int)  # JSON keeps the number, a table shows the time
    assert re.search(r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", table)
    structures = json.loads(ctl(daemon, "--json", "display", "structures").stdout)
    assert {row["name"] for row in structures} >= {"MSGQ01", "MSGQ01OV", "SMALL"}
    read = ctl(daemon, "read", "MSGQ01", "TRANX")
    assert read.returncode == 0 and "hello operator" in read.stdout
    empty = ctl(daemon, "read", "MSGQ01", "TRANX")
    assert empty.returncode == 1 and "NO_MESSAGE" in empty.stderr


def test_dequeue_requeue_delete_and_failures(daemon):
    """Dequeue empties a queue, delete takes one entry, errors carry the reason code."""
    for i in range(3):
        ctl(daemon, "put", "MSGQ01", "JUNK", f"m{i}")
    refused = ctl(daemon, "dequeue", "MSGQ01", "JUNK")  # no terminal and no --yes
    assert refused.returncode == 2
    done = ctl(daemon, "--json", "dequeue", "MSGQ01", "JUNK", "--yes")
    assert done.returncode == 0, done.stderr
    eid = int(ctl(daemon, "put", "MSGQ01", "ONE", "x").stdout)
    assert ctl(daemon, "delete", "MSGQ01", str(eid)).returncode == 0
    gone = ctl(daemon, "delete", "MSGQ01", str(eid))
    assert gone.returncode == 1 and "ENTRY_NOT_FOUND" in gone.stderr
    unknown = ctl(daemon, "put", "NOSUCH", "Q", "x")
    assert unknown.returncode == 1 and "UNKNOWN_STRUCTURE" in unknown.stderr
    not_cold = ctl(daemon, "requeue", "MSGQ01", "123")
    assert not_cold.returncode == 1 and "ENTRY_NOT_FOUND" in not_cold.stderr


def test_unreachable_daemon_exits_3(tmp_path):
    """A daemon that is not there is named, with exit status 3."""
    r = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", f"unix://{tmp_path}/none",
                        "display", "structures"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "none" in r.stderr


def test_put_with_a_delay_is_counted_as_delayed_and_refused_nonsense_names_it(daemon):
    """put --delay holds the message back: display queues shows it under DELAYED (the
    JSON key delayed), read finds nothing; an infinite delay is INVALID_REQUEST."""
    put = ctl(daemon, "put", "MSGQ01", "LATER", "tomorrow", "--delay", "86400")
    assert put.returncode == 0, put.stderr
    row = next(r for r in json.loads(ctl(daemon, "--json", "display", "queues").stdout)
               if r["queue"] == "LATER")
    assert (row["depth"], row["delayed"]) == (0, 1)
    assert "DELAYED" in ctl(daemon, "display", "queues").stdout
    assert ctl(daemon, "read", "MSGQ01", "LATER").returncode == 1
    bad = ctl(daemon, "put", "MSGQ01", "LATER", "never", "--delay", "inf")
    assert bad.returncode != 0 and "INVALID_REQUEST" in bad.stderr and "delay" in bad.stderr
