"""Who a client is, from its environment: ``$CQSD_CLIENT`` names it (read by
``connect``), ``$CQSD_SECRET`` is its secret, or ``$CQSD_SECRET_FILE`` names a
file whose first line is, as for cqsctl. A secret in a file (mode 0600, or a
systemd credential) stays out of ``ps`` and of the process's environment dumps;
the variable is for containers that inject it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

__all__ = ["SECRET_ENV", "SECRET_FILE_ENV", "read_secret_file", "secret_from_env"]

SECRET_ENV: Final = "CQSD_SECRET"
SECRET_FILE_ENV: Final = "CQSD_SECRET_FILE"


def read_secret_file(path: str) -> str:
    """The first line of the file at ``path``, without its line break. Raises
    ValueError naming the file if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"secret file {path}: {error}") from None


def secret_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``$CQSD_SECRET``, else the first line of the file ``$CQSD_SECRET_FILE`` names,
    else None (a client registering without a secret)."""
    if SECRET_ENV in environ:
        return environ[SECRET_ENV]
    path = environ.get(SECRET_FILE_ENV)
    return read_secret_file(path) if path else None
