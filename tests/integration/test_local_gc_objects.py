"""What a running local replica costs the host's garbage collector (issue 16).

The worst stalls of a service's event loop while it supervises many replicas
are full collections of CPython's garbage collector, whose time grows with the
number of objects it tracks. A library cannot tune the collector of the
process it lives in; it can hold fewer objects. These tests count them
(deterministic, unlike a timing): objects held per running replica, and what
``import supervisor`` and an open Supervisor leave to walk.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import AppDef, AppState, ReplicaState, Role, Supervisor
from supervisor.actor import AppActor
from supervisor.backends.local.backend import LocalRuntime
from supervisor.backends.local.process import ReplicaProcess

from .helpers import until

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

REPLICAS = 200
PER_REPLICA_BOUND = 25
"""Measured 19 per running ``sleep`` replica here (16 at 1,000 replicas, where the app's
own objects weigh less): its state machine, transitions and status, its slot, launch, log
and process, its exit report and two flags. 56 when each running replica had a follower
task of its own (its coroutines, future, task handle and cancel scope) and two reader
registrations with the loop (a handle, a selector key and a context each); see
``ReplicaProcess.watch`` and ``PipeReaders``."""


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_a_running_replica_holds_few_objects_for_the_collector(state_dir: Path) -> None:
    sleeper = Role(name="r", entrypoint="sleep", args=["60"], num_replicas=1)
    async with Supervisor(session="svc") as sv:
        # One app first: the reaper, the records' thread and the caches are there already.
        warm = await sv.submit(AppDef(name="warm", roles=[sleeper]), "local")
        await sv.cancel(warm)
        await sv.wait(warm)
        before = _tracked()
        many = Role(name="r", entrypoint="sleep", args=["60"], num_replicas=REPLICAS)
        handle = await sv.submit(AppDef(name="many", roles=[many]), "local")

        def all_running() -> bool:
            status = sv.status(handle)
            return status is not None and all(
                r.state is ReplicaState.RUNNING for role in status.roles for r in role.replicas
            )

        await until(all_running, 30)
        per_replica = (_tracked() - before) / REPLICAS
        await sv.cancel(handle)
        assert (await sv.wait(handle)).state is AppState.CANCELLED
    assert per_replica < PER_REPLICA_BOUND, f"{per_replica:.1f} objects per running replica"


def test_importing_and_opening_leave_entry_point_metadata_unloaded(tmp_path: Path) -> None:
    """``importlib.metadata`` (with ``email``, ``zipfile``, ``csv``: some 3,000 objects) is
    loaded only when a backend is not a built-in one: a fresh interpreter, as a service's."""
    script = (
        "import sys, anyio, supervisor\n"
        "async def main():\n"
        "    async with supervisor.Supervisor(session='svc') as sv:\n"
        "        assert sv.run_opts('local') is not None\n"
        "anyio.run(main)\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    env = {**os.environ, "ASUPERVISOR_HOME": str(tmp_path / "state")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False", out.stderr


async def test_a_running_replica_has_no_task_and_closing_leaves_no_descriptor(
    state_dir: Path,
) -> None:
    """Running replicas are followed by callbacks, with one task per app, not per replica
    (their follower task starts at their exit); the one epoll that reads every replica's
    pipes goes with the Supervisor."""
    fds_before = sorted(os.listdir("/proc/self/fd"))
    async with Supervisor(session="svc") as sv:
        sleeper = Role(name="r", entrypoint="sleep", args=["60"], num_replicas=1)
        warm = await sv.submit(AppDef(name="warm", roles=[sleeper]), "local")
        await sv.cancel(warm)
        await sv.wait(warm)
        tasks_before = len(asyncio.all_tasks())
        many = Role(name="r", entrypoint="sleep", args=["60"], num_replicas=50)
        handle = await sv.submit(AppDef(name="many", roles=[many]), "local")
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        added = len(asyncio.all_tasks()) - tasks_before
        await sv.cancel(handle)
        assert (await sv.wait(handle)).state is AppState.CANCELLED
    assert added < 10, f"{added} tasks for an app of 50 running replicas"
    assert sorted(os.listdir("/proc/self/fd")) == fds_before


async def test_a_replica_that_succeeded_quietly_is_told_with_no_task(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its pipes at their end and nothing left to write: its exit is told where the
    reaper's report arrives. A follower task would cost a task start and a turn of the
    loop on the way to every ``wait``; one still follows what does need to wait (a
    failure's error file, output not yet written). The replicas sleep a little, so
    that each is watched before it ends (the usual case)."""
    followed: list[tuple[str, int]] = []
    real = LocalRuntime._follow

    async def counted(runtime: LocalRuntime, slot: Any, proc: ReplicaProcess, done: Any) -> None:
        followed.append(proc.key)
        await real(runtime, slot, proc, done)

    monkeypatch.setattr(LocalRuntime, "_follow", counted)
    async with Supervisor(session="svc") as sv:
        quiet = Role(name="q", entrypoint="sleep", args=["0.3"], num_replicas=5)
        handle = await sv.submit(AppDef(name="quiet", roles=[quiet]), "local")
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert followed == []
        failing = Role(name="f", entrypoint="sh", args=["-c", "sleep 0.3; exit 3"])
        handle = await sv.submit(AppDef(name="failing", roles=[failing]), "local")
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.FAILED
        assert followed == [("f", 0)]
        assert status.roles[0].replicas[0].exit_code == 3


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_APP_TYPES = (AppActor, LocalRuntime, ReplicaProcess)


def _app_objects_alive() -> int:
    # ``type``, not ``isinstance``: that asks ``__class__``, which some modules' proxies
    # (torch's, once imported by another test) answer with a warning.
    return sum(type(o) in _APP_TYPES for o in gc.get_objects())


async def test_an_ended_app_leaves_memory_with_the_collector_off(
    state_dir: Path, collector_off: None
) -> None:
    """No reference cycle holds an ended app: its objects go as its resources are released,
    not at the collector's next full pass.

    Three cycles did: the actor and its runtime (through the runtime's event
    sink), the runtime and the two callbacks it hands its processes, and the
    periodic writer's cancel (anyio keeps a cancelled task's exception in a
    cycle with its frames). Each kept an ended app, about 20 objects per
    replica, on the heap that every full pass walks: after a 1,000-replica app,
    a pass stalled the host's loop 25 ms instead of 16 (bench case loop_lag).
    """
    ways = {
        "succeeded": (AppDef(name="ok", roles=[Role(name="a", entrypoint="true")]), False),
        "cancelled": (
            AppDef(
                name="cancelled",
                roles=[Role(name="a", entrypoint="sleep", args=["60"], num_replicas=20)],
            ),
            True,
        ),
        "gang failure": (
            AppDef(
                name="gang",
                roles=[
                    Role(name="a", entrypoint="sh", args=["-c", "exit 3"]),
                    Role(name="b", entrypoint="sleep", args=["60"], num_replicas=3),
                ],
            ),
            False,
        ),
        "retried": (
            AppDef(
                name="retried",
                roles=[
                    Role(
                        name="a",
                        entrypoint="sh",
                        args=["-c", 'test "$ASUPERVISOR_ATTEMPT" = 1 || exit 2'],
                        max_retries=2,
                    )
                ],
            ),
            False,
        ),
        "not startable": (
            AppDef(name="missing", roles=[Role(name="a", entrypoint="/nonexistent/program")]),
            False,
        ),
    }
    ended: dict[str, AppState] = {}
    left: dict[str, int] = {}
    async with Supervisor(session="svc") as sv:
        for way, (app, cancel) in ways.items():
            handle = await sv.submit(app, "local")
            if cancel:
                await sv.cancel(handle)
            ended[way] = (await sv.wait(handle, timeout=30)).state
            with contextlib.suppress(TimeoutError):
                await until(lambda: _app_objects_alive() == 0, 10)
            left[way] = _app_objects_alive()
    assert ended == {
        "succeeded": AppState.SUCCEEDED,
        "cancelled": AppState.CANCELLED,
        "gang failure": AppState.FAILED,
        "retried": AppState.SUCCEEDED,
        "not startable": AppState.FAILED,
    }
    assert left == dict.fromkeys(ways, 0), "app objects still alive after their app ended"
