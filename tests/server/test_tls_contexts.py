"""The TLS listener's pieces in-process: the server context made from the configured
certificate, key and client CA (TLS 1.2 at least; a client certificate required only
with a CA), the handshake's client common name, a listener whose context a reload
replaces for the next connection, and certificate files that are missing or cannot be
read, refused by the config naming them before any context is made.

Certificates come from a throwaway CA (``Pki`` of the daemon's TLS tests); handshakes
run over trio's in-memory streams, so no socket is opened.
"""

import contextlib
import hashlib
import ssl

import pytest
import trio
import trio.testing

from cqsd import config
from cqsd.config import ConfigError, loads
from cqsd.server import tls
from tests.daemon.test_tls import Pki

DIGEST = hashlib.sha256(b"s3cret").hexdigest()
HANDSHAKE = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate it signs and a client certificate for CN "IMS1"."""
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.server = p.issue("server", "server", server=True)
    p.client = p.issue("client", "IMS1")
    return p


def daemon_config(cert, key, ca=""):
    """The [daemon] table of a config with TLS on the TCP listener."""
    ca_line = f'tls_client_ca = "{ca}"\n' if ca else ""
    return loads(f'[daemon]\ntcp = "127.0.0.1:1"\ntls_cert = "{cert}"\ntls_key = "{key}"\n'
                 f'{ca_line}[[structure]]\nname = "S"\nsize = "1MiB"\n'
                 f'[[client]]\nname = "A"\nsecret_sha256 = "{DIGEST}"\n').daemon


def client_context(pki, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.check_hostname = False  # the in-memory peer has no address to match
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def shake(server_ctx, client_ctx):
    """Both sides' handshakes over a memory stream pair: what the server side's ended
    in, the common name or the BrokenResourceError of a failed handshake (the client
    side is then cancelled: under TLS 1.3 it may have finished before the server
    refused it)."""
    server_end, client_end = trio.testing.memory_stream_pair()
    server = trio.SSLStream(server_end, server_ctx, server_side=True)
    client = trio.SSLStream(client_end, client_ctx)
    outcome: list[str | trio.BrokenResourceError] = []

    async def serve(nursery):
        try:
            outcome.append(await tls.handshake(server, HANDSHAKE))
        except trio.BrokenResourceError as err:
            outcome.append(err)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, nursery)
        with contextlib.suppress(trio.BrokenResourceError):
            await client.do_handshake()
    return outcome[0]


def test_the_context_asks_tls_1_2_and_no_client_certificate_without_a_ca(pki):
    """Without tls_client_ca the context requires TLS 1.2 and does not ask for a client
    certificate."""
    ctx = tls.context(daemon_config(*pki.server))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE


async def test_a_handshake_without_a_client_certificate_has_no_common_name(pki):
    """The server's certificate is the configured one (the client trusts the CA), and the
    common name of a connection with no client certificate is empty."""
    assert await shake(tls.context(daemon_config(*pki.server)), client_context(pki)) == ""


async def test_a_client_certificate_signed_by_the_ca_gives_its_common_name(pki):
    """With tls_client_ca the handshake checks the client's certificate and yields its CN."""
    ctx = tls.context(daemon_config(*pki.server, ca=pki.ca))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert await shake(ctx, client_context(pki, *pki.client)) == "IMS1"


async def test_with_a_ca_a_client_without_a_certificate_fails_the_handshake(pki):
    """A required client certificate that is not presented ends the handshake broken."""
    ctx = tls.context(daemon_config(*pki.server, ca=pki.ca))
    assert isinstance(await shake(ctx, client_context(pki)), trio.BrokenResourceError)


async def test_a_silent_peer_times_the_handshake_out(pki, autojump_clock):
    """A connection that never sends its hello is TooSlowError after the given seconds."""
    server_end, _client_end = trio.testing.memory_stream_pair()
    stream = trio.SSLStream(server_end, tls.context(daemon_config(*pki.server)),
                            server_side=True)
    start = trio.current_time()
    with pytest.raises(trio.TooSlowError):
        await tls.handshake(stream, HANDSHAKE)
    assert trio.current_time() - start == pytest.approx(HANDSHAKE)


class _Transport(trio.abc.Listener[trio.abc.Stream]):
    """A TCP listener's stand-in: hands out one end of a memory stream pair per accept."""

    def __init__(self) -> None:
        self.closed = False

    async def accept(self) -> trio.abc.Stream:
        server_end, _ = trio.testing.memory_stream_pair()
        return server_end

    async def aclose(self) -> None:
        self.closed = True


async def test_the_listener_wraps_each_connection_with_the_current_context(pki):
    """A reload replaces ``current``: the next connection gets the new context, one
    accepted before keeps the old; closing the listener closes its transport."""
    first = tls.context(daemon_config(*pki.server))
    second = tls.context(daemon_config(*pki.server, ca=pki.ca))
    transport = _Transport()
    listener = tls.Listener(transport, first)
    before = await listener.accept()
    listener.current = second
    after = await listener.accept()
    assert before.context is first
    assert after.context is second
    await listener.aclose()
    assert transport.closed


def test_common_name_reads_the_subject_and_is_empty_without_one():
    """The CN is found among the subject's RDNs; no certificate or no CN gives ""."""
    cert = {"subject": ((("countryName", "GB"),), (("commonName", "IMS2"),))}
    assert tls.common_name(cert) == "IMS2"
    assert tls.common_name({"subject": ((("organizationName", "X"),),)}) == ""
    assert tls.common_name(None) == ""
    assert tls.common_name({}) == ""


def test_a_missing_certificate_file_is_refused_naming_it(pki, tmp_path):
    """The config names the key and the path of a certificate file that is not there."""
    missing = tmp_path / "gone.pem"
    with pytest.raises(ConfigError) as refused:
        daemon_config(missing, pki.server[1])
    assert any(p.startswith("daemon.tls_cert") and str(missing) in p
               for p in refused.value.problems)


def test_a_missing_client_ca_file_is_refused_naming_it(pki, tmp_path):
    """The same holds for tls_client_ca."""
    missing = tmp_path / "no-ca.pem"
    with pytest.raises(ConfigError) as refused:
        daemon_config(*pki.server, ca=missing)
    assert any(p.startswith("daemon.tls_client_ca") and str(missing) in p
               for p in refused.value.problems)


def test_an_unreadable_key_file_is_refused_naming_it(pki, monkeypatch):
    """A key the daemon may not read is refused naming it (the permission is faked: the
    tests may run as root, whom no mode keeps out)."""
    key = str(pki.server[1])
    real = config.os.access
    monkeypatch.setattr(config.os, "access",
                        lambda path, mode: False if str(path) == key else real(path, mode))
    with pytest.raises(ConfigError) as refused:
        daemon_config(pki.server[0], key)
    assert [p for p in refused.value.problems if p.startswith("daemon.tls_key")] == [
        f"daemon.tls_key: cannot read file: {key}"]


def test_a_certificate_gone_after_the_config_was_read_raises_oserror(pki, tmp_path):
    """Files that vanish between the config check and a reload make ``context`` raise
    OSError, which the reload reports and survives."""
    cert = tmp_path / "cert.pem"
    cert.write_bytes(pki.server[0].read_bytes())
    d = daemon_config(cert, pki.server[1])
    cert.unlink()
    with pytest.raises(OSError):
        tls.context(d)


def test_a_file_that_is_not_a_certificate_raises_ssl_error(pki, tmp_path):
    """A readable file holding no PEM certificate passes the config's file check but
    ``context`` refuses it with ssl.SSLError."""
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n")
    d = daemon_config(bogus, pki.server[1])
    with pytest.raises(ssl.SSLError):
        tls.context(d)
