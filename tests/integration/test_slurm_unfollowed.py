"""A Slurm app whose supervising process is gone, read by another process (accounting on).

Slurm gives every component of a het job the job's exit code; each replica's
own exit record (its pump's ``exit.json``) says how it really ended. The
first reader to see the end of an app nobody follows records it: the final
state, the replicas' codes and the app's times then outlive the job in Slurm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, ReplicaState, Supervisor

from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

# Submits a two-replica app (one fails with 7, the other would succeed later) and exits:
# nobody follows the app to its end.
SUBMIT_AND_LEAVE = """
import anyio
from supervisor import AppDef, Role, Supervisor

async def main():
    async with Supervisor(session="owner") as sv:
        app = AppDef(name="pair", roles=[
            Role(name="bad", entrypoint="sh", args=["-c", "sleep 1; exit 7"]),
            # One process: Slurm's stop signals every process of the step in turn, and a
            # shell whose sleep died first could still run its "exit 0" (seen once).
            Role(name="good", entrypoint="sleep", args=["20"]),
        ])
        print(await sv.submit(app, "slurm"), flush=True)

anyio.run(main)
"""


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.mark.timeout(240)
async def test_an_end_nobody_followed_is_told_by_each_replica_and_recorded_once(
    cluster: dict[str, object], state_dir: Path
) -> None:
    owner = await anyio.run_process([sys.executable, "-c", SUBMIT_AND_LEAVE], check=False)
    handle = owner.stdout.decode().strip()
    assert handle.startswith("slurm://"), owner.stderr.decode()
    async with Supervisor(session="reader") as sv:
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.FAILED, status
        assert status.msg == "bad/0 exited with code 7", status
        bad, good = status.replica("bad", 0), status.replica("good", 0)
        assert bad is not None and (bad.state, bad.exit_code) == (ReplicaState.FAILED, 7)
        # Stopped with the gang when "bad" failed, as its owner would have decided.
        assert good is not None and good.state is ReplicaState.CANCELLED, good
        described = await sv.describe(handle)
        assert described is not None and described.to_status() == status
        moves = [(t.source, t.dest) for t in described.transitions if t.role is None]
        assert moves[-1] == ("RUNNING", "FAILED"), described.transitions
        assert moves.count(("RUNNING", "FAILED")) == 1  # recorded once, however often read
        times = described.times
        assert times.submitted is not None and times.started is not None, times
        assert times.ended is not None and times.submitted <= times.started < times.ended
        [listed] = [a for a in await sv.list("slurm") if a.app_handle == handle]
        assert (listed.state, listed.times) == (AppState.FAILED, times)
    [record] = [p async for p in anyio.Path(state_dir).glob("**/owner/pair-*/state.json")]
    assert json.loads(await record.read_text())["final"] is True


async def test_an_app_whose_supervisor_closed_is_recorded_by_the_next_reader(
    cluster: dict[str, object], state_dir: Path
) -> None:
    from supervisor import AppDef, Role

    app = AppDef(name="left", roles=[Role(name="r", entrypoint="sh", args=["-c", "sleep 3"])])
    async with Supervisor(session="owner") as owner:
        handle = await owner.submit(app, "slurm")
    # This process lives on, but its Supervisor closed: it follows the app no more.
    async with Supervisor(session="reader") as sv:
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        described = await sv.describe(handle)
        assert described is not None and described.times.ended is not None, described
    [record] = [p async for p in anyio.Path(state_dir).glob("**/owner/left-*/state.json")]
    assert json.loads(await record.read_text())["final"] is True
