"""Waits on a Slurm app that another Supervisor follows share that Supervisor's poller.

Slurm has no event stream, so the guide allows polling only through one shared
poller: every wait for another process's app hears of its job from the same
``squeue`` per tick, and looks at the app again only when the job changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppDef, AppState, AppStatus, Role, Supervisor

from .slurm_cluster import ensure_cluster, until_running

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

WAITERS = 5
RUN_S = 20


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.mark.timeout(180)
async def test_waits_for_another_supervisors_app_share_one_poller(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="w", entrypoint="sleep", args=[str(RUN_S)])
    ended: list[AppStatus] = []
    async with Supervisor(session="owner") as owner:
        handle = await owner.submit(AppDef(name="shared", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(owner, handle)
        async with Supervisor(session="reader") as reader:
            backend = reader.backend("slurm")

            async def wait_once() -> None:
                ended.append(await reader.wait(handle, timeout=120))

            async with anyio.create_task_group() as tg:
                for _ in range(WAITERS):
                    tg.start_soon(wait_once)
                await anyio.sleep(3)
                during: dict[str, Any] = backend.statistics()
            after: dict[str, Any] = backend.statistics()
    assert [s.state for s in ended] == [AppState.SUCCEEDED] * WAITERS, ended
    assert during["tracked_jobs"] == 1  # the five waiters, one job tracked once
    assert after["tracked_jobs"] == 0  # each waiter stopped listening when it returned
    assert after["ticks"] >= 3  # the poller told them, tick after tick
    # Besides the ticks, a waiter asks Slurm only to look at the app: once at the start,
    # then once per change of the job (RUNNING, completing, ended). Looking every second
    # instead would be about RUN_S looks per waiter.
    looks = after["queue_calls"] - after["ticks"]
    assert looks <= 6 * WAITERS, after
