"""The atheris fuzz target of the codec (fuzz_codec.py) runs clean on a bounded budget.

It fuzzes cqsproto's Python source even where a compiled build (mypyc) is installed
beside it: atheris takes its coverage from bytecode, which a compiled module has none
of, so coverage-guided fuzzing can only steer through the source. The source is the
reference the compiled build must match, and test_codec.py's Hypothesis tests (whole,
byte by byte, damaged, garbage) run against the build that is imported, compiled or
not, so both builds are held to the same checks.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
# A budget the suite can afford (7 s of CPU, some 15 s on a busy 2-core machine); set
# CQSD_ATHERIS_RUNS for a long run, e.g. 1000000 (the fuzzer's own report says
# how fast it went and what it covered).
RUNS = int(os.environ.get("CQSD_ATHERIS_RUNS", "10000"))
LONG = "CQSD_ATHERIS_RUNS" in os.environ
# The fuzzer's peak RSS is some 50 MB; a leak or an unbounded buffer shows well before this.
RSS_LIMIT_MB = 512


def rss_limit_mb() -> int:
    """RSS_LIMIT_MB above this process's peak RSS, which the fuzzer starts from.

    libFuzzer checks the peak RSS (ru_maxrss), and Linux carries a process's peak
    across fork and exec: after the codec tests' 100 MiB frames the fuzzer would
    start "out of memory" at some 670 MB.
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 + RSS_LIMIT_MB


@pytest.mark.timeout(0 if LONG else 300)
def test_the_codec_survives_coverage_guided_fuzzing(tmp_path: Path) -> None:
    """Every input decodes to frames or a named ProtocolError, the same whole and in reads."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO_ROOT), str(REPO_ROOT / "clients"), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(HERE / "fuzz_codec.py"), f"-atheris_runs={RUNS}", "-seed=1",
         f"-rss_limit_mb={rss_limit_mb()}", f"-artifact_prefix={tmp_path}/",
         str(tmp_path / "corpus")],
        capture_output=True, text=True, env=env, check=False,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert f"Done {RUNS} in" in result.stderr, result.stderr[-2000:]
    for module in ("cqsproto.codec", "cqsproto.requests"):  # the source, fuzzed with coverage
        assert f"INFO: Instrumenting {module}\n" in result.stderr, result.stderr[:2000]
