"""Hypothesis drives random submit / cancel / restart / exit interleavings against real processes.

Each example is one Supervisor on the local backend, run on an event loop in
a portal thread so hypothesis itself stays synchronous. Replicas are short
``sh`` programs chosen per attempt (succeed, fail, crash by signal, sleep
long, leave an escaped child behind), so restarts, gang stops, cancels and
the supervisor's close race each other as they would in use. After the
example, whatever happened:

* ``close()`` returns (within a generous bound: a hang is the failure);
* every app and every replica is in a terminal state;
* no transition ever left a terminal state;
* no process started for the example survives (found in /proc by a token in
  the replicas' environment, inherited by anything they start).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from supervisor import AppDef, AppState, RetryPolicy, Role, Supervisor, Transition
from supervisor.states import TERMINAL

from .test_faults_processes import TOKEN_VAR, kill_token, survivors, token_pids

pytestmark = [pytest.mark.integration]

# What one attempt of a replica does.
PROGRAMS = {
    "ok": "exit 0",
    "fail": "exit 3",
    "crash": "kill -9 $$",
    "brief": "sleep 0.05; exit 0",
    "long": "exec sleep 600",
    "escape": "setsid sleep 600 & (sleep 600 &); exit 0",
}

programs = st.sampled_from(sorted(PROGRAMS))


@st.composite
def roles(draw: st.DrawFn) -> list[tuple[str, int, int, RetryPolicy, str, str]]:
    out = []
    for name in draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=2, unique=True)):
        out.append(
            (
                name,
                draw(st.integers(1, 3)),
                draw(st.integers(0, 2)),
                draw(st.sampled_from(list(RetryPolicy))),
                draw(programs),  # first attempt
                draw(programs),  # later attempts
            )
        )
    return out


def _script(first: str, later: str) -> str:
    return f'if [ "$ASUPERVISOR_ATTEMPT" = 0 ]; then {PROGRAMS[first]}; else {PROGRAMS[later]}; fi'


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.token = secrets.token_hex(6)
        self.handles: list[str] = []
        self._exit = ExitStack()
        self.portal = self._exit.enter_context(start_blocking_portal("asyncio"))
        self.sv = Supervisor(session="interleave")
        self._sv_cm = self.portal.wrap_async_context_manager(self.sv)
        self._sv_cm.__enter__()

    @rule(spec=roles())
    def submit(self, spec: list[tuple[str, int, int, RetryPolicy, str, str]]) -> None:
        app = AppDef(
            name="i",
            roles=[
                Role(
                    name=name,
                    entrypoint="sh",
                    args=["-c", _script(first, later)],
                    num_replicas=n,
                    max_retries=retries,
                    retry_policy=policy,
                    env={TOKEN_VAR: self.token},
                )
                for name, n, retries, policy, first, later in spec
            ],
        )
        handle = self.portal.call(self.sv.submit, app, "local", {"stop_grace": 0.5})
        self.handles.append(handle)

    @precondition(lambda self: bool(self.handles))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.portal.call(self.sv.cancel, data.draw(st.sampled_from(self.handles)))

    @precondition(lambda self: bool(self.handles))
    @rule(pick=st.integers(0, 1000))
    def kill_a_process(self, pick: int) -> None:
        """An exit from outside: SIGKILL one live process of the example, if any runs.

        The choice is drawn before looking (the processes alive differ from run to run).
        """
        pids = sorted(token_pids(self.token))
        if pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[pick % len(pids)], signal.SIGKILL)

    @rule(ms=st.sampled_from([0, 5, 20, 60]))
    def let_time_pass(self, ms: int) -> None:
        self.portal.call(anyio.sleep, ms / 1000)

    def teardown(self) -> None:
        try:
            started = time.monotonic()
            self._sv_cm.__exit__(None, None, None)  # Supervisor.close()
            assert time.monotonic() - started < 60, "close() took a minute"
            final = {h: self.sv.status(h) for h in self.handles}
            history = {h: self.portal.call(_collect, self.sv, h) for h in self.handles}
            assert survivors(self.token, 5.0) == []
        finally:
            kill_token(self.token)
            self._exit.close()
        for handle in self.handles:
            status = final[handle]
            assert status is not None
            assert status.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)
            for role in status.roles:
                for replica in role.replicas:
                    assert replica.state.name in TERMINAL, (handle, replica)
            for t in history[handle]:
                assert t.source not in TERMINAL, (handle, t)


async def _collect(sv: Supervisor, handle: str) -> list[Transition]:
    return [t async for t in sv.watch(handle)]


@pytest.mark.parametrize("containment", ["best", "subreaper"])
def test_random_interleavings_end_cleanly(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, containment: str
) -> None:
    monkeypatch.setenv("ASUPERVISOR_CONTAINMENT", containment)
    runner = Interleavings.TestCase
    runner.settings = settings(
        max_examples=int(os.environ.get("ASV_INTERLEAVING_EXAMPLES", "10")),
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    runner().runTest()
