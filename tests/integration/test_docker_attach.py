"""``Supervisor.attach``: a new process takes over a Docker app whose owner is gone.

The owner is a separate process, SIGKILLed while the app runs (no close, no
release, no final record). The process that attaches then follows the app as
its owner: a replica that fails afterwards is retried under the app's policy,
the app ends as its machines decide, and its ``watch`` gives every transition,
recorded ones and live ones, exactly once. While an owner lives, ``attach``
only observes. Both engines; any container or network left behind fails the test.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppDef, AppState, BindMount, Role, Supervisor, UnknownAppError
from supervisor.backends.docker.engine import engine_time
from supervisor.status import Transition

from .docker_engines import IMAGE, EngineUnderTest, api, labelled
from .helpers import until

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]

# Attempt 0: replica 0 fails once /gate/fail exists, replica 1 runs until stopped.
# Attempt 1 (the retry): both succeed.
REPLICA = """
import os, sys, time
attempt = int(os.environ["ASUPERVISOR_ATTEMPT"])
k = int(os.environ["ASUPERVISOR_REPLICA_ID"])
print("attempt", attempt, flush=True)
if attempt == 0:
    while k == 1 or not os.path.exists("/gate/fail"):
        time.sleep(0.05)
    print("failing", flush=True)
    sys.exit(3)
print("done", flush=True)
"""

OWNER = """
import sys, anyio
from supervisor import AppDef, BindMount, Role, RetryPolicy, Supervisor

async def main() -> None:
    gate, host, session, image, code, replicas = sys.argv[1:7]
    role = Role("w", image=image, entrypoint="python3", args=["-c", code],
                num_replicas=int(replicas),
                max_retries=1, retry_policy=RetryPolicy.APPLICATION,
                mounts=[BindMount(gate, "/gate", read_only=True)])
    async with Supervisor(session=session) as sv:
        handle = await sv.submit(AppDef("adopted", [role]), "docker",
                                 {"host": host, "stop_grace": 2.0})
        for k in range(int(replicas)):  # each one's first line is in its files before the kill
            async for _ in sv.log_iter(handle, "w", k, should_tail=True):
                break
        print(handle, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


# The retry below: attempt 0 fails once /gate/fail exists, attempt 1 succeeds once
# /gate/done does.
RETRIED = """
import os, sys, time
attempt = os.environ["ASUPERVISOR_ATTEMPT"]
gate = "/gate/fail" if attempt == "0" else "/gate/done"
while not os.path.exists(gate):
    time.sleep(0.02)
sys.exit(3 if attempt == "0" else 0)
"""

# An owner whose coalesced writes wait 5 s instead of 50 ms: the window a busy owner
# leaves open for a moment, held open for the test to kill it in.
SLOW_WRITING_OWNER = """
import sys, anyio
import supervisor.actor
from supervisor import AppDef, BindMount, Role, RetryPolicy, Supervisor

supervisor.actor.PERSIST_INTERVAL = 5.0

async def main() -> None:
    gate, host, session, image, code = sys.argv[1:6]
    role = Role("w", image=image, entrypoint="python3", args=["-c", code], num_replicas=1,
                max_retries=1, retry_policy=RetryPolicy.REPLICA,
                mounts=[BindMount(gate, "/gate", read_only=True)])
    async with Supervisor(session=session) as sv:
        handle = await sv.submit(AppDef("retried", [role]), "docker",
                                 {"host": host, "stop_grace": 2.0})
        print(handle, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


# An owner whose engine takes 30 s per removal (an engine under load takes seconds):
# killed after its app's final record, it dies before removing the app's container.
SLOW_REMOVING_OWNER = """
import sys, anyio
from supervisor import AppDef, Role, Supervisor
from supervisor.backends.docker.engine import Engine

removing = Engine.remove

async def slow_remove(engine: Engine, cid: str) -> None:
    await anyio.sleep(30)
    await removing(engine, cid)

Engine.remove = slow_remove

async def main() -> None:
    host, session, image = sys.argv[1:4]
    role = Role("w", image=image, entrypoint="true")
    async with Supervisor(session=session) as sv:
        handle = await sv.submit(AppDef("ending", [role]), "docker", {"host": host})
        print(handle, flush=True)
        await sv.wait(handle)
        await anyio.sleep_forever()

anyio.run(main)
"""


def _owner_env(state_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def _running_retry(engine: EngineUnderTest, app_id: str) -> dict[str, Any] | None:
    """The container of the app's attempt 1, once it runs."""
    for c in labelled(engine.host, "containers", f"io.asupervisor.app_id={app_id}"):
        if c["Labels"].get("io.asupervisor.attempt") == "1" and c["State"] == "running":
            return c
    return None


def _key(t: Transition) -> tuple[object, ...]:
    return (t.seq, t.source, t.dest, t.trigger, t.role, t.replica_id, t.attempt)


async def _owner_killed_while_running(
    engine: EngineUnderTest, gate: Path, state_dir: Path, replicas: int = 2
) -> str:
    argv = [sys.executable, "-c", OWNER, str(gate), engine.host, engine.session, IMAGE, REPLICA]
    argv.append(str(replicas))
    async with await anyio.open_process(argv, env=_owner_env(state_dir)) as owner:
        assert owner.stdout is not None
        with anyio.fail_after(120):
            handle = (await owner.stdout.receive()).decode().strip()
        owner.kill()  # SIGKILL: no close, no release, no final record
        await owner.wait()
    return handle


async def _failed_while_nobody_followed(engine: EngineUnderTest, gate: Path, handle: str) -> None:
    """Make replica 0 of the (owner-killed) app fail, and return once its container exited."""
    (gate / "fail").touch()
    app_id = handle.rsplit("/", 1)[1]
    [failing] = [
        c
        for c in labelled(engine.host, "containers", f"io.asupervisor.app_id={app_id}")
        if c["Labels"]["io.asupervisor.replica_id"] == "0"
    ]
    with anyio.fail_after(60):  # the engine's wait: returns once the container exited
        await anyio.to_thread.run_sync(
            api, engine.host, "POST", f"/containers/{failing['Id']}/wait"
        )


async def test_an_app_whose_owner_was_sigkilled_is_retried_by_the_process_that_attaches(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    handle = await _owner_killed_while_running(engine, tmp_path, state_dir)
    async with Supervisor(session=engine.session) as sv:
        stream = sv.events()  # every app this Supervisor follows: attached ones too
        attached = await sv.attach(handle)
        assert attached.state is AppState.RUNNING, attached
        assert handle in sv.followed()
        record = json.loads(
            (
                state_dir / "index" / "docker" / engine.session / f"{handle.rsplit('/', 1)[1]}.json"
            ).read_text()
        )
        app_json = json.loads((Path(record["app_dir"]) / "app.json").read_text())
        assert app_json["owner"]["pid"] == os.getpid()  # this process holds the lease now

        seen: list[Transition] = []

        async def watch() -> None:
            async for t in sv.watch(handle):
                seen.append(t)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            (tmp_path / "fail").touch()
            with anyio.fail_after(120):
                final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED, final
        assert final.num_restarts == 1, final
        assert [r.restarts for r in final.roles] == [1]
        # Every transition once, in order: the dead owner's then this process's.
        assert [t.seq for t in seen] == list(range(len(seen)))
        restarts = [t for t in seen if t.trigger == "restart"]
        assert sorted((t.replica_id, t.attempt) for t in restarts) == [(0, 1), (1, 1)], seen
        assert (seen[-1].role, seen[-1].dest) == (None, "SUCCEEDED"), seen
        lines = [line async for line in sv.log_iter(handle, "w", 0)]
        assert lines == ["attempt 0\n", "failing\n", "attempt 1\n", "done\n"], lines
        # The event stream carries what happened since the attach, once each.
        streamed = []
        async with stream:
            with anyio.move_on_after(1):
                async for event in stream:
                    assert event.handle == handle
                    streamed.append(_key(event.transition))
        live = [_key(t) for t in seen if t.seq >= restarts[0].seq]
        assert streamed == [k for k in map(_key, seen) if k in streamed], streamed  # in order
        assert set(live) <= set(streamed) and len(streamed) == len(set(streamed)), streamed

    async with Supervisor(session=engine.session) as later:
        described = await later.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED, described
        # The journal on disk holds the same transitions, none written twice.
        assert [_key(t) for t in described.transitions] == [_key(t) for t in seen]


async def test_an_observer_takes_the_app_over_by_attaching_again_once_its_owner_died(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """A second replica of a service observes an app while its owner lives (``status``
    from the records), then the owner is SIGKILLed: attaching again makes it the owner,
    its observation gives way to the app's machines, and the retry is carried out."""
    argv = [sys.executable, "-c", OWNER, str(tmp_path), engine.host, engine.session, IMAGE, REPLICA]
    argv.append("2")
    async with (
        await anyio.open_process(argv, env=_owner_env(state_dir)) as owner,
        Supervisor(session=engine.session) as sv,
    ):
        assert owner.stdout is not None
        with anyio.fail_after(120):
            handle = (await owner.stdout.receive()).decode().strip()
        observed = await sv.attach(handle)
        assert observed.state is AppState.RUNNING, observed
        assert sv.followed() == [] and sv.status(handle) is not None
        owner.kill()  # SIGKILL: its lease goes with it
        await owner.wait()
        taken = await sv.attach(handle)
        assert taken.state is AppState.RUNNING, taken
        assert sv.followed() == [handle]
        (tmp_path / "fail").touch()
        with anyio.fail_after(120):
            final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED and final.num_restarts == 1, final
        now = sv.status(handle)
        assert now is not None and now.state is AppState.SUCCEEDED, now
        assert now.num_restarts == 1, now


async def test_a_retry_whose_owner_died_before_recording_its_start_is_taken_over_as_is(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """The owner is SIGKILLed while its replica's retry runs and before its coalesced
    write recorded that start. It recorded the retry itself before making the retry's
    container, so the process that attaches follows that container as attempt 1 of 1
    (it took it for the failed attempt: the failure and the retry were lost, the app
    ended SUCCEEDED with 0 restarts, and a failure of the retry would have been retried
    past max_retries), and records its RUNNING at the engine's start time, not at the
    attach a second later."""
    argv = [sys.executable, "-c", SLOW_WRITING_OWNER, str(tmp_path), engine.host]
    async with await anyio.open_process(
        [*argv, engine.session, IMAGE, RETRIED], env=_owner_env(state_dir)
    ) as owner:
        assert owner.stdout is not None
        with anyio.fail_after(120):
            handle = (await owner.stdout.receive()).decode().strip()
            app_id = handle.rsplit("/", 1)[1]
            (tmp_path / "fail").touch()
            retry = None
            while retry is None:  # the engine's state, polled: Podman's events lag
                await anyio.sleep(0.02)
                retry = await anyio.to_thread.run_sync(_running_retry, engine, app_id)
        owner.kill()
        await owner.wait()
    index = state_dir / "index" / "docker" / engine.session / f"{app_id}.json"
    state = json.loads((Path(json.loads(index.read_text())["app_dir"]) / "state.json").read_text())
    [recorded] = state["status"]["roles"][0]["replicas"]
    assert (recorded["state"], recorded["restarts"]) == ("PENDING", 1), recorded
    inspected = await anyio.to_thread.run_sync(
        api, engine.host, "GET", f"/containers/{retry['Id']}/json"
    )
    engine_started = engine_time(inspected["State"]["StartedAt"])
    assert engine_started is not None
    await anyio.sleep(1)
    async with Supervisor(session=engine.session) as sv:
        attached = await sv.attach(handle)
        assert attached.state is AppState.RUNNING, attached
        (tmp_path / "done").touch()
        with anyio.fail_after(60):
            final = await sv.wait(handle)
        assert (final.state, final.num_restarts) == (AppState.SUCCEEDED, 1), final
        described = await sv.describe(handle)
    assert described is not None
    seen = described.transitions
    assert [t.seq for t in seen] == list(range(len(seen)))
    restarts = [t for t in seen if t.trigger == "restart"]
    assert [(t.replica_id, t.attempt) for t in restarts] == [(0, 1)], seen
    assert restarts[0].msg == "w/0 exited with code 3; restart 1/1 (REPLICA)", restarts
    [started] = [t for t in seen if t.role and t.dest == "RUNNING" and t.attempt == 1]
    assert abs(started.at - engine_started) < 0.01, (started, engine_started)


async def test_what_an_owner_killed_amid_its_apps_end_left_goes_when_the_app_is_read(
    engine: EngineUnderTest, state_dir: Path
) -> None:
    """The owner recorded its app's end and was SIGKILLed before it removed the container
    and network. Nobody finishes an ended app, so they stayed for ever: the first reader
    of the app now removes them (once: it marks them removed)."""
    argv = [sys.executable, "-c", SLOW_REMOVING_OWNER, engine.host, engine.session, IMAGE]
    async with await anyio.open_process(argv, env=_owner_env(state_dir)) as owner:
        assert owner.stdout is not None
        with anyio.fail_after(120):
            handle = (await owner.stdout.receive()).decode().strip()
            app_id = handle.rsplit("/", 1)[1]
            index = state_dir / "index" / "docker" / engine.session / f"{app_id}.json"
            app_dir = Path(json.loads(index.read_text())["app_dir"])
            while not json.loads((app_dir / "state.json").read_text())["final"]:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        owner.kill()
        await owner.wait()
    label = f"io.asupervisor.app_id={app_id}"
    assert labelled(engine.host, "containers", label), "the owner removed its container"
    assert labelled(engine.host, "networks", label), "the owner removed its network"
    async with Supervisor(session=engine.session) as sv:
        described = await sv.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED, described
    assert labelled(engine.host, "containers", label) == []
    assert labelled(engine.host, "networks", label) == []
    assert (app_dir / "containers-removed").exists()


async def test_a_container_removed_while_nobody_followed_counts_as_killed_and_is_retried(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """``docker rm -f`` of a replica's container between its owner's death and the attach:
    the replica was killed (137) and the app's retry runs the next attempt of both."""
    handle = await _owner_killed_while_running(engine, tmp_path, state_dir)
    app_id = handle.rsplit("/", 1)[1]
    [gone] = [
        c
        for c in labelled(engine.host, "containers", f"io.asupervisor.app_id={app_id}")
        if c["Labels"]["io.asupervisor.replica_id"] == "1"
    ]
    await anyio.to_thread.run_sync(api, engine.host, "DELETE", f"/containers/{gone['Id']}?force=1")
    async with Supervisor(session=engine.session) as sv:
        await sv.attach(handle)
        with anyio.fail_after(120):
            final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED, final
        assert final.num_restarts == 1, final
        described = await sv.describe(handle)
        assert described is not None
        restarts = [t for t in described.transitions if t.trigger == "restart"]
        assert [t.replica_id for t in restarts] == [0, 1], described.transitions
        said = "w/1 killed by SIGKILL: its container is gone; restart 1/1"
        assert all(t.msg.startswith(said) for t in restarts), restarts
        lines = [line async for line in sv.log_iter(handle, "w", 1)]
        assert lines == ["attempt 0\n", "attempt 1\n", "done\n"], lines


async def test_attach_while_the_owner_lives_only_observes(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    role = Role(
        "w",
        image=IMAGE,
        entrypoint="python3",
        args=["-c", REPLICA],
        num_replicas=1,
        mounts=[BindMount(str(tmp_path), "/gate", read_only=True)],
    )
    async with (
        Supervisor(session=engine.session) as owner,
        Supervisor(session=engine.session) as other,
    ):
        handle = await owner.submit(AppDef("observed", [role]), "docker", engine.cfg)
        seen = await other.attach(handle)
        assert seen.state in (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING), seen
        assert other.followed() == []  # observed: its status kept, nothing carried out
        assert other.status(handle) is not None
        (tmp_path / "fail").touch()
        with anyio.fail_after(120):
            final = await other.wait(handle)
        await until(lambda: getattr(other.status(handle), "is_settled", False), 30)
        assert final.state is AppState.FAILED, final  # max_retries=0: the owner decided
        now = other.status(handle)
        assert now is not None and now.state is AppState.FAILED and now.msg == final.msg, now
        assert (await other.attach(handle)).state is AppState.FAILED
        with pytest.raises(UnknownAppError):
            await other.attach(handle.rsplit("/", 1)[0] + "/no-such-app")


async def test_the_cli_attaches_to_an_app_whose_replica_failed_while_nobody_followed_it(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """``asupervisor attach``: the failure that happened while the app had no owner is
    decided by its machines on attach (a retry left: the app runs again), to its end."""
    handle = await _owner_killed_while_running(engine, tmp_path, state_dir)
    await _failed_while_nobody_followed(engine, tmp_path, handle)
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "supervisor.cli.main", "--session", engine.session]
    with anyio.fail_after(120):
        done = await anyio.run_process([*argv, "attach", handle, "--json"], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    shown = json.loads(done.stdout)
    assert (shown["state"], shown["num_restarts"]) == ("SUCCEEDED", 1), shown
    assert shown["ended"] is not None


async def test_a_read_of_a_failure_with_a_retry_left_leaves_the_retry_to_whoever_attaches(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """``describe`` and ``list`` of an app whose replica failed, with a retry left, while
    nobody followed it read UNKNOWN and record nothing: the retry is the attach's to make.
    A read recorded it FAILED (and removed its containers), and the attach then gave that."""
    handle = await _owner_killed_while_running(engine, tmp_path, state_dir, replicas=1)
    await _failed_while_nobody_followed(engine, tmp_path, handle)
    async with Supervisor(session=engine.session) as reader:
        described = await reader.describe(handle)
        listed = [a for a in await reader.list("docker") if a.app_handle == handle]
    assert described is not None and described.state is AppState.UNKNOWN, described
    assert "w/0 failed with a retry left" in described.msg, described
    assert [(a.state, a.msg) for a in listed] == [(AppState.UNKNOWN, described.msg)], listed
    async with Supervisor(session=engine.session) as sv:
        await sv.attach(handle)
        with anyio.fail_after(120):
            final = await sv.wait(handle)
    assert (final.state, final.num_restarts) == (AppState.SUCCEEDED, 1), final
