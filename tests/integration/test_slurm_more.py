"""More of the slurm backend on the real cluster: whole-job retries, job_dir, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, AppStatus, Role, ShuttingDown, SubmitError, Supervisor
from supervisor.backends.slurm import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings

from .slurm_cluster import ensure_cluster, until, until_running

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

PY = sys.executable
CLI = [PY, "-m", "supervisor.cli.main"]


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


async def test_a_failed_attempt_is_retried_by_requeueing_the_whole_job(
    cluster: dict[str, object], state_dir: Path
) -> None:
    flaky = (
        "import os, sys, time; attempt = int(os.environ['ASUPERVISOR_ATTEMPT']);"
        "print('attempt', attempt, flush=True); time.sleep(3); sys.exit(0 if attempt else 5)"
    )
    role = Role(name="w", entrypoint=PY, args=["-c", flaky], num_replicas=2, max_retries=1)
    # Slurm 22.05 leaves restart_cnt at 0 for het jobs, so a requeue is seen from the
    # run before it: tick often enough not to miss that run entirely.
    fast = partial(SlurmBackend, poller=PollerSettings(fast=0.5, slow=1.0))
    async with Supervisor(session="svc", backends={"slurm": fast}) as sv:
        handle = await sv.submit(AppDef(name="retry", roles=[role]), "slurm")
        final = await sv.wait(handle, timeout=120)
        lines = [line async for line in sv.log_iter(handle, "w", 0, streams="stdout")]
    assert final.state is AppState.SUCCEEDED, final
    assert all(r.restarts == 1 for r in final.roles[0].replicas), final
    assert lines == ["attempt 0\n", "attempt 1\n"]  # logs of both attempts are kept


async def test_job_dir_runs_in_a_snapshot_of_the_workspace(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "train.py").write_text("import os; print(os.getcwd(), sorted(os.listdir('.')))\n")
    (workspace / "big.ckpt").write_text("x")
    (workspace / ".asupervisorignore").write_text("# not shipped\n*.ckpt\n")
    monkeypatch.chdir(workspace)
    job_dir = tmp_path / "jobs" / "run-1"
    role = Role(name="t", entrypoint=PY, args=["train.py"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="jd", roles=[role]), "slurm", {"job_dir": str(job_dir)}
        )
        assert (await sv.wait(handle, timeout=90)).state is AppState.SUCCEEDED
        (line,) = [x async for x in sv.log_iter(handle, "t", 0, streams="stdout")]
    assert line == f"{job_dir} ['.asupervisorignore', 'train.py']\n"
    (workspace / "train.py").write_text("changed after submission")
    assert (job_dir / "train.py").read_text().startswith("import os")


async def test_a_refused_submit_leaves_nothing_and_its_app_id_can_be_used_again(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 12 (sbatch refuses the job) and issue 17 item 7 (job_dir exists): a launch
    that started nothing releases its app id and leaves no app directory (nor a job_dir)."""
    monkeypatch.chdir(tmp_path)
    app = AppDef(name="again", roles=[Role(name="r", entrypoint="true")])
    taken = tmp_path / "taken"
    taken.mkdir()
    async with Supervisor(session="svc") as sv:
        await sv.prepare("slurm")
        refused = sv.dryrun(app, "slurm", {"partition": "nosuchpartition"}, app_id="fixed-1")
        with pytest.raises(SubmitError, match=r"(?i)partition"):
            await sv.schedule(refused)
        assert not (state_dir / "logs" / "svc" / "fixed-1").exists()
        job_dir = tmp_path / "fresh"
        refused = sv.dryrun(app, "slurm", {"job_dir": str(taken)}, app_id="fixed-1")
        with pytest.raises(SubmitError, match="exists"):
            await sv.schedule(refused)
        assert not (state_dir / "logs" / "svc" / "fixed-1").exists()
        assert taken.is_dir()  # not ours: left as it was
        handle = await sv.schedule(
            sv.dryrun(app, "slurm", {"job_dir": str(job_dir)}, app_id="fixed-1")
        )
        final = await sv.wait(handle, timeout=90)
    assert handle == "slurm://svc/fixed-1"
    assert final.state is AppState.SUCCEEDED, final


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASUPERVISOR_HOME": str(state_dir)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


async def test_the_cli_submits_follows_and_cancels_slurm_apps(
    cluster: dict[str, object], state_dir: Path
) -> None:
    done = await anyio.to_thread.run_sync(
        lambda: _cli(state_dir, "run", "--backend", "slurm", "--wait", "--", PY, "-c", "print(1)")
    )
    assert done.returncode == 0, done.stderr
    assert "SUCCEEDED" in done.stdout
    # Without --wait, run returns once Slurm has the job: Slurm keeps it, not this process.
    started = await anyio.to_thread.run_sync(
        lambda: _cli(state_dir, "run", "--backend", "slurm", "--", "sleep", "60")
    )
    assert started.returncode == 0, started.stderr
    handle = started.stdout.strip().splitlines()[-1]
    assert handle.startswith("slurm://")
    status = json.loads(
        (await anyio.to_thread.run_sync(lambda: _cli(state_dir, "status", "--json", handle))).stdout
    )
    assert status["state"] in ("PENDING", "RUNNING")
    cancelled = await anyio.to_thread.run_sync(lambda: _cli(state_dir, "cancel", handle))
    assert cancelled.returncode == 0, cancelled.stderr
    async with Supervisor(session="observer") as sv:
        final = await sv.wait(handle, timeout=60)
    assert final.state is AppState.CANCELLED


async def test_the_poller_keeps_ticking_every_second_while_a_job_runs(
    cluster: dict[str, object], state_dir: Path
) -> None:
    # Unchanged answers back the pause off towards `slow`, but never past `running`
    # while a job runs, so its end is seen within a second.
    role = Role(name="s", entrypoint="sleep", args=["60"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="ticker", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        before = sv.statistics()["slurm"]["ticks"]
        await anyio.sleep(6)  # unchanged: 1 -> 1.5 -> 2.25 -> 3.4 s if it backed off
        stats = sv.statistics()["slurm"]
        await sv.cancel(handle)
        assert (await sv.wait(handle, timeout=60)).state is AppState.CANCELLED
    assert stats["interval_s"] == PollerSettings().running == 1.0
    assert stats["ticks"] - before >= 5


async def _slurm_state(job_id: str) -> str:
    done = await anyio.run_process(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
    return done.stdout.decode().strip()


@pytest.mark.slurm_exclusive  # takes every node, exclusively
async def test_a_waiting_app_says_why_and_its_cancel_records_no_start(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    """Held back by a job that takes every node: while the app waits, its status (here and
    in another process) gives the scheduler's reason; cancelling it records no start."""
    out = f"--output={tmp_path}/blocker.out"
    sbatch = ["sbatch", "--parsable", "--nodes=3", "--exclusive", out]
    blocker = (await anyio.run_process([*sbatch, "--wrap", "sleep 300"])).stdout.decode().strip()
    try:
        await until(partial(_slurm_state, blocker), "RUNNING".__eq__, 60, "the blocker to run")
        role = Role(name="w", entrypoint="sleep", args=["1"])
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(AppDef(name="waits", roles=[role]), "slurm")
            seen: list[str] = []

            async def record() -> None:
                async for t in sv.watch(handle):
                    seen.append(f"{t.role or 'app'}:{t.dest}")

            async def status() -> AppStatus | None:
                return sv.status(handle)

            async with anyio.create_task_group() as group:
                group.start_soon(record)
                # The reason is a message, not a transition: no event says it came.
                waiting = await until(
                    status, lambda s: bool(s and s.msg.startswith("pending: ")), 60, "a reason"
                )
                assert waiting is not None and waiting.state is AppState.PENDING, waiting
                reason = waiting.msg.removeprefix("pending: ")
                assert reason in ("Resources", "Priority"), waiting
                replica = waiting.replica("w", 0)
                assert replica is not None and replica.msg == reason, waiting
                async with Supervisor(session="reader") as other:
                    described = await other.describe(handle)
                    assert described is not None
                    theirs = described.to_status()
                    assert theirs.state is AppState.PENDING, theirs
                    assert theirs.msg.startswith("pending: "), theirs
                await sv.cancel(handle)
                final = await sv.wait(handle, timeout=60)
            assert final.state is AppState.CANCELLED, final
            assert "pending" not in final.msg, final
            assert not any(s.endswith(":RUNNING") for s in seen), seen
            assert "app:PENDING" in seen and "app:CANCELLED" in seen, seen
    finally:
        await anyio.run_process(["scancel", blocker], check=False)


async def test_the_cluster_facts_are_asked_once_for_many_submits_at_once(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Issue 19 (low): 20 submits preparing at the same time ask sinfo twice, not 40 times."""
    async with Supervisor(session="svc") as sv:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(sv.prepare, "slurm")
        await sv.prepare("slurm")
        calls = sv.statistics()["slurm"]
    assert calls["calls_sinfo"] == 2, calls  # its version, and its partitions


async def test_sbatch_variables_of_the_submitter_do_not_override_run_options(
    cluster: dict[str, object], state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 item 7: SBATCH_* in the submitting environment beat #SBATCH lines in sbatch;
    our sbatch calls run without them, so the app's own options hold."""
    monkeypatch.setenv("SBATCH_PARTITION", "nosuchpartition")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "0:01")
    role = Role(name="r", entrypoint=PY, args=["-c", "import time; time.sleep(3)"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="env", roles=[role]), "slurm", {"partition": "debug"})
        final = await sv.wait(handle, timeout=90)
    assert final.state is AppState.SUCCEEDED, final


async def test_each_replica_of_a_multi_node_group_reports_its_own_node(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """Issue 17 item 7: a role of 2 nodes x 1 task is one het group whose node list is
    ``n[1-2]``; each replica's host is the node it ran on, here and in another process."""
    role = Role(
        name="g",
        entrypoint=PY,
        args=["-c", "import os, time; print(os.environ['SLURMD_NODENAME']); time.sleep(8)"],
        num_replicas=2,
        metadata={"asupervisor/procs_per_node": 1},
    )
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(AppDef(name="nodes", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        async with Supervisor(session="svc") as other:
            seen = await other.describe(handle)
        final = await sv.wait(handle, timeout=60)
        ran_on = [
            "".join([x async for x in sv.log_iter(handle, "g", k, streams="stdout")]).strip()
            for k in (0, 1)
        ]
    hosts = [r.hostname for r in final.roles[0].replicas]
    assert hosts == ran_on and len(set(hosts)) == 2, (hosts, ran_on)
    assert seen is not None
    assert [r.hostname for r in seen.roles_statuses[0].replicas] == ran_on, seen


async def test_leaving_async_with_ends_a_follow_watch_and_wait_and_the_job_runs_on(
    cluster: dict[str, object], state_dir: Path
) -> None:
    """``close`` (begin_shutdown) ends the streams of a durable app at once; it runs on."""
    role = Role(name="s", entrypoint="sh", args=["-c", "echo up; exec sleep 60"])
    ended: dict[str, object] = {}
    all_ended = anyio.Event()

    def end(what: str, value: object) -> None:
        ended[what] = value
        if len(ended) == 3:
            all_ended.set()

    async with anyio.create_task_group() as tg:
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(AppDef(name="durable", roles=[role]), "slurm")
            following = anyio.Event()

            async def follow() -> None:
                lines = []
                async for line in sv.log_iter(handle, "s", 0, should_tail=True):
                    lines.append(line)
                    following.set()
                end("log", lines)

            running = anyio.Event()

            async def watch() -> None:
                seen = []
                async for t in sv.watch(handle):
                    if t.role is None:
                        seen.append(t.dest)
                        if t.dest == "RUNNING":
                            running.set()
                end("watch", seen)

            async def wait() -> None:
                try:
                    await sv.wait(handle)
                except ShuttingDown as e:
                    end("wait", e)

            tg.start_soon(follow)
            tg.start_soon(watch)
            tg.start_soon(wait)
            with anyio.fail_after(60):
                # The replica's first line can come before the poller's next tick shows
                # the job RUNNING (seen under load): leave once both are in.
                await following.wait()
                await running.wait()
        with anyio.fail_after(20):  # the job runs for a minute
            await all_ended.wait()
    assert ended["log"] == ["up\n"]
    watched = ended["watch"]
    assert isinstance(watched, list) and watched[-1] == "RUNNING", watched
    assert isinstance(ended["wait"], ShuttingDown)
    async with Supervisor(session="other") as other:
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.RUNNING, described
        await other.cancel(handle)
        assert (await other.wait(handle, timeout=60)).state is AppState.CANCELLED
