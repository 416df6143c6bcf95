"""cqsd: a shared queue server in the manner of the IMS Common Queue Server.

The import packages are layered (STYLE §14): ``cqsd.engine`` and
``cqsd.protocol`` are pure; ``cqsd.server`` is the only part that awaits.
Importing ``cqsd`` itself pulls in nothing heavy, so the SDK can use the codec.
"""

__version__ = "0.1.0"
