"""What a caller sees when things go wrong around the Supervisor: real processes, real files.

Exceptions raised in the ``async with`` block come out as themselves, a
cancelled submit leaves nothing running, and an app whose supervising
process died is reported UNKNOWN down to its replicas, with followers of its
logs released at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import supervisor.supervisor as supervisor_module
from supervisor import (
    AppState,
    ReplicaState,
    SpecError,
    Supervisor,
    Transition,
    UnknownAppError,
)
from supervisor.backends.store import CancelRequests
from supervisor.specs import parse_handle

from .helpers import app, py_role, running_with

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


# ------------------------------------------------------------------ item 8
async def test_users_own_exception_leaves_the_block_unwrapped(state_dir: Path) -> None:
    handles: list[str] = []

    async def block() -> None:
        async with Supervisor(session="svc") as sv:
            handles.append(
                await sv.submit(app(py_role("s", "import time; time.sleep(60)")), "local")
            )
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await block()
    handle = handles[0]
    # Closing still stopped what the block started.
    async with Supervisor(session="svc") as sv:
        described = await sv.describe(handle)
    assert described is not None and described.state is AppState.CANCELLED


async def test_library_errors_in_the_block_are_catchable_by_their_type(state_dir: Path) -> None:
    caught: list[type[BaseException]] = []
    try:
        async with Supervisor(session="svc") as sv:
            sv.dryrun(app(py_role("", "pass")), "local")  # an empty role name: invalid
    except SpecError:
        caught.append(SpecError)
    try:
        async with Supervisor(session="svc") as sv:
            await sv.wait("local://svc/no-such-app")
    except UnknownAppError:
        caught.append(UnknownAppError)
    assert caught == [SpecError, UnknownAppError]


# ------------------------------------------------------------------ item 9
async def test_a_cancelled_submit_leaves_no_replica_running(state_dir: Path) -> None:
    """The caller's task is cancelled at every point of submit in turn (a few loop steps
    later each time, until submit returns first): whenever no handle came back, nothing
    of the app may still run."""
    exercised_after_spawn = 0
    async with Supervisor(session="svc") as sv:
        # Loop steps, not seconds: the cancel lands ever later until submit outruns it.
        for steps in range(5000):
            token = f"asv-cancelled-submit-{os.getpid()}-{steps}"
            role = py_role("s", "import time; time.sleep(600)", args=[token], num_replicas=2)
            info = sv.dryrun(app(role), "local")
            handles: list[str] = []
            with anyio.CancelScope() as scope:

                async def cancel_after(n: int, scope: anyio.CancelScope = scope) -> None:
                    for _ in range(n):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_after, steps)
                    handles.append(await sv.schedule(info))
            if handles:
                await sv.cancel(handles[0])
                await sv.wait(handles[0], timeout=30)
            else:
                app_dir = Path(info.request.app_dir)  # type: ignore[attr-defined]
                if (app_dir / "transitions.jsonl").exists():
                    exercised_after_spawn += 1
            assert running_with(token) == [], f"cancelled after {steps} steps"
            if handles:
                break
    # The sweep reached the window this guards: processes spawned, no handle returned.
    assert exercised_after_spawn > 0


async def test_a_submit_cut_by_an_asyncio_cancel_leaves_no_app_behind(state_dir: Path) -> None:
    """``asyncio.timeout`` cancels natively, through anyio's shield, into the launch: the
    app stayed listed SUBMITTED, followed by nobody, and later read UNKNOWN. The caller's
    task is cancelled a few loop steps later each time, until submit returns first."""
    leftovers: list[str] = []
    cuts = 0
    async with Supervisor(session="svc") as sv:
        for steps in range(2000):
            token = f"asv-native-cut-{os.getpid()}-{steps}"
            role = py_role("s", "import time; time.sleep(600)", args=[token])
            info = sv.dryrun(app(role), "local")
            launch = asyncio.ensure_future(sv.schedule(info))
            for _ in range(steps):
                await asyncio.sleep(0)
            launch.cancel()
            try:
                handle: str | None = await launch
            except asyncio.CancelledError:
                handle = None
            if handle is not None:
                await sv.cancel(handle)
                await sv.wait(handle, timeout=30)
                break
            cuts += 1
            # Nothing, or (cut after its launch, as an anyio cancel is) stopped and said so.
            listed = [a for a in await sv.list("local") if a.app_id == info.app_id]
            leftovers += [
                f"{a.app_id} {a.state.name} after {steps} steps"
                for a in listed
                if a.state is not AppState.CANCELLED
            ]
            assert running_with(token) == [], f"cancelled after {steps} steps"
    assert cuts > 0
    assert leftovers == []


# ------------------------------------------------------------------ item 11
OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from supervisor import AppDef, Role, Supervisor

    async def main() -> None:
        code = "import time\\nwhile True:\\n    print('tick', flush=True); time.sleep(0.2)\\n"
        role = Role(name="w", entrypoint=sys.executable, args=["-c", code], num_replicas=2)
        async with Supervisor(session="owner") as sv:
            handle = await sv.submit(AppDef(name="o", roles=[role]), "local")
            print("HANDLE", handle, flush=True)
            await sv.wait(handle)

    asyncio.run(main())
    """
)


def _start_owner(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("HANDLE "), line
    return proc, line.split()[1]


async def test_a_watch_of_a_dead_owners_app_ends_where_wait_does(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner died before recording an end: the watch's last step is the UNKNOWN
    that ``wait`` returns, numbered after the journal, not a RUNNING left hanging. And at
    once, as ``wait`` does: it waited out the grace a live owner gets to record its end
    (5 s; an hour here, past the test's bound)."""
    monkeypatch.setattr(supervisor_module, "RECORDED_END_GRACE_S", 3600.0)
    owner, handle = await anyio.to_thread.run_sync(_start_owner, state_dir.parent)
    try:
        async with Supervisor(session="reader") as sv:
            seen: list[Transition] = []
            with anyio.fail_after(20):
                async for t in sv.watch(handle):
                    seen.append(t)
                    if t.role is None and t.dest == "RUNNING":
                        owner.send_signal(signal.SIGKILL)
            status = await sv.wait(handle, timeout=10)
    finally:
        owner.kill()
        await anyio.to_thread.run_sync(owner.wait)
        assert owner.stdout is not None
        owner.stdout.close()
    assert status.state is AppState.UNKNOWN
    app_level = [t for t in seen if t.role is None]
    assert [(t.source, t.dest) for t in app_level[-2:]] == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "UNKNOWN"),
    ], seen
    assert app_level[-1].trigger == "lose" and app_level[-1].msg == status.msg
    assert [t.seq for t in seen] == list(range(len(seen)))


def _request_of(state_dir: Path, handle: str) -> Path:
    """Where a cancel request for ``handle`` is left for its owner to read."""
    parsed = parse_handle(handle)
    requests = CancelRequests(state_dir, "local")
    return requests.directory / CancelRequests.name(parsed.session, parsed.app_id)


async def _killed(owner: subprocess.Popen[str]) -> None:
    owner.kill()
    await anyio.to_thread.run_sync(owner.wait)
    assert owner.stdout is not None
    owner.stdout.close()


async def test_a_cancel_of_a_dead_owners_app_leaves_no_request_behind(state_dir: Path) -> None:
    """Its replicas died with their owner: nothing to stop, and nobody would read a request."""
    owner, handle = await anyio.to_thread.run_sync(_start_owner, state_dir.parent)
    await _killed(owner)
    async with Supervisor(session="reader") as sv:
        status = await sv.wait(handle, timeout=10)
        await sv.cancel(handle)
        assert (await sv.wait(handle, timeout=0)).state is AppState.UNKNOWN
    assert status.state is AppState.UNKNOWN
    assert not _request_of(state_dir, handle).exists()


async def test_gc_removes_a_cancel_request_its_owner_never_read(state_dir: Path) -> None:
    """The owner was stopped when the request came, then killed: gc takes the request
    with the app's records, or it would stay in the shared directory for ever."""
    owner, handle = await anyio.to_thread.run_sync(_start_owner, state_dir.parent)
    try:
        owner.send_signal(signal.SIGSTOP)
        async with Supervisor(session="reader") as sv:
            await sv.cancel(handle)
        assert _request_of(state_dir, handle).exists()
    finally:
        await _killed(owner)
    async with Supervisor(session="owner") as sv:
        assert (await sv.wait(handle, timeout=10)).state is AppState.UNKNOWN
        assert await sv.gc("local", keep=0) == [handle]
    assert not _request_of(state_dir, handle).exists()


async def test_a_dead_owners_app_is_unknown_down_to_its_replicas(state_dir: Path) -> None:
    owner, handle = await anyio.to_thread.run_sync(_start_owner, state_dir.parent)
    try:
        async with Supervisor(session="reader") as sv:
            lines: list[str] = []

            async def follow() -> None:
                async for line in sv.log_iter(handle, "w", 1, should_tail=True):
                    lines.append(line)
                    if len(lines) == 2:
                        owner.send_signal(signal.SIGKILL)

            # The follower must end soon after the owner died: the owner's death is an
            # event (its pidfd), not something noticed at the next 30 s re-check.
            with anyio.fail_after(15):
                await follow()
            assert lines[:2] == ["tick\n", "tick\n"]
            described = await sv.describe(handle)
    finally:
        owner.kill()
        await anyio.to_thread.run_sync(owner.wait)
        assert owner.stdout is not None
        owner.stdout.close()
    assert described is not None
    assert described.state is AppState.UNKNOWN
    assert "ended without recording a final state" in described.msg
    replicas = [r for role in described.roles_statuses for r in role.replicas]
    assert len(replicas) == 2
    assert {r.state for r in replicas} == {ReplicaState.UNKNOWN}
