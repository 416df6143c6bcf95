"""The library stands alone: it never pulls in the daemon or trio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_logstream_imports_neither_trio_nor_cqsd() -> None:
    """A fresh interpreter importing every logstream module has no trio or cqsd loaded."""
    code = (
        "import sys, pkgutil, importlib, logstream\n"
        "for m in pkgutil.iter_modules(logstream.__path__):\n"
        "    importlib.import_module('logstream.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('trio', 'cqsd'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
