"""What an app says of the exit that ended it: the code, and the backend's reason with it.

The backends' own reasons here are the ones they send (Docker's OOM flag, the
local backend's failed exec, Slurm's time limit); the decision core is pure,
so the events are built directly.
"""

from __future__ import annotations

import pytest

from supervisor.events import Exited, Started, Submitted
from supervisor.fsm.app import AppFSM, RestartReplicas, RoleSpec, StopReplicas
from supervisor.specs import RetryPolicy
from supervisor.states import AppState


def _running(*roles: RoleSpec) -> AppFSM:
    fsm = AppFSM(roles)
    for role in roles:
        for k in range(role.num_replicas):
            fsm.apply(Submitted(role=role.name, replica_id=k, attempt=0))
            fsm.apply(Started(role=role.name, replica_id=k, attempt=0, hostname="h"))
    assert fsm.state is AppState.RUNNING
    return fsm


@pytest.mark.parametrize(
    ("code", "signal", "reason", "expected"),
    [
        (
            137,
            "SIGKILL",
            "w/0: killed for exceeding its memory limit",
            "w/0 killed by SIGKILL: killed for exceeding its memory limit",
        ),
        (
            127,
            None,
            "w/0: cannot start 'trian.py': No such file or directory",
            "w/0 exited with code 127: cannot start 'trian.py': No such file or directory",
        ),
        (
            None,
            "SIGTERM",
            "w/0: Slurm state TIMEOUT (TimeLimit)",
            "w/0 killed by SIGTERM: Slurm state TIMEOUT (TimeLimit)",
        ),
        (3, None, "", "w/0 exited with code 3"),
        (None, None, "w/0: srun ended before the replica recorded an exit", None),
    ],
)
def test_the_app_message_keeps_the_backends_reason(
    code: int | None, signal: str | None, reason: str, expected: str | None
) -> None:
    fsm = _running(RoleSpec("w", 2))
    actions = fsm.apply(
        Exited(role="w", replica_id=0, attempt=0, exit_code=code, signal=signal, msg=reason)
    )
    said = expected or reason  # no code known: the backend's words are all there is
    assert actions == [StopReplicas((("w", 1),), f"{said}; stopping the app")]
    fsm.apply(Exited(role="w", replica_id=1, attempt=0, exit_code=-15, signal="SIGTERM"))
    assert fsm.state is AppState.FAILED
    assert fsm.snapshot().msg == said
    assert fsm.replicas[("w", 0)].msg == (reason or said)


def test_a_restart_names_the_reason_too() -> None:
    fsm = _running(RoleSpec("w", 1, max_retries=1, retry_policy=RetryPolicy.REPLICA))
    actions = fsm.apply(
        Exited(
            role="w",
            replica_id=0,
            attempt=0,
            exit_code=137,
            signal="SIGKILL",
            msg="w/0: killed for exceeding its memory limit",
        )
    )
    reason = "w/0 killed by SIGKILL: killed for exceeding its memory limit; restart 1/1 (REPLICA)"
    assert actions == [RestartReplicas(((("w", 0), 1),), reason)]


def test_a_success_with_a_note_is_no_failure() -> None:
    fsm = _running(RoleSpec("w", 1))
    fsm.apply(Exited(role="w", replica_id=0, attempt=0, exit_code=0, msg="w/0: a note"))
    assert fsm.state is AppState.SUCCEEDED
    assert fsm.snapshot().msg == ""
