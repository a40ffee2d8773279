"""What Slurm says about one job component, in one shape whatever the Slurm version.

``squeue --json`` and ``sacct --json`` (and slurmrestd) disagree between
themselves and across releases: ``job_state`` is a string before 23.11 and a
list after; exit codes are raw wait statuses in 22.05's squeue and objects
elsewhere; het components are flat fields in squeue and a nested ``het`` in
sacct. Parsing is the only place that knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JobRecord",
    "StepRecord",
    "expand_hostlist",
    "from_sacct",
    "from_squeue",
    "hosts_of_tasks",
    "latest_per_component",
    "parse_steps",
]


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    het_job_id: int  # the het job's id (the id sbatch printed); equals job_id when not het
    het_offset: int
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    restart_cnt: int = 0
    comment: str = ""
    name: str = ""
    source: str = "squeue"
    requeue: bool = False  # Slurm will put the job back in the queue after a node failure
    started: int = 0  # epoch seconds the current (or last) run began; 0 if unknown
    submitted: int = 0  # epoch seconds the job was submitted; 0 if unknown


@dataclass(frozen=True)
class StepRecord:
    """One live job step, as ``squeue --steps`` lists it (steps of allocations apps run in)."""

    job_id: int
    step: str  # the step's own id: "0", "1", ... (or "batch", "extern", "interactive")
    name: str
    nodes: str = ""

    @property
    def step_id(self) -> str:
        """``JOBID.STEP``, what ``scancel`` takes."""
        return f"{self.job_id}.{self.step}"


def parse_steps(text: str) -> list[StepRecord]:
    """``squeue --steps -h -o '%i|%N|%j'``: the name last, since it may hold anything."""
    out = []
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) != 3:
            continue
        job, _, step = parts[0].strip().partition(".")
        if not job.isdigit() or not step:
            continue
        out.append(StepRecord(int(job), step, parts[2], parts[1].strip()))
    return out


def _first(value: Any) -> str:
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def _exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status int or an exit-code object."""
    if isinstance(value, bool) or value is None:
        return None, None
    if isinstance(value, int):  # a wait status: code << 8, or the signal number
        killed_by = value & 0x7F
        return (None, killed_by) if killed_by else ((value >> 8) & 0xFF, None)
    if isinstance(value, Mapping):
        status = _first(value.get("status"))
        signal_info = value.get("signal") or {}
        sig_id = _number(signal_info.get("signal_id")) if isinstance(signal_info, Mapping) else None
        code = _number(value.get("return_code"))
        if status == "SIGNALED" and sig_id:
            return None, sig_id
        return code, sig_id or None
    return None, None


def _number(value: Any) -> int | None:
    """An int, or 23.11's {"set": true, "infinite": false, "number": 3}; None otherwise."""
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(value: Any, default: int = 0) -> int:
    number = _number(value)
    return default if number is None else number


def _component_exit(job: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A component's own result.

    ``derived_exit_code`` is the worst of the component's steps, i.e. its
    replica; ``exit_code`` is the batch script's, which only says something
    when no step failed (a script that died before srun).
    """
    derived = _exit(job.get("derived_exit_code"))
    if derived not in ((0, None), (None, None)):
        return derived
    batch = _exit(job.get("exit_code"))
    return batch if batch != (None, None) else derived


def from_squeue(job: Mapping[str, Any]) -> JobRecord:
    job_id = _int(job.get("job_id"))
    het_job_id = _int(job.get("het_job_id")) or job_id
    code, signal = _component_exit(job)
    return JobRecord(
        job_id=job_id,
        het_job_id=het_job_id,
        het_offset=_int(job.get("het_job_offset")),
        state=_first(job.get("job_state")).upper(),
        reason=_first(job.get("state_reason")),
        exit_code=code,
        signal=signal,
        nodes=str(job.get("nodes") or ""),
        restart_cnt=_int(job.get("restart_cnt")),
        comment=str(job.get("comment") or ""),
        name=str(job.get("name") or ""),
        source="squeue",
        requeue=job.get("requeue") is True,
        started=_int(job.get("start_time")),
        submitted=_int(job.get("submit_time")),
    )


def from_sacct(job: Mapping[str, Any]) -> JobRecord:
    job_id = _int(job.get("job_id"))
    het = job.get("het") or {}
    het_job_id = _int(het.get("job_id")) or job_id
    state = job.get("state") or {}
    current = state.get("current") if isinstance(state, Mapping) else state
    reason = state.get("reason", "") if isinstance(state, Mapping) else ""
    comment = job.get("comment") or {}
    code, signal = _component_exit(job)
    return JobRecord(
        job_id=job_id,
        het_job_id=het_job_id,
        het_offset=_int(het.get("job_offset")),
        state=_first(current).upper(),
        reason=_first(reason),
        exit_code=code,
        signal=signal,
        nodes=str(job.get("nodes") or ""),
        restart_cnt=_int(job.get("restart_cnt")),
        comment=str(comment.get("job") or "") if isinstance(comment, Mapping) else str(comment),
        name=str(job.get("name") or ""),
        source="sacct",
        started=_int((job.get("time") or {}).get("start")),
        submitted=_int((job.get("time") or {}).get("submission")),
    )


def latest_per_component(records: list[JobRecord]) -> list[JobRecord]:
    """sacct lists a requeued job once per attempt; the latest record is the job now."""
    latest: dict[tuple[int, int], JobRecord] = {}
    for record in records:
        key = (record.het_job_id, record.het_offset)
        if key not in latest or record.started >= latest[key].started:
            latest[key] = record
    return list(latest.values())


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact node list (``n[1-3,5],gpu[01-02]``) as one name per node.

    An item this does not understand (several bracket groups) is kept whole.
    """
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    hosts: list[str] = []
    for item in filter(None, (x.strip() for x in items)):
        prefix, bracket, rest = item.partition("[")
        ranges, closed, suffix = rest.partition("]")
        if not bracket or not closed or "[" in suffix:
            hosts.append(item)
            continue
        try:
            for part in ranges.split(","):
                low, dash, high = part.partition("-")
                width = len(low)
                for n in range(int(low), int(high if dash else low) + 1):
                    hosts.append(f"{prefix}{n:0{width}d}{suffix}")
        except ValueError:
            hosts.append(item)
    return hosts


def hosts_of_tasks(nodes: str, tasks: int) -> list[str]:
    """The node each of a component's ``tasks`` runs on, in task order (block placement,
    as the script's ``--ntasks-per-node`` gives it); the whole list where it does not divide."""
    hosts = expand_hostlist(nodes)
    if tasks <= 1 or not hosts or tasks % len(hosts):
        return [nodes] * tasks
    per_node = tasks // len(hosts)
    return [hosts[i // per_node] for i in range(tasks)]
