"""What the log and cqsctl tell an operator: the start event names the version, the
config file, the data directory and the build; cqsctl's comings and goings are debug, not info;
a structure never checkpointed says so."""

import json
import os
import subprocess
import sys

from cqsd import __version__


def ctl(d, *args):
    return subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", d.address, *args],
                          capture_output=True, text=True, timeout=60)


def test_the_start_event_says_what_runs_where(make_daemon):
    d = make_daemon().start()
    started = d.events("starting")[0]
    assert started["version"] == __version__ and started["pid"] == d.proc.pid
    assert started["config"] == str(d.config)
    assert started["data_dir"] == os.path.abspath(d.data)
    # the build of each package, the one the test run asked for (docs/native.md)
    asked = os.environ.get("CQSD_BUILD")
    assert set(started["build"]) == {"cqsproto", "cqsd", "logstream"}
    assert asked in (None, "") or set(started["build"].values()) == {asked}
    events = [e["event"] for e in d.lines]
    assert events.index("starting") < events.index("ready")


def test_operator_sessions_are_debug_and_no_checkpoint_is_said(make_daemon):
    d = make_daemon().start()
    before = d.mark()
    status = ctl(d, "status")
    assert status.returncode == 0, status.stderr
    assert "no checkpoint yet" in status.stdout
    snapshot = json.loads(ctl(d, "--json", "status").stdout)
    row = next(r for r in snapshot["structures"] if r["name"] == "MSGQ01")
    assert row["last_checkpoint"] is None and row["checkpoint_age_seconds"] >= 0
    assert ctl(d, "put", "MSGQ01", "Q", "x").returncode == 0  # logged (a request), then gone
    assert not [e for e in d.lines[before:d.mark()]
                if e["event"] in ("register", "deregister")]

    debug = make_daemon('log_level = "debug"').start()
    assert ctl(debug, "status").returncode == 0
    seen = debug.wait_for("deregister")
    registered = debug.events("register", operator=True)
    assert registered and all(e["level"] == "debug" for e in registered + seen)


def test_a_checkpointed_structure_shows_its_time(make_daemon):
    d = make_daemon().start()
    done = ctl(d, "checkpoint", "SMALL")
    assert done.returncode == 0, done.stderr
    snapshot = json.loads(ctl(d, "--json", "status").stdout)
    row = next(r for r in snapshot["structures"] if r["name"] == "SMALL")
    assert isinstance(row["last_checkpoint"], float)
