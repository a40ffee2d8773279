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

from supervisor import AppState, ReplicaState, ReplicaStatus, Supervisor

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


async def _submitted_by_a_process_that_left(script: str) -> str:
    """The handle ``script`` printed: it submitted one app and exited, following nothing."""
    owner = await anyio.run_process([sys.executable, "-c", script], check=False)
    handle = owner.stdout.decode().strip()
    assert handle.startswith("slurm://"), owner.stderr.decode()
    return handle


@pytest.mark.timeout(240)
async def test_an_end_nobody_followed_is_told_by_each_replica_and_recorded_once(
    cluster: dict[str, object], state_dir: Path
) -> None:
    handle = await _submitted_by_a_process_that_left(SUBMIT_AND_LEAVE)
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


# Submits three apps and exits: one held (PENDING until someone releases it), one that
# sleeps, one whose replica is killed by SIGKILL at once. Prints "name handle" lines.
SUBMIT_THREE_AND_LEAVE = """
import anyio
from supervisor import AppDef, Role, Supervisor

async def main():
    async with Supervisor(session="owner") as sv:
        for name, code, cfg in (
            ("held", "exit 0", {"hold": True}),
            ("sleeper", "exec sleep 600", {}),
            ("killed", "kill -9 $$$$", {}),  # $$ is the macros' escape of $
        ):
            app = AppDef(name=name, roles=[Role(name="r", entrypoint="sh", args=["-c", code])])
            print(name, await sv.submit(app, "slurm", cfg), flush=True)

anyio.run(main)
"""


async def _replica_when(sv: Supervisor, handle: str, state: AppState) -> ReplicaStatus:
    """The replica of a one-replica app, read once the app is in ``state``."""
    with anyio.fail_after(120):
        while True:
            described = await sv.describe(handle)
            assert described is not None
            status = described.to_status()
            if status.state is state:
                replica = status.replica("r", 0)
                assert replica is not None
                return replica
            await anyio.sleep(0.2)


@pytest.mark.timeout(240)
async def test_a_reader_tells_an_unfollowed_app_as_its_owner_would(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Before: a waiting or running replica read ``exit_code`` 0 (Slurm's 0:0); an app
    cancelled while it waited got the cancel's time as its start; a replica killed by a
    signal made a FAILED app with no message; and ``list`` showed no name for an app
    whose end a reader recorded."""
    owner = await anyio.run_process([sys.executable, "-c", SUBMIT_THREE_AND_LEAVE], check=False)
    handles = dict(line.split() for line in owner.stdout.decode().splitlines())
    assert set(handles) == {"held", "sleeper", "killed"}, owner.stderr.decode()
    async with Supervisor(session="reader") as sv:
        held = await _replica_when(sv, handles["held"], AppState.PENDING)
        assert (held.exit_code, held.signal) == (None, None), held
        running = await _replica_when(sv, handles["sleeper"], AppState.RUNNING)
        assert (running.exit_code, running.signal) == (None, None), running
        for name in ("held", "sleeper"):
            await sv.cancel(handles[name])

        cancelled = await sv.wait(handles["held"], timeout=120)
        assert cancelled.state is AppState.CANCELLED, cancelled
        [replica] = cancelled.roles[0].replicas
        assert replica.exit_code is None, replica
        described = await sv.describe(handles["held"])
        assert described is not None
        assert described.times.started is None, described.times

        killed = await sv.wait(handles["killed"], timeout=120)
        assert killed.state is AppState.FAILED, killed
        assert killed.msg == "r/0 killed by SIGKILL", killed
        [replica] = killed.roles[0].replicas
        assert (replica.exit_code, replica.signal) == (-9, "SIGKILL"), replica  # as the owner

        assert (await sv.wait(handles["sleeper"], timeout=120)).state is AppState.CANCELLED
        listed = {a.app_handle: a for a in await sv.list("slurm")}
        for name, handle in handles.items():
            assert listed[handle].name == name, listed[handle]


# Submits a one-minute job with a retry and exits: attempt 0 outlives the time limit,
# attempt 1 ends at once.
SUBMIT_TIMED_AND_LEAVE = """
import anyio
from supervisor import AppDef, Role, Supervisor

CODE = 'if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then exec sleep 600; fi; echo retried'

async def main():
    async with Supervisor(session="owner") as sv:
        role = Role(name="r", entrypoint="sh", args=["-c", CODE], max_retries=1)
        print(await sv.submit(AppDef(name="timed", roles=[role]), "slurm", {"time": "1"}))

anyio.run(main)
"""


@pytest.mark.timeout(360)  # Slurm ends attempt 0 a minute in
async def test_a_time_limit_nobody_followed_is_left_for_the_supervisor_that_attaches(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """A job Slurm ended at its time limit ran no more of its script, so only a
    Supervisor's requeue can retry it. Before: the first process to read it recorded
    FAILED for good, and one that attached after could not retry it; attaching first
    did. Now a reader says UNKNOWN, why and what to do, records no end, and the
    Supervisor that attaches makes the retry."""
    handle = await _submitted_by_a_process_that_left(SUBMIT_TIMED_AND_LEAVE)
    async with Supervisor(session="reader") as reader:
        seen = await reader.wait(handle, timeout=200)
        assert seen.state is AppState.UNKNOWN, seen
        assert "1 retry left" in seen.msg and "attach" in seen.msg, seen
        assert seen.msg.startswith("r/0 killed by SIGTERM"), seen
        [replica] = seen.roles[0].replicas
        assert replica.state is ReplicaState.FAILED and "TIMEOUT" in replica.msg, replica
    [record] = [p async for p in anyio.Path(state_dir).glob("**/owner/timed-*/state.json")]
    assert json.loads(await record.read_text())["final"] is False  # no end recorded
    async with Supervisor(session="adopter") as adopter:
        await adopter.attach(handle)
        final = await adopter.wait(handle, timeout=120)
        assert final.state is AppState.SUCCEEDED, final
        assert final.num_restarts == 1, final
        lines = [line async for line in adopter.log_iter(handle, "r", 0)]
    assert "retried\n" in lines, lines
