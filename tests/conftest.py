"""Shared fixtures: anyio on asyncio, and a private state directory per test."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every Supervisor (and CLI child process) at a fresh state directory."""
    home = tmp_path / "state"
    monkeypatch.setenv("ASUPERVISOR_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def _library_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    """Keep the library's debug trace: pytest shows it only for a failed test."""
    caplog.set_level(logging.DEBUG, logger="supervisor")
