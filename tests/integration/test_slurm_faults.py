"""The slurm backend when the cluster misbehaves: a node dies, the controller restarts.

Both faults are real: ``scontrol update state=down`` on the node a replica
runs on, and a killed and restarted slurmctld.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppDef, AppState, Role, Supervisor
from supervisor.backends.slurm import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings
from supervisor.backends.slurm.rest import RestTransport

from . import fake_slurm
from .slurm_cluster import SCRIPT, ensure_cluster, until_running

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm, pytest.mark.faults]

PY = sys.executable
# Sleeps through its first attempt, so only a requeue lets it finish in time.
SLOW_FIRST = (
    "import os, time; attempt = int(os.environ['ASUPERVISOR_ATTEMPT']);"
    "print('attempt', attempt, os.environ.get('SLURMD_NODENAME'), flush=True);"
    "time.sleep(120 if attempt == 0 else 1)"
)


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.mark.slurm_exclusive  # a node DOWN fails every job on it
async def test_node_failure_requeues_and_the_app_still_succeeds(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="w", entrypoint=PY, args=["-c", SLOW_FIRST], max_retries=1)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="nodefail", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        status = sv.status(handle)
        assert status is not None
        node = status.replica("w", 0).hostname  # type: ignore[union-attr]
        assert node in {"n1", "n2", "n3"}
        try:
            await anyio.run_process(
                ["scontrol", "update", f"nodename={node}", "state=down", "reason=asupervisor-test"]
            )
            final = await sv.wait(handle, timeout=150)
        finally:
            await anyio.run_process(
                ["scontrol", "update", f"nodename={node}", "state=resume"], check=False
            )
        history = [t async for t in sv.watch(handle)]
    assert final.state is AppState.SUCCEEDED, final
    assert final.num_restarts == 1
    app_path = [t.dest for t in history if t.role is None]
    assert app_path[-4:] == ["RUNNING", "PENDING", "RUNNING", "SUCCEEDED"], app_path
    replica = final.replica("w", 0)
    assert replica is not None and replica.restarts == 1


@pytest.mark.slurm_exclusive  # slurmctld away for everyone
async def test_controller_restart_causes_no_false_terminal_state(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="w", entrypoint="bash", args=["-c", "echo launched; exec sleep 20"])
    pid_file = anyio.Path("/run/slurmctld.pid")
    # A quick tick, so that several fall while the controller is away.
    fast = partial(SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0))
    async with Supervisor(session="svc", backends={"slurm": fast}) as sv:
        handle = await sv.submit(AppDef(name="ctld", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
            # The job RUNNING is not yet its step launched: srun asks the controller for
            # the step and gives up (exit 1) after ~10 s without one, a real failure this
            # test is not about. The replica's first line says the step runs.
            async for _ in sv.log_iter(handle, "w", 0, regex="launched", should_tail=True):
                break
        seen_states = set()
        seen_msgs = []

        async def observe() -> None:
            while True:
                status = sv.status(handle)
                if status is not None:
                    seen_states.add(status.state)
                    if status.msg:
                        seen_msgs.append(status.msg)
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(observe)
            # SIGTERM: a restart that saves state (SIGKILL loses the last job changes).
            os.kill(int((await pid_file.read_text()).strip()), signal.SIGTERM)
            await anyio.sleep(15)  # longer than squeue's own retries (MessageTimeout)
            restarted = await anyio.run_process(["bash", str(SCRIPT), "up"], check=False)
            assert restarted.returncode == 0, restarted.stderr.decode()
            final = await sv.wait(handle, timeout=90)
            tg.cancel_scope.cancel()
    assert final.state is AppState.SUCCEEDED, final
    assert seen_states <= {AppState.RUNNING, AppState.SUCCEEDED}
    assert any("squeue failed" in m for m in seen_msgs), seen_msgs
    assert "squeue failed" not in final.msg


async def _down_for_a_moment(node: str) -> None:
    """The node DOWN (Slurm fails and requeues what runs there), then back at once."""
    try:
        await anyio.run_process(
            ["scontrol", "update", f"nodename={node}", "state=down", "reason=asupervisor-test"]
        )
        await anyio.sleep(2)
    finally:
        await anyio.run_process(
            ["scontrol", "update", f"nodename={node}", "state=resume"], check=False
        )


@pytest.mark.slurm_exclusive  # a node DOWN fails every job on it
async def test_the_leaders_node_failing_under_two_replicas_is_one_requeue(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Issue 19 item 7. Slurm 22.05 requeues a het job whose leader's node fails only half
    way: the leader waits again while its sibling shows FAILED (JobLaunchFailure) on the old
    attempt, for ever. That sibling is not a failure, the backend completes the requeue (and
    never cancels the job), and the app ends after one restart."""
    role = Role(name="w", entrypoint=PY, args=["-c", SLOW_FIRST], max_retries=1, num_replicas=2)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="leaderfail", roles=[role]), "slurm")

        with anyio.fail_after(60):
            running = set()
            async for t in sv.watch(handle):
                if t.role is not None and t.dest == "RUNNING":
                    running.add(t.replica_id)
                if len(running) == 2:
                    break
        status = sv.status(handle)
        assert status is not None
        leader = status.replica("w", 0).hostname  # type: ignore[union-attr]  # het group 0
        assert leader in {"n1", "n2", "n3"}
        await _down_for_a_moment(leader)
        final = await sv.wait(handle, timeout=150)
        history = [t async for t in sv.watch(handle)]
    assert final.state is AppState.SUCCEEDED, final
    assert final.num_restarts == 1
    assert [r.restarts for r in final.roles[0].replicas] == [1, 1]
    assert not any(t.dest in ("FAILED", "CANCELLED") for t in history), history


@pytest.mark.timeout(300)  # Slurm ends the job a minute in, and the retry queues again
async def test_a_time_limit_hit_with_a_retry_left_is_retried_and_ends(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Issue 19 item 8: a job killed at its (1-minute) time limit ran no more of its batch
    script, so nothing requeued it; the retry requeues it from here, and the app ends. Another
    process sees the same end."""
    role = Role(name="w", entrypoint=PY, args=["-c", SLOW_FIRST], max_retries=1)
    app = AppDef(name="timeout", roles=[role])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app, "slurm", cfg={"time": "1"})
        final = await sv.wait(handle, timeout=240)
        history = [t async for t in sv.watch(handle)]
    assert final.state is AppState.SUCCEEDED, final
    assert final.num_restarts == 1
    # One retry: the FSM's restart (this backend requeues the job after seeing TIMEOUT), or
    # a requeue seen from Slurm when the batch script's own retry won the race (the time
    # limit's SIGTERM ended srun before the script itself, which then requeued the job).
    retries = [t.trigger for t in history if t.role == "w" and t.trigger in ("restart", "requeue")]
    assert len(retries) == 1, history
    async with Supervisor(session="svc") as other:
        seen = await other.describe(handle)
    assert seen is not None and seen.state is AppState.SUCCEEDED, seen


@pytest.mark.timeout(300)  # Slurm ends the job a minute in, and the retry queues again
async def test_a_cancel_of_a_job_retried_after_its_time_limit_reaches_slurm(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """A job Slurm ended (its time limit) and this process requeued is a job again: a
    cancel of its retry is sent until Slurm shows it over. The first run's end had
    confirmed every later cancel: none was sent, and the retry ran on."""
    forever = Role(name="w", entrypoint="sleep", args=["300"], max_retries=1)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="timeout", roles=[forever]), "slurm", {"time": "1"})
        submitted = sv.status(handle)
        assert submitted is not None
        job = submitted.metadata["slurm_job_id"]
        with anyio.fail_after(240):
            async for move in sv.watch(handle):
                now = sv.status(handle)
                retried = now is not None and now.num_restarts == 1
                if move.role is None and move.dest == "RUNNING" and retried:
                    break
        await sv.cancel(handle)
        final = await sv.wait(handle, timeout=60)
        assert final.state is AppState.CANCELLED, final
        queued = await anyio.run_process(["squeue", "-h", "-j", job, "-o", "%T"], check=False)
        assert queued.stdout.decode().strip() in ("", "CANCELLED", "COMPLETING"), queued


@pytest.mark.timeout(300)
async def test_a_time_limit_hit_over_slurmrestd_fails_saying_the_retry_cannot_be_made(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Issue 19 item 8 over slurmrestd (JWT endpoint, used as a client only): v0.0.38 has no
    requeue, so the retry fails with the reason instead of leaving the app PENDING; another
    process sees FAILED too."""
    rest = cluster["rest"]
    assert isinstance(rest, dict)
    if not rest.get("jwt_token"):
        pytest.skip("slurmrestd has no JWT endpoint here")

    def backend() -> Any:
        url, token = str(rest["jwt_url"]), str(rest["jwt_token"])
        transport = RestTransport(url=url, token=token, user="root")
        return partial(SlurmBackend, transport=transport)

    role = Role(name="w", entrypoint=PY, args=["-c", SLOW_FIRST], max_retries=1)
    async with Supervisor(session="svc", backends={"slurm": backend()}) as sv:
        handle = await sv.submit(AppDef(name="timeout", roles=[role]), "slurm", cfg={"time": "1"})
        final = await sv.wait(handle, timeout=240)
        history = [t async for t in sv.watch(handle)]
    if any(t.role == "w" and t.trigger == "requeue" for t in history):
        # The batch script's own retry won the race (the time limit's SIGTERM ended srun
        # before the script, which then requeued the job itself, as in the test above):
        # no requeue was left for this process to make, and the retry ran.
        assert final.state is AppState.SUCCEEDED and final.num_restarts == 1, history
    else:
        assert final.state is AppState.FAILED, final
        assert "could not be made" in final.msg and "requeue" in final.msg, final
    async with Supervisor(session="svc", backends={"slurm": backend()}) as other:
        seen = await other.describe(handle)
    assert seen is not None and seen.state is final.state, seen


async def _job_id(state_dir: Path, handle: str) -> int:
    app_dir = state_dir / "logs" / "svc" / handle.rsplit("/", 1)[1]
    return int(json.loads(await anyio.Path(app_dir / "app.json").read_text())["job_id"])


async def test_a_job_the_controller_forgot_ends_with_what_its_replicas_recorded(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 10, forgotten job. A fake squeue/sacct (``fake_slurm``) lies about this
    test's job only: killing slurmctld's state would forget every other user's jobs too.
    squeue stops listing the job while accounting still calls it RUNNING; once that lasts
    the app ends with what its replica's own exit record says, not RUNNING for ever."""
    fakes = fake_slurm.install(tmp_path / "fakebin")
    monkeypatch.setenv("PATH", fake_slurm.path_with(fakes))
    fast = partial(
        SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0, running=0.5, forgotten=10.0)
    )
    # The replica ends when the test says, right after the lie: its exit record is then
    # written long before the job counts as forgotten, however loaded the machine (a fixed
    # sleep raced the 3 s window under two concurrent test runs and left the app UNKNOWN).
    release = tmp_path / "release"
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    role = Role(name="w", entrypoint=PY, args=["-c", code])
    async with Supervisor(session="svc", backends={"slurm": fast}) as sv:
        handle = await sv.submit(AppDef(name="forgotten", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        fake_slurm.lie_about(fakes, await _job_id(state_dir, handle), "forget")
        release.touch()
        final = await sv.wait(handle, timeout=60)
    assert final.state is AppState.SUCCEEDED, final  # its exit record says 0
    replica = final.replica("w", 0)
    assert replica is not None and "forgot" in replica.msg, final


async def test_a_reused_job_id_is_never_shown_nor_cancelled_as_ours(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 10, reused id. The fake squeue (``fake_slurm``) shows this test's job id
    with another job's comment and name, as a controller that lost its state and handed the
    id out again would; the fake scancel records what it is asked. The app does not take
    that job for its own, and neither this process's cancel nor another's scancels it."""
    fakes = fake_slurm.install(tmp_path / "fakebin")
    monkeypatch.setenv("PATH", fake_slurm.path_with(fakes))
    fast = partial(SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0, running=0.5))
    role = Role(name="w", entrypoint="sleep", args=["300"])
    async with Supervisor(session="svc", backends={"slurm": fast}) as sv:
        handle = await sv.submit(AppDef(name="reused", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        job_id = await _job_id(state_dir, handle)
        fake_slurm.lie_about(fakes, job_id, "reuse")
        with anyio.fail_after(30):
            async for t in sv.watch(handle):
                if t.role is None and t.dest == "UNKNOWN":
                    break
        status = sv.status(handle)
        assert status is not None, handle
        replica = status.replica("w", 0)
        assert replica is not None and "now names another job" in replica.msg, status
        async with Supervisor(session="svc") as other:
            seen = await other.describe(handle)
            assert seen is not None and seen.state is AppState.UNKNOWN, seen
            await other.cancel(handle)
        await sv.cancel(handle)
        await anyio.sleep(3)
        assert not [c for c in fake_slurm.cancels(fakes) if str(job_id) in c.split()]
    fake_slurm.lie_about(fakes, job_id, "")
    await anyio.run_process(["scancel", str(job_id)])  # this test's own job, for real
