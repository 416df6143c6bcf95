"""Where cqsctl finds its daemon and who it is there, so that the usual cases need
no flags (docs/operations.md, "cqsctl: finding the daemon").

Design note. redis-cli and rabbitmqadmin read a per-user file; cqsctl reads
one too, ``~/.config/cqsd/cqsctl.toml`` (``$XDG_CONFIG_HOME`` honoured,
``$CQSCTL_PROFILE`` names another), with ``address``, ``client``,
``secret_file``, ``config`` and ``cafile``. It also reads the daemon's own
config for its socket: ``--config``, else ``$CQSD_CONFIG``, else
``/etc/cqsd/cqsd.toml`` (the service layout). An address given outright
(``--address``, ``$CQSD_ADDRESS``) is the only one tried; otherwise cqsctl
tries, in order, the profile's address, the socket the daemon's config
names, the service layout's socket and the embedded default's, and when none
answers says which it tried, why each failed and how to point it elsewhere.

The daemon's config is read here with tomllib, not with the server's loader:
the client distribution imports nothing of the server's (tests/test_imports.py).
Relative paths in it are relative to the daemon's working directory, which
cqsctl cannot know; they are tried relative to the current one.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .address import ADDRESS_ENV, DEFAULT_ADDRESS

__all__ = ["CONFIG_ENV", "SERVICE_CONFIG", "SERVICE_SOCKET", "Candidate", "Profile",
           "candidates", "profile_path", "read_profile", "unreachable"]

CONFIG_ENV = "CQSD_CONFIG"
PROFILE_ENV = "CQSCTL_PROFILE"
SERVICE_CONFIG = "/etc/cqsd/cqsd.toml"  # config/cqsd.service reads it
SERVICE_SOCKET = "unix:///run/cqsd/cqsd.sock"  # config/systemd.toml puts it there
PROFILE_KEYS = ("address", "client", "secret_file", "config", "cafile")


@dataclass(frozen=True)
class Candidate:
    """An address to try and where it came from (said when it fails)."""

    address: str
    source: str


@dataclass
class Profile:
    """The per-user file's settings; ``path`` is None when there is no file."""

    path: str | None = None
    address: str | None = None
    client: str | None = None
    secret_file: str | None = None
    config: str | None = None
    cafile: str | None = None
    notes: list[str] = field(default_factory=list)  # why something was not used


def profile_path(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    """``$CQSCTL_PROFILE``, else ``$XDG_CONFIG_HOME/cqsd/cqsctl.toml`` (``~/.config``)."""
    if environ.get(PROFILE_ENV):
        return Path(environ[PROFILE_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "cqsd" / "cqsctl.toml"


def read_profile(path: Path) -> Profile:
    """The profile at ``path``; an empty one if there is no file. ValueError names a
    file that is there but cannot be used (a typo must not pass unnoticed)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Profile()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"profile {path}: {error}") from None
    unknown = sorted(set(doc) - set(PROFILE_KEYS))
    if unknown:
        raise ValueError(f"profile {path}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(PROFILE_KEYS)})")
    values: dict[str, Any] = {}
    for key in PROFILE_KEYS:
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"profile {path}: {key} must be a string")
        if value is not None and key in ("secret_file", "config", "cafile"):
            value = os.path.expanduser(value)
        values[key] = value
    return Profile(path=str(path), **values)


def _daemon_addresses(path: str) -> list[str]:
    """The addresses the daemon's config at ``path`` listens on: its socket (given,
    or derived from data_dir as the daemon derives it). OSError or ValueError if
    the file cannot be read as TOML."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    daemon = doc.get("daemon", {})
    if not isinstance(daemon, dict):
        raise ValueError("[daemon] is not a table")
    socket = daemon.get("socket")
    if not isinstance(socket, str) or not socket:
        data_dir = daemon.get("data_dir", "./cqsd-data")
        socket = os.path.join(data_dir if isinstance(data_dir, str) else ".", "cqsd.sock")
    return [f"unix://{socket}"]


def candidates(address: str | None, config: str | None, profile: Profile,
               environ: os._Environ[str] | dict[str, str] = os.environ,
               notes: list[str] | None = None) -> list[Candidate]:
    """The addresses to try, in order. ``address`` and ``config`` are the command
    line's; ``notes`` collects why a config file gave nothing (said if all fail)."""
    if address is not None:
        return [Candidate(address, "--address")]
    if environ.get(ADDRESS_ENV):
        return [Candidate(environ[ADDRESS_ENV], f"${ADDRESS_ENV}")]
    found: list[Candidate] = []
    if profile.address:
        found.append(Candidate(profile.address, f"address in {profile.path}"))
    if config is not None:
        configs = [(config, "--config")]
    elif environ.get(CONFIG_ENV):
        configs = [(environ[CONFIG_ENV], f"${CONFIG_ENV}")]
    elif profile.config:
        configs = [(profile.config, f"config in {profile.path}")]
    else:
        configs = [(SERVICE_CONFIG, "the service's config")]
    for path, how in configs:
        try:
            found += [Candidate(a, f"the socket in {path} ({how})")
                      for a in _daemon_addresses(path)]
        except FileNotFoundError:
            if how != "the service's config" and notes is not None:
                notes.append(f"{path} ({how}): no such file")
        except (OSError, ValueError, tomllib.TOMLDecodeError) as error:
            if notes is not None:
                notes.append(f"{path} ({how}) could not be read: "
                             f"{getattr(error, 'strerror', None) or error}")
    found += [Candidate(SERVICE_SOCKET, "the service layout's socket"),
              Candidate(DEFAULT_ADDRESS, "the embedded default's socket")]
    unique: dict[str, Candidate] = {}
    for c in found:
        unique.setdefault(c.address, c)
    return list(unique.values())


def unreachable(tried: list[tuple[Candidate, str]], notes: list[str],
                profile: str) -> str:
    """What cqsctl says when no address answered: each address, why, and the ways
    to point it elsewhere."""
    lines = ["cannot reach the daemon; tried:"]
    lines += [f"  {c.address}  ({c.source}): {why}" for c, why in tried]
    lines += [f"  note: {note}" for note in notes]
    lines += ["point cqsctl at the daemon with --address unix:///PATH/cqsd.sock (or tcp://, "
              f"tls://), ${ADDRESS_ENV}, --config /etc/cqsd/cqsd.toml or ${CONFIG_ENV} (the "
              f"daemon's config: its socket), or address = \"...\" in {profile}"]
    return "\n".join(lines)
