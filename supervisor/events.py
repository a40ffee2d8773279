"""Normalized facts a backend reports about one replica.

Backends translate native observations (a pidfd becoming readable, a Slurm
state, a container event) into these and nothing else; they never decide an
app's state. Every event names the attempt it belongs to: after a restart,
late news about an earlier attempt is recognisably stale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = [
    "Exited",
    "Lost",
    "Queued",
    "ReplicaEvent",
    "ReplicaKey",
    "Requeued",
    "Started",
    "Submitted",
    "recorded_time",
]

ReplicaKey = tuple[str, int]
"""(role name, replica index within the role)."""


def recorded_time(source_at: float | None, not_before: float = 0.0) -> float:
    """The time to record for what a replica's engine or node says happened at ``source_at``.

    Its own time, not when the host heard of it: a busy loop, a Slurm poll, or the
    inspect and error file read an exit may need would move the event by that much.
    Kept within what the host knows, as a container engine reached over TCP or a node
    may run on a clock of its own: never before ``not_before`` (what the host recorded
    of the replica before: its start, or when it asked for the start), never after now.
    None: now.
    """
    now = time.time()
    if source_at is None:
        return now
    return min(max(source_at, not_before), now)


@dataclass(frozen=True, kw_only=True)
class ReplicaEvent:
    role: str
    replica_id: int
    attempt: int = 0
    at: float = field(default_factory=time.time)

    @property
    def key(self) -> ReplicaKey:
        return (self.role, self.replica_id)


@dataclass(frozen=True, kw_only=True)
class Submitted(ReplicaEvent):
    """The backend accepted the replica (a job id exists, a container was created)."""


@dataclass(frozen=True, kw_only=True)
class Queued(ReplicaEvent):
    """The replica waits for resources or for its turn."""

    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Started(ReplicaEvent):
    hostname: str = ""
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class Exited(ReplicaEvent):
    """The replica's main process ended.

    ``exit_code`` is None when no process was running (a pending replica that was
    stopped); ``signal`` names the signal that killed it, if one did.
    """

    exit_code: int | None
    signal: str | None = None
    msg: str = ""
    structured_error_msg: str = ""


@dataclass(frozen=True, kw_only=True)
class Requeued(ReplicaEvent):
    """The scheduler put a started replica back in the queue (preemption, node failure)."""

    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Lost(ReplicaEvent):
    """The backend can no longer tell what became of the replica."""

    reason: str = ""
