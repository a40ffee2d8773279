"""The slurm backend on a cluster without accounting (no slurmdbd), as many real ones are.

While a job is in the controller everything works as with accounting; once
it has left (MinJobAge, 30 s on this test cluster), nothing can say how it
ended, and the backend says so instead of guessing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, ReplicaState, Role, Supervisor

from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, object]]:
    facts = ensure_cluster(accounting=False)
    try:
        yield facts
    finally:
        ensure_cluster(accounting=True)  # the other Slurm tests expect accounting


@pytest.mark.timeout(300)
async def test_correct_in_the_controller_and_unknown_with_a_reason_after(
    cluster: dict[str, object], state_dir: Path
) -> None:
    ok = Role(name="ok", entrypoint="sleep", args=["1"])
    bad = Role(name="bad", entrypoint=sys.executable, args=["-c", "import sys; sys.exit(4)"])
    async with Supervisor(session="svc") as sv:
        good = await sv.submit(AppDef(name="good", roles=[ok]), "slurm")
        failing = await sv.submit(AppDef(name="failing", roles=[bad]), "slurm")
        assert (await sv.wait(good, timeout=90)).state is AppState.SUCCEEDED
        failed = await sv.wait(failing, timeout=90)
        assert failed.state is AppState.FAILED
        replica = failed.replica("bad", 0)
        assert replica is not None and replica.exit_code == 4
        assert sv.statistics()["slurm"]["accounting"] in (None, False)
    # Another process, once the controller has forgotten the job.
    async with Supervisor(session="later") as other:
        with anyio.fail_after(200):
            while True:
                described = await other.describe(good)
                assert described is not None
                if described.state is not AppState.SUCCEEDED:
                    break
                await anyio.sleep(5)  # Slurm purges finished jobs on its own schedule
        assert described.state is AppState.UNKNOWN, described
        assert "keeps no accounting" in described.msg
        assert all(r.state is ReplicaState.UNKNOWN for r in described.roles_statuses[0].replicas)
