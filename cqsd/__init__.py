"""cqsd: a shared queue server in the manner of the IMS Common Queue Server.

The import packages are layered (docs/architecture.md): ``cqsd.engine`` is pure and
``cqsd.server`` is the only part that awaits. The wire protocol is not here but
in ``cqsproto`` (shipped with the SDK under ``clients/``), the leaf both the
daemon and the SDK import; nothing of the SDK imports ``cqsd``.
"""

__version__ = "0.1.0"

import os

from cqsproto import native

# The compiled build or the source (cqsproto/native.py), for this package and for
# logstream, before any of their modules loads: logstream itself imports nothing
# of ours.
native.choose(__name__, __path__)
native.choose("logstream")

# pyarrow (the SRDS slots a restart reads) imports numpy, whose OpenBLAS starts a
# thread per CPU that now and then spins though cqsd does no linear algebra:
# 2-3% of the daemon's CPU moving 1 MiB messages (perf). With one, it starts none.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
