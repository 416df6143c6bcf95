"""The SDK over tls:// against the fake server with a throwaway self-signed certificate."""

from __future__ import annotations

import ssl
import subprocess
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

import cqsclient
import cqsclient.aio
from cqsclient import errors

from .fakeserver import FakeServer, ok


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for localhost: (cert path, key path)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


@pytest.fixture
def tls_server(certificate):
    """The fake server on TCP 127.0.0.1 with TLS."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    fake = FakeServer(None, tls=context).start()
    try:
        yield fake
    finally:
        fake.stop()


def test_blocking_client_over_tls_pipelines_threads(tls_server, certificate):
    """Over TLS, several threads pipeline on one connection and every reply finds its caller."""
    tls_server.shuffle = True
    tls_server.handlers["put"] = lambda conn, f: ok(f["id"], entry_id=int(f["data"]))
    address = f"tls://localhost:{tls_server.port}"
    with cqsclient.connect(address, client="TLS1", cafile=certificate[0]) as c:
        s = c.structure("MSGQ01")

        def work(t):
            for i in range(100):
                assert s.put("Q", str(t * 1000 + i).encode()) == t * 1000 + i

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
    assert len(tls_server.ops("put")) == 400


def test_untrusted_certificate_cannot_connect(tls_server):
    """A server certificate the client does not trust is a CannotConnect naming the address."""
    address = f"tls://localhost:{tls_server.port}"
    with pytest.raises(errors.CannotConnect, match=address):
        cqsclient.connect(address, client="TLS1")


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_async_client_over_tls(tls_server, certificate, backend):
    """The async client connects with a CA file and round trips over TLS."""
    address = f"tls://localhost:{tls_server.port}"

    async def main():
        async with cqsclient.aio.connect(address, client="TLS2", cafile=certificate[0]) as c:
            s = await c.structure("MSGQ01")
            eid = await s.put("Q", b"secret")
            assert (await s.read("Q")).entry_id == eid

    anyio.run(main, backend=backend)
