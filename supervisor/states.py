"""App and replica states, and the absorbing ones.

Values are TorchX's so persisted states and user code comparing ints keep
working. Which state may follow which is the business of
``supervisor.fsm.tables`` alone. They sit at the bottom layer so that the
snapshots (``supervisor.status``) and the FSM both use them without importing
each other.
"""

from __future__ import annotations

import enum

__all__ = [
    "TERMINAL",
    "AppState",
    "ReplicaState",
    "is_terminal",
]


class AppState(enum.IntEnum):
    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name


class ReplicaState(enum.IntEnum):
    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name


TERMINAL: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
"""Names of the absorbing states (shared by both enums)."""


def is_terminal(state: AppState | ReplicaState) -> bool:
    return state.name in TERMINAL
