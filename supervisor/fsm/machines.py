"""Replica and app machines, built from the tables with ``transitions``' asyncio machine.

One machine per app drives every replica model of that app (``transitions``
supports many models per machine), and another drives the app model. Only
the app actor fires triggers, one at a time, so the asyncio machine's rule
that a new trigger cancels one still in flight on the same model never
applies. Callbacks are not used: models are plain records and every side
effect is decided outside the machine.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from transitions.extensions.asyncio import AsyncMachine

from supervisor.fsm.states import AppState, ReplicaState
from supervisor.fsm.tables import APP_TRANSITIONS, REPLICA_TRANSITIONS, TransitionRow

__all__ = [
    "AppModel",
    "ReplicaModel",
    "StopReason",
    "build_app_machine",
    "build_replica_machine",
    "fire",
]


class StopReason(enum.Enum):
    CANCEL = "cancel"  # the user cancelled the app
    GANG = "gang"  # a sibling failed for good; this one is stopped with it


class ReplicaModel:
    """What the app actor knows of one replica; ``state`` is owned by the machine."""

    state: ReplicaState

    def __init__(self, role: str, replica_id: int) -> None:
        self.role = role
        self.replica_id = replica_id
        self.attempt = 0
        self.restarts = 0
        self.hostname = ""
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.msg = ""
        self.structured_error_msg = ""
        self.stop_reason: StopReason | None = None

    def __repr__(self) -> str:
        return f"<replica {self.role}/{self.replica_id} {self.state.name} attempt={self.attempt}>"


class AppModel:
    state: AppState


async def fire(model: ReplicaModel | AppModel, trigger: str) -> None:
    """Fire a trigger the machine bound to ``model``; an illegal one raises MachineError."""
    bound: Any = model
    await bound.trigger(trigger)


def _rows(table: list[TransitionRow], states: type[enum.Enum]) -> list[dict[str, Any]]:
    return [
        {
            "trigger": row["trigger"],
            "source": [states[s] for s in row["source"]],
            "dest": states[row["dest"]],
        }
        for row in table
    ]


def _build(models: Sequence[object], states: type[enum.Enum], table: list[TransitionRow]) -> Any:
    return AsyncMachine(
        model=list(models),
        states=states,
        transitions=_rows(table, states),
        initial=states["UNSUBMITTED"],
        auto_transitions=False,
        send_event=False,
        queued=False,
    )


def build_replica_machine(models: Sequence[ReplicaModel]) -> Any:
    return _build(models, ReplicaState, REPLICA_TRANSITIONS)


def build_app_machine(model: AppModel) -> Any:
    return _build([model], AppState, APP_TRANSITIONS)
