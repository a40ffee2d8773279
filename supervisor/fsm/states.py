"""App and replica states, with the sets that give them meaning.

Values are TorchX's so persisted states and user code comparing ints keep
working. ``ORDER`` ranks states along the normal life cycle; the FSMs use it
to tell a stale event (behind) from a skip-ahead one (in front).
"""

from __future__ import annotations

import enum

__all__ = [
    "ORDER",
    "STARTED",
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

STARTED: frozenset[str] = TERMINAL | {"RUNNING"}
"""Names of the states reached only after the work began."""

ORDER: dict[str, int] = {
    "UNSUBMITTED": 0,
    "SUBMITTED": 1,
    "PENDING": 2,
    "UNKNOWN": 2,  # lost track: as far along as "queued", no further
    "RUNNING": 3,
    "SUCCEEDED": 4,
    "FAILED": 4,
    "CANCELLED": 4,
}


def is_terminal(state: AppState | ReplicaState) -> bool:
    return state.name in TERMINAL
