"""The slurm backend on a cluster without accounting (no slurmdbd), as many real ones are.

While a job is in the controller everything works as with accounting; once
it has left (MinJobAge, 30 s on this test cluster), only the final record its
supervising process wrote, or each replica's own exit record, can say how it
ended; without either, the backend says so instead of guessing.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, ReplicaState, Role, Supervisor, parse_handle

from .slurm_cluster import ensure_cluster, until

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


# Submits an app whose one replica runs the given shell command, prints the handle and
# the Slurm job id, then dies by SIGKILL: nobody follows the app, nobody records its end.
ORPHANING_OWNER = """
import os, signal, sys, anyio
from supervisor import AppDef, Role, Supervisor

async def main():
    async with Supervisor(session="owner") as sv:
        role = Role(name="r", entrypoint="sh", args=["-c", sys.argv[1]])
        handle = await sv.submit(AppDef(name="orphan", roles=[role]), "slurm")
        print(handle, (await sv.describe(handle)).metadata["slurm_job_id"], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
"""


async def orphan(command: str) -> tuple[str, str]:
    """(handle, Slurm job id) of an app running ``command`` whose owner is dead."""
    owner = await anyio.run_process([sys.executable, "-c", ORPHANING_OWNER, command], check=False)
    handle, job_id = owner.stdout.decode().split()
    assert handle.startswith("slurm://"), owner.stderr.decode()
    return handle, job_id


async def forgotten(job_id: str) -> None:
    """Until the controller no longer knows the job (MinJobAge): nobody looks at it meanwhile."""

    async def known() -> bool:
        shown = await anyio.run_process(["scontrol", "show", "job", job_id], check=False)
        return shown.returncode == 0

    await until(known, lambda k: not k, 200, f"Slurm forgetting job {job_id}")


@pytest.mark.timeout(360)
async def test_correct_in_the_controller_and_after_it_by_each_replicas_own_record(
    cluster: dict[str, object], state_dir: Path
) -> None:
    ok = Role(name="ok", entrypoint="sleep", args=["1"])
    bad = Role(name="bad", entrypoint=sys.executable, args=["-c", "import sys; sys.exit(4)"])
    ended, ended_job = await orphan("sleep 1; exit 3")
    # Its pump is killed by SIGKILL (a node dying looks so): no record says how it ended.
    lost, lost_job = await orphan("sleep 600")
    async with Supervisor(session="svc") as sv:
        good = await sv.submit(AppDef(name="good", roles=[ok]), "slurm")
        failing = await sv.submit(AppDef(name="failing", roles=[bad]), "slurm")
        assert (await sv.wait(good, timeout=90)).state is AppState.SUCCEEDED
        failed = await sv.wait(failing, timeout=90)
        assert failed.state is AppState.FAILED
        replica = failed.replica("bad", 0)
        assert replica is not None and replica.exit_code == 4
        assert sv.statistics()["slurm"]["accounting"] in (None, False)
    await until(  # the replica's step runs (its pump with it)
        partial(anyio.run_process, ["squeue", "-h", "--steps", "-j", lost_job], check=False),
        lambda shown: f"{lost_job}.0 " in shown.stdout.decode(),
        60,
        f"job {lost_job}'s step running",
    )
    # The cluster's nodes run on this machine: the pump is a process here. (Slurm's own
    # signals would not do: the pump outlives them and records how its command ended.)
    # The pump alone: its ``srun`` lines name it too, and a killed srun has Slurm end the
    # step's tasks, so the pump could be gone (or have recorded its end) before its kill.
    pump = rf"^[^ ]+ -S [^ ]*pump\.py .*{parse_handle(lost).app_id}"
    found = await anyio.run_process(["pgrep", "-f", pump], check=False)
    assert found.stdout.split(), f"no pump of {lost} running"
    for pid in found.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    await forgotten(ended_job)
    await forgotten(lost_job)
    # Another process, once the controller has forgotten the jobs.
    async with Supervisor(session="later") as other:
        # Nobody recorded its end, and Slurm no longer knows it: its replica's record does.
        told = await other.describe(ended)
        assert told is not None and told.state is AppState.FAILED, told
        assert told.to_status().replica("r", 0).exit_code == 3  # type: ignore[union-attr]
        assert told.times.ended is not None
        # No record anywhere: UNKNOWN, saying why.
        described = await other.describe(lost)
        assert described is not None and described.state is AppState.UNKNOWN, described
        assert "keeps no accounting" in described.msg
        assert all(r.state is ReplicaState.UNKNOWN for r in described.roles_statuses[0].replicas)
        # The apps whose owner recorded their end keep it, long after Slurm forgot them.
        kept = await other.describe(failing)
        assert kept is not None and kept.state is AppState.FAILED
        assert kept.to_status().replica("bad", 0).exit_code == 4  # type: ignore[union-attr]
