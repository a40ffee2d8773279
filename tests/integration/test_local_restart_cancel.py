"""A cancel asked while a restart starts its replica's new attempt (local backend).

Once ``cancel`` is asked, no new attempt may start running user code, and the
app ends CANCELLED. One whose spawn was already under way (it cannot be taken
back) began before the cancel: it is stopped, and a short one that ended first
with a zero exit did its work (SUCCEEDED, as any replica whose zero exit beats
the stop). Before, the stop reached the runtime some turns of the loop after
the cancel was asked, and a restart that had not yet sent its spawn sent it
meanwhile: user code began after ``cancel`` returned.

The window is a few turns of the loop wide. To land in it on any machine, the
test holds the loop (blocking, on purpose) between its turns: during a hold the
records' thread and the reaper finish what the loop asked of them, so the turn
after it finds their answers waiting. The cancel is asked at the end of a hold,
after 0, 1, 2, ... such turns from the restart's decision, so that one trial
asks it while the restart's last hop before its spawn has come back and not yet
been taken up, and others while the spawn itself is under way.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from supervisor import AppState, ReplicaState, RetryPolicy, Role, Supervisor
from supervisor.observe.records import LOGGER_NAME

from .helpers import app
from .test_faults_processes import TOKEN_VAR, kill_token, survivors

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

HOLD_S = 0.3
"""How long each hold keeps the loop: long enough for a thread's hop, or a spawned
bash to write its mark, on a loaded 2-core machine."""

MAX_TURNS = 12

# The first attempt fails at once; the next says when its user code began, and succeeds.
SCRIPT = (
    'if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then exit 3; fi; echo "$EPOCHREALTIME" > "$MARK"; exit 0'
)


class _StateAtCancel(logging.Handler):
    """The replica's state when the FSM decided the cancel's stop.

    Read from the Supervisor's own log of the decision, which the actor writes
    as it applies the cancel: what the FSM knew then (a ``Started`` sent before
    the cancel and applied first makes the attempt a running one, whose zero
    exit is its work finished).
    """

    def __init__(self, sv: Supervisor) -> None:
        super().__init__(logging.INFO)
        self.sv = sv
        self.app_handle = ""
        self.state: ReplicaState | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.app_handle and record.getMessage().startswith(f"{self.app_handle} w/0: stop ("):
            status = self.sv.status(self.app_handle)
            assert status is not None
            self.state = status.roles[0].replicas[0].state


def assert_cancelled_end(where: str, app: AppState, replica: ReplicaState, *, ran: bool) -> None:
    """The app ended CANCELLED; the replica too, unless its attempt ran (from a start
    already under way, which cannot be taken back): then its zero exit is work done."""
    assert app is AppState.CANCELLED, where
    allowed = {ReplicaState.CANCELLED} | ({ReplicaState.SUCCEEDED} if ran else set())
    assert replica in allowed, where


async def _trial(
    sv: Supervisor, seen: _StateAtCancel, turns: int, mark: Path, token: str
) -> tuple[ReplicaState | None, float, AppState, ReplicaState]:
    role = Role(
        name="w",
        entrypoint="bash",
        args=["-c", SCRIPT],
        max_retries=1,
        retry_policy=RetryPolicy.REPLICA,
        env={TOKEN_VAR: token, "MARK": str(mark)},
    )
    handle = await sv.submit(app(role), "local", {"stop_grace": 5.0})
    seen.app_handle, seen.state = handle, None
    async for t in sv.watch(handle):
        if t.trigger == "restart":
            break
    for _ in range(turns):
        time.sleep(HOLD_S)  # noqa: ASYNC251 (holds the loop on purpose, see the docstring)
        await anyio.lowlevel.checkpoint()
    time.sleep(HOLD_S)  # noqa: ASYNC251
    asked = time.time()
    await sv.cancel(handle)
    status = await sv.wait(handle, timeout=60)
    return seen.state, asked, status.state, status.roles[0].replicas[0].state


async def test_a_cancel_during_a_restarts_spawn_starts_nothing_and_ends_cancelled(
    state_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = secrets.token_hex(6)
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    logger = logging.getLogger(LOGGER_NAME)
    unstarted = 0
    try:
        async with Supervisor(session="restartcancel") as sv:
            seen = _StateAtCancel(sv)
            logger.addHandler(seen)
            try:
                for turns in range(MAX_TURNS):
                    mark = tmp_path / f"ran-{turns}"
                    at_cancel, asked, app_state, replica = await _trial(
                        sv, seen, turns, mark, token
                    )
                    where = f"cancel after {turns} turns, replica {at_cancel} then"
                    began = float(mark.read_text()) if mark.exists() else None
                    if began is not None:
                        assert began < asked, f"{where}: attempt 1 began {began - asked:.3f}s after"
                    if at_cancel is None or at_cancel is ReplicaState.RUNNING:
                        break  # past the window: the attempt had started, or ended, first
                    unstarted += 1
                    assert_cancelled_end(where, app_state, replica, ran=began is not None)
            finally:
                logger.removeHandler(seen)
        assert unstarted, "no cancel came while the new attempt was not yet seen to start"
        assert survivors(token, 2.0) == []
    finally:
        kill_token(token)
