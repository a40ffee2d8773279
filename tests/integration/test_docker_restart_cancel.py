"""A cancel asked while a restart starts its replica's new container (docker backend).

The docker twin of ``test_local_restart_cancel``: once ``cancel`` is asked, no
new attempt may start running user code, and the app ends CANCELLED. Between
the restart's decision and the new container's start the runtime waits on the
engine several times (the old container's removal, the new one's create, its
attempt mark, then the start); the cancel's stop reached the runtime some turns
of the loop after the cancel was asked, and a stop that came during those waits
found nothing running and left the start to go ahead: the container started
(its code ran after ``cancel`` returned), then was killed, or a short one ran
to its end and read SUCCEEDED.

The test holds the loop (blocking, on purpose) between its turns, as the local
one does: during a hold the engine answers what the loop asked of it, so the
turn after finds the answer waiting. The cancel is asked at the end of a hold,
after 0, 1, 2, ... such turns from the restart's decision, so that the trials
land on each of the restart's waits in turn until one finds the attempt started.

A start asked of the engine before the cancel cannot be taken back (as a spawn
under way on the local backend): its container's code may begin after the
cancel (an engine takes some hundreds of ms to start one on a loaded host), and
is then stopped. When the engine was asked is not visible from outside, so the
real ``Engine.start`` is wrapped only to note when it is called; what is
asserted is that no start is asked once ``cancel`` returned, and that code
which ran came from a start asked before. (Docker's ``cancel`` first writes the
request where other processes see it, a worker thread's hop: the refusal comes
after it, as the cancel is queued, and a start asked during the hop is one
under way.)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from supervisor import AppDef, AppState, BindMount, ReplicaState, RetryPolicy, Role, Supervisor
from supervisor.backends.docker.engine import Engine
from supervisor.observe.records import LOGGER_NAME

from .docker_engines import IMAGE, EngineUnderTest
from .test_local_restart_cancel import _StateAtCancel, assert_cancelled_end

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]

HOLD_S = 0.3
"""How long each hold keeps the loop: long enough for an engine's answer, or a thread's
hop, on a loaded 2-core machine."""

MAX_TURNS = 30

# The first attempt fails at once; the next says when its code began (the host's clock:
# a container shares the kernel's), and succeeds.
CODE = (
    "import os, sys, time\n"
    "if os.environ['ASUPERVISOR_ATTEMPT'] == '0': sys.exit(3)\n"
    "open('/out/ran', 'w').write(repr(time.time()))\n"
)


async def _trial(
    sv: Supervisor,
    engine: EngineUnderTest,
    seen: _StateAtCancel,
    starts: list[float],
    turns: int,
    out: Path,
) -> tuple[ReplicaState | None, float, list[float], AppState, ReplicaState]:
    role = Role(
        name="w",
        image=IMAGE,
        entrypoint="python3",
        args=["-c", CODE],
        max_retries=1,
        retry_policy=RetryPolicy.REPLICA,
        mounts=[BindMount(str(out), "/out")],
    )
    handle = await sv.submit(AppDef("rc", [role]), "docker", engine.cfg)
    seen.app_handle, seen.state = handle, None
    async for t in sv.watch(handle):
        if t.trigger == "restart":
            break
    first = len(starts)  # the starts asked from here on are the restart's
    for _ in range(turns):
        time.sleep(HOLD_S)  # noqa: ASYNC251 (holds the loop on purpose, see the docstring)
        await anyio.lowlevel.checkpoint()
    time.sleep(HOLD_S)  # noqa: ASYNC251
    await sv.cancel(handle)
    asked = time.time()  # (docker's cancel writes its durable record first, on a thread)
    status = await sv.wait(handle, timeout=60)
    return seen.state, asked, starts[first:], status.state, status.roles[0].replicas[0].state


async def test_a_cancel_during_a_restarts_container_start_starts_nothing_and_ends_cancelled(
    engine: EngineUnderTest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_start = Engine.start
    starts: list[float] = []

    async def noted_start(self: Engine, cid: str) -> None:
        starts.append(time.time())
        await real_start(self, cid)

    monkeypatch.setattr(Engine, "start", noted_start)
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    logger = logging.getLogger(LOGGER_NAME)
    unstarted = 0
    async with Supervisor(session=engine.session) as sv:
        seen = _StateAtCancel(sv)
        logger.addHandler(seen)
        try:
            for turns in range(MAX_TURNS):
                out = tmp_path / f"out-{turns}"
                out.mkdir()
                out.chmod(0o777)
                at_cancel, asked, asked_starts, app_state, replica = await _trial(
                    sv, engine, seen, starts, turns, out
                )
                where = f"on {engine.name}, cancel after {turns} turns, replica {at_cancel} then"
                late = [f"{at - asked:.3f}s" for at in asked_starts if at >= asked]
                assert not late, f"{where}: attempt 1's start asked {late} after the cancel"
                mark = out / "ran"
                began = float(mark.read_text()) if mark.exists() else None
                if began is not None:
                    assert asked_starts, f"{where}: attempt 1 ran, its start not seen asked"
                if at_cancel is None or at_cancel is ReplicaState.RUNNING:
                    break  # past the window: the attempt had started, or ended, first
                unstarted += 1
                assert_cancelled_end(where, app_state, replica, ran=began is not None)
        finally:
            logger.removeHandler(seen)
    assert unstarted, "no cancel came while the new attempt was not yet seen to start"
