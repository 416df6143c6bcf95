"""cqsctl as an operator runs it on a service: a secret from a file, status, and a
checkpoint followed stage by stage (or left to run with --no-wait, then display jobs)."""

import hashlib
import json
import os
import re
import subprocess
import sys

SECRET = "op-secret"
OPS = (f'[[client]]\nname = "OPS"\nsecret_sha256 = "{hashlib.sha256(SECRET.encode()).hexdigest()}"'
       '\noperator = true\n')


def ctl(daemon, *args, env=None):
    return subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", daemon.address,
                           "--client", "OPS", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_checkpoint_progress_no_wait_and_jobs(make_daemon, tmp_path):
    """--no-wait returns with the job's number while it runs; a second checkpoint joins it
    and shows its stages as they end; display jobs and status report it; the job's
    output is in the daemon log."""
    d = make_daemon(extra=OPS).start()
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    auth = ("--secret-file", str(secret))
    assert ctl(d, *auth, "put", "MSGQ01", "TRANX", "to checkpoint").returncode == 0
    started = ctl(d, *auth, "checkpoint", "MSGQ01", "--no-wait")
    assert started.returncode == 0, started.stderr
    assert "started as job 1" in started.stdout
    waited = ctl(d, *auth, "checkpoint", "MSGQ01")
    assert waited.returncode == 0, waited.stderr
    assert "checkpoint of MSGQ01 in SRDS" in waited.stdout
    assert "checkpoint MSGQ01: commit done" in waited.stderr
    jobs = json.loads(ctl(d, *auth, "--json", "display", "jobs").stdout)
    assert [(j["id"], j["kind"], j["state"], j["stage"]) for j in jobs] == [
        (1, "checkpoint", "done", "commit")]
    table = ctl(d, *auth, "display", "jobs").stdout
    # durations (seconds, or minutes and seconds on a slow machine) and timestamps,
    # not raw numbers
    assert re.search(r"\d s\b|\dm \d\ds\b", table) and "T" in table
    status = ctl(d, *auth, "status")
    assert status.returncode == 0 and "# Structures" in status.stdout
    assert d.events("job_output", kind="checkpoint")
    assert any(e.get("output", {}).get("event") == "srds_stage" for e in d.events("job_output"))


def test_secret_from_the_environment_and_a_missing_file(make_daemon, tmp_path):
    """$CQSD_SECRET_FILE names the secret's file; an unreadable one is a usage error."""
    d = make_daemon(extra=OPS).start()
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    env = {k: v for k, v in os.environ.items() if k != "CQSD_SECRET"}
    env["CQSD_SECRET_FILE"] = str(secret)
    ok = ctl(d, "--json", "status", env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["operator_sessions"] == 1
    missing = ctl(d, "--secret-file", str(tmp_path / "none"), "status")
    assert missing.returncode == 2 and "secret file" in missing.stderr


def test_checkpoint_shows_every_stage_with_its_own_time(make_daemon, tmp_path):
    """Each stage of the job (session, plan, read, fold, commit) on its own line, in
    order, each with its own time, which add up to no more than the whole job's."""
    d = make_daemon(extra=OPS).start()
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    auth = ("--secret-file", str(secret))
    assert ctl(d, *auth, "put", "MSGQ01", "TRANX", "to checkpoint").returncode == 0
    done = ctl(d, *auth, "checkpoint", "MSGQ01")
    assert done.returncode == 0, done.stderr
    shown = re.findall(r"checkpoint MSGQ01: (\w+) done in ([\d.]+) (ms|s)\n", done.stderr)
    assert [stage for stage, _, _ in shown] == ["session", "plan", "read", "fold", "commit"]
    jobs = json.loads(ctl(d, *auth, "--json", "display", "jobs").stdout)
    stages = jobs[0]["stages"]
    assert [s["stage"] for s in stages] == ["session", "plan", "read", "fold", "commit"]
    assert sum(s["seconds"] for s in stages) <= jobs[0]["seconds"] + 0.01
