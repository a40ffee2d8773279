"""Replica directories of a big local app are made while its first replicas start.

The first ``DIRS_BEFORE_SPAWNS`` are made with the app's records; the rest in
batches, each replica waiting for its own. Every replica must find its
directory there when it starts, and a batch that cannot be made must fail only
its replicas, saying why.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, ReplicaState, RetryPolicy, Role, Supervisor
from supervisor.backends.local.backend import DIRS_BEFORE_SPAWNS, DIRS_PER_HOP
from supervisor.backends.store import AppStore

from .helpers import app

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

# Each replica writes into its own directory at once: it must be there when it starts.
WRITES_ITS_DIR = 'echo "$ASUPERVISOR_ROLE/$ASUPERVISOR_REPLICA_ID" > "$PET_LOG_DIR/mine"'


def _role(
    name: str,
    replicas: int,
    max_retries: int = 0,
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION,
) -> Role:
    return Role(
        name=name,
        entrypoint="sh",
        args=["-c", WRITES_ITS_DIR],
        num_replicas=replicas,
        max_retries=max_retries,
        retry_policy=retry_policy,
    )


def _app_dir(state_dir: Path, handle: str) -> Path:
    """Where the local backend puts the app's directory by default (session "svc")."""
    return state_dir / "logs" / "svc" / handle.rsplit("/", 1)[1]


async def test_every_replica_of_a_big_app_finds_its_directory(state_dir: Path) -> None:
    # The second role starts past the first batch: its role directory comes with a batch.
    small, big = DIRS_BEFORE_SPAWNS + 4, DIRS_PER_HOP + 30
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(_role("a", small), _role("b", big)), "local")
        with anyio.fail_after(90):
            status = await sv.wait(handle)
    assert status.state is AppState.SUCCEEDED, status.msg
    app_dir = _app_dir(state_dir, handle)
    for role, count in (("a", small), ("b", big)):
        for k in range(count):
            mine = app_dir / role / str(k) / "mine"
            assert mine.read_text() == f"{role}/{k}\n"


class _FullDisk:
    """A fake fault, as a real disk cannot be made full on demand between the app's first
    directories and the rest: the batches made after the first spawns fail with ENOSPC
    (``times`` of them; every later one is made)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
        self.left = times
        real = AppStore.make_replica_dirs

        def make(replica_dirs: Sequence[Path]) -> None:
            if replica_dirs and replica_dirs[0].name != "0" and self.left > 0:
                self.left -= 1
                raise OSError(errno.ENOSPC, "No space left on device", str(replica_dirs[0]))
            real(replica_dirs)

        monkeypatch.setattr(AppStore, "make_replica_dirs", staticmethod(make))


async def test_a_batch_of_directories_that_cannot_be_made_fails_only_its_replicas(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _FullDisk(monkeypatch, times=1)
    replicas = DIRS_BEFORE_SPAWNS + 5
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(_role("w", replicas)), "local")
        with anyio.fail_after(60):
            status = await sv.wait(handle)
    assert status.state is AppState.FAILED
    assert "cannot create" in status.msg and "No space left on device" in status.msg, status.msg
    app_dir = _app_dir(state_dir, handle)
    for replica in status.roles[0].replicas:
        if replica.id < DIRS_BEFORE_SPAWNS:
            # Made with the records: they ran (or were stopped by the gang's failure).
            assert replica.state in (ReplicaState.SUCCEEDED, ReplicaState.CANCELLED), replica
        else:
            # Its batch failed: it never ran, its failure (or the stop it met) says so.
            assert replica.state in (ReplicaState.FAILED, ReplicaState.CANCELLED), replica
            assert not (app_dir / "w" / str(replica.id)).exists()
    failed = [r for r in status.roles[0].replicas if r.state is ReplicaState.FAILED]
    assert failed and all(r.exit_code == 127 and "cannot create" in r.msg for r in failed)


async def test_a_retry_makes_the_directory_its_first_attempt_could_not(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _FullDisk(monkeypatch, times=1)
    replicas = DIRS_BEFORE_SPAWNS + 1  # one replica in the batch: retries count per role
    role = _role("w", replicas, max_retries=1, retry_policy=RetryPolicy.REPLICA)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        with anyio.fail_after(60):
            status = await sv.wait(handle)
    assert status.state is AppState.SUCCEEDED, status.msg
    app_dir = _app_dir(state_dir, handle)
    for k in range(replicas):
        assert (app_dir / "w" / str(k) / "mine").read_text() == f"w/{k}\n"
    retried = [r.id for r in status.roles[0].replicas if r.restarts]
    assert retried == [DIRS_BEFORE_SPAWNS]
