"""The Makefile's choices of system packages: the JRE the Debian release offers
(`make java-package`), asked of apt-cache as apt-get install would see it."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def fake_apt_cache(tmp_path: Path, offered: list[str]) -> dict[str, str]:
    """An environment whose apt-cache offers ``offered`` (a Candidate) and knows every
    other name only as a package without one, as Debian 12 knows openjdk-21."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-cache"
    cases = "".join(f'  {name}) echo "  Candidate: 1.0";;\n' for name in offered)
    script.write_text(f'#!/bin/sh\n[ "$1" = policy ] || exit 100\necho "$2:"\n'
                      f'case "$2" in\n{cases}  *) echo "  Candidate: (none)";;\nesac\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize(("offered", "chosen"), [
    (["openjdk-17-jre-headless", "openjdk-21-jre-headless"], "openjdk-21-jre-headless"),
    (["openjdk-21-jre-headless"], "openjdk-21-jre-headless"),  # Debian 13: no 17
    (["openjdk-17-jre-headless", "openjdk-11-jre-headless"], "openjdk-17-jre-headless"),
])
def test_the_jre_is_the_one_the_release_offers(tmp_path, offered, chosen):
    run = subprocess.run([shutil.which("make"), "-s", "--no-print-directory", "java-package"],
                         cwd=ROOT, env=fake_apt_cache(tmp_path, offered),
                         capture_output=True, text=True, timeout=30)
    assert (run.returncode, run.stdout.strip()) == (0, chosen), run.stderr


def test_a_release_without_a_jre_spark_runs_on_says_so(tmp_path):
    run = subprocess.run([shutil.which("make"), "-s", "--no-print-directory", "java-package"],
                         cwd=ROOT, env=fake_apt_cache(tmp_path, ["openjdk-11-jre-headless"]),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and run.stdout == ""
    assert "install Java 17 or 21" in run.stderr


def test_the_docs_name_no_single_jre():
    """The install steps name the package by the release, not openjdk-17 alone."""
    text = (ROOT / "docs" / "operations.md").read_text()
    assert "make -s java-package" in text
    assert "apt-get install -y python3-venv openjdk-17-jre-headless" not in text
