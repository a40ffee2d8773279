"""What ties an app to its Slurm job beyond the bare job id.

A controller that lost its state hands out job ids again: the id an app
recorded may later name someone else's job. Such a job is never shown as
the app's, nor cancelled for it. A job is the app's when its comment carries
the app's owner tag (the controller always reports it; accounting may not
keep comments), each component has the name the script gave it, and it was
not submitted before the app was (Slurm moves the submit time of a requeued job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.backends.slurm.records import JobRecord

__all__ = ["SUBMIT_SLACK_S", "JobIdentity"]

SUBMIT_SLACK_S = 300
"""How far the controller's clock may be behind the submitting host's."""


@dataclass(frozen=True)
class JobIdentity:
    tag: str  # the owner tag the job's comment starts with
    names: tuple[str, ...] = ()  # each component's job name ("" or absent: not checked)
    submitted_at: float = 0.0  # epoch seconds just before sbatch (0: not recorded)

    def owns(self, record: JobRecord) -> bool:
        if record.comment:
            if record.comment != self.tag and not record.comment.startswith(self.tag + " "):
                return False
        elif record.source == "squeue":
            return False  # the controller reports every job's comment; ours always has one
        if record.het_offset < len(self.names):
            expected = self.names[record.het_offset]
            if expected and record.name and record.name != expected:
                return False
        # Slurm moves the submit time to the requeue's: only a job submitted before ours
        # is told apart by it.
        earlier = record.submitted < self.submitted_at - SUBMIT_SLACK_S
        return not (self.submitted_at and record.submitted and earlier)

    def owns_all(self, records: Sequence[JobRecord]) -> bool:
        return all(self.owns(r) for r in records)

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "names": list(self.names), "submitted_at": self.submitted_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, tag: str) -> JobIdentity:
        """An app record's identity; records written before it was kept give the tag only."""
        if not isinstance(data, Mapping):
            return cls(tag)
        names = data.get("names")
        when = data.get("submitted_at")
        return cls(
            tag=str(data.get("tag") or tag),
            names=tuple(str(n) for n in names) if isinstance(names, list) else (),
            submitted_at=float(when) if isinstance(when, int | float) else 0.0,
        )
