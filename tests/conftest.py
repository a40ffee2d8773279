"""Shared fixtures: anyio on asyncio, a private state directory per test, and the one
place that keeps every Slurm test off the cluster under ``ASUPERVISOR_SLURM_CLUSTER=skip``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.integration.slurm_cluster import is_slurm_test, skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every Slurm test, with the reason, before any of its fixtures can run."""
    reason = skip_reason()
    if reason is None:
        return
    skipped = [item for item in items if is_slurm_test(item)]
    for item in skipped:
        item.add_marker(pytest.mark.skip(reason=reason))
    if skipped:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"{reason} ({len(skipped)} tests skipped)")


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
