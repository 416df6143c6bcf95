"""Daemon addresses: ``unix://PATH``, ``tcp://HOST:PORT``, ``tls://HOST:PORT``.

``unix:///run/cqsd/cqsd.sock`` is an absolute path, ``unix://./cqsd.sock`` (or
any path not starting with ``/``) is relative to the current directory. IPv6
hosts are written in brackets: ``tcp://[::1]:7410``. The default address is
``$CQSD_ADDRESS``, else ``unix://./cqsd-data/cqsd.sock``, where the daemon's
embedded default configuration puts its socket (docs/operations.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_ADDRESS", "Address", "default_address", "parse_address"]

DEFAULT_ADDRESS = "unix://./cqsd-data/cqsd.sock"
ADDRESS_ENV = "CQSD_ADDRESS"


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed address; ``path`` for unix, ``host`` and ``port`` otherwise."""

    scheme: Literal["unix", "tcp", "tls"]
    text: str
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        return self.text


def default_address() -> str:
    """``$CQSD_ADDRESS`` if set and not empty, else :data:`DEFAULT_ADDRESS`."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def parse_address(address: str | None) -> Address:
    """Parse *address* (None means the default). Raises ValueError naming the problem."""
    text = default_address() if address is None else address
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError(
            f"address {text!r} has no scheme: use unix://PATH, tcp://HOST:PORT or tls://HOST:PORT"
        )
    if scheme == "unix":
        if not rest:
            raise ValueError(f"address {text!r} has no socket path")
        return Address("unix", text, path=rest)
    if scheme in ("tcp", "tls"):
        host, port = _host_port(text, rest)
        return Address(scheme, text, host=host, port=port)  # type: ignore[arg-type]
    raise ValueError(f"address {text!r}: unknown scheme {scheme!r} (use unix, tcp or tls)")


def _host_port(text: str, rest: str) -> tuple[str, int]:
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or not tail.startswith(":"):
            raise ValueError(f"address {text!r}: write IPv6 hosts as [HOST]:PORT")
        port_text = tail[1:]
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise ValueError(f"address {text!r} needs a port: HOST:PORT")
    if not host:
        raise ValueError(f"address {text!r} has no host")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {text!r}: port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)
