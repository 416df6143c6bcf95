"""Fixtures for the SDK tests: a fake cqsd on a real Unix socket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fakeserver import FakeServer, short_socket_path


@pytest.fixture
def server(tmp_path) -> Iterator[FakeServer]:
    """A running fake server; stopped (every connection cut) after the test."""
    fake = FakeServer(short_socket_path(tmp_path)).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def address(server: FakeServer) -> str:
    """The fake server's address in the SDK's unix:// form."""
    return f"unix://{server.path}"
