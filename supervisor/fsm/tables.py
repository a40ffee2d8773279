"""Every legal transition, as data.

The machines in ``machines.py``, the skip-ahead paths in ``ingest.py`` and
the diagram in the docs are all built from these tables, so they can never
disagree. A transition not listed here raises inside ``transitions`` rather
than happening quietly.

Triggers fall in three groups:

* ``ADVANCE``: the normal life cycle, which ingestion may also use to fill in
  states a backend skipped (a replica seen RUNNING straight from SUBMITTED
  passes PENDING);
* ``succeed``, ``fail`` and ``lose``: taken only as the last step toward an
  observed state;
* ``restart``, ``requeue`` and ``cancel``: taken only on a decision
  (a retry, a preemption report, a user's cancel), never inferred.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from supervisor.states import AppState, ReplicaState

__all__ = [
    "ADVANCE",
    "APP_TRANSITIONS",
    "REPLICA_TRANSITIONS",
    "S",
    "TransitionRow",
]

S = TypeVar("S", AppState, ReplicaState)


@dataclass(frozen=True, slots=True)
class TransitionRow(Generic[S]):
    trigger: str
    source: tuple[S, ...]
    dest: S


ADVANCE: tuple[str, ...] = ("submit", "queue", "start")

_R = ReplicaState
_R_LIVE = (_R.UNSUBMITTED, _R.SUBMITTED, _R.PENDING, _R.RUNNING, _R.UNKNOWN)

REPLICA_TRANSITIONS: tuple[TransitionRow[ReplicaState], ...] = (
    TransitionRow("submit", (_R.UNSUBMITTED,), _R.SUBMITTED),
    TransitionRow("queue", (_R.SUBMITTED, _R.UNKNOWN), _R.PENDING),
    TransitionRow("start", (_R.PENDING, _R.UNKNOWN), _R.RUNNING),
    TransitionRow("succeed", (_R.RUNNING, _R.UNKNOWN), _R.SUCCEEDED),
    TransitionRow("fail", (_R.SUBMITTED, _R.PENDING, _R.RUNNING, _R.UNKNOWN), _R.FAILED),
    TransitionRow("cancel", _R_LIVE, _R.CANCELLED),
    # A failed replica with retries left goes back to the queue instead of FAILED.
    TransitionRow("restart", (_R.RUNNING, _R.UNKNOWN), _R.PENDING),
    # The scheduler took a started replica back (preemption, node failure).
    TransitionRow("requeue", (_R.RUNNING,), _R.PENDING),
    TransitionRow("lose", (_R.SUBMITTED, _R.PENDING, _R.RUNNING), _R.UNKNOWN),
)

_A = AppState
_A_LIVE = (_A.UNSUBMITTED, _A.SUBMITTED, _A.PENDING, _A.RUNNING, _A.UNKNOWN)

APP_TRANSITIONS: tuple[TransitionRow[AppState], ...] = (
    TransitionRow("submit", (_A.UNSUBMITTED,), _A.SUBMITTED),
    TransitionRow("queue", (_A.SUBMITTED, _A.UNKNOWN), _A.PENDING),
    TransitionRow("start", (_A.PENDING, _A.UNKNOWN), _A.RUNNING),
    TransitionRow("succeed", (_A.RUNNING, _A.UNKNOWN), _A.SUCCEEDED),
    TransitionRow("fail", (_A.SUBMITTED, _A.PENDING, _A.RUNNING, _A.UNKNOWN), _A.FAILED),
    TransitionRow("cancel", _A_LIVE, _A.CANCELLED),
    # Every started replica went back to the queue (a whole-app restart or requeue).
    TransitionRow("requeue", (_A.RUNNING,), _A.PENDING),
    TransitionRow("lose", (_A.SUBMITTED, _A.PENDING, _A.RUNNING), _A.UNKNOWN),
)
