"""Docker apps seen from processes that did not launch them (containers outlive Supervisors).

A second Supervisor, and separate ``asupervisor`` CLI processes, describe,
list, wait for, read the logs of and cancel apps: while the launching
Supervisor follows them (its records are the truth, a cancel goes through
it) and after it closed (the containers are the truth). Both engines; any
container or network left behind fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppDef, AppState, ReplicaState, Role, ShuttingDown, Supervisor

from .docker_engines import (
    IMAGE,
    EngineUnderTest,
    api,
    labelled,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]


# Prints, then waits for /gate/go (a bind-mounted host directory) before printing again.
GATED = """
import os, sys, time
print("started", os.environ["ASUPERVISOR_REPLICA_ID"], flush=True)
while not os.path.exists("/gate/go"):
    time.sleep(0.05)
print("after the gate", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def gated_app(gate: Path, *, replicas: int = 1, exit_code: int = 0) -> AppDef:
    from supervisor import BindMount

    role = Role(
        "w",
        image=IMAGE,
        entrypoint="python3",
        args=["-c", GATED],
        env={"EXIT_CODE": str(exit_code)},
        num_replicas=replicas,
        mounts=[BindMount(str(gate), "/gate", read_only=True)],
    )
    return AppDef("gated", [role])


async def first_line(sv: Supervisor, handle: str, role: str = "w", k: int = 0) -> str:
    async for line in sv.log_iter(handle, role, k, should_tail=True):
        return line
    raise AssertionError("no output")


def running_containers(engine: EngineUnderTest) -> list[dict[str, Any]]:
    found = labelled(engine.host, "containers", f"io.asupervisor.session={engine.session}")
    return [c for c in found if c["State"] == "running"]


async def test_a_second_supervisor_follows_and_cancels_through_the_owner(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    async with (
        Supervisor(session=engine.session) as owner,
        Supervisor(session=engine.session) as other,
    ):
        handle = await owner.submit(gated_app(tmp_path, replicas=2), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.RUNNING
        listed = {a.app_handle: a.state for a in await other.list("docker")}
        assert listed[handle] is AppState.RUNNING
        assert await first_line(other, handle, "w", 1) == "started 1\n"

        async with anyio.create_task_group() as tg:
            seen: dict[str, Any] = {}

            async def wait_foreign() -> None:
                seen["status"] = await other.wait(handle, timeout=60)

            tg.start_soon(wait_foreign)
            await other.cancel(handle)  # a cancel.request the owner acts on
            status = await owner.wait(handle, timeout=60)
        assert status.state is AppState.CANCELLED, status
        assert seen["status"].state is AppState.CANCELLED
        assert not running_containers(engine)


async def test_containers_outlive_their_supervisor_and_another_one_finishes_them(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path, exit_code=4), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
    # The owner closed: the container still runs.
    assert len(running_containers(engine)) == 1
    async with Supervisor(session=engine.session) as other:
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.RUNNING, described
        assert "no process follows" in described.msg
        opened = time.time()
        await anyio.Path(tmp_path / "go").touch()
        status = await other.wait(handle, timeout=60)
        assert status.state is AppState.FAILED, status
        replica = status.replica("w", 0)
        assert replica is not None and replica.exit_code == 4
        lines = [line async for line in other.log_iter(handle, "w", 0)]
        assert lines == ["started 0\n", "after the gate\n"]
        again = await other.describe(handle)
        assert again is not None and again.state is AppState.FAILED
        # The end nobody followed is recorded with its time, as the engine saw it.
        app_moves = [(t.source, t.dest) for t in again.transitions if t.role is None]
        assert app_moves[-1] == ("RUNNING", "FAILED"), again.transitions
        times = again.times
        assert times.started is not None and times.ended is not None, times
        assert times.started < opened < times.ended < time.time(), (times, opened)
        [listed] = [a for a in await other.list("docker") if a.app_handle == handle]
        assert listed.times == times


def cli(engine: EngineUnderTest, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "DOCKER_HOST": engine.host,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_cli_processes_read_and_cancel_an_app_nobody_follows(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"

    status = await anyio.to_thread.run_sync(cli, engine, state_dir, "status", handle, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "RUNNING"
    listed = await anyio.to_thread.run_sync(
        cli, engine, state_dir, "list", "--backend", "docker", "--json"
    )
    assert listed.returncode == 0, listed.stderr
    assert handle in {a["handle"] for a in json.loads(listed.stdout)}
    log = await anyio.to_thread.run_sync(cli, engine, state_dir, "log", handle, "w/0")
    assert log.returncode == 0 and log.stdout == "started 0\n", log

    cancelled = await anyio.to_thread.run_sync(cli, engine, state_dir, "cancel", handle)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not running_containers(engine)
    final = await anyio.to_thread.run_sync(cli, engine, state_dir, "status", handle, "--json")
    body = json.loads(final.stdout)
    assert body["state"] == "CANCELLED", body
    assert body["roles"][0]["replicas"][0]["state"] == ReplicaState.CANCELLED.name


SUBMITTER = """
import sys, anyio
from supervisor import AppDef, BindMount, Role, Supervisor

async def main() -> None:
    gate, host, session, code = sys.argv[1:5]
    role = Role("w", image="localhost/sv-test:py", entrypoint="python3", args=["-c", code],
                mounts=[BindMount(gate, "/gate", read_only=True)])
    async with Supervisor(session=session) as sv:
        handle = await sv.submit(AppDef("killed", [role]), "docker", {"host": host})
        print(handle, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_an_owner_killed_with_sigkill_leaves_an_app_others_can_wait_for(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-c", SUBMITTER, str(tmp_path), engine.host, engine.session, GATED]
    async with await anyio.open_process(argv, env=env) as owner:
        assert owner.stdout is not None
        handle = (await owner.stdout.receive()).decode().strip()
        owner.kill()  # SIGKILL: no close, no release, no final state
        await owner.wait()
    async with Supervisor(session=engine.session) as other:
        assert await first_line(other, handle) == "started 0\n"
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.RUNNING, described
        (tmp_path / "go").touch()
        status = await other.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        lines = [line async for line in other.log_iter(handle, "w", 0)]
        assert lines == ["started 0\n", "after the gate\n"]


async def test_a_reader_whose_record_predates_the_end_another_recorded_reads_that_end(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first reader to see an unfollowed app's containers all ended records its end,
    then removes them. A reader that read the app's record just before must not take their
    absence for their loss (UNKNOWN, "the app's containers are gone"): it reads the end
    recorded meanwhile. Seen in 1 of 28 runs of the SIGKILL test above on a loaded
    machine (the log follower's waiter finished the app under the test's ``wait``).

    That interleaving comes only by chance: here the reader's record is made the one read
    before the end (the real record, read then), the only stand-in in this test.
    """
    from supervisor.backends.store import AppStore

    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
    # The owner closed: nobody follows the app, whoever sees its end finishes it.

    def read_now() -> tuple[Path, Any]:
        (found,) = state_dir.glob(f"**/{handle.rsplit('/', 1)[1]}")
        return found, AppStore(found).read_state()

    app_dir, before_the_end = await anyio.to_thread.run_sync(read_now)
    assert before_the_end is not None and before_the_end[0].state is AppState.RUNNING
    (tmp_path / "go").touch()
    async with Supervisor(session=engine.session) as first:
        ended = await first.wait(handle, timeout=60)
    assert ended.state is AppState.SUCCEEDED, ended
    assert not labelled(engine.host, "containers", f"io.asupervisor.session={engine.session}")

    real_read_state = AppStore.read_state
    stale = [before_the_end]

    def read_before_the_end(store: AppStore) -> object:
        return stale.pop() if stale and store.app_dir == app_dir else real_read_state(store)

    monkeypatch.setattr(AppStore, "read_state", read_before_the_end)
    async with Supervisor(session=engine.session) as late:
        status = await late.wait(handle, timeout=60)
    assert not stale, "the reader did not read the app's record"
    assert status.state is AppState.SUCCEEDED, status
    assert status.replica("w", 0) == ended.replica("w", 0)


async def test_many_readers_of_an_ended_app_in_one_process_leave_its_finisher_threads(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    """Every reader of an unfollowed app that sees it ended goes to record its end, one at a
    time (the finalize lock). The one that holds the lock needs worker threads to read and
    write the records; the others must not take them all while they wait for the lock.
    With the default limiter at 2 threads (a service may lower it; 40, anyio's default,
    is reached the same way by 40 readers), 16 readers all get the end. Checked: before
    the lock's waits had threads of their own this hung on dockerd; Podman answers the
    readers' container lists one after another, so they reach the lock apart and it passed.
    With the threads fixed, 2 runs in 12 on dockerd still failed: the readers that listed
    the container while the finisher removed it (state ``removing``) answered UNKNOWN; a
    container being removed now sends its reader to the end recorded, as none does.
    """
    readers = 16
    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path, exit_code=3), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
    (tmp_path / "go").touch()
    label = f"io.asupervisor.session={engine.session}"
    [container] = labelled(engine.host, "containers", label)
    with anyio.fail_after(60):  # nobody follows the app: the engine says when it ended
        await anyio.to_thread.run_sync(
            api, engine.host, "POST", f"/containers/{container['Id']}/wait"
        )
    anyio.to_thread.current_default_thread_limiter().total_tokens = 2
    async with Supervisor(session=engine.session) as late:
        states: list[AppState] = []

        async def read() -> None:
            described = await late.describe(handle)
            assert described is not None
            states.append(described.state)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(readers):
                    tg.start_soon(read)
    assert states == [AppState.FAILED] * readers, states
    assert not labelled(engine.host, "containers", label)


async def test_a_cli_follower_sees_an_unfollowed_app_to_its_end(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "DOCKER_HOST": engine.host,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "supervisor.cli.main", "log", "-f", handle, "w/0"]
    async with await anyio.open_process(argv, env=env) as follower:
        assert follower.stdout is not None
        first = await follower.stdout.receive()
        assert first == b"started 0\n"
        (tmp_path / "go").touch()
        rest = b""
        with anyio.fail_after(60):
            async for chunk in follower.stdout:
                rest += chunk
            assert await follower.wait() == 0
    assert rest == b"after the gate\n"
    # The follower saw the end first, so it recorded it and removed the containers.
    final = await anyio.to_thread.run_sync(cli, engine, state_dir, "status", handle, "--json")
    assert json.loads(final.stdout)["state"] == "SUCCEEDED"
    assert not labelled(engine.host, "containers", f"io.asupervisor.session={engine.session}")


async def test_a_cli_follower_ends_soon_after_the_app_not_at_its_re_check(
    engine: EngineUnderTest, tmp_path: Path, state_dir: Path
) -> None:
    """The engine's die event ends ``log -f``, not the follower's 30 s re-check.

    Nothing in the replica's directory changes when a container nobody follows
    exits, so only the engine's events can tell the follower in time. The bound
    leaves room for a slow engine and a loaded machine, and is still well short
    of the 30 s re-check.
    """
    async with Supervisor(session=engine.session) as owner:
        handle = await owner.submit(gated_app(tmp_path), "docker", engine.cfg)
        assert await first_line(owner, handle) == "started 0\n"
    # The owner closed (as `asupervisor run` does when it exits): the container runs on.
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "DOCKER_HOST": engine.host,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "supervisor.cli.main", "log", "-f", handle, "w/0"]
    async with await anyio.open_process(argv, env=env) as follower:
        assert follower.stdout is not None
        assert await follower.stdout.receive() == b"started 0\n"
        rest = b""
        (tmp_path / "go").touch()
        with anyio.fail_after(20):
            async for chunk in follower.stdout:
                rest += chunk
            assert await follower.wait() == 0
    assert rest == b"after the gate\n"
    final = await anyio.to_thread.run_sync(cli, engine, state_dir, "status", handle, "--json")
    assert json.loads(final.stdout)["state"] == "SUCCEEDED"


async def test_close_ends_open_streams_of_a_docker_app_which_runs_on(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    """Leaving ``async with`` ends a follow, a watch and a wait; the durable app runs on."""
    ended: dict[str, object] = {}
    all_ended = anyio.Event()

    def end(what: str, value: object) -> None:
        ended[what] = value
        if len(ended) == 3:
            all_ended.set()

    async with anyio.create_task_group() as tg:
        async with Supervisor(session=engine.session) as owner:
            handle = await owner.submit(gated_app(tmp_path), "docker", engine.cfg)
            following = anyio.Event()

            async def follow() -> None:
                lines = []
                async for line in owner.log_iter(handle, "w", 0, should_tail=True):
                    lines.append(line)
                    following.set()
                end("log", lines)

            async def watch() -> None:
                end("watch", [t.dest async for t in owner.watch(handle) if t.role is None])

            async def wait() -> None:
                try:
                    await owner.wait(handle)
                except ShuttingDown as e:
                    end("wait", e)

            tg.start_soon(follow)
            tg.start_soon(watch)
            tg.start_soon(wait)
            await following.wait()
        with anyio.fail_after(20):  # far below the 30 s re-check and the gate (never opened)
            await all_ended.wait()
    assert ended["log"] == ["started 0\n"]
    watched = ended["watch"]
    assert isinstance(watched, list) and watched[-1] == "RUNNING", watched
    assert isinstance(ended["wait"], ShuttingDown)
    assert len(running_containers(engine)) == 1  # durable: it runs on
    async with Supervisor(session=engine.session) as other:
        (tmp_path / "go").touch()
        status = await other.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
    assert not running_containers(engine)
