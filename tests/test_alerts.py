"""The example alert rules (config/cqsd-alerts.yml) fire when they should, by
``promtool test rules``, and use only metrics the daemon exports. promtool comes
with Debian's prometheus package (``make test`` installs it when missing, as root)."""

import re
import shutil
import subprocess
from pathlib import Path

from cqsd.server import metrics

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "config" / "cqsd-alerts.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args: str, cwd: Path = ROOT, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, input=input, capture_output=True,
                          text=True, timeout=120)


def test_the_rules_are_valid():
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_rules_fire_when_they_should():
    run = promtool("test", "rules", "cqsd-alerts-test.yml", cwd=ROOT / "tests" / "alerts")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_rules_cover_the_operators_worries_with_exported_metrics():
    """Backlog age, structure and SMDS fullness, checkpoint age, fsync latency and a
    fenced node each have an alert, on a family the metrics module defines."""
    lines = [line for line in RULES.read_text().splitlines() if not line.lstrip().startswith("#")]
    used = set(re.findall(r"\b(cqsd_[a-z_]+)", "\n".join(lines)))
    source = Path(metrics.__file__).read_text()
    for name in used:
        family = re.sub(r"_(bucket|count|sum|total)$", "", name)
        assert f'"{family}' in source, f"{name} is not exported by cqsd/server/metrics.py"
    for needed in ("cqsd_queue_oldest_age_seconds", "cqsd_structure_fullness_ratio",
                   "cqsd_smds_used_ratio", "cqsd_checkpoint_age_seconds",
                   "cqsd_fsync_seconds_bucket", "cqsd_node_fenced"):
        assert needed in used, needed
