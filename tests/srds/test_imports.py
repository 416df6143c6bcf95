"""Imports go one way (docs/architecture.md): the daemon's half never starts a JVM, the jobs never
reach into the server."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(imports: str) -> list[str]:
    code = (f"import sys\n{imports}\n"
            "print(' '.join(sorted({n.split('.')[0] if not n.startswith('cqsd.') else "
            "'.'.join(n.split('.')[:2]) for n in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_what_the_daemon_imports_does_not_load_pyspark():
    """slots and manifest are read by the daemon: no pyspark, so never a JVM."""
    loaded = loaded_after("import cqsd.srds.slots, cqsd.srds.manifest")
    assert "pyspark" not in loaded and "py4j" not in loaded


def test_the_jobs_do_not_import_the_server_or_trio():
    """Every SRDS module together pulls in neither cqsd.server nor trio."""
    loaded = loaded_after("import cqsd.srds.__main__, cqsd.srds.jobs, cqsd.srds.session, "
                          "cqsd.srds.traffic")
    assert "cqsd.server" not in loaded and "trio" not in loaded
