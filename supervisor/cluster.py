"""What a scheduler's cluster looks like now: partitions, nodes and every job it holds.

Answers of ``Supervisor.cluster`` and ``Supervisor.cluster_jobs`` (the Slurm
backend; ``asupervisor cluster`` and ``asupervisor list --cluster``). Plain
frozen snapshots, whatever the Slurm version or transport (the command-line
tools or slurmrestd) they were read from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ClusterInfo", "ClusterJob", "NodeInfo", "PartitionInfo"]


@dataclass(frozen=True)
class PartitionInfo:
    """One partition, as ``sinfo``/``scontrol show partition`` report it."""

    name: str
    state: str  # UP, DOWN, DRAIN, INACTIVE
    nodes: str  # the node list in Slurm's notation: n[1-3]
    total_nodes: int
    total_cpus: int
    default: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "nodes": self.nodes,
            "total_nodes": self.total_nodes,
            "total_cpus": self.total_cpus,
            "default": self.default,
        }


@dataclass(frozen=True)
class NodeInfo:
    """One node: its state (``idle``, ``mixed``, ``allocated``, ``down``..., flags after ``+``),
    CPUs and memory (MB) allocated out of its total, generic resources and partitions."""

    name: str
    state: str
    cpus: int
    alloc_cpus: int
    memory_mb: int
    alloc_memory_mb: int
    gres: str = ""
    partitions: Sequence[str] = ()
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "cpus": self.cpus,
            "alloc_cpus": self.alloc_cpus,
            "memory_mb": self.memory_mb,
            "alloc_memory_mb": self.alloc_memory_mb,
            "gres": self.gres,
            "partitions": list(self.partitions),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster's partitions and nodes; ``version`` is the scheduler's (``22.05.8``)."""

    backend: str
    version: str
    partitions: Sequence[PartitionInfo] = ()
    nodes: Sequence[NodeInfo] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "version": self.version,
            "partitions": [p.to_json() for p in self.partitions],
            "nodes": [n.to_json() for n in self.nodes],
        }


@dataclass(frozen=True)
class ClusterJob:
    """One job the scheduler holds, anyone's; ``handle`` is set when it is one of our apps
    (any session's: its comment carries the app's owner tag)."""

    job_id: int
    name: str
    user: str
    state: str  # Slurm's own: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    partition: str
    nodes: str = ""
    reason: str = ""
    handle: str | None = None
    components: int = 1  # a heterogeneous job's components (one het group per replica)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "state": self.state,
            "partition": self.partition,
            "nodes": self.nodes,
            "reason": self.reason,
            "handle": self.handle,
            "components": self.components,
        }
