"""Log lines under systemd carry their journald priority (``<N>``), elsewhere not."""

import os
import subprocess
import sys

SCRIPT = """
import structlog
from cqsd import logs
logs.configure("debug")
log = structlog.get_logger()
log.debug("d"); log.info("i"); log.warning("w"); log.error("e"); log.critical("c")
"""


def run_logging(tmp_path, journal: bool) -> list[str]:
    path = tmp_path / "stderr"
    with open(path, "w") as stderr:
        st = os.fstat(stderr.fileno())
        env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
        env.pop("JOURNAL_STREAM", None)
        if journal:
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=stderr, env=env, check=True,
                       timeout=60)
    return path.read_text().splitlines()


def test_the_journal_gets_each_lines_priority(tmp_path):
    lines = run_logging(tmp_path, journal=True)
    assert [line[:4] for line in lines] == ["<7>{", "<6>{", "<4>{", "<3>{", "<2>{"]


def test_a_file_or_terminal_gets_the_json_alone(tmp_path):
    lines = run_logging(tmp_path, journal=False)
    assert all(line.startswith("{") for line in lines) and len(lines) == 5


def test_another_stream_named_in_journal_stream_is_not_ours(tmp_path):
    """$JOURNAL_STREAM inherited from a parent whose stderr was the journal, ours is not."""
    path = tmp_path / "stderr"
    with open(path, "w") as stderr:
        env = {**os.environ, "PYTHONPATH": ":".join(sys.path), "JOURNAL_STREAM": "1:2"}
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=stderr, env=env, check=True,
                       timeout=60)
    assert all(line.startswith("{") for line in path.read_text().splitlines())
