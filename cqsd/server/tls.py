"""TLS on the TCP listener: TLS 1.2 at least, optional client certificates, and
certificates that SIGHUP replaces without a restart.

The listener wraps each accepted connection with whatever context is current
when it arrives, so a reload (new certificate, key or client CA) applies to the
next connection and leaves the open ones as they are. A client certificate, when
``tls_client_ca`` asks for one, is checked against that CA by the handshake;
its common name is what ``access.py`` maps to a client name.
"""

import ssl

import trio

from ..config import DaemonConfig


def context(d: DaemonConfig) -> ssl.SSLContext:
    """A server context for ``d``'s certificate; raises OSError or ssl.SSLError."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(d.tls_cert, d.tls_key)
    if d.tls_client_ca:
        ctx.load_verify_locations(cafile=d.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class Listener(trio.abc.Listener[trio.SSLStream]):
    """trio.SSLListener with a context that can be replaced (``current``)."""

    def __init__(self, transport: trio.abc.Listener, current: ssl.SSLContext) -> None:
        self.transport = transport
        self.current = current

    async def accept(self) -> trio.SSLStream:
        stream = await self.transport.accept()
        return trio.SSLStream(stream, self.current, server_side=True)

    async def aclose(self) -> None:
        await self.transport.aclose()


async def handshake(stream: trio.SSLStream, seconds: float) -> str:
    """Complete the handshake within ``seconds``; the client certificate's common
    name ("" without one). Raises trio.BrokenResourceError (a failed handshake) or
    trio.TooSlowError."""
    with trio.fail_after(seconds):
        await stream.do_handshake()
    return common_name(stream.getpeercert())


def common_name(cert: dict | None) -> str:
    """The subject common name of a certificate as ``getpeercert`` gives it."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return ""
