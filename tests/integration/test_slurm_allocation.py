"""Apps inside an existing allocation (``cfg allocation=JOBID``), on the real local cluster.

The allocations are made here, with a real ``salloc --no-shell`` (and a running
``sbatch`` job), and cancelled here: only those, whatever a test does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    BackendError,
    ReplicaState,
    Role,
    SpecError,
    SubmitError,
    Supervisor,
)

from .helpers import hold_while_it_ends, start_seen_after_a_hold
from .slurm_cluster import ensure_cluster, until, until_running

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

PY = sys.executable
REPORT = (
    "import json, os;"
    "print(json.dumps({k: os.environ.get(k) for k in ('SLURM_JOB_ID', 'SLURM_STEP_ID',"
    " 'SLURMD_NODENAME', 'ASUPERVISOR_ATTEMPT', 'ASUPERVISOR_REPLICA_ID')}))"
)


@pytest.fixture(scope="module")
def facts() -> dict[str, object]:
    return ensure_cluster(accounting=True)


def _state(job: str) -> str:
    done = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def _salloc(*args: str) -> str:
    """A real interactive allocation, without a shell: its job id once it has its nodes."""
    done = subprocess.run(
        ["salloc", "--no-shell", "--job-name=asup-test-alloc", "--time=20", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    found = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert found, f"salloc failed: {done.stderr}"
    return found.group(1)


def _scancel(job: str) -> None:
    subprocess.run(["scancel", job], check=False, timeout=60)


@pytest.fixture
def allocation(facts: dict[str, object]) -> Iterator[str]:
    """One node held with ``salloc --no-shell`` for the test, cancelled at its end.

    Per test, not per module: the cluster lock is held per test, and between two tests
    another run's exclusive test may set a node DOWN, which ends an allocation (seen with
    two full runs at once: NODE_FAIL for the rest of the module)."""
    job = _salloc("-N1")
    try:
        yield job
    finally:
        _scancel(job)


def _steps(job: str) -> list[str]:
    """The live steps of the job, as 'ID|NAME'."""
    done = subprocess.run(
        ["squeue", "--steps", "-h", "-j", job, "-o", "%i|%j"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


async def _sh(*args: str) -> str:
    done = await anyio.run_process(list(args), check=True)
    return done.stdout.decode()


async def _alive(job: str) -> bool:
    return await anyio.to_thread.run_sync(_state, job) == "RUNNING"


def _driver_pid(state_dir: Path, app_id: str) -> int:
    pid_file = next(p for p in state_dir.rglob("driver/pid") if app_id in str(p))
    return int(pid_file.read_text().split()[0])


async def _lines(sv: Supervisor, handle: str, role: str, k: int = 0) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, streams="stdout")]


async def test_an_app_runs_as_steps_of_a_salloc_allocation(
    allocation: str, state_dir: Path
) -> None:
    role = Role(name="r", entrypoint=PY, args=["-c", REPORT], num_replicas=2)
    async with Supervisor(session="svc") as sv:
        info = sv.dryrun(AppDef(name="in", roles=[role]), "slurm", {"allocation": allocation})
        assert f"srun --jobid={allocation} --overlap" in str(info.request)
        assert "sbatch" not in str(info.request)
        handle = await sv.submit(
            AppDef(name="in", roles=[role]), "slurm", {"allocation": allocation}
        )
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        reports = [json.loads((await _lines(sv, handle, "r", k))[0]) for k in (0, 1)]
        for k, report in enumerate(reports):
            assert report["SLURM_JOB_ID"] == allocation  # a step of the allocation, no new job
            assert report["ASUPERVISOR_REPLICA_ID"] == str(k)
            assert report["ASUPERVISOR_ATTEMPT"] == "0"
            replica = status.replica("r", k)
            assert replica is not None and replica.exit_code == 0
        assert reports[0]["SLURM_STEP_ID"] != reports[1]["SLURM_STEP_ID"]
        # No job of its own: nothing to hold, nothing another app could wait for.
        with pytest.raises(BackendError, match="allocation"):
            await sv.hold(handle)
        with pytest.raises(SpecError, match=r"cfg\.afterok"):
            await sv.submit(AppDef(name="after", roles=[role]), "slurm", {"afterok": [handle]})
    # Accounting lists the replicas as steps of the allocation, under the app's names.
    app_id = handle.rsplit("/", 1)[1]
    accounted = await until(
        lambda: _sh("sacct", "-n", "-P", "-j", allocation, "-o", "JobID,JobName"),
        lambda out: out.count(f"asupervisor:svc/{app_id}:g") == 2,
        60,
        "sacct lists the app's steps",
    )
    steps = {line.split("|")[1]: line.split("|")[0] for line in accounted.splitlines()}
    for g in (0, 1):
        step = steps[f"asupervisor:svc/{app_id}:g{g}:a0"]
        assert step.startswith(f"{allocation}.")
        assert step.split(".")[1] in {r["SLURM_STEP_ID"] for r in reports}
    # Another process sees the app (from its records and Slurm), and no job of its own.
    async with Supervisor(session="reader") as other:
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED, described
        listed = {x.app_handle: x.state for x in await other.list("slurm")}
        assert listed[handle] is AppState.SUCCEEDED
    assert await _alive(allocation)
    assert app_id not in await _sh("squeue", "-h", "-o", "%k")  # nothing submitted for the app


async def test_exit_codes_gang_and_retries_inside_the_allocation(
    allocation: str, state_dir: Path
) -> None:
    code = (
        "import os, sys, time; print('attempt', os.environ['ASUPERVISOR_ATTEMPT'], flush=True);"
        "time.sleep(1); sys.exit(3)"
    )
    bad = Role(name="bad", entrypoint=PY, args=["-c", code], max_retries=1)
    slow = Role(name="slow", entrypoint="sleep", args=["120"], max_retries=1)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="gang", roles=[bad, slow]), "slurm", {"allocation": allocation}
        )
        status = await sv.wait(handle, timeout=180)
        assert status.state is AppState.FAILED, status
        assert status.num_restarts == 1
        failed = status.replica("bad", 0)
        assert failed is not None and failed.state is ReplicaState.FAILED
        assert failed.exit_code == 3
        other = status.replica("slow", 0)
        assert other is not None and other.state is ReplicaState.CANCELLED, status
        # Both attempts' output, in the replica's one log, as for a batch app.
        assert await _lines(sv, handle, "bad") == ["attempt 0\n", "attempt 1\n"]
    # The driver stopped the gang: no step of the app is left in the allocation.
    app_id = handle.rsplit("/", 1)[1]
    await until(
        lambda: anyio.to_thread.run_sync(_steps, allocation),
        lambda steps: not any(app_id in s for s in steps),
        60,
        "the app's steps end",
    )
    assert await _alive(allocation)


async def test_a_steps_end_is_recorded_when_it_ended_not_when_a_busy_host_heard(
    allocation: str, state_dir: Path
) -> None:
    """As for a batch job: the loop held while the replica ends, the end recorded is the
    one its pump saw on the node, not when a look after the hold saw it."""
    code = "import sys, time; print('up', flush=True); time.sleep(2); sys.exit(3)"
    role = Role(name="r", entrypoint=PY, args=["-c", code])
    with anyio.fail_after(150):
        async with Supervisor(session="svc") as sv:
            cfg = {"allocation": allocation}
            handle = await sv.submit(AppDef(name="held", roles=[role]), "slurm", cfg)
            run = await hold_while_it_ends(sv, handle, "r", 4.0, AppState.FAILED)
    assert run.up + 1.0 <= run.ended < run.held_until - 1.0, run
    assert run.ended - run.started >= 1.0, run  # it ran 2 s


async def test_a_steps_start_is_recorded_when_it_started_not_when_a_busy_host_saw_it(
    allocation: str, state_dir: Path
) -> None:
    """As for a batch job: the start recorded is the one the step's pump recorded, not the
    time of the first look after a hold that lasted until well after it."""
    cfg = {"allocation": allocation}
    with anyio.fail_after(150):
        async with Supervisor(session="svc") as sv:
            running, record, held_until = await start_seen_after_a_hold(sv, cfg, state_dir)
    assert record["attempt"] == 0, record
    assert running.at == record["started"] < held_until - 1.5, (running, held_until)


async def test_cancel_stops_the_steps_only_and_the_allocation_is_reused(
    allocation: str, state_dir: Path
) -> None:
    sleeper = Role(name="s", entrypoint="sleep", args=["300"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="long", roles=[sleeper]), "slurm", {"allocation": allocation}
        )
        with anyio.fail_after(120):
            await until_running(sv, handle)
        app_id = handle.rsplit("/", 1)[1]
        steps = await anyio.to_thread.run_sync(_steps, allocation)
        assert [s for s in steps if app_id in s], steps  # a named step of the allocation
        await sv.cancel(handle)
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.CANCELLED, status
        await until(
            lambda: anyio.to_thread.run_sync(_steps, allocation),
            lambda steps: not any(app_id in s for s in steps),
            60,
            "the cancelled app's steps end",
        )
        assert await _alive(allocation)  # the allocation itself lives on
        # The next iteration starts at once in the same allocation: nothing queues.
        started = time.monotonic()
        again = await sv.submit(
            AppDef(name="again", roles=[Role(name="r", entrypoint=PY, args=["-c", REPORT])]),
            "slurm",
            {"allocation": allocation},
        )
        status = await sv.wait(again, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        report = json.loads((await _lines(sv, again, "r"))[0])
        assert report["SLURM_JOB_ID"] == allocation
        print(f"second app in the allocation took {time.monotonic() - started:.1f} s")


async def test_a_cancel_from_another_process_stops_the_steps_only(
    allocation: str, state_dir: Path
) -> None:
    sleeper = Role(name="s", entrypoint="sleep", args=["300"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="other", roles=[sleeper]), "slurm", {"allocation": allocation}
        )
        with anyio.fail_after(120):
            await until_running(sv, handle)
        async with Supervisor(session="canceller") as other:
            await other.cancel(handle)
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.CANCELLED, status
    assert await _alive(allocation)


async def test_a_running_batch_job_is_an_allocation_too(
    facts: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    submitted = await _sh(
        "sbatch", "--parsable", "-N1", "--time=20", "--job-name=asup-test-alloc",
        f"--output={tmp_path}/holder.out", "--wrap", "sleep 600",
    )  # fmt: skip
    job = submitted.strip().split(";")[0]
    try:
        await until(
            lambda: anyio.to_thread.run_sync(_state, job),
            lambda state: state == "RUNNING",
            120,
            "the batch job runs",
        )
        role = Role(name="r", entrypoint=PY, args=["-c", REPORT])
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(AppDef(name="inbatch", roles=[role]), "slurm",
                                     {"allocation": job})  # fmt: skip
            status = await sv.wait(handle, timeout=120)
            assert status.state is AppState.SUCCEEDED, status
            report = json.loads((await _lines(sv, handle, "r"))[0])
            assert report["SLURM_JOB_ID"] == job
        assert await _alive(job)
    finally:
        await anyio.to_thread.run_sync(_scancel, job)


async def test_an_allocation_that_does_not_run_is_refused(
    facts: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    role = Role(name="r", entrypoint="true")
    held = await _sh(
        "sbatch", "--parsable", "--hold", "--job-name=asup-test-alloc",
        f"--output={tmp_path}/held.out", "--wrap", "true",
    )  # fmt: skip
    job = held.strip().split(";")[0]
    try:
        async with Supervisor(session="svc") as sv:
            with pytest.raises(SubmitError, match=r"cfg\.allocation.*not RUNNING"):
                await sv.submit(AppDef(name="x", roles=[role]), "slurm", {"allocation": job})
            with pytest.raises(SubmitError, match=r"cfg\.allocation.*no job 999999"):
                await sv.submit(AppDef(name="x", roles=[role]), "slurm", {"allocation": "999999"})
            assert await sv.list("slurm") == []  # nothing left behind
    finally:
        await anyio.to_thread.run_sync(_scancel, job)


async def test_replicas_spread_over_the_allocations_nodes(
    facts: dict[str, object], state_dir: Path
) -> None:
    job = await anyio.to_thread.run_sync(_salloc, "-N2")
    try:
        role = Role(name="r", entrypoint=PY, args=["-c", REPORT], num_replicas=2)
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(AppDef(name="two", roles=[role]), "slurm",
                                     {"allocation": job})  # fmt: skip
            status = await sv.wait(handle, timeout=120)
            assert status.state is AppState.SUCCEEDED, status
            nodes = [json.loads((await _lines(sv, handle, "r", k))[0])["SLURMD_NODENAME"]
                     for k in (0, 1)]  # fmt: skip
            assert len(set(nodes)) == 2  # one node each, as the batch job's het groups
            hosts = [status.replica("r", k).hostname for k in (0, 1)]  # type: ignore[union-attr]
            assert hosts == nodes
    finally:
        await anyio.to_thread.run_sync(_scancel, job)


async def test_a_retry_beyond_the_drivers_own_starts_a_new_driver(
    allocation: str, state_dir: Path
) -> None:
    code = "import os, sys; print('attempt', os.environ['ASUPERVISOR_ATTEMPT']); sys.exit(5)"
    bad = Role(name="bad", entrypoint=PY, args=["-c", code], max_retries=1)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="beyond", roles=[bad]),
            "slurm",
            {"allocation": allocation, "requeue_on_failure": False},  # the driver retries none
        )
        status = await sv.wait(handle, timeout=180)
    assert status.state is AppState.FAILED, status
    assert status.num_restarts == 1
    assert status.replica("bad", 0).exit_code == 5  # type: ignore[union-attr]
    async with Supervisor(session="reader") as other:
        assert await _lines(other, handle, "bad") == ["attempt 0\n", "attempt 1\n"]


async def test_the_app_outlives_its_supervisor_and_a_killed_driver(
    allocation: str, state_dir: Path
) -> None:
    code = "import time; time.sleep(6); print('done')"
    role = Role(name="r", entrypoint=PY, args=["-c", code])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="durable", roles=[role]), "slurm", {"allocation": allocation}
        )
        with anyio.fail_after(120):
            await until_running(sv, handle)
    # Nobody follows it now; the step goes on.
    async with Supervisor(session="reader") as other:
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.RUNNING, described
        app_id = handle.rsplit("/", 1)[1]
        pid = await anyio.to_thread.run_sync(_driver_pid, state_dir, app_id)
        os.kill(pid, signal.SIGKILL)  # a killed driver: its running step is still followed
        final = await until(
            lambda: other.describe(handle),
            lambda d: d is not None and d.state is not AppState.RUNNING,
            120,
            "the app ends",
        )
        assert final is not None and final.state is AppState.SUCCEEDED, final
        assert await _lines(other, handle, "r") == ["done\n"]


async def test_an_allocation_that_ends_ends_the_app(
    facts: dict[str, object], state_dir: Path
) -> None:
    job = await anyio.to_thread.run_sync(_salloc, "-N1")
    try:
        sleeper = Role(name="s", entrypoint="sleep", args=["300"], max_retries=2)
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(
                AppDef(name="orphan", roles=[sleeper]), "slurm", {"allocation": job}
            )
            with anyio.fail_after(120):
                await until_running(sv, handle)
            await anyio.to_thread.run_sync(_scancel, job)
            status = await sv.wait(handle, timeout=120)
        assert status.state in (AppState.UNKNOWN, AppState.FAILED), status
        assert f"allocation {job} ended" in status.msg, status
    finally:
        await anyio.to_thread.run_sync(_scancel, job)
