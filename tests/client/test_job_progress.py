"""How cqsctl tells a long job's progress: each finished stage with its own time, and
a line saying which stage is under way and for how long."""

from cqsclient.ctl import progress_line, stage_lines

JOB = {"kind": "checkpoint", "structure": "MSGQ01", "started": 1000.0, "state": "running",
       "stages": [{"stage": "session", "seconds": 18.2}, {"stage": "plan", "seconds": 0.004}]}


def test_each_stage_is_shown_once_with_its_own_time():
    assert stage_lines(JOB, 0) == ["checkpoint MSGQ01: session done in 18.2 s",
                                   "checkpoint MSGQ01: plan done in 4.00 ms"]
    assert stage_lines(JOB, 1) == ["checkpoint MSGQ01: plan done in 4.00 ms"]
    assert stage_lines(JOB, 2) == []


def test_the_progress_line_names_the_stage_under_way():
    line = progress_line(JOB, now=1000.0 + 18.204 + 3.0)
    assert line == "checkpoint MSGQ01: read… 3.0 s (stage 3 of 5, 21.2 s in all)"
    done = {**JOB, "stages": [{"stage": s, "seconds": 1.0}
                              for s in ("session", "plan", "read", "fold", "commit")]}
    assert progress_line(done, now=1006.0) == "checkpoint MSGQ01: finishing… (6.0 s in all)"
