"""cqsd: a shared queue server in the manner of the IMS Common Queue Server.

The import packages are layered (STYLE §14): ``cqsd.engine`` is pure and
``cqsd.server`` is the only part that awaits. The wire protocol is not here but
in ``cqsproto`` (shipped with the SDK under ``clients/``), the leaf both the
daemon and the SDK import; nothing of the SDK imports ``cqsd``.
"""

__version__ = "0.1.0"
