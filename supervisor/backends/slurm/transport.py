"""How the backend talks to Slurm: the command-line tools, as async subprocesses.

Every call is counted (``calls``) so the one-squeue-per-tick promise can be
checked, and every failure becomes a ``BackendError`` whose ``transient``
flag says whether asking again later may work (a controller restarting, a
timeout) or not (a bad partition name).
"""

from __future__ import annotations

import abc
import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio

from supervisor.backends.slurm.cluster import partitions_from_scontrol
from supervisor.backends.slurm.records import (
    JobRecord,
    StepRecord,
    from_sacct,
    from_squeue,
    parse_steps,
)
from supervisor.backends.slurm.script import ClusterFacts
from supervisor.cluster import PartitionInfo
from supervisor.errors import BackendError, SubmitError
from supervisor.observe import metrics

__all__ = ["AccountingDisabled", "CliTransport", "SlurmTransport"]

CALL_TIMEOUT = 30.0

_TRANSIENT_HINTS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "slurm_load_jobs error",
    "temporarily unavailable",
    "try again",
    "slurmdbd",
    "connection reset",
    "timed out",
)


class AccountingDisabled(BackendError):
    """The cluster keeps no accounting (no slurmdbd): jobs that left the controller are unknown."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class SlurmTransport(abc.ABC):
    kind: str
    queue_call: str  # the name ``calls`` counts queue() under
    accounting_call: str

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    @abc.abstractmethod
    async def submit(self, script: str, workdir: str) -> int:
        """The new job's id; SubmitError when Slurm certainly took no job, another
        BackendError when that is unknown (no answer in time: the job may exist)."""

    @abc.abstractmethod
    async def queue(self) -> list[JobRecord]:
        """Every job component the controller holds, in one call."""

    @abc.abstractmethod
    async def accounting(self, job_ids: Sequence[int]) -> list[JobRecord]:
        """Components of these jobs from accounting, in one call; AccountingDisabled if none."""

    @abc.abstractmethod
    async def cancel(self, job_id: int) -> None: ...

    @abc.abstractmethod
    async def requeue(self, job_id: int) -> None: ...

    async def steps(self, job_ids: Sequence[int]) -> list[StepRecord]:
        """The live steps of these (running) jobs, in one call: apps run inside allocations."""
        raise BackendError(
            f"the {self.kind} transport cannot list job steps (cfg.allocation needs the cli "
            "transport)",
            transient=False,
        )

    async def cancel_steps(self, step_ids: Sequence[str]) -> None:
        """Cancel these steps (``JOBID.STEP``), never their job."""
        raise BackendError(
            f"the {self.kind} transport cannot cancel job steps (cfg.allocation needs the cli "
            "transport)",
            transient=False,
        )

    async def launch_failure_hint(self, workdir: str, app_dir: str) -> str:
        """Why a job may fail to launch on this transport ("" when nothing is known)."""
        return ""

    async def complete_requeue(self, job_id: int) -> None:
        """Put back in the queue the components Slurm left ended when it requeued the job.

        22.05 requeues a het job whose leader's node failed only half way: the
        leader waits (Reason=Resources) for ever beside its ended components.
        """
        raise BackendError(
            f"job {job_id} was requeued by Slurm with some of its components left ended, "
            f"and the {self.kind} transport cannot requeue them: the job cannot start again",
            transient=False,
        )

    @abc.abstractmethod
    async def hold(self, job_id: int) -> None:
        """Keep the pending job from starting (reason JobHeldUser, as ``--hold`` gives)."""

    @abc.abstractmethod
    async def release(self, job_id: int) -> None:
        """Let a held job start."""

    @abc.abstractmethod
    async def facts(self) -> ClusterFacts: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections, if the transport holds any."""

    # ------------------------------------------------------ the cluster view (cluster.py)
    async def version_text(self) -> str:
        """The controller's Slurm version, ``22.05.8``."""
        raise BackendError(f"the {self.kind} transport cannot show the cluster", transient=False)

    async def node_list(self) -> list[dict[str, Any]]:
        """Every node, in the shape of ``sinfo --json``'s (and slurmrestd's) ``nodes``."""
        raise BackendError(f"the {self.kind} transport cannot show the cluster", transient=False)

    async def partition_list(self) -> list[PartitionInfo]:
        """Every partition."""
        raise BackendError(f"the {self.kind} transport cannot show the cluster", transient=False)

    async def job_list(self) -> list[dict[str, Any]]:
        """Every job component the controller holds, anyone's, as ``squeue --json`` has them."""
        raise BackendError(f"the {self.kind} transport cannot show the cluster", transient=False)


def _environment(tool: str) -> dict[str, str] | None:
    """sbatch's environment without the submitter's ``SBATCH_*`` variables.

    sbatch takes them over the script's ``#SBATCH`` lines, so a stray
    ``SBATCH_PARTITION`` would silently beat the app's run options.
    """
    if tool != "sbatch":
        return None
    return {k: v for k, v in os.environ.items() if not k.startswith("SBATCH_")}


def _transient(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _TRANSIENT_HINTS)


class CliTransport(SlurmTransport):
    kind = "cli"
    queue_call = "squeue"
    accounting_call = "sacct"

    async def _run(
        self, tool: str, *args: str, stdin: bytes | None = None, counted: str | None = None
    ) -> str:
        self.calls[counted or tool] += 1
        metrics.count_slurm_call(self.kind, tool)
        try:
            with anyio.fail_after(CALL_TIMEOUT):
                done = await anyio.run_process(
                    [tool, *args], input=stdin, check=False, env=_environment(tool)
                )
        except TimeoutError as e:
            raise BackendError(
                f"{tool} did not answer in {CALL_TIMEOUT:.0f} s", transient=True
            ) from e
        except FileNotFoundError as e:
            raise BackendError(f"{tool} is not installed here", transient=False) from e
        except OSError as e:
            raise BackendError(f"cannot run {tool}: {e}", transient=True) from e
        out = done.stdout.decode(errors="replace")
        err = done.stderr.decode(errors="replace").strip()
        if done.returncode != 0:
            if "accounting storage is disabled" in err.lower():
                raise AccountingDisabled(err)
            raise BackendError(
                f"{tool} {' '.join(args)} failed ({done.returncode}): {err or out.strip()}",
                transient=_transient(err),
            )
        return out

    async def submit(self, script: str, workdir: str) -> int:
        try:
            out = await self._run(
                "sbatch", "--parsable", f"--chdir={workdir}", stdin=script.encode()
            )
        except BackendError as e:
            if isinstance(e.__cause__, TimeoutError):
                raise BackendError(f"{e}; the job may exist", transient=True) from e
            raise SubmitError(str(e), transient=e.transient) from e
        try:
            return int(out.strip().split(";")[0])
        except ValueError as e:
            raise SubmitError(f"sbatch printed no job id: {out!r}", transient=False) from e

    async def queue(self) -> list[JobRecord]:
        data = _json(await self._run("squeue", "--json"), "squeue")
        errors = data.get("errors") or []
        if errors:
            # An answer with errors is not "no jobs": never let it make jobs disappear.
            raise BackendError(f"squeue reported errors: {errors}", transient=True)
        return [from_squeue(j) for j in data.get("jobs", [])]

    async def accounting(self, job_ids: Sequence[int]) -> list[JobRecord]:
        if not job_ids:
            return []
        ids = ",".join(str(i) for i in job_ids)
        data = _json(await self._run("sacct", "--json", "-j", ids), "sacct")
        return [from_sacct(j) for j in data.get("jobs", [])]

    async def cancel(self, job_id: int) -> None:
        await self._run("scancel", str(job_id))

    async def steps(self, job_ids: Sequence[int]) -> list[StepRecord]:
        if not job_ids:
            return []
        ids = ",".join(str(i) for i in job_ids)
        # Text, not --json: 22.05's squeue --json ignores --steps (and -j).
        out = await self._run(
            "squeue", "--steps", "-h", "-o", "%i|%N|%j", "-j", ids, counted="squeue_steps"
        )
        return [s for s in parse_steps(out) if s.job_id in job_ids]

    async def cancel_steps(self, step_ids: Sequence[str]) -> None:
        if not step_ids:
            return
        try:
            await self._run("scancel", *step_ids)
        except BackendError as e:
            # A step that ended meanwhile is cancelled already (the others were sent theirs).
            errors = [line for line in str(e).split("scancel: error:")[1:] if line.strip()]
            if not errors or any("Invalid job id" not in line for line in errors):
                raise

    async def requeue(self, job_id: int) -> None:
        await self._run("scontrol", "requeue", str(job_id))

    async def hold(self, job_id: int) -> None:
        # uhold, not hold: run by root or an operator, hold is an admin hold
        # (JobHeldAdmin) that the job's own user could not release.
        await self._run("scontrol", "uhold", str(job_id))

    async def release(self, job_id: int) -> None:
        await self._run("scontrol", "release", str(job_id))

    async def complete_requeue(self, job_id: int) -> None:
        try:
            await self._run("scontrol", "requeue", str(job_id))
        except BackendError as e:
            # scontrol requeues every ended component, then reports the one already
            # waiting (the leader) as an error: that is the requeue done.
            if "pending execution" not in str(e):
                raise

    async def version_text(self) -> str:
        words = (await self._run("sinfo", "--version")).split()
        return words[-1] if words else ""

    async def node_list(self) -> list[dict[str, Any]]:
        data = _json(await self._run("sinfo", "--json"), "sinfo")
        nodes = data.get("nodes")
        return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []

    async def partition_list(self) -> list[PartitionInfo]:
        return partitions_from_scontrol(await self._run("scontrol", "show", "partition", "-o"))

    async def job_list(self) -> list[dict[str, Any]]:
        data = _json(await self._run("squeue", "--json"), "squeue")
        jobs = data.get("jobs")
        return [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []

    async def facts(self) -> ClusterFacts:
        version_text = await self._run("sinfo", "--version")
        partitions = await self._run("sinfo", "-h", "-o", "%P|%m")
        return parse_facts(version_text, partitions)


def parse_facts(version_text: str, partitions: str) -> ClusterFacts:
    """From ``sinfo --version`` and ``sinfo -h -o '%P|%m'`` (memory per node, MB)."""
    numbers = version_text.split()[-1].split(".") if version_text.split() else []
    try:
        version = (int(numbers[0]), int(numbers[1]))
    except (IndexError, ValueError):
        version = (0, 0)
    memory: dict[str, int] = {}
    default = None
    for line in partitions.splitlines():
        name, _, mem = line.partition("|")
        if name.endswith("*"):
            name = name[:-1]
            default = name
        try:
            value = int(mem.rstrip("+"))
        except ValueError:
            continue
        memory[name] = min(value, memory.get(name, value))
    return ClusterFacts(version=version, default_partition=default, real_memory_mb=memory)


def _json(text: str, tool: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BackendError(f"{tool} printed no JSON: {e}", transient=True) from e
    if not isinstance(data, dict):
        raise BackendError(f"{tool} printed unexpected JSON", transient=True)
    return data
