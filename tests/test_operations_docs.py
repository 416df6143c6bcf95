"""What the operator's documents say matches what the daemon does."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_smds_is_described_as_part_of_the_daemon():
    """SMDS runs in the daemon (cqsd/server/smds/): no document says otherwise."""
    for doc in ("README.md", "docs/operations.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert "not yet wired" not in text and "will join these families" not in text, doc


def walk_through() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("## From install to first alert")
    return text[start:text.index("\n## ", start + 1)]


def test_the_walk_through_goes_from_install_to_first_alert_in_order():
    """Install, start, status, a client, a scrape, the alert rules, an alert firing."""
    text = walk_through()
    steps = ["make -s java-package", "systemctl enable --now cqsd", "cqsctl status",
             "[[client]]", "scrape_configs", "install -D -m 0644 config/cqsd-alerts.yml",
             "CqsdQueueBacklogOld"]
    positions = [text.index(step) for step in steps]
    assert positions == sorted(positions), dict(zip(steps, positions, strict=True))


def test_the_walk_throughs_prometheus_config_passes_promtool(tmp_path):
    """The prometheus.yml shown, with the rules file it names, is one promtool accepts."""
    text = walk_through()
    block = text[text.index("# /etc/prometheus/prometheus.yml"):]
    block = block[:block.index("```")]
    lines = [line[3:] if line.startswith("   ") else line for line in block.splitlines()]
    rules = tmp_path / "cqsd-alerts.yml"
    shutil.copy(ROOT / "config" / "cqsd-alerts.yml", rules)
    config = tmp_path / "prometheus.yml"
    config.write_text("\n".join(lines).replace("/etc/prometheus/rules/cqsd-alerts.yml",
                                               str(rules)) + "\n")
    run = subprocess.run([shutil.which("promtool") or "/usr/bin/promtool", "check", "config",
                          str(config)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS: 9 rules found" in run.stdout + run.stderr
