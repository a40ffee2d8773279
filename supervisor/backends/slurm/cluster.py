"""The cluster view: what Slurm says of partitions, nodes and jobs, as ``supervisor.cluster`` types.

Both transports feed the same parsers: nodes come in one shape from
``sinfo --json`` and slurmrestd's ``/nodes``; jobs from ``squeue --json`` and
``/jobs``; partitions from slurmrestd's ``/partitions``, and from
``scontrol show partition -o`` on the command line (22.05's ``sinfo --json``
has no partitions, and its ``scontrol`` no ``--json``). Fields differ across
releases (a node's ``state`` is a string before 23.02 and a list after;
numbers become ``{"set", "number"}`` objects in 23.11): parsing here is the
only place that knows.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from supervisor.backends.slurm.script import OWNER_TAG
from supervisor.cluster import ClusterInfo, ClusterJob, NodeInfo, PartitionInfo
from supervisor.specs import make_handle

if TYPE_CHECKING:  # the transports import the parsers here
    pass

JOB_ID_KEY = "slurm_job_id"
"""The key of an app's status metadata that holds its Slurm job id (the id sbatch printed)."""

__all__ = [
    "JOB_ID_KEY",
    "cluster_info",
    "handle_of_comment",
    "job_metadata",
    "jobs_from_json",
    "node_from_json",
    "partition_from_json",
    "partitions_from_scontrol",
]


def _number(value: Any, default: int = 0) -> int:
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if v is not None and str(v)]
    return [str(value)] if value not in (None, "") else []


def node_from_json(node: Mapping[str, Any]) -> NodeInfo:
    """One node of ``sinfo --json`` / ``/nodes``; its state lower case, flags after ``+``."""
    states = [s.lower() for s in _words(node.get("state"))]
    flags = [f.lower() for f in _words(node.get("state_flags"))]
    state = "+".join(dict.fromkeys([*states, *flags])) or "unknown"
    gres = str(node.get("gres") or "")
    return NodeInfo(
        name=str(node.get("name") or ""),
        state=state,
        cpus=_number(node.get("cpus")),
        alloc_cpus=_number(node.get("alloc_cpus")),
        memory_mb=_number(node.get("real_memory")),
        alloc_memory_mb=_number(node.get("alloc_memory")),
        gres="" if gres in ("(null)", "N/A") else gres,
        partitions=tuple(_words(node.get("partitions"))),
        reason=str(node.get("reason") or ""),
    )


def partition_from_json(partition: Mapping[str, Any]) -> PartitionInfo:
    """One partition of slurmrestd's ``/partitions``."""
    flags = [f.lower() for f in _words(partition.get("flags"))]
    state = partition.get("state")
    nested = partition.get("partition")  # 23.11 and later: {"state": [...]} under "partition"
    if state is None and isinstance(nested, Mapping):
        state = nested.get("state")
    nodes = partition.get("nodes")
    names = nodes.get("configured") if isinstance(nodes, Mapping) else nodes
    total_nodes = partition.get("total_nodes")
    total_cpus = partition.get("total_cpus")
    if isinstance(nodes, Mapping):
        total_nodes = nodes.get("total", total_nodes)
    cpus = partition.get("cpus")
    if isinstance(cpus, Mapping):
        total_cpus = cpus.get("total", total_cpus)
    return PartitionInfo(
        name=str(partition.get("name") or ""),
        state=",".join(_words(state)).upper() or "UNKNOWN",
        nodes=str(names or ""),
        total_nodes=_number(total_nodes),
        total_cpus=_number(total_cpus),
        default="default" in flags,
    )


def partitions_from_scontrol(text: str) -> list[PartitionInfo]:
    """``scontrol show partition -o``: one ``Key=Value ...`` line per partition."""
    found = []
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for word in shlex.split(line):
            key, sep, value = word.partition("=")
            if sep:
                fields[key] = value
        if "PartitionName" not in fields:
            continue
        found.append(
            PartitionInfo(
                name=fields["PartitionName"],
                state=fields.get("State", "UNKNOWN"),
                nodes="" if fields.get("Nodes") == "(null)" else fields.get("Nodes", ""),
                total_nodes=_int_text(fields.get("TotalNodes")),
                total_cpus=_int_text(fields.get("TotalCPUs")),
                default=fields.get("Default", "NO").upper() == "YES",
            )
        )
    return found


def _int_text(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 0


def cluster_info(
    version: str,
    partitions: Sequence[PartitionInfo],
    nodes: Iterable[Mapping[str, Any]],
    only_partition: str | None = None,
) -> ClusterInfo:
    """Partitions and nodes, sorted by name; with ``only_partition``, that one and its nodes."""
    shown = sorted(partitions, key=lambda p: p.name)
    infos = sorted((node_from_json(n) for n in nodes), key=lambda n: n.name)
    if only_partition is not None:
        shown = [p for p in shown if p.name == only_partition]
        infos = [n for n in infos if only_partition in n.partitions]
    return ClusterInfo("slurm", version, tuple(shown), tuple(infos))


def handle_of_comment(comment: str, backend: str = "slurm") -> str | None:
    """``{backend}://session/app_id`` for a job whose comment carries our owner tag; else None."""
    tag, _, _ = comment.partition(" ")
    prefix = f"{OWNER_TAG}:"
    if not tag.startswith(prefix):
        return None
    session, sep, app_id = tag[len(prefix) :].partition("/")
    if not (sep and session and app_id):
        return None
    return make_handle(backend, session, app_id)


def jobs_from_json(jobs: Iterable[Mapping[str, Any]], backend: str = "slurm") -> list[ClusterJob]:
    """One ``ClusterJob`` per job (a het job's components folded into its leader), by id;
    ours carry their handle under ``backend``, the name the Slurm backend is registered as."""
    by_id: dict[int, list[Mapping[str, Any]]] = {}
    for job in jobs:
        job_id = _number(job.get("job_id"))
        leader = _number(job.get("het_job_id")) or job_id
        by_id.setdefault(leader, []).append(job)
    found = []
    for job_id, parts in sorted(by_id.items()):
        parts.sort(key=lambda j: _number(j.get("het_job_offset")))
        first = parts[0]
        nodes = [str(p.get("nodes") or "") for p in parts]
        reason = str(_first(first.get("state_reason")))
        found.append(
            ClusterJob(
                job_id=job_id,
                name=str(first.get("name") or ""),
                user=str(first.get("user_name") or first.get("user_id") or ""),
                state=_first(first.get("job_state")).upper(),
                partition=str(first.get("partition") or ""),
                nodes=",".join(n for n in nodes if n),
                reason="" if reason == "None" else reason,
                handle=handle_of_comment(str(first.get("comment") or ""), backend),
                components=len(parts),
            )
        )
    return found


def _first(value: Any) -> str:
    words = _words(value)
    return words[0] if words else ""


def job_metadata(job_id: int) -> dict[str, str]:
    """An app's status metadata: its Slurm job id."""
    return {JOB_ID_KEY: str(job_id)}
