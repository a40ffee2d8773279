"""Every legal transition, as data.

The machines in ``machines.py`` are built from these tables and the diagram
in the docs is rendered from them, so the three can never disagree. A
transition not listed here raises inside ``transitions`` rather than
happening quietly.

Triggers fall in three groups:

* ``ADVANCE``: the normal life cycle, which ingestion may also use to fill in
  states a backend skipped (a replica seen RUNNING straight from SUBMITTED
  passes PENDING);
* ``FINISH`` and ``lose``: taken only as the last step toward an observed state;
* ``restart``, ``requeue`` and ``cancel``: taken only on a decision
  (a retry, a preemption report, a user's cancel), never inferred.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "ADVANCE",
    "APP_TRANSITIONS",
    "FINISH",
    "REPLICA_TRANSITIONS",
    "TransitionRow",
]


class TransitionRow(TypedDict):
    trigger: str
    source: list[str]
    dest: str


_LIVE = ["UNSUBMITTED", "SUBMITTED", "PENDING", "RUNNING", "UNKNOWN"]

ADVANCE: tuple[str, ...] = ("submit", "queue", "start")
FINISH: tuple[str, ...] = ("succeed", "fail")

REPLICA_TRANSITIONS: list[TransitionRow] = [
    {"trigger": "submit", "source": ["UNSUBMITTED"], "dest": "SUBMITTED"},
    {"trigger": "queue", "source": ["SUBMITTED", "UNKNOWN"], "dest": "PENDING"},
    {"trigger": "start", "source": ["PENDING", "UNKNOWN"], "dest": "RUNNING"},
    {"trigger": "succeed", "source": ["RUNNING", "UNKNOWN"], "dest": "SUCCEEDED"},
    {"trigger": "fail", "source": ["SUBMITTED", "PENDING", "RUNNING", "UNKNOWN"], "dest": "FAILED"},
    {"trigger": "cancel", "source": list(_LIVE), "dest": "CANCELLED"},
    # A failed replica with retries left goes back to the queue instead of FAILED.
    {"trigger": "restart", "source": ["RUNNING", "UNKNOWN"], "dest": "PENDING"},
    # The scheduler took a started replica back (preemption, node failure).
    {"trigger": "requeue", "source": ["RUNNING"], "dest": "PENDING"},
    {"trigger": "lose", "source": ["SUBMITTED", "PENDING", "RUNNING"], "dest": "UNKNOWN"},
]

APP_TRANSITIONS: list[TransitionRow] = [
    {"trigger": "submit", "source": ["UNSUBMITTED"], "dest": "SUBMITTED"},
    {"trigger": "queue", "source": ["SUBMITTED", "UNKNOWN"], "dest": "PENDING"},
    {"trigger": "start", "source": ["PENDING", "UNKNOWN"], "dest": "RUNNING"},
    {"trigger": "succeed", "source": ["RUNNING", "UNKNOWN"], "dest": "SUCCEEDED"},
    {"trigger": "fail", "source": ["SUBMITTED", "PENDING", "RUNNING", "UNKNOWN"], "dest": "FAILED"},
    {"trigger": "cancel", "source": list(_LIVE), "dest": "CANCELLED"},
    # Every started replica went back to the queue (a whole-app restart or requeue).
    {"trigger": "requeue", "source": ["RUNNING"], "dest": "PENDING"},
    {"trigger": "lose", "source": ["SUBMITTED", "PENDING", "RUNNING"], "dest": "UNKNOWN"},
]
