"""Fixtures shared by the logstream tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def fsync_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count os.fsync calls (all of them, by every module) while still doing them."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls
