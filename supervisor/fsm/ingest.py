"""Monotonic ingestion: turning "the backend now says X" into legal steps.

Backends report observations, not transitions: news can arrive twice, late
(after something newer), or skip states the backend never saw (a short job
observed only once it finished). Each observation is classified against the
table before any trigger fires, so the machines only ever take listed
transitions and every dropped observation has a stated reason.

The classification depends only on the table, so every answer is worked out
once, at import: ``REPLICA_PATHS`` and ``APP_PATHS`` map (current state,
observed state, triggers that may end the path) to the plan, and ingesting an
event is one dict lookup.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from supervisor.fsm.tables import (
    ADVANCE,
    APP_TRANSITIONS,
    REPLICA_TRANSITIONS,
    S,
    TransitionRow,
)
from supervisor.states import TERMINAL, AppState, ReplicaState
from supervisor.status import AppStatus, Transition

__all__ = [
    "ANY_APP_TRIGGER",
    "APP_PATHS",
    "REPLICA_PATHS",
    "Drop",
    "Plan",
    "Steps",
    "app_steps",
    "closing_steps",
    "compile_paths",
]


@dataclass(frozen=True, slots=True)
class Drop:
    """The observation changes nothing; ``reason`` is one of absorbed, duplicate, stale."""

    reason: str


@dataclass(frozen=True, slots=True)
class Steps:
    """Triggers to fire in order; all but the last fill in skipped states."""

    triggers: tuple[str, ...]


Plan = Drop | Steps


def _search(
    table: Sequence[TransitionRow[S]], current: S, target: S, finals: frozenset[str]
) -> Plan:
    """The shortest legal way from ``current`` to ``target`` (breadth first).

    Only ``ADVANCE`` triggers may fill in skipped states; the last step must be
    one of ``finals`` (the triggers that the observation itself justifies).
    """
    if current.name in TERMINAL:
        return Drop("absorbed")
    if current == target:
        return Drop("duplicate")
    last = [row for row in table if row.trigger in finals and row.dest == target]
    fill = [row for trig in ADVANCE for row in table if row.trigger == trig]
    seen = {current}
    queue: deque[tuple[S, tuple[str, ...]]] = deque([(current, ())])
    while queue:
        state: S
        path: tuple[str, ...]
        state, path = queue.popleft()
        for row in last:
            if state in row.source:
                return Steps((*path, row.trigger))
        for row in fill:
            if state in row.source and row.dest not in seen:
                seen.add(row.dest)
                queue.append((row.dest, (*path, row.trigger)))
    return Drop("stale")


def compile_paths(
    table: Sequence[TransitionRow[S]], states: Iterable[S], final_sets: Iterable[frozenset[str]]
) -> dict[tuple[S, S, frozenset[str]], Plan]:
    """Every plan of ``table``: each pair of states, for each set of allowed last triggers."""
    members = list(states)
    return {
        (current, target, finals): _search(table, current, target, finals)
        for finals in final_sets
        for current in members
        for target in members
    }


ANY_APP_TRIGGER = frozenset(row.trigger for row in APP_TRANSITIONS)
"""The app's state is derived, never observed: any trigger may end its path."""

REPLICA_PATHS: dict[tuple[ReplicaState, ReplicaState, frozenset[str]], Plan] = compile_paths(
    REPLICA_TRANSITIONS,
    ReplicaState,
    {frozenset({row.trigger}) for row in REPLICA_TRANSITIONS},
)
"""A replica observation justifies exactly one last trigger (``start`` for Started, ...)."""

APP_PATHS: dict[tuple[AppState, AppState, frozenset[str]], Plan] = compile_paths(
    APP_TRANSITIONS, AppState, [ANY_APP_TRIGGER]
)


def app_steps(current: AppState, observed: AppState) -> tuple[tuple[str, AppState, AppState], ...]:
    """The app's legal steps from ``current`` to ``observed``: (trigger, source, dest) each.

    For a reader that finishes the record of an app nobody followed to its end:
    the states it never saw recorded are filled in by the table's own path, as
    ingestion would have taken them (empty when there is nothing to add).
    """
    plan = APP_PATHS[(current, observed, ANY_APP_TRIGGER)]
    if isinstance(plan, Drop):
        return ()
    steps = []
    state = current
    for trigger in plan.triggers:
        row = next(r for r in APP_TRANSITIONS if r.trigger == trigger and state in r.source)
        steps.append((trigger, state, row.dest))
        state = row.dest
    return tuple(steps)


def closing_steps(
    recorded: Sequence[Transition], status: AppStatus, started: float | None, ended: float
) -> list[Transition]:
    """The app-level transitions a journal (``recorded``) lacks to reach ``status``.

    For what a reader saw that no owner recorded: an app nobody followed to its
    end, or whose owner died first. Taken as the state table takes them
    (``app_steps``); through RUNNING, at ``started``, when the app is known to
    have run and that was never recorded; the last step at ``ended``; numbered
    after the journal, never timed before it (a scheduler's clock may round to
    the second).
    """
    app_level = [t for t in recorded if t.role is None]
    current = AppState[app_level[-1].dest] if app_level else AppState.UNSUBMITTED
    seq = recorded[-1].seq + 1 if recorded else 0
    floor = max((t.at for t in recorded), default=0.0)
    ran = any(t.dest == AppState.RUNNING.name for t in app_level)
    steps = list(app_steps(current, status.state))
    if started is not None and not ran and status.state is not AppState.RUNNING:
        steps = [
            *app_steps(current, AppState.RUNNING),
            *app_steps(AppState.RUNNING, status.state),
        ]
    added = []
    for trigger, source, dest in steps:
        end = dest is status.state and status.is_settled  # the end, with its message
        at = max(ended if end or started is None else started, floor)
        added.append(
            Transition(seq, at, source.name, dest.name, trigger, msg=status.msg if end else "")
        )
        seq += 1
    return added
