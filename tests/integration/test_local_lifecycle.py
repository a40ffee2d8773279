"""The local backend end to end: real processes, from submit to a terminal state."""

from __future__ import annotations

import gc
import json
import os
import time
import warnings
from pathlib import Path

import anyio
import pytest

from supervisor import (
    AppState,
    ReplicaState,
    RetryPolicy,
    Role,
    SpecError,
    SubmitError,
    Supervisor,
    UnknownAppError,
    WaitTimeout,
)

from ..inotify_watches import watched_inodes
from .helpers import app, pid_alive, py_role, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

REPORT_ENV = (
    "import os, json, sys;"
    "keys = ['ASUPERVISOR_ROLE','ASUPERVISOR_REPLICA_ID','ASUPERVISOR_APP_ID',"
    "'ASUPERVISOR_RANK0_HOST','TORCHX_RANK0_HOST','PYTHONUNBUFFERED','ASUPERVISOR_ATTEMPT'];"
    "extra = {'argv': sys.argv[1:], 'cwd': os.getcwd()};"
    "print(json.dumps({k: os.environ.get(k) for k in keys} | extra))"
)


async def _lines(sv: Supervisor, handle: str, role: str, k: int = 0, **kw: object) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, **kw)]  # type: ignore[arg-type]


async def test_multi_role_app_succeeds_with_env_macros_and_logs(state_dir: Path) -> None:
    trainer = py_role(
        "trainer", REPORT_ENV, num_replicas=2, args=["${app_id}", "${replica_id}", "${rank0_env}"]
    )
    ps = py_role("ps", REPORT_ENV)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(trainer, ps), "local")
        assert handle.startswith("local://svc/test-")
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.SUCCEEDED
        assert [r.role for r in status.roles] == ["trainer", "ps"]
        for role_status in status.roles:
            for replica in role_status.replicas:
                assert replica.state is ReplicaState.SUCCEEDED
                assert replica.exit_code == 0
                assert replica.hostname
        app_id = handle.rpartition("/")[2]
        report = json.loads((await _lines(sv, handle, "trainer", 1, streams="stdout"))[0])
        assert report["ASUPERVISOR_ROLE"] == "trainer"
        assert report["ASUPERVISOR_REPLICA_ID"] == "1"
        assert report["ASUPERVISOR_APP_ID"] == app_id
        assert report["TORCHX_RANK0_HOST"] == report["ASUPERVISOR_RANK0_HOST"] == "localhost"
        assert report["PYTHONUNBUFFERED"] == "1"
        assert report["ASUPERVISOR_ATTEMPT"] == "0"
        assert report["argv"] == [app_id, "1", "TORCHX_RANK0_HOST"]
        assert report["cwd"] == os.getcwd()
        described = await sv.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED
        assert await sv.exists(handle)


async def test_failing_replica_fails_app_and_stops_siblings(state_dir: Path) -> None:
    bad = py_role("bad", "import sys; sys.exit(3)")
    slow = py_role("slow", "import time; time.sleep(60)", num_replicas=2)
    async with Supervisor(session="svc") as sv:
        started = time.monotonic()
        handle = await sv.submit(app(bad, slow), "local")
        status = await sv.wait(handle, timeout=30)
        assert time.monotonic() - started < 20  # the sleepers were stopped, not waited for
    assert status.state is AppState.FAILED
    failed = status.replica("bad", 0)
    assert failed is not None and failed.state is ReplicaState.FAILED and failed.exit_code == 3
    assert "bad/0 exited with code 3" in status.msg
    for k in (0, 1):
        sibling = status.replica("slow", k)
        assert sibling is not None
        assert sibling.state is ReplicaState.CANCELLED
        assert sibling.signal == "SIGTERM"


async def test_a_program_that_cannot_start_says_why_in_the_app_message(
    state_dir: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "trian.py"
    role = Role(name="t", entrypoint=str(missing))
    async with Supervisor(session="svc") as sv:
        status = await sv.wait(await sv.submit(app(role), "local"), timeout=30)
    assert status.state is AppState.FAILED
    why = f"cannot start '{missing}': No such file or directory"
    assert status.msg == f"t/0 exited with code 127: {why}", status


def _open_under(directory: Path) -> list[str]:
    """Files under ``directory`` this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor among them)
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


async def test_a_replica_that_cannot_start_says_why_in_its_log_and_keeps_no_file_open(
    state_dir: Path,
) -> None:
    # A noisy app keeps the log writer busy: the line must still be written before
    # ``wait`` returns, as a replica that ran has its last lines written (it was
    # queued and the exit told at once: missing in 4 of 30 reads right after ``wait``).
    noisy = py_role(
        "n", "import os\nfor _ in range(400): os.write(1, b'z' * 60000 + b'\\n')", num_replicas=2
    )
    async with Supervisor(session="svc") as sv:
        noise = await sv.submit(app(noisy), "local")
        for _ in range(8):
            role = Role(name="t", entrypoint="no-such-command-of-asupervisor")
            handle = await sv.submit(app(role), "local")
            status = await sv.wait(handle, timeout=30)
            assert status.state is AppState.FAILED
            lines = [line async for line in sv.log_iter(handle, "t", 0)]
            assert lines == [
                "asupervisor: cannot start 'no-such-command-of-asupervisor': "
                "No such file or directory\n"
            ]
        await sv.wait(noise, timeout=60)
        # Its files are closed as a replica's that ran (they were kept open for the
        # Supervisor's life, three per replica that never started).
        await until(lambda: not _open_under(state_dir), 10)


async def test_a_replica_starts_with_arguments_and_environment_as_long_as_execve_takes(
    state_dir: Path,
) -> None:
    # 300 KB of arguments and 100,000 non-ASCII characters of environment: legal for
    # ``execve`` (2 MiB in all, 128 KiB per string), but more than one record of the
    # reaper's socket (208 KiB by default): such a spawn failed with "Message too long".
    args = ["x" * 1000] * 300
    env = {"WIDE": "\u2713" * 40_000, "WIDER": "\u00e9" * 60_000}
    code = (
        "import os, sys;"
        "print(sum(map(len, sys.argv[1:])), len(os.environ['WIDE']), len(os.environ['WIDER']))"
    )
    role = py_role("big", code, args=args, env=env)
    too_long = Role(name="huge", entrypoint="true", args=["y" * 100_000] * 30)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.SUCCEEDED, status
        lines = [line async for line in sv.log_iter(handle, "big", 0)]
        assert lines == ["300000 40000 60000\n"]
        # Beyond what ``execve`` takes: the replica fails to start, saying why.
        status = await sv.wait(await sv.submit(app(too_long), "local"), timeout=30)
    assert status.state is AppState.FAILED
    assert status.msg == "huge/0 exited with code 127: cannot start 'true': Argument list too long"


async def test_replicas_failing_together_each_keep_their_own_exit(state_dir: Path) -> None:
    """The gang's stop of a replica that had exited, its exit not told yet (its output
    flushed, its error file read), made up one of its own: "stopped before it ran", no
    exit code, no error, in a fifth to a third of such apps. Both ranks' causes count."""
    role = Role(
        name="w", entrypoint="sh", args=["-c", "echo ran-$ASUPERVISOR_REPLICA_ID; exit 3"],
        num_replicas=2,
    )  # fmt: skip
    async with Supervisor(session="svc") as sv:
        for _ in range(15):
            status = await sv.wait(await sv.submit(app(role), "local"), timeout=30)
            assert status.state is AppState.FAILED
            replicas = status.roles[0].replicas
            # Each its own exit: 3, or the stop's SIGTERM where one was slower to get there
            # (a loaded machine); never none at all.
            assert 3 in [r.exit_code for r in replicas], replicas
            assert all(r.exit_code in (3, -15) for r in replicas), replicas
            assert not [r for r in replicas if "before it ran" in r.msg], replicas


FAIL_FIRST_ATTEMPT = (
    "import os, sys, time;"
    "attempt = int(os.environ['ASUPERVISOR_ATTEMPT']);"
    "first = os.environ['ASUPERVISOR_ROLE'] == 'a' and os.environ['ASUPERVISOR_REPLICA_ID'] == '0';"
    "sys.exit(1) if (attempt == 0 and first) else None;"
    "time.sleep(30) if attempt == 0 and {long} else None"
)


@pytest.mark.parametrize(
    ("policy", "restarted"),
    [
        (RetryPolicy.REPLICA, {("a", 0)}),
        (RetryPolicy.ROLE, {("a", 0), ("a", 1)}),
        (RetryPolicy.APPLICATION, {("a", 0), ("a", 1), ("b", 0)}),
    ],
)
async def test_retry_policies_restart_the_right_replicas(
    state_dir: Path, policy: RetryPolicy, restarted: set[tuple[str, int]]
) -> None:
    # Replicas other than a/0 sleep through their first attempt, so a restart is
    # the only way they can finish quickly; a/0 fails on its first attempt only.
    long = "True"
    a = py_role(
        "a",
        FAIL_FIRST_ATTEMPT.format(long=long),
        num_replicas=2,
        max_retries=1,
        retry_policy=policy,
    )
    b = py_role("b", FAIL_FIRST_ATTEMPT.format(long="False"))
    if policy is RetryPolicy.APPLICATION:
        b = py_role("b", FAIL_FIRST_ATTEMPT.format(long=long))
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(a, b), "local", cfg={"stop_grace": 2.0})
        if policy is RetryPolicy.REPLICA:
            # a/1 keeps sleeping on attempt 0: let the test end once a/0 is done.
            async for t in sv.watch(handle):
                if t.role == "a" and t.replica_id == 0 and t.dest == "SUCCEEDED":
                    break
            await sv.cancel(handle)
        status = await sv.wait(handle, timeout=40)
    assert status.num_restarts == 1
    for role_status in status.roles:
        for r in role_status.replicas:
            assert r.restarts == (1 if (r.role, r.id) in restarted else 0), r
    if policy is not RetryPolicy.REPLICA:
        assert status.state is AppState.SUCCEEDED, status


async def test_retries_exhausted_fails_with_restart_count(state_dir: Path) -> None:
    role = py_role("a", "import sys; sys.exit(2)", max_retries=2, retry_policy=RetryPolicy.REPLICA)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        status = await sv.wait(handle, timeout=30)
    assert status.state is AppState.FAILED
    replica = status.replica("a", 0)
    assert replica is not None and replica.restarts == 2 and replica.exit_code == 2
    assert status.num_restarts == 2


async def test_cancel_stops_processes_and_is_idempotent(state_dir: Path) -> None:
    role = py_role(
        "sleeper", "import os, time; print(os.getpid(), flush=True); time.sleep(60)", num_replicas=2
    )
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        pids = []
        for k in (0, 1):
            async for line in sv.log_iter(handle, "sleeper", k, should_tail=True):
                pids.append(int(line))
                break
        await sv.cancel(handle)
        await sv.cancel(handle)
        status = await sv.wait(handle, timeout=20)
        await sv.cancel(handle)
    assert status.state is AppState.CANCELLED
    assert all(r.state is ReplicaState.CANCELLED for r in status.roles[0].replicas)
    assert not any(pid_alive(p) for p in pids)


async def test_wait_timeout_raises_timeout_error_and_app_keeps_running(state_dir: Path) -> None:
    role = py_role("sleeper", "import time; time.sleep(60)")
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        with pytest.raises(WaitTimeout):
            await sv.wait(handle, timeout=0.3)
        with pytest.raises(TimeoutError):
            await sv.wait(handle, timeout=0.1)
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        await sv.cancel(handle)
        assert (await sv.wait(handle, timeout=20)).state is AppState.CANCELLED


async def test_close_stops_running_replicas(state_dir: Path) -> None:
    role = py_role("sleeper", "import os, time; print(os.getpid(), flush=True); time.sleep(60)")
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        async for line in sv.log_iter(handle, "sleeper", 0, should_tail=True):
            pid = int(line)
            break
    assert not pid_alive(pid)
    async with Supervisor(session="other") as sv2:
        described = await sv2.describe(handle)
    assert described is not None and described.state is AppState.CANCELLED


async def test_exit_by_signal_and_structured_error(state_dir: Path) -> None:
    killer = py_role("killed", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    writer = py_role(
        "writer",
        "import json, os, sys;"
        "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write("
        "json.dumps({'message': {'message': 'boom'}})); sys.exit(1)",
    )
    async with Supervisor(session="svc") as sv:
        h1 = await sv.submit(app(killer, name="k"), "local")
        h2 = await sv.submit(app(writer, name="w"), "local")
        s1 = await sv.wait(h1, timeout=30)
        s2 = await sv.wait(h2, timeout=30)
    r1 = s1.replica("killed", 0)
    assert s1.state is AppState.FAILED and r1 is not None
    assert r1.signal == "SIGKILL" and r1.exit_code == -9
    assert s2.state is AppState.FAILED
    assert "boom" in s2.structured_error_msg
    r2 = s2.replica("writer", 0)
    assert r2 is not None and "boom" in r2.structured_error_msg


async def test_missing_entrypoint_fails_with_a_message(state_dir: Path) -> None:
    role = Role(name="ghost", entrypoint="/nonexistent/program")
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        status = await sv.wait(handle, timeout=30)
        err = await _lines(sv, handle, "ghost", 0, streams="stderr")
    replica = status.replica("ghost", 0)
    assert status.state is AppState.FAILED and replica is not None
    assert replica.exit_code == 127
    assert "/nonexistent/program" in replica.msg
    assert any("/nonexistent/program" in line for line in err)


async def test_watch_yields_every_transition_in_order(state_dir: Path) -> None:
    role = py_role("a", "pass", num_replicas=2)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        seen = [t async for t in sv.watch(handle)]
    assert [t.seq for t in seen] == list(range(len(seen)))
    app_path = [(t.source, t.dest) for t in seen if t.role is None]
    assert app_path[0] == ("UNSUBMITTED", "SUBMITTED")
    assert app_path[-1] == ("RUNNING", "SUCCEEDED")
    for k in (0, 1):
        states = [t.dest for t in seen if t.role == "a" and t.replica_id == k]
        assert states == ["SUBMITTED", "PENDING", "RUNNING", "SUCCEEDED"]


async def test_state_is_recorded_on_disk(state_dir: Path) -> None:
    role = py_role("a", "pass")
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local", cfg={"log_dir": str(state_dir / "custom")})
        await sv.wait(handle, timeout=30)
    app_dir = state_dir / "custom" / "svc" / handle.rpartition("/")[2]
    state = json.loads((app_dir / "state.json").read_text())
    assert state["final"] is True and state["status"]["state"] == "SUCCEEDED"
    recorded = [json.loads(x) for x in (app_dir / "transitions.jsonl").read_text().splitlines()]
    assert [t["seq"] for t in recorded] == list(range(len(recorded)))
    assert json.loads((app_dir / "app.json").read_text())["app"]["name"] == "test"
    async with Supervisor(session="reader") as sv2:
        listed = await sv2.list("local")
        assert handle in [x.app_handle for x in listed]
        described = await sv2.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED
        assert [r.name for r in described.roles] == ["a"]
        assert await sv2.describe(handle + "-nope") is None
        assert not await sv2.exists("local://svc/never-was")


async def test_dryrun_is_pure_and_validates(state_dir: Path) -> None:
    role = py_role("a", "pass", args=["${replica_id}"])
    definition = app(role)
    async with Supervisor(session="svc") as sv:
        one = sv.dryrun(definition, "local", app_id="fixed-1")
        two = sv.dryrun(definition, "local", app_id="fixed-1")
        assert one.request == two.request
        assert "a/0:" in str(one) and "fixed-1" in str(one)
        assert definition.roles[0].args == ("-c", "pass", "${replica_id}")
        bad = app(Role(name="a", entrypoint="", num_replicas=0))
        with pytest.raises(SpecError) as err:
            sv.dryrun(bad, "local")
        assert {"roles[0].entrypoint", "roles[0].num_replicas"} <= set(err.value.fields)
        with pytest.raises(SpecError) as err:
            sv.dryrun(definition, "local", cfg={"log_dri": "/tmp"})
        assert "log_dir" in str(err.value)
        handle = await sv.schedule(one)
        assert handle == "local://svc/fixed-1"
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert one.request == two.request


async def test_prepend_cwd_and_gpu_assignment_are_in_the_request(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho from-cwd\n")
    script.chmod(0o755)
    role = Role(name="a", entrypoint="hello.sh")
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local", cfg={"prepend_cwd": True})
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert await _lines(sv, handle, "a") == ["from-cwd\n"]


async def test_many_replicas_start_and_finish(state_dir: Path) -> None:
    role = Role(name="w", entrypoint="true", num_replicas=50)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        with anyio.fail_after(60):
            status = await sv.wait(handle)
    assert status.state is AppState.SUCCEEDED
    assert len(status.roles[0].replicas) == 50


async def test_another_supervisor_waits_for_and_cancels_an_app_it_did_not_start(
    state_dir: Path,
) -> None:
    role = py_role("sleeper", "import time; time.sleep(60)")
    async with Supervisor(session="owner") as owner, Supervisor(session="other") as other:
        handle = await owner.submit(app(role), "local")
        assert other.status(handle) is None  # not followed here: no I/O, no answer
        with pytest.raises(WaitTimeout):
            await other.wait(handle, timeout=0.3)
        await other.cancel(handle)  # goes through the owner's records
        with anyio.fail_after(20):
            seen_by_other = await other.wait(handle)
        assert seen_by_other.state is AppState.CANCELLED
        assert (await owner.wait(handle, timeout=5)).state is AppState.CANCELLED


async def test_one_watch_hears_the_cancel_requests_of_every_app(state_dir: Path) -> None:
    """Five running apps cost their owner one inotify watch, not one each; the app
    another process cancels, and only it, ends CANCELLED, and its request goes with it."""
    role = py_role("sleeper", "import time; time.sleep(60)")
    async with Supervisor(session="owner") as owner, Supervisor(session="other") as other:
        before = len(watched_inodes())
        handles = [await owner.submit(app(role), "local") for _ in range(5)]
        assert len(watched_inodes()) - before == 1
        await other.cancel(handles[2])
        with anyio.fail_after(20):
            assert (await owner.wait(handles[2])).state is AppState.CANCELLED
        (requests,) = await anyio.to_thread.run_sync(
            lambda: list(state_dir.glob("**/cancel-requests/local"))
        )
        await until(lambda: not any(requests.iterdir()), 10)
        for handle in handles[:2] + handles[3:]:
            status = owner.status(handle)
            assert status is not None and status.state is AppState.RUNNING, status
            await owner.cancel(handle)


async def test_logs_of_an_unknown_replica_or_app_are_an_error(state_dir: Path) -> None:
    async with Supervisor(session="owner") as owner, Supervisor(session="other") as other:
        handle = await owner.submit(app(py_role("a", "print('x')")), "local")
        await owner.wait(handle, timeout=30)
        for sv in (owner, other):
            with pytest.raises(UnknownAppError):
                await _lines(sv, handle, "a", 5)
            with pytest.raises(UnknownAppError):
                await _lines(sv, handle, "nope", 0)
        with pytest.raises(UnknownAppError):
            await _lines(other, "local://owner/never", "a", 0)
        assert await _lines(other, handle, "a", 0) == ["x\n"]


async def test_a_launch_that_fails_leaves_nothing_open(state_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with Supervisor(session="svc") as sv:
        with pytest.raises(SubmitError, match="cannot create"):
            await sv.submit(app(py_role("r", "pass")), "local", {"log_dir": str(blocker / "x")})
        assert await sv.list("local") == []
    # The app's mailbox was closed, not left for the garbage collector to complain about.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_a_state_dir_that_cannot_hold_records_fails_the_submit_saying_where(
    tmp_path: Path,
) -> None:
    """The first records a local submit writes in the state directory are where other
    processes ask for a cancel: a state directory that is a file fails it as a SubmitError."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with Supervisor(session="svc", state_dir=blocker) as sv:
        with pytest.raises(SubmitError, match=f"cannot create .*{blocker}"):
            await sv.submit(app(py_role("r", "pass")), "local", {"log_dir": str(tmp_path / "logs")})


def _app_tasks(handle: str) -> list[str]:
    """The tasks that host ``handle``'s own task group (named after the app)."""
    return [t.name for t in anyio.get_running_tasks() if t.name == f"asupervisor app {handle}"]


async def test_each_app_runs_in_its_own_task_group_which_ends_with_it(state_dir: Path) -> None:
    """Every task of an app lives in that app's group: once the app ended and its
    runtime was released, nothing of it runs on in the Supervisor (no follow task,
    no action), while the Supervisor and its other apps go on."""
    async with Supervisor(session="svc") as sv:
        quick = [
            await sv.submit(app(py_role("w", "print('hi')", num_replicas=3)), "local")
            for _ in range(3)
        ]
        slow = await sv.submit(app(py_role("s", "import time; time.sleep(600)")), "local")
        assert _app_tasks(slow) == [f"asupervisor app {slow}"]
        for handle in quick:
            with anyio.fail_after(60):
                assert (await sv.wait(handle)).state is AppState.SUCCEEDED
        await until(lambda: not any(_app_tasks(h) for h in quick), 10)
        assert _app_tasks(slow) == [f"asupervisor app {slow}"]
        await sv.cancel(slow)
        with anyio.fail_after(60):
            assert (await sv.wait(slow)).state is AppState.CANCELLED
        await until(lambda: not _app_tasks(slow), 10)


async def test_a_stop_of_a_replica_that_ended_leaves_its_slot_settled(state_dir: Path) -> None:
    """Stopping a replica whose attempt ended (a gang stop racing its exit) answers the stop
    and leaves nothing to wait for: the app's close skips it, as it does every ended replica.

    White-box (the runtime's slots): what this pins is only the close's fast path.
    """
    from supervisor.backends.local.backend import LocalRuntime

    code = "import sys, time; time.sleep(600 * int(sys.argv[1]))"
    role = py_role("r", code, num_replicas=2, args=["${replica_id}"])
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")

        def first_ended() -> bool:
            status = sv.status(handle)
            ended = ReplicaState.SUCCEEDED
            return status is not None and status.roles[0].replicas[0].state is ended

        await until(first_ended, 30)
        runtime = sv._actors[handle].runtime
        assert isinstance(runtime, LocalRuntime)
        await runtime.stop([("r", 0)], "a gang stop that raced the exit")
        assert runtime.replica_slot(("r", 0)).settled()
        await sv.cancel(handle)
        with anyio.fail_after(30):
            assert (await sv.wait(handle)).state is AppState.CANCELLED
