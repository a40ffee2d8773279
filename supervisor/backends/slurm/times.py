"""When a Slurm replica started and ended, as recorded: where it can be, as its pump saw it.

Slurm is polled: a look sees a replica start and end up to a poll interval late
(and a busy loop later still). Each replica's pump records on the node when it
started the command and when the command ended (``exit.json``), to the
microsecond; both Slurm runtimes (a batch job, steps in an allocation) tell
events at those times where the record is there.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from supervisor.events import Exited, ReplicaEvent, ReplicaKey, Started, recorded_time

__all__ = ["PumpTimes", "ReplicaTimes"]

PumpTimes = tuple[float | None, float]
"""(started, ended) as a replica's pump recorded an attempt (started: None in older records)."""

_Event = TypeVar("_Event", bound=ReplicaEvent)


class ReplicaTimes:
    """The times told for each replica's start and end, one attempt after another."""

    def __init__(self) -> None:
        self._started_at: dict[tuple[ReplicaKey, int], float] = {}

    def stamped(self, event: _Event, pump: PumpTimes | None) -> _Event:
        """``event`` at the time its pump recorded (``pump``: None where it recorded nothing).

        A start seen in the same look as its end (it ran between two looks) takes the
        pump's start too; one seen earlier keeps the time it was seen, and no end is
        recorded before it.
        """
        key = (event.key, event.attempt)
        if isinstance(event, Started):
            if pump is not None and pump[0] is not None:
                event = dataclasses.replace(event, at=recorded_time(min(pump[0], pump[1])))
            self._started_at[key] = event.at
        elif isinstance(event, Exited) and pump is not None:
            ended = recorded_time(pump[1], self._started_at.get(key, 0.0))
            event = dataclasses.replace(event, at=ended)
        return event
