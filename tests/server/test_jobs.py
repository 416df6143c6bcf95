"""The jobs table: a job's stderr goes into the daemon log line by line, its stages are
kept as they end, and a failed job's reply carries its own error."""

import json

import pytest
from structlog.testing import capture_logs

from cqsd.config import loads
from cqsd.server.jobs import JobFailed, Jobs, last_error, outcome

CONFIG = loads('[daemon]\ndata_dir = "/nonexistent/cqsd"\n[[structure]]\nname = "S"\n'
               'size = "1MiB"\n')
STAGE = json.dumps({"event": "srds_stage", "stage": "plan", "level": "info", "seconds": 0.1})
FAILED = json.dumps({"event": "srds_job_failed", "level": "error", "kind": "SlotError",
                     "error": "slot SRDS1 is torn"})


def test_lines_go_to_the_log_and_stages_to_the_table():
    """A JSON line is logged as job_output at its level, a stage becomes the job's stage,
    and any other line is logged as text."""
    jobs = Jobs()
    job = jobs.start(["checkpoint", "--structure", "S"])
    tail: list[str] = []
    with capture_logs() as logged:
        for line in (STAGE, "WARN some JVM noise", FAILED):
            jobs.heard(job, line, tail)
    assert job.stage == "plan" and tail[-1] == FAILED
    assert [(e["log_level"], e.get("text") or e["output"]["event"]) for e in logged] == [
        ("info", "srds_stage"), ("info", "WARN some JVM noise"), ("error", "srds_job_failed")]
    assert jobs.rows()[0]["state"] == "running"


def test_a_failed_job_says_why_in_its_own_words():
    """The reply names the stage reached, the exit status and the job's error kind and
    message; the table keeps the failure."""
    jobs = Jobs()
    job = jobs.start(["checkpoint", "--structure", "S"])
    job.stage = "plan"
    with pytest.raises(JobFailed) as err:
        jobs.finish(job, ["checkpoint", "--structure", "S"], 1, b"", [STAGE, FAILED])
    assert err.value.message == ("checkpoint --structure S failed after stage plan (exit 1): "
                                 "SlotError: slot SRDS1 is torn")
    assert jobs.rows()[0]["state"] == "failed" and "torn" in jobs.rows()[0]["error"]
    assert last_error(["just text"]) == "just text" and last_error([]) == "no output"
    assert outcome(["x"], 0, b'noise\n{"rows": 3}\n', []) == {"rows": 3}


async def test_a_real_job_that_fails_at_once():
    """python -m cqsd.srds refusing its structure name: the reply has its error, and its
    error event reached the daemon log while it ran."""
    jobs = Jobs()
    with capture_logs() as logged:
        with pytest.raises(JobFailed) as err:
            await jobs.run(CONFIG, ["checkpoint", "--structure", "bad/name"])
    assert "bad/name" in err.value.message and "exit 1" in err.value.message
    assert any(e["event"] == "job_output" and e["log_level"] == "error" for e in logged)
    assert [r["state"] for r in jobs.rows()] == ["failed"]
