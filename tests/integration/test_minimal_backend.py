"""A backend that implements only the five methods the contract requires.

It runs each replica as a real process (``anyio.open_process``) and relies on
``supervisor.backends.base``'s defaults for everything else (no run options,
every retry policy, no records). The Supervisor drives it as any other:
state machines, retries, cancel, ``wait`` and ``log_iter`` while it runs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from supervisor import AppDef, AppHandle, AppState, ReplicaState, RetryPolicy, Role, Supervisor
from supervisor.backends.base import (
    AppRuntime,
    AppTasks,
    Backend,
    DryrunContext,
    EventSink,
    LogTarget,
    Request,
)
from supervisor.events import Exited, ReplicaKey, Started, Submitted
from supervisor.runopts import ResolvedCfg

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PY = sys.executable


class ProcessRuntime(AppRuntime):
    def __init__(self, request: Request, sink: EventSink, logs: Path, tasks: AppTasks) -> None:
        self.request, self.sink, self.logs, self.tasks = request, sink, logs, tasks
        self.procs: dict[ReplicaKey, Process] = {}

    async def spawn(self, key: ReplicaKey, attempt: int) -> None:
        role = next(r for r in self.request.app.roles if r.name == key[0])
        directory = self.logs / key[0] / str(key[1])
        await anyio.Path(directory).mkdir(parents=True, exist_ok=True)
        out = await anyio.to_thread.run_sync(open, directory / "combined.log", "ab")
        proc = await anyio.open_process(
            [role.entrypoint, *role.args], stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self.procs[key] = proc
        self.sink(Started(role=key[0], replica_id=key[1], attempt=attempt, hostname="here"))
        self.tasks.start_soon(self.reap, key, attempt, proc)

    async def reap(self, key: ReplicaKey, attempt: int, proc: Process) -> None:
        code = await proc.wait()
        sig = signal.Signals(-code).name if code < 0 else None
        exit_code = None if sig else code
        self.sink(
            Exited(role=key[0], replica_id=key[1], attempt=attempt, exit_code=exit_code, signal=sig)
        )

    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        for key in keys:
            proc = self.procs.get(key)
            if proc is not None and proc.returncode is None:
                proc.terminate()

    async def restart(self, attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
        for key, attempt in attempts:
            old = self.procs.get(key)
            if old is not None and old.returncode is None:
                old.terminate()
                await old.wait()
            await self.spawn(key, attempt)

    def log_target(self, role: str, replica_id: int) -> LogTarget:
        async def finished() -> bool:
            proc = self.procs.get((role, replica_id))
            return proc is not None and proc.returncode is not None

        return LogTarget(directory=self.logs / role / str(replica_id), is_finished=finished)


class ProcessBackend(Backend):
    name = "proc"

    def dryrun(self, app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext) -> Request:
        return Request(backend="proc", session=ctx.session, app_id=ctx.app_id, app=app, cfg=cfg)

    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> AppRuntime:
        logs = self.context.state_dir / "proc" / request.app_id
        runtime = ProcessRuntime(request, sink, logs, tasks)
        for role in request.app.roles:
            for k in range(role.num_replicas):
                sink(Submitted(role=role.name, replica_id=k))
                await runtime.spawn((role.name, k), 0)
        return runtime


def test_five_methods_are_all_a_backend_must_write() -> None:
    assert set(ProcessBackend.__abstractmethods__) == set()
    assert set(ProcessRuntime.__abstractmethods__) == set()
    own = {n for n in vars(ProcessBackend) if not n.startswith("_")} - {"name"}
    own |= {n for n in ("stop", "restart", "log_target") if n in vars(ProcessRuntime)}
    assert own == {"dryrun", "launch", "stop", "restart", "log_target"}


async def test_the_supervisor_drives_a_five_method_backend(state_dir: Path) -> None:
    flaky = (
        "import os, sys; p = sys.argv[1]; first = not os.path.exists(p); open(p, 'a').close();"
        "print('first' if first else 'again', flush=True); sys.exit(4 if first else 0)"
    )
    retried = Role(
        name="r",
        entrypoint=PY,
        args=["-c", flaky, str(state_dir / "ran-once")],
        max_retries=1,
        retry_policy=RetryPolicy.REPLICA,
    )
    sleeper = Role(
        name="s", entrypoint=PY, args=["-c", "import time; print('up', flush=True); time.sleep(60)"]
    )
    async with Supervisor(session="mini", backends={"proc": ProcessBackend}) as sv:
        handle = await sv.submit(AppDef(name="flaky", roles=[retried]), "proc")
        assert handle.startswith("proc://mini/")
        with anyio.fail_after(60):
            final = await sv.wait(handle)
        assert final.state is AppState.SUCCEEDED, final
        assert final.num_restarts == 1 and final.roles[0].restarts == 1, final

        long = await sv.submit(AppDef(name="long", roles=[sleeper]), "proc")
        with anyio.fail_after(60):
            async for line in sv.log_iter(long, "s", 0, should_tail=True):
                assert line == "up\n"
                break
        await sv.cancel(long)
        with anyio.fail_after(60):
            cancelled = await sv.wait(long)
        assert cancelled.state is AppState.CANCELLED, cancelled
        assert cancelled.roles[0].replicas[0].state is ReplicaState.CANCELLED
    # No records: another Supervisor does not know the apps (the default ``describe``).
    async with Supervisor(session="other", backends={"proc": ProcessBackend}) as other:
        assert await other.describe(handle) is None


class RewritingBackend(ProcessBackend):
    """A backend whose last copy of an ended app's output rewrites the files (as docker's
    does when the engine's follow stream lost or reordered pieces). A fake: Podman does
    that only under heavy load, never on demand."""

    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        directory = self.context.state_dir / "proc" / handle.app_id / role / str(replica_id)

        async def finished() -> bool:
            return True

        async def copied() -> None:
            await anyio.sleep(0.2)  # the engine's last fetch takes a while
            await anyio.Path(directory / "combined.log").write_text("whole, in order\n")

        return LogTarget(directory=directory, is_finished=finished, copied=copied)


@pytest.mark.parametrize("should_tail", [False, True])
async def test_a_read_after_the_end_waits_for_the_last_copy_of_the_output(
    state_dir: Path, should_tail: bool
) -> None:
    """Of an app known from its records (it ended and left memory), a follow too waits
    for the backend's last copy: a follow that read the files first would give what
    that copy replaces."""
    role = Role(name="r", entrypoint=PY, args=["-c", "print('reordered', flush=True)"])
    async with Supervisor(session="mini", backends={"proc": RewritingBackend}) as sv:
        handle = await sv.submit(AppDef(name="copy", roles=[role]), "proc")
        with anyio.fail_after(60):
            assert (await sv.wait(handle)).state is AppState.SUCCEEDED
        assert handle not in sv.followed()  # ended: answered from the backend from now on
        with anyio.fail_after(60):
            lines = [line async for line in sv.log_iter(handle, "r", 0, should_tail=should_tail)]
        assert lines == ["whole, in order\n"]
