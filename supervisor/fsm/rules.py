"""Pure rules: what an exit means, and what the app's state is.

Kept apart from the machines so they can be read, tested and reasoned about
as plain functions of their inputs.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping

from supervisor.fsm.states import TERMINAL, AppState, ReplicaState

__all__ = ["ExitOutcome", "derive_app_state", "derive_from_counts", "exit_outcome"]


class ExitOutcome(enum.Enum):
    SUCCEEDED = "succeed"
    CANCELLED = "cancel"
    RESTART = "restart"
    FAILED = "fail"


def exit_outcome(exit_code: int | None, stopping: bool, retries_left: bool) -> ExitOutcome:
    """Classify one replica's exit.

    A zero exit is success even while stopping (the work finished). Any other
    exit of a replica we were stopping is the stop we asked for. Otherwise it
    is a failure, retried while its role has retries left.
    """
    if exit_code == 0:
        return ExitOutcome.SUCCEEDED
    if stopping:
        return ExitOutcome.CANCELLED
    if retries_left:
        return ExitOutcome.RESTART
    return ExitOutcome.FAILED


def derive_app_state(replicas: Iterable[ReplicaState], cancel_requested: bool) -> AppState:
    """The app's state as a function of its replicas' states."""
    return derive_from_counts(Counter(s.name for s in replicas), cancel_requested)


def derive_from_counts(counts: Mapping[str, int], cancel_requested: bool) -> AppState:
    """``derive_app_state`` from how many replicas are in each state (O(states), not O(replicas)).

    The app is terminal only once every replica is, so nothing is still running
    when ``wait`` returns. A failure outranks a later cancel; CANCELLED needs a
    cancel (by the user, or by the scheduler where a backend reports one).
    """
    names = {name for name, count in counts.items() if count > 0}
    if not names:
        return AppState.UNSUBMITTED
    if names <= TERMINAL:
        if "FAILED" in names:
            return AppState.FAILED
        if cancel_requested or "CANCELLED" in names:
            return AppState.CANCELLED
        return AppState.SUCCEEDED
    if "UNKNOWN" in names:
        return AppState.UNKNOWN
    if "RUNNING" in names or names & TERMINAL:
        # A finished replica means the app has started, whatever the rest wait for.
        return AppState.RUNNING
    for name in ("PENDING", "SUBMITTED"):
        if name in names:
            return AppState[name]
    return AppState.UNSUBMITTED
