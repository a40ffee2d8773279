"""A Slurm replica's own records (its pump's), and the times told from them.

Slurm is polled: a look sees a replica start and end up to a poll interval late
(a start after a long wait in the queue, up to the longest pause), and a busy
loop later still. Each replica's pump records on the node when it started the
command (``start.json``) and when the command ended (``exit.json``), to the
microsecond; both Slurm runtimes (a batch job, steps in an allocation) tell
events at those times where the records are there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from supervisor.backends.store import read_json_or_none
from supervisor.events import Exited, ReplicaEvent, ReplicaKey, Started, recorded_time
from supervisor.logs.pump import START_FILE

__all__ = ["PumpExit", "ReplicaTimes", "read_pump_exit", "read_pump_starts"]

_Event = TypeVar("_Event", bound=ReplicaEvent)


@dataclasses.dataclass(frozen=True)
class PumpExit:
    """One replica's ``exit.json``: how its pump saw the command end, in which attempt."""

    attempt: int
    returncode: int
    ended: float
    started: float | None
    host: str


def read_pump_exit(path: Path) -> PumpExit | None:
    """Blocking: the ``exit.json`` at ``path``; None when there is none, or it cannot be one."""
    record = read_json_or_none(path)
    if not isinstance(record, dict):
        return None
    try:
        started = record.get("started")
        return PumpExit(
            attempt=int(record["attempt"]),
            returncode=int(record["returncode"]),
            ended=float(record["ended"]),
            started=float(started) if isinstance(started, int | float) else None,
            host=str(record.get("host") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def read_pump_starts(
    starts: Sequence[Started], log_dirs: Mapping[ReplicaKey, str]
) -> dict[tuple[ReplicaKey, int], float]:
    """Blocking: when each pump started the attempt a start tells of, where it recorded it.

    A record of another attempt (the next one's, by the time it is read) says nothing.
    """
    out: dict[tuple[ReplicaKey, int], float] = {}
    for m in starts:
        log_dir = log_dirs.get(m.key)
        record = read_json_or_none(Path(log_dir) / START_FILE) if log_dir else None
        if not isinstance(record, dict) or record.get("attempt") != m.attempt:
            continue
        started = record.get("started")
        if isinstance(started, int | float) and not isinstance(started, bool):
            out[(m.key, m.attempt)] = float(started)
    return out


class ReplicaTimes:
    """The times told for each replica's start and end, one attempt after another."""

    def __init__(self) -> None:
        self._started_at: dict[tuple[ReplicaKey, int], float] = {}

    def stamped(
        self, event: _Event, started: float | None = None, ended: float | None = None
    ) -> _Event:
        """``event`` at the time its pump recorded: ``started`` and ``ended`` (None where it
        recorded nothing) are its attempt's, as read from its records.

        A start takes the pump's time; one told with no record keeps the time it was
        seen. No end is recorded before the start told of its attempt.
        """
        key = (event.key, event.attempt)
        if isinstance(event, Started):
            if started is not None:
                at = min(started, ended) if ended is not None else started
                event = dataclasses.replace(event, at=recorded_time(at))
            self._started_at[key] = event.at
        elif isinstance(event, Exited) and ended is not None:
            at = recorded_time(ended, self._started_at.get(key, 0.0))
            event = dataclasses.replace(event, at=at)
        return event
