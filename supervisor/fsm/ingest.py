"""Monotonic ingestion: turning "the backend now says X" into legal steps.

Backends report observations, not transitions: news can arrive twice, late
(after something newer), or skip states the backend never saw (a short job
observed only once it finished). ``plan`` classifies each observation
against the table before any trigger fires, so the machines only ever take
listed transitions and every dropped observation has a stated reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.fsm.states import TERMINAL
from supervisor.fsm.tables import ADVANCE, TransitionRow

__all__ = ["Drop", "Steps", "plan"]


@dataclass(frozen=True, slots=True)
class Drop:
    """The observation changes nothing; ``reason`` is one of absorbed, duplicate, stale."""

    reason: str


@dataclass(frozen=True, slots=True)
class Steps:
    """Triggers to fire in order; all but the last fill in skipped states."""

    triggers: tuple[str, ...]


def plan(
    table: list[TransitionRow], current: str, target: str, final: Iterable[str]
) -> Drop | Steps:
    """The shortest legal way from ``current`` to ``target``.

    Only ``ADVANCE`` triggers may fill in skipped states; the last step must be
    one of ``final`` (the triggers that the observation itself justifies).
    """
    if current in TERMINAL:
        return Drop("absorbed")
    if current == target:
        return Drop("duplicate")
    finals = set(final)
    by_trigger: dict[str, list[TransitionRow]] = {}
    for row in table:
        by_trigger.setdefault(row["trigger"], []).append(row)

    seen = {current}
    queue: deque[tuple[str, tuple[str, ...]]] = deque([(current, ())])
    while queue:
        state, path = queue.popleft()
        for trig in finals:
            for row in by_trigger.get(trig, []):
                if state in row["source"] and row["dest"] == target:
                    return Steps((*path, trig))
        for trig in ADVANCE:
            for row in by_trigger.get(trig, []):
                nxt = row["dest"]
                if state in row["source"] and nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, (*path, trig)))
    return Drop("stale")
