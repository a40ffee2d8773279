"""The docker backend on real engines (dockerd and Podman): exits, gang failure, retries, cancel.

Every test runs on both engines (scripts/docker-engines starts them) and fails
if it leaves a container or network behind.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    ReplicaState,
    RetryPolicy,
    Role,
    SubmitError,
    Supervisor,
)

from .docker_engines import IMAGE, EngineUnderTest
from .helpers import hold_while_it_ends

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]


def py(name: str, code: str, **kw: Any) -> Role:
    return Role(name=name, image=IMAGE, entrypoint="python3", args=["-c", code], **kw)


async def stdout(sv: Supervisor, handle: str, role: str, k: int = 0) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, streams="stdout")]


async def test_success_and_failure_exit_codes_with_error_json(engine: EngineUnderTest) -> None:
    fail = (
        "import json, os, sys;"
        "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write("
        "json.dumps({'message': {'message': 'boom in replica'}}));"
        "print('bye'); sys.exit(3)"
    )
    async with Supervisor(session=engine.session) as sv:
        ok = await sv.submit(AppDef("ok", [py("w", "print('hello')")]), "docker", engine.cfg)
        bad = await sv.submit(AppDef("bad", [py("w", fail)]), "docker", engine.cfg)
        assert ok.startswith(f"docker://{engine.session}/ok-")
        status = await sv.wait(ok, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        replica = status.replica("w", 0)
        assert replica is not None and replica.exit_code == 0
        assert replica.hostname.endswith("-w-0")
        assert await stdout(sv, ok, "w") == ["hello\n"]
        failed = await sv.wait(bad, timeout=60)
        assert failed.state is AppState.FAILED, failed
        replica = failed.replica("w", 0)
        assert replica is not None and replica.exit_code == 3
        assert "boom in replica" in replica.structured_error_msg
        assert await stdout(sv, bad, "w") == ["bye\n"]


async def test_gang_failure_stops_the_other_replicas(engine: EngineUnderTest) -> None:
    app = AppDef(
        "gang",
        [
            py("fails", "import time, sys; time.sleep(0.5); sys.exit(7)"),
            py("sleeps", "import time; time.sleep(60)", num_replicas=2),
        ],
    )
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(app, "docker", engine.cfg)
        start = time.monotonic()
        status = await sv.wait(handle, timeout=60)
        assert time.monotonic() - start < 30  # not the sleepers' 60 s
        assert status.state is AppState.FAILED, status
        assert status.replica("fails", 0).exit_code == 7  # type: ignore[union-attr]
        for k in (0, 1):
            sleeper = status.replica("sleeps", k)
            assert sleeper is not None and sleeper.state is ReplicaState.CANCELLED, status


# The line goes out in one write(2): replicas run with PYTHONUNBUFFERED, where print() writes
# each of its pieces apart, so a restart's SIGTERM could cut it ('attempt' alone, seen in CI).
FLAKY = (
    "import os, sys;"
    "a = int(os.environ['ASUPERVISOR_ATTEMPT']);"
    "os.write(1, f\"attempt {a} {os.environ['ASUPERVISOR_REPLICA_ID']}\\n\".encode());"
    "sys.exit(0 if a >= 2 or os.environ['ASUPERVISOR_REPLICA_ID'] != '0' else 5)"
)


@pytest.mark.parametrize("policy", list(RetryPolicy))
async def test_retries_follow_the_policy(engine: EngineUnderTest, policy: RetryPolicy) -> None:
    role = py("w", FLAKY, num_replicas=2, max_retries=2, retry_policy=policy)
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("retry", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.SUCCEEDED, status
        assert status.num_restarts == 2, status
        lines = await stdout(sv, handle, "w", 0)
        assert lines == ["attempt 0 0\n", "attempt 1 0\n", "attempt 2 0\n"]
        other = await stdout(sv, handle, "w", 1)
        if policy is RetryPolicy.REPLICA:
            # Replica 1 succeeds at once, and REPLICA leaves it alone while 0 retries.
            assert other == ["attempt 0 1\n"]
        else:
            # ROLE and APPLICATION restart replica 1 with replica 0 while it still runs (a
            # replica that succeeded stays so). Under load replica 0 may fail before replica
            # 1's Python wrote: that attempt leaves no line. Every line is whole (one write),
            # one per attempt, in order, and the attempt that succeeded wrote its line.
            assert other and all(re.fullmatch(r"attempt [012] 1\n", x) for x in other), other
            attempts = [int(line.split()[1]) for line in other]
            assert attempts == sorted(set(attempts)), other


async def test_cancel_sends_sigterm_then_sigkill_after_the_grace(engine: EngineUnderTest) -> None:
    polite = (
        "import signal, sys, time;"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(0)));"
        "print('ready', flush=True); time.sleep(60)"
    )
    stubborn = (
        "import signal, time;"
        "signal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM', flush=True));"
        "print('ready', flush=True); time.sleep(60)"
    )
    app = AppDef("cancel", [py("polite", polite), py("stubborn", stubborn)])
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(app, "docker", {**engine.cfg, "stop_grace": 1.0})
        for role in ("polite", "stubborn"):
            async for line in sv.log_iter(handle, role, 0, should_tail=True):
                assert line == "ready\n"
                break
        await sv.cancel(handle)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.CANCELLED, status
        assert await stdout(sv, handle, "polite") == ["ready\n", "got SIGTERM\n"]
        assert await stdout(sv, handle, "stubborn") == ["ready\n", "ignoring SIGTERM\n"]
        stubborn_status = status.replica("stubborn", 0)
        assert stubborn_status is not None and stubborn_status.exit_code == 137


async def test_a_missing_image_fails_the_submit_clearly(engine: EngineUnderTest) -> None:
    role = Role("w", image="localhost/no-such-image:never", entrypoint="true")
    async with Supervisor(session=engine.session) as sv:
        with pytest.raises(SubmitError) as caught:
            await sv.submit(AppDef("noimage", [role]), "docker", engine.cfg)
    assert "localhost/no-such-image:never" in str(caught.value)
    assert "not on the engine" in str(caught.value)
    assert caught.value.transient is False


async def test_submitting_ten_replicas_and_waiting(engine: EngineUnderTest) -> None:
    role = py("w", "import os; print(os.environ['ASUPERVISOR_REPLICA_ID'])", num_replicas=10)
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("ten", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        for k in range(10):
            assert await stdout(sv, handle, "w", k) == [f"{k}\n"]


async def test_a_missing_entrypoint_fails_the_replica_saying_why(engine: EngineUnderTest) -> None:
    role = Role("w", image=IMAGE, entrypoint="/no/such/prog")
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("noentry", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.FAILED, status
        replica = status.replica("w", 0)
        assert replica is not None and replica.exit_code not in (None, 0)
        lines = [line async for line in sv.log_iter(handle, "w", 0, streams="stderr")]
        # dockerd's init names the program; Podman's (catatonit) only the error.
        assert any("No such file or directory" in line for line in lines), lines


async def test_an_engine_that_does_not_answer_fails_the_submit_as_transient(
    state_dir: Path, tmp_path: Path
) -> None:
    """No engine needed: the socket does not exist, so a later retry may find one."""
    role = Role("w", image=IMAGE, entrypoint="true")
    host = f"unix://{tmp_path / 'no-engine.sock'}"
    async with Supervisor(session="noengine") as sv:
        with pytest.raises(SubmitError) as caught:
            await sv.submit(AppDef("noengine", [role]), "docker", {"host": host})
    assert caught.value.transient is True
    assert "no-engine.sock" in str(caught.value)


BURST = (
    "import sys\n"
    "for i in range(20000): print(f'line {i}')\n"
    "sys.stdout.write('last, without newline'); sys.stdout.flush()\n"
    "sys.exit(int(sys.argv[1]))\n"
)


async def test_every_line_written_just_before_the_exit_is_read_right_after_wait(
    engine: EngineUnderTest,
) -> None:
    """The exit is reported before the engine's last fetch completes the files: every
    read right after ``wait`` (here, followed, and from another Supervisor) waits for it.
    Also across a retry: the first container's output is copied before it is removed."""
    expected = [f"line {i}\n" for i in range(20000)] + ["last, without newline"]
    role = Role(
        "w",
        image=IMAGE,
        entrypoint="sh",
        # Fails on its first attempt, succeeds on the retry: same output each time.
        args=["-c", 'python3 -c "$0" "$(( ASUPERVISOR_ATTEMPT == 0 ? 5 : 0 ))"', BURST],
        max_retries=1,
    )
    async with (
        Supervisor(session=engine.session) as sv,
        Supervisor(session=engine.session) as other,
    ):
        handle = await sv.submit(AppDef("burst", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        async with anyio.create_task_group() as tg:
            reads: dict[str, list[str]] = {}

            async def read(name: str, reader: Supervisor, tail: bool) -> None:
                lines = reader.log_iter(handle, "w", 0, streams="stdout", should_tail=tail)
                reads[name] = [line async for line in lines]

            tg.start_soon(read, "here", sv, False)
            tg.start_soon(read, "followed", sv, True)
            tg.start_soon(read, "other", other, False)
        # Two attempts, one after the other; the first one's last line was ended
        # when its stream ended, so the second does not run on from it.
        both = [*expected[:-1], "last, without newline\n", *expected]
        for name, got in reads.items():
            assert got == both, (name, len(got), got[-3:])


async def test_a_running_container_removed_by_force_from_outside_is_killed_137(
    engine: EngineUnderTest,
) -> None:
    """`docker rm -f` of a replica's running container from outside: the replica FAILED
    with 137 (SIGKILL), on both engines. Podman 4.3 sometimes announces no exit for it
    (its label filter no longer matches a removed container) and may answer 500 "no such
    container" for it: the end of its log stream makes the backend look, and gone counts
    as killed."""
    from .docker_engines import api, labelled

    app = AppDef("removed", [py("w", "import time; print('up', flush=True); time.sleep(600)")])
    with anyio.fail_after(180):
        async with Supervisor(session=engine.session) as sv:
            handle = await sv.submit(app, "docker", engine.cfg)
            async for line in sv.log_iter(handle, "w", 0, should_tail=True):
                assert line == "up\n"
                break
            for c in labelled(
                engine.host, "containers", f"io.asupervisor.session={engine.session}"
            ):
                await anyio.to_thread.run_sync(
                    api, engine.host, "DELETE", f"/containers/{c['Id']}?force=1"
                )
            status = await sv.wait(handle, timeout=90)
    replica = status.replica("w", 0)
    assert status.state is AppState.FAILED, status
    assert replica is not None and replica.exit_code == 137, replica


async def test_a_containers_end_is_recorded_when_it_died_not_when_a_busy_host_heard(
    engine: EngineUnderTest,
) -> None:
    """The host's loop is held (a service busy elsewhere) while its container ends: the end
    recorded is the engine's time of the exit, not when the loop got to the event (with the
    host's stamp it read as the end of the hold, and an exit that needs an inspect or the
    error file read later still)."""
    code = "import sys, time; print('up', flush=True); time.sleep(1); sys.exit(3)"
    with anyio.fail_after(120):
        async with Supervisor(session=engine.session) as sv:
            handle = await sv.submit(AppDef("held", [py("w", code)]), "docker", engine.cfg)
            run = await hold_while_it_ends(sv, handle, "w", 3.0, AppState.FAILED)
    assert run.up + 0.5 <= run.ended < run.held_until - 1.0, run
    assert run.started <= run.up


async def test_a_containers_start_is_recorded_when_it_started_not_when_a_busy_host_heard(
    engine: EngineUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's loop is held (a service busy elsewhere) just as the engine answers the
    start: the start recorded is the engine's, not when the loop got to the answer (with
    the host's stamp, the container's 1 s run read as none: its end, recorded when it
    happened, came before the late start and was kept at it).

    A held loop at that exact moment cannot be had on demand: the real start is wrapped
    only to hold the loop once the engine has answered it.
    """
    from supervisor.backends.docker.engine import Engine

    real_start = Engine.start
    holds: list[tuple[float, float]] = []

    async def start_then_busy(self: Engine, cid: str) -> None:
        await real_start(self, cid)
        began = time.time()
        time.sleep(3.0)  # noqa: ASYNC251 (holds the loop on purpose: the answer waits)
        holds.append((began, time.time()))

    monkeypatch.setattr(Engine, "start", start_then_busy)
    code = "import time; time.sleep(1)"
    with anyio.fail_after(120):
        async with Supervisor(session=engine.session) as sv:
            handle = await sv.submit(AppDef("held", [py("w", code)]), "docker", engine.cfg)
            status = await sv.wait(handle, timeout=90)
            described = await sv.describe(handle)
    assert status.state is AppState.SUCCEEDED, status
    assert described is not None
    ((began, held_until),) = holds
    started, ended = described.times.started, described.times.ended
    assert started is not None and ended is not None
    # The engine answered once the container ran: it started before the hold began.
    assert started <= began + 0.1 < held_until - 2.5, (started, began, held_until)
    assert ended - started >= 0.8, (started, ended)


async def test_a_submit_cut_by_an_asyncio_timeout_leaves_no_container_running(
    engine: EngineUnderTest,
) -> None:
    """``asyncio.timeout`` cancels natively, through anyio's shield: a launch it cut
    short left the containers it had created and started, and the network, with no
    record (gone from ``list``, still running). Cut at several points, each submit
    leaves nothing behind (the fixture checks the engine); what was launched ends
    CANCELLED, and a submit left to finish works."""
    app = AppDef(
        "cut", [Role(name="w", image=IMAGE, entrypoint="sleep", args=["30"], num_replicas=2)]
    )
    cfg = {**engine.cfg, "stop_grace": 1.0}
    cuts = 0
    async with Supervisor(session=engine.session) as sv:
        for delay in (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 30.0):
            try:
                async with asyncio.timeout(delay):
                    handle = await sv.submit(app, "docker", cfg)
            except TimeoutError:
                cuts += 1
                continue
            await sv.cancel(handle)
            await sv.wait(handle)
        states = [a.state for a in await sv.list("docker")]
    assert cuts > 0
    assert states and set(states) == {AppState.CANCELLED}, states


async def test_a_cancel_cut_by_an_asyncio_timeout_still_stops_the_app(
    engine: EngineUnderTest,
) -> None:
    """The cancel is recorded (a hop to a thread) before it is carried out; an
    asyncio-native cancel of the caller cut it there, and the app ran on for good:
    ``wait`` timed out, and the close waited for the app's end (30 s and more)."""
    app = AppDef("cut", [Role(name="w", image=IMAGE, entrypoint="sleep", args=["600"])])
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(app, "docker", {**engine.cfg, "stop_grace": 1.0})
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):
                await sv.cancel(handle)
        status = await sv.wait(handle, timeout=30)
    assert status.state is AppState.CANCELLED, status


async def test_leaving_the_block_cut_by_an_asyncio_cancel_gives_the_app_up(
    engine: EngineUnderTest,
) -> None:
    """An asyncio-native cancel during the close (a timeout around the block, Ctrl-C
    under ``asyncio.run``) cut it before it gave its running apps up: another
    Supervisor could then only observe them, and their cancel was carried out by
    nobody while the cut process lived. Now the close ends first, then the cancel is
    raised, and another Supervisor takes the app over and stops it."""
    app = AppDef("cut", [Role(name="w", image=IMAGE, entrypoint="sleep", args=["600"])])
    handles: list[str] = []
    launched = asyncio.Event()

    async def block() -> None:
        async with Supervisor(session=engine.session) as sv:
            handles.append(await sv.submit(app, "docker", {**engine.cfg, "stop_grace": 1.0}))
            launched.set()

    task = asyncio.ensure_future(block())
    await launched.wait()
    task.cancel()  # as the block is left
    with anyio.fail_after(60), pytest.raises(asyncio.CancelledError):
        await task
    async with Supervisor(session=engine.session) as other:
        await other.attach(handles[0])
        await other.cancel(handles[0])
        status = await other.wait(handles[0], timeout=30)
    assert status.state is AppState.CANCELLED, status
