"""Shared fixtures: anyio on asyncio, a private state directory per test, the one
place that keeps every Slurm test off the cluster under ``ASUPERVISOR_SLURM_CLUSTER=skip``,
and the cross-run lock on the cluster (``tests/host_lock.py``): every Slurm test holds it
shared, a ``slurm_exclusive`` one (it disturbs every user of the cluster) exclusive."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.host_lock import HostLockError, host_lock
from tests.integration.slurm_cluster import is_slurm_test, skip_reason

_LOCK_FAILED = pytest.StashKey[str]()


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


def _cluster_lock_mode(item: pytest.Item) -> str | None:
    """How a test holds the cluster lock: ``exclusive``, ``shared``, or not at all."""
    if skip_reason() is not None:
        return None
    if item.get_closest_marker("slurm_exclusive") is not None:
        return "exclusive"
    return "shared" if is_slurm_test(item) else None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Hold the cluster lock over the test's setup, call and teardown (module fixtures
    that reconfigure the cluster included). Outside pytest-timeout's timer: a wait for
    another run is bounded by ``ASUPERVISOR_TEST_LOCK_WAIT``, not the test's timeout."""
    mode = _cluster_lock_mode(item)
    if mode is None:
        yield
        return
    lock = host_lock()
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    queued_at = 0.0

    def queued() -> None:
        nonlocal queued_at
        queued_at = time.monotonic()
        if reporter is not None:
            reporter.write_line(f"{item.nodeid}: waits for the Slurm cluster lock ({mode})")

    try:
        lock.acquire(exclusive=mode == "exclusive", what=item.nodeid, on_queued=queued)
        if queued_at and reporter is not None:
            waited = time.monotonic() - queued_at
            reporter.write_line(f"{item.nodeid}: has the lock ({mode}) after {waited:.1f} s")
    except HostLockError as e:
        item.stash[_LOCK_FAILED] = str(e)  # failed in its setup, below: no internal error
        yield
        return
    try:
        yield
    finally:
        lock.release()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    failure = item.stash.get(_LOCK_FAILED, None)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


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


def _our_queued_slurm_jobs(basetemp: Path) -> set[str]:
    """Ids of the jobs in the controller whose output goes below this pytest run's
    ``basetemp`` (a het job by its leader's id): jobs of other runs and other users of the
    cluster are never ours. Empty when the controller cannot say."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "-O", "JobID:|,STDOUT:"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if done.returncode != 0:
        return set()
    ours = set()
    for line in done.stdout.splitlines():
        job_id, _, stdout = line.partition("|")
        if stdout.strip().startswith(f"{basetemp}/"):
            ours.add(job_id.strip().split("+")[0])
    return ours


@pytest.fixture(autouse=True)
def _no_slurm_job_outlives_its_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A Slurm test that fails mid-way leaves its (durable) job queued or running, and the
    3-node cluster is then full for every test after it: such jobs are cancelled, saying so.
    Only jobs writing below this run's basetemp count, so two runs (or another user of the
    cluster) beside this one are left alone; tests that sbatch by hand write there too."""
    if not is_slurm_test(request.node) or skip_reason() is not None or not shutil.which("squeue"):
        yield
        return
    basetemp = tmp_path_factory.getbasetemp().resolve()
    before = _our_queued_slurm_jobs(basetemp)
    yield
    left = sorted(_our_queued_slurm_jobs(basetemp) - before)
    if left:
        print(f"cancelling Slurm jobs the test left behind: {', '.join(left)}")
        subprocess.run(["scancel", *left], capture_output=True, timeout=60, check=False)
