"""The slurm backend on a cluster without accounting (no slurmdbd), as many real ones are.

While a job is in the controller everything works as with accounting; once
it has left (MinJobAge, 30 s on this test cluster), only the final record its
supervising process wrote can say how it ended; without one, the backend says
so instead of guessing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, ReplicaState, Role, Supervisor

from .slurm_cluster import ensure_cluster

# Switching accounting off restarts the cluster's daemons under every other user: exclusive.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.slurm,
    pytest.mark.slurm_exclusive,
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, object]]:
    facts = ensure_cluster(accounting=False)
    try:
        yield facts
    finally:
        ensure_cluster(accounting=True)  # the other Slurm tests expect accounting


# Submits, then dies by SIGKILL at once: nobody records how its job ended.
ORPHANING_OWNER = """
import os, signal, anyio
from supervisor import AppDef, Role, Supervisor

async def main():
    async with Supervisor(session="owner") as sv:
        app = AppDef(name="orphan", roles=[Role(name="ok", entrypoint="sleep", args=["1"])])
        print(await sv.submit(app, "slurm"), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
"""


@pytest.mark.timeout(300)
async def test_correct_in_the_controller_and_unknown_with_a_reason_after(
    cluster: dict[str, object], state_dir: Path
) -> None:
    ok = Role(name="ok", entrypoint="sleep", args=["1"])
    bad = Role(name="bad", entrypoint=sys.executable, args=["-c", "import sys; sys.exit(4)"])
    owner = await anyio.run_process([sys.executable, "-c", ORPHANING_OWNER], check=False)
    orphan = owner.stdout.decode().strip()
    assert orphan.startswith("slurm://"), owner.stderr.decode()
    async with Supervisor(session="svc") as sv:
        good = await sv.submit(AppDef(name="good", roles=[ok]), "slurm")
        failing = await sv.submit(AppDef(name="failing", roles=[bad]), "slurm")
        assert (await sv.wait(good, timeout=90)).state is AppState.SUCCEEDED
        failed = await sv.wait(failing, timeout=90)
        assert failed.state is AppState.FAILED
        replica = failed.replica("bad", 0)
        assert replica is not None and replica.exit_code == 4
        assert sv.statistics()["slurm"]["accounting"] in (None, False)
    # Another process, once the controller has forgotten the jobs.
    async with Supervisor(session="later") as other:
        with anyio.fail_after(200):
            while True:
                described = await other.describe(orphan)
                assert described is not None
                if described.state is not AppState.SUCCEEDED:
                    break
                await anyio.sleep(5)  # Slurm purges finished jobs on its own schedule
        # Its owner died before recording the end, and Slurm no longer knows: UNKNOWN, why.
        assert described.state is AppState.UNKNOWN, described
        assert "keeps no accounting" in described.msg
        assert all(r.state is ReplicaState.UNKNOWN for r in described.roles_statuses[0].replicas)
        # The apps whose owner recorded their end keep it, long after Slurm forgot them.
        kept = await other.describe(failing)
        assert kept is not None and kept.state is AppState.FAILED
        assert kept.to_status().replica("bad", 0).exit_code == 4  # type: ignore[union-attr]
