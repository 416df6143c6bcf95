"""The manifest of a structure's SRDS slots: which slot is current, and what each holds.

``<srds>/<S>/manifest.json`` (format in docs/srds.md) is the one place that says
a slot is a checkpoint. A slot directory the manifest does not list, or lists
with other file sizes or CRCs, is not one. The manifest is replaced whole by
temp file → fsync → rename → fsync of the directory, so after a crash it is
either the old one or the new one, never a mixture; that swap is the commit
point of a checkpoint.
"""

import json
from pathlib import Path

from crc32c import crc32c

from logstream.durable import replace_file

from ..errors import DaemonError

FORMAT = 1
NAME = "manifest.json"


class ManifestError(DaemonError):
    """A manifest that cannot be trusted; the message names the file and the problem."""


def empty(structure: str) -> dict:
    """The manifest of a structure that has no checkpoint yet."""
    return {"format": FORMAT, "structure": structure, "current": None, "slots": {}}


def checksum(entry: dict) -> int:
    """CRC32C of a slot entry without its checksum, over canonical JSON.

    It covers the file list and, with it, the LSNs and counts: a manifest
    damaged on disk must not send recovery to the wrong place in the log.
    """
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def load(directory: Path, structure: str) -> dict:
    """The manifest in ``directory`` (the empty one if there is none yet).

    Raises ManifestError naming the file if it is unreadable, not a format-1
    manifest, or belongs to another structure.
    """
    path = directory / NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty(structure)
    except OSError as err:
        raise ManifestError(f"{path}: cannot read the SRDS manifest: {err.strerror}") from err
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise ManifestError(f"{path}: the SRDS manifest is not JSON ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{path}: not an SRDS manifest of format {FORMAT}")
    if manifest.get("structure") != structure:
        raise ManifestError(
            f"{path}: the SRDS manifest of structure {manifest.get('structure')}, not {structure}"
        )
    if not isinstance(manifest.get("slots"), dict):
        raise ManifestError(f"{path}: the SRDS manifest has no slot table")
    return manifest


def store(directory: Path, manifest: dict) -> None:
    """Replace the manifest in ``directory`` durably and atomically."""
    data = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    replace_file(directory / NAME, data)
