"""The slurm backend against the real local 3-node cluster (scripts/slurm-cluster)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    ReplicaState,
    RetryPolicy,
    Role,
    SpecError,
    Supervisor,
    WaitTimeout,
)

from .helpers import hold_while_it_ends, start_seen_after_a_hold
from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

PY = sys.executable
REPORT = (
    "import json, os, sys;"
    "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('TRICKY'),"
    " 'node': os.environ.get('SLURMD_NODENAME'), 'role': os.environ['ASUPERVISOR_ROLE']}))"
)


@pytest.fixture(scope="module")
def facts() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.fixture(params=["cli", "rest"])
def cluster(
    request: pytest.FixtureRequest, facts: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> dict[str, object]:
    """Every test here runs on both transports: the Slurm commands, and slurmrestd (JWT)."""
    if request.param == "rest":
        rest = facts["rest"]
        assert isinstance(rest, dict)
        if not rest.get("jwt_token"):
            print("slurmrestd has no JWT endpoint here")
            pytest.skip("slurmrestd has no JWT endpoint here")
        monkeypatch.setenv("ASUPERVISOR_SLURM_TRANSPORT", "rest")
        monkeypatch.setenv("ASUPERVISOR_SLURMRESTD", str(rest["jwt_url"]))
        monkeypatch.setenv("ASUPERVISOR_SLURMRESTD_USER", "root")
        monkeypatch.setenv("SLURM_JWT", str(rest["jwt_token"]))
    return facts


async def _lines(sv: Supervisor, handle: str, role: str, k: int = 0) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, streams="stdout")]


@pytest.mark.slurm_exclusive  # needs all 3 nodes at once
async def test_two_roles_succeed_on_distinct_nodes_with_logs(
    cluster: dict[str, object], state_dir: Path
) -> None:
    hostile = "$(touch /tmp/pwned-by-asupervisor) `id`; 'q' \"d\""
    trainer = Role(
        name="trainer",
        entrypoint=PY,
        args=["-c", REPORT, hostile, "${replica_id}"],
        env={"TRICKY": "a,b,c=d;$(id)"},
        num_replicas=2,
    )
    ps = Role(name="ps", entrypoint=PY, args=["-c", REPORT])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="two", roles=[trainer, ps]), "slurm")
        assert handle.startswith("slurm://svc/two-")
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.SUCCEEDED, status
        hosts = set()
        for role_status in status.roles:
            for replica in role_status.replicas:
                assert replica.state is ReplicaState.SUCCEEDED
                assert replica.exit_code == 0
                hosts.add(replica.hostname)
        assert hosts == {"n1", "n2", "n3"}  # one het group per replica, one node each
        report = json.loads((await _lines(sv, handle, "trainer", 1))[0])
        assert report["argv"] == [hostile, "1"]
        assert report["env"] == "a,b,c=d;$(id)"
        assert report["role"] == "trainer"
        assert report["node"] == status.replica("trainer", 1).hostname  # type: ignore[union-attr]
    assert not await anyio.Path("/tmp/pwned-by-asupervisor").exists()


async def test_a_failing_replica_fails_the_app_and_stops_the_others(
    cluster: dict[str, object], state_dir: Path
) -> None:
    bad = Role(
        name="bad", entrypoint=PY, args=["-c", "import sys, time; time.sleep(1); sys.exit(3)"]
    )
    slow = Role(name="slow", entrypoint="sleep", args=["60"], num_replicas=2)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="gang", roles=[bad, slow]), "slurm")
        status = await sv.wait(handle, timeout=90)
    assert status.state is AppState.FAILED, status
    failed = status.replica("bad", 0)
    assert failed is not None and failed.state is ReplicaState.FAILED and failed.exit_code == 3
    for k in (0, 1):
        other = status.replica("slow", k)
        assert other is not None and other.state is ReplicaState.CANCELLED, status


async def test_cancel_wait_timeout_and_unknown_handles(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="sleeper", entrypoint="sleep", args=["120"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="c", roles=[role]), "slurm")
        with pytest.raises(WaitTimeout):
            await sv.wait(handle, timeout=0.5)
        await sv.cancel(handle)
        await sv.cancel(handle)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.CANCELLED
        assert await sv.describe("slurm://svc/never-submitted") is None
        assert not await sv.exists("slurm://other/nothing")


async def test_foreign_jobs_are_ignored_and_other_processes_see_ours(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    submitted = await anyio.run_process(
        ["sbatch", "--parsable", f"--output={tmp_path}/foreign.out", "--wrap", "sleep 30"]
    )
    foreign = submitted.stdout.decode().strip()
    try:
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(
                AppDef(name="mine", roles=[Role(name="r", entrypoint="true")]), "slurm"
            )
            assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED
        async with Supervisor(session="reader") as other:
            listed = await other.list("slurm")
            assert [x.app_handle for x in listed] == [handle]
            assert listed[0].state is AppState.SUCCEEDED and listed[0].name == "mine"
            described = await other.describe(handle)
            assert described is not None and described.state is AppState.SUCCEEDED
            assert await other.describe(f"slurm://svc/{foreign}") is None
            with anyio.fail_after(10):
                lines = [line async for line in other.log_iter(handle, "r", 0, streams="stdout")]
            assert lines == []
    finally:
        await anyio.run_process(["scancel", foreign], check=False)


async def test_one_squeue_per_tick_whatever_the_number_of_apps(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="r", entrypoint="sleep", args=["3"])
    async with Supervisor(session="svc") as sv:
        handles = [
            await sv.submit(AppDef(name=f"load{i}", roles=[role]), "slurm") for i in range(4)
        ]
        with anyio.fail_after(120):
            for h in handles:
                assert (await sv.wait(h)).state is AppState.SUCCEEDED
        stats = sv.statistics()["slurm"]
    assert stats["queue_calls"] == stats["ticks"]
    assert stats["accounting_calls"] == 0  # every job was still in the controller


async def test_retry_policies_other_than_whole_job_are_rejected(state_dir: Path) -> None:
    role = Role(name="r", entrypoint="true", max_retries=1, retry_policy=RetryPolicy.REPLICA)
    async with Supervisor(session="svc") as sv:
        with pytest.raises(SpecError, match="retry_policy"):
            sv.dryrun(AppDef(name="x", roles=[role]), "slurm")
        with pytest.raises(SpecError, match=r"cfg\.time"):
            sv.dryrun(
                AppDef(name="x", roles=[Role(name="r", entrypoint="true")]), "slurm", {"time": "1h"}
            )


async def test_logs_follow_streams_and_times_like_local_ones(
    cluster: dict[str, object], state_dir: Path
) -> None:
    code = (
        "import sys, time; print('early', flush=True); print('oops', file=sys.stderr, flush=True);"
        "time.sleep(3); sys.stdout.write('late without newline')"
    )
    role = Role(name="t", entrypoint=PY, args=["-c", code])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="logs", roles=[role]), "slurm")
        followed = []
        seen_at: dict[str, float] = {}
        with anyio.fail_after(90):
            async for line in sv.log_iter(handle, "t", 0, should_tail=True):
                seen_at[line] = time.time()
                status = sv.status(handle)
                followed.append((line, status.state if status else None))
        assert [line for line, _ in followed] == ["early\n", "oops\n", "late without newline"]
        # Seen live, before the end. The poller may not have seen the job yet: on a
        # saturated machine the first line can come before its first poll (SUBMITTED).
        assert followed[0][1] in (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING)
        final = sv.status(handle)
        assert final is not None and final.state is AppState.SUCCEEDED
        err = [line async for line in sv.log_iter(handle, "t", 0, streams="stderr")]
        assert err == ["oops\n"]
        marker = seen_at["oops\n"] + 1.0  # the last line came 3 s after the first ones
        late = [line async for line in sv.log_iter(handle, "t", 0, since=marker)]
        assert late == ["late without newline"]
        loud = [line async for line in sv.log_iter(handle, "t", 0, regex="oops|early")]
        assert loud == ["early\n", "oops\n"]


async def test_a_replicas_end_is_recorded_when_it_ended_not_when_a_busy_host_heard(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """The host's loop is held (a service busy elsewhere) while its replica ends: the end
    recorded is the one its pump saw on the node, not when a look after the hold saw it
    (up to a poll interval after the end, even with the loop free)."""
    code = "import time; print('up', flush=True); time.sleep(2)"
    role = Role(name="r", entrypoint=PY, args=["-c", code])
    with anyio.fail_after(150):
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(AppDef(name="held", roles=[role]), "slurm")
            run = await hold_while_it_ends(sv, handle, "r", 4.0, AppState.SUCCEEDED)
    assert run.up + 1.0 <= run.ended < run.held_until - 1.0, run
    # It ran 2 s: seen starting and ending in one look, both at the look's time read as 6 us.
    assert run.ended - run.started >= 1.0, run


async def test_a_replicas_start_is_recorded_when_it_started_not_when_a_busy_host_saw_it(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """The loop is held from the submit until a while after the replica's pump recorded
    its start: no look sees it start before. The start recorded is the pump's, not the
    time of the first look after the hold (nor, on a free loop, of the first look after
    a long wait in the queue)."""
    with anyio.fail_after(150):
        async with Supervisor(session="svc") as sv:
            running, record, held_until = await start_seen_after_a_hold(sv, {}, state_dir)
    assert record["attempt"] == 0, record
    assert running.at == record["started"] < held_until - 1.5, (running, held_until)


async def test_a_submit_cut_by_an_asyncio_timeout_leaves_no_job_behind(
    facts: dict[str, object], state_dir: Path
) -> None:
    """``asyncio.timeout`` cancels natively, through anyio's shield, into the launch: a
    job sbatch had queued was left with no record. Cut at several points, no job of
    the app stays queued or running, and what was launched ends CANCELLED."""
    app = AppDef(name="cut", roles=[Role(name="s", entrypoint="sleep", args=["120"])])
    cuts, alive = 0, []
    async with Supervisor(session="svc") as sv:
        # 5 ms to 0.4 s, then long enough to finish: a launch (sbatch) takes about 50 ms.
        for delay in [0.005 * 1.4**k for k in range(14)] + [60.0]:
            info = sv.dryrun(app, "slurm")
            try:
                async with asyncio.timeout(delay):
                    handle = await sv.schedule(info)
            except TimeoutError:
                cuts += 1
            else:
                await sv.cancel(handle)
                await sv.wait(handle, timeout=60)
            names = ",".join(info.request.job_names)  # type: ignore[attr-defined]
            queued = await anyio.run_process(
                ["squeue", "--noheader", "--format=%i", f"--name={names}", "--states=PD,R,S"]
            )
            alive += queued.stdout.decode().split()
        states = [a.state for a in await sv.list("slurm")]
    assert cuts > 0
    assert alive == []
    assert states and set(states) == {AppState.CANCELLED}, states
