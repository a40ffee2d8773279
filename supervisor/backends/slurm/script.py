"""Pure rendering of an AppDef into one heterogeneous sbatch script.

One het group per replica, so each replica gets its own node allocation,
state and exit code in Slurm; one ``srun`` starts all groups at once with
``--kill-on-bad-exit=1`` (a failing replica stops the gang). Every argument
and environment value reaches the program literally: the script quotes each
piece for the shell and passes the environment through ``env NAME=VALUE``,
never through ``srun --export`` (which splits values at commas).

Facts about the cluster that change the script (its Slurm version, the
memory of its partitions) are an explicit input, so the same inputs always
give the same script.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.backends.base import DryrunContext, Request
from supervisor.runopts import ResolvedCfg
from supervisor.specs import AppDef, macros

__all__ = [
    "RANK0_ENV",
    "ClusterFacts",
    "SlurmReplica",
    "SlurmRequest",
    "owner_comment",
    "pump_path",
    "render",
]

RANK0_ENV = "SLURM_JOB_NODELIST_HET_GROUP_0"
OWNER_TAG = "asupervisor"
SMALL_MEMORY_MB = 1000
"""Partitions with at most this much RealMemory get no --mem: TorchX's rule for toy clusters."""


@dataclass(frozen=True)
class ClusterFacts:
    version: tuple[int, int] = (22, 5)
    default_partition: str | None = None
    real_memory_mb: Mapping[str, int] = field(default_factory=dict)

    def partition_memory(self, partition: str | None) -> int | None:
        name = partition or self.default_partition
        return self.real_memory_mb.get(name) if name else None


@dataclass(frozen=True)
class SlurmReplica:
    role: str
    replica_id: int
    group: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_dir: str
    directives: tuple[str, ...]

    def srun_group(self, het: bool, pump: str) -> str:
        """This replica's part of the srun line; ``het`` False for a one-replica (plain) job.

        The replica runs under the log pump (``$ASUP_PYTHON`` is the only
        unquoted word: the node's interpreter, chosen when the job starts).
        """
        launcher = [
            *([f"--het-group={self.group}"] if het else []),
            f"--output={self.log_dir}/launcher.log",
            "env",
            "--",
            *(f"{k}={v}" for k, v in self.env.items()),
        ]
        pumped = ["-S", pump, self.log_dir, "--", *self.argv]
        return f'{shlex.join(launcher)} "$ASUP_PYTHON" {shlex.join(pumped)}'


@dataclass(frozen=True)
class SlurmRequest(Request):
    app_dir: str = ""
    source_dir: str = ""
    workdir: str = ""
    job_dir: str | None = None
    max_retries: int = 0
    replicas: tuple[SlurmReplica, ...] = ()
    script: str = ""

    def __str__(self) -> str:
        return self.script

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "app_dir": self.app_dir,
            "workdir": self.workdir,
            "job_dir": self.job_dir,
            "max_retries": self.max_retries,
            "script": self.script,
        }


def pump_path(app_dir: Path | str) -> str:
    """Where launch ships the log pump: in the app directory, which the nodes share."""
    return f"{app_dir}/.asupervisor/run_pump.py"


def owner_comment(session: str, app_id: str, comment: str | None) -> str:
    """The tag that tells our jobs from everyone else's in squeue and sacct."""
    tag = f"{OWNER_TAG}:{session}/{app_id}"
    return f"{tag} {comment}" if comment else tag


def _resource_directives(
    cpu: int, gpu: int, mem_mb: int, cfg: ResolvedCfg, facts: ClusterFacts
) -> list[str]:
    out = ["--ntasks=1"]
    if cpu > 0:
        out.append(f"--cpus-per-task={cpu}")
    partition = cfg.get_str("partition")
    memory = facts.partition_memory(partition)
    if mem_mb > 0 and not (memory is not None and memory <= SMALL_MEMORY_MB):
        out.append(f"--mem={mem_mb}")
    if gpu > 0:
        out.append(
            f"--gpus-per-node={gpu}" if facts.version >= (24, 11) else f"--gpus-per-task={gpu}"
        )
    for key in ("partition", "constraint", "qos", "account"):
        value = cfg.get_str(key)
        if value:
            out.append(f"--{key}={value}")
    return out


def render(
    app: AppDef,
    cfg: ResolvedCfg,
    ctx: DryrunContext,
    *,
    facts: ClusterFacts,
    default_log_dir: Path,
    job_dir: str | None,
) -> SlurmRequest:
    """``job_dir`` is the directory chosen for this app (fresh per app), or None."""
    # Absolute (relative to the dry run's directory): compute nodes and other processes read it.
    log_root = Path(ctx.cwd, cfg.get_str("log_dir") or default_log_dir)
    app_dir = log_root / ctx.session / ctx.app_id
    workdir = job_dir or ctx.cwd
    replicas: list[SlurmReplica] = []
    for role in app.roles:
        for k in range(role.num_replicas):
            values = macros.Values(
                img_root=role.image or workdir,
                app_id=ctx.app_id,
                replica_id=str(k),
                rank0_env=RANK0_ENV,
            )
            resolved = values.apply(role)
            replica_dir = app_dir / role.name / str(k)
            env = {
                "PYTHONUNBUFFERED": "1",
                **resolved.env,
                "ASUPERVISOR_APP_ID": ctx.app_id,
                "ASUPERVISOR_SESSION": ctx.session,
                "ASUPERVISOR_ROLE": role.name,
                "ASUPERVISOR_REPLICA_ID": str(k),
                "ASUPERVISOR_NUM_REPLICAS": str(role.num_replicas),
                "TORCHELASTIC_ERROR_FILE": str(replica_dir / "error.json"),
                "PET_LOG_DIR": str(replica_dir),
            }
            res = role.resource
            directives = [
                f"--job-name={role.name}-{k}",
                *_resource_directives(res.cpu, res.gpu, res.memMB, cfg, facts),
            ]
            replicas.append(
                SlurmReplica(
                    role=role.name,
                    replica_id=k,
                    group=len(replicas),
                    argv=(resolved.entrypoint, *resolved.args),
                    env=env,
                    log_dir=str(replica_dir),
                    directives=tuple(directives),
                )
            )
    max_retries = max((r.max_retries for r in app.roles), default=0)
    if not cfg.get_bool("requeue_on_failure", True):
        max_retries = 0
    script = _script(app, cfg, ctx, replicas, app_dir, workdir, max_retries)
    return SlurmRequest(
        backend="slurm",
        session=ctx.session,
        app_id=ctx.app_id,
        app=app,
        cfg=cfg,
        app_dir=str(app_dir),
        source_dir=ctx.cwd,
        workdir=workdir,
        job_dir=job_dir,
        max_retries=max_retries,
        replicas=tuple(replicas),
        script=script,
    )


def _script(
    app: AppDef,
    cfg: ResolvedCfg,
    ctx: DryrunContext,
    replicas: list[SlurmReplica],
    app_dir: Path,
    workdir: str,
    max_retries: int,
) -> str:
    q = shlex.quote
    job_level = [
        f"--chdir={workdir}",
        f"--output={app_dir}/slurm-%j.out",
        "--open-mode=append",
        f"--comment={owner_comment(ctx.session, ctx.app_id, cfg.get_str('comment'))}",
        "--requeue" if max_retries > 0 else "--no-requeue",
    ]
    for key in ("time", "mail-user", "mail-type"):
        value = cfg.get_str(key)
        if value:
            job_level.append(f"--{key}={value}")
    lines = ["#!/bin/bash", f"# asupervisor app {ctx.app_id} ({app.name}), session {ctx.session}"]
    for replica in replicas:
        if replica.group > 0:
            lines.append("#SBATCH hetjob")
        directives = list(replica.directives) + (job_level if replica.group == 0 else [])
        lines.extend(f"#SBATCH {q(d)}" for d in directives)
    het = len(replicas) > 1
    pump = pump_path(app_dir)
    groups = " \\\n    : ".join(r.srun_group(het, pump) for r in replicas)
    lines += [
        "",
        "export SLURM_UNBUFFEREDIO=1",
        'ASUP_PYTHON="${ASUPERVISOR_PYTHON:-python3}"',
        'export ASUPERVISOR_ATTEMPT="${SLURM_RESTART_COUNT:-0}"',
        "",
        "srun --kill-on-bad-exit=1 --wait=60 --open-mode=append \\",
        f"    {groups}",
        "exitcode=$?",
        'echo "asupervisor: srun exited with code $exitcode"',
        f'if [ "$exitcode" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {max_retries} ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$exitcode"',
        "",
    ]
    return "\n".join(lines)
