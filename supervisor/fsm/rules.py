"""Pure rules: what an exit means, and what the app's state is.

Kept apart from the machines so they can be read, tested and reasoned about
as plain functions of their inputs.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping

from supervisor.states import AppState, ReplicaState

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


def derive_app_state(
    replicas: Iterable[ReplicaState], cancel_requested: bool, current: AppState | None = None
) -> AppState:
    """The app's state as a function of its replicas' states (see ``derive_from_counts``)."""
    return derive_from_counts(Counter(replicas), cancel_requested, current)


_WAITING = (AppState.SUBMITTED, AppState.PENDING)
_ENDED = frozenset({ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.CANCELLED})


def derive_from_counts(
    counts: Mapping[ReplicaState, int], cancel_requested: bool, current: AppState | None = None
) -> AppState:
    """The one rule for the app's state, from how many replicas are in each state.

    O(states), not O(replicas). ``current`` is the app's state so far (None
    for an observer that has no history, such as a ``describe`` from outside).

    The app is terminal only once every replica is, so nothing is still running
    when ``wait`` returns. A failure outranks a later cancel; CANCELLED needs a
    cancel (by the user, or by the scheduler where a backend reports one).
    Otherwise UNKNOWN if any replica is; RUNNING if any runs or has finished (a
    finished replica means the app started, whatever the rest wait for), except
    that replicas a cancel ended while they waited do not start an app that
    never ran: it keeps its state until the rest end. Then PENDING, then SUBMITTED.
    """
    present = {state for state, count in counts.items() if count > 0}
    if not present:
        return AppState.UNSUBMITTED
    ended = present & _ENDED
    if ended == present:
        if ReplicaState.FAILED in ended:
            return AppState.FAILED
        if cancel_requested or ReplicaState.CANCELLED in ended:
            return AppState.CANCELLED
        return AppState.SUCCEEDED
    if ReplicaState.UNKNOWN in present:
        return AppState.UNKNOWN
    if ReplicaState.RUNNING in present:
        return AppState.RUNNING
    if ended:
        if cancel_requested and current is not None and current in _WAITING:
            return current
        return AppState.RUNNING
    if ReplicaState.PENDING in present:
        return AppState.PENDING
    if ReplicaState.SUBMITTED in present:
        return AppState.SUBMITTED
    return AppState.UNSUBMITTED
