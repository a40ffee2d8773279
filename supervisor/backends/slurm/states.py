"""The one map from Slurm job states to what they mean for a replica."""

from __future__ import annotations

import enum

__all__ = ["Meaning", "meaning_of"]


class Meaning(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"  # back in the queue after it ran: never a failure


_MEANINGS: dict[str, Meaning] = {
    "PENDING": Meaning.QUEUED,
    "CONFIGURING": Meaning.QUEUED,
    "RESV_DEL_HOLD": Meaning.QUEUED,
    "REQUEUE_HOLD": Meaning.REQUEUED,
    "REQUEUE_FED": Meaning.REQUEUED,
    "REQUEUED": Meaning.REQUEUED,
    "PREEMPTED": Meaning.REQUEUED,
    "RUNNING": Meaning.RUNNING,
    "COMPLETING": Meaning.RUNNING,
    "SUSPENDED": Meaning.RUNNING,
    "STOPPED": Meaning.RUNNING,
    "SIGNALING": Meaning.RUNNING,
    "STAGE_OUT": Meaning.RUNNING,
    "RESIZING": Meaning.RUNNING,
    "COMPLETED": Meaning.SUCCEEDED,
    "FAILED": Meaning.FAILED,
    "TIMEOUT": Meaning.FAILED,
    "OUT_OF_MEMORY": Meaning.FAILED,
    "BOOT_FAIL": Meaning.FAILED,
    "DEADLINE": Meaning.FAILED,
    "NODE_FAIL": Meaning.FAILED,
    "SPECIAL_EXIT": Meaning.FAILED,
    "REVOKED": Meaning.CANCELLED,
    "CANCELLED": Meaning.CANCELLED,
}


def meaning_of(state: str) -> Meaning | None:
    """None for a state this table does not know; the caller reports it, never guesses."""
    return _MEANINGS.get(state.split()[0].upper() if state else "")
