"""Fixtures shared by the logstream tests."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


@pytest.fixture
def fsync_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count os.fsync and os.fdatasync calls (by every module) while still doing them."""
    calls: list[int] = []

    def counting(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            calls.append(fd)
            real(fd)

        return sync

    monkeypatch.setattr(os, "fsync", counting(os.fsync))
    monkeypatch.setattr(os, "fdatasync", counting(os.fdatasync))
    return calls
