"""The backend metrics with the real engines and the real cluster: Slurm calls, engine events.

Read with the OpenTelemetry SDK's in-memory reader (tests/otel_reader.py).
"""

from __future__ import annotations

import sys

import pytest

from supervisor import AppDef, AppState, Role, Supervisor

from ..otel_reader import reader, total
from .docker_engines import IMAGE, EngineUnderTest
from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.mark.docker
async def test_engine_events_are_counted(engine: EngineUnderTest) -> None:
    reader()
    events = "asupervisor.docker.engine.events"
    before = total(events, **{"asupervisor.docker.action": "die"})
    role = Role(name="w", image=IMAGE, entrypoint="python3", args=["-c", "pass"])
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("counted", [role]), "docker", engine.cfg)
        assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED
    assert total(events, **{"asupervisor.docker.action": "die"}) >= before + 1
    assert total(events, **{"asupervisor.docker.action": "start"}) >= 1


@pytest.mark.slurm
async def test_slurm_calls_are_counted_by_command() -> None:
    ensure_cluster(accounting=True)
    reader()
    calls = "asupervisor.slurm.calls"
    sbatch = {"asupervisor.slurm.transport": "cli", "asupervisor.slurm.command": "sbatch"}
    squeue = {"asupervisor.slurm.transport": "cli", "asupervisor.slurm.command": "squeue"}
    before = (total(calls, **sbatch), total(calls, **squeue))
    role = Role(name="w", image="", entrypoint=sys.executable, args=["-c", "pass"])
    async with Supervisor(session="metrics") as sv:
        handle = await sv.submit(AppDef("counted", [role]), "slurm")
        assert (await sv.wait(handle, timeout=120)).state is AppState.SUCCEEDED
    assert total(calls, **sbatch) == before[0] + 1
    assert total(calls, **squeue) > before[1]
