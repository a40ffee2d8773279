"""Pure rendering of an AppDef into one heterogeneous sbatch script.

One het group per replica, so each replica gets its own node allocation,
state and exit code in Slurm; except a role whose metadata names
``asupervisor/procs_per_node`` (M, e.g. ``ddp -j NxM``): it becomes one het
group of N nodes with M tasks each, its replicas the tasks of that group (in
order, M per node), since Slurm never places two het groups on one node. One
``srun`` starts all groups at once with ``--kill-on-bad-exit=1`` (a failing
replica stops the gang).

MPI (role metadata :data:`MPI`, set by the ``mpi`` component): ``pmix`` or
``pmi2`` adds ``--mpi=PLUGIN`` to the role's part of the srun line, so each
replica is one MPI rank wired up by Slurm; ``mpirun`` runs the role's one
replica in the batch script itself, on the first node of an allocation of
:data:`MPI_NODES` nodes x :data:`PROCS_PER_NODE` tasks, and mpirun starts the
ranks through Slurm itself.

Containers (pyxis): a role's ``image`` becomes ``--container-image`` on its
part of the srun line, with ``--container-mounts`` (the app's directory, the
working directory and the role's mounts) and ``--container-workdir``; unless
the run option ``image_is_tag`` says the image is only a tag.

Every argument and environment value reaches the
program literally: the script quotes each piece for the shell and passes the
environment through ``env NAME=VALUE``, never through ``srun --export``
(which splits values at commas).

Facts about the cluster that change the script (its Slurm version, the
memory of its partitions) are an explicit input, so the same inputs always
give the same script.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.backends.base import DryrunContext, Request
from supervisor.backends.slurm.options import DEPENDENCY_KINDS, expand_hostlist, mail_types
from supervisor.errors import Problem, SpecError
from supervisor.runopts import ResolvedCfg
from supervisor.specs import (
    MPI,
    MPI_NODES,
    MPI_PLUGINS,
    PROCS_PER_NODE,
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    macros,
)

__all__ = [
    "DEPENDENCY_MARK",
    "RANK0_ENV",
    "ClusterFacts",
    "SlurmGroup",
    "SlurmReplica",
    "SlurmRequest",
    "app_problems",
    "dependencies",
    "group_keys",
    "owner_comment",
    "pump_path",
    "render",
    "with_dependencies",
]

RANK0_ENV = "TORCHX_RANK0_HOST"
"""Exported by the batch script: the first host of het group 0 (``${rank0_env}``)."""
TASK_INDEX = "SLURM_PROCID"
"""A task's rank in the whole het step; a group's replicas are ``first .. first+n-1``."""
OWNER_TAG = "asupervisor"
SMALL_MEMORY_MB = 1000
"""Partitions with at most this much RealMemory get no --mem: TorchX's rule for toy clusters."""


@dataclass(frozen=True)
class ClusterFacts:
    version: tuple[int, int] = (22, 5)
    default_partition: str | None = None
    real_memory_mb: Mapping[str, int] = field(default_factory=dict)
    pyxis: bool | None = None
    """Whether srun takes pyxis' ``--container-image`` (None: not known, images are rendered)."""

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
    path_prepend: str = ""  # the role's own PATH, put before the node's (as TorchX joins it)

    def error_file(self, workdir: str) -> str:
        """Where a failed replica's structured error is read (the role's own file, if set)."""
        chosen = self.env.get("TORCHELASTIC_ERROR_FILE") or str(Path(self.log_dir) / "error.json")
        return os.path.join(workdir, chosen)

    def command(self, pump: str) -> str:
        """The replica under the log pump, as shell words.

        ``$ASUP_PYTHON`` and the node's ``$PATH`` are the only expanded words:
        the node's interpreter and search path, known when the job starts.
        """
        env = shlex.join(["env", "--", *(f"{k}={v}" for k, v in self.env.items())])
        if self.path_prepend:
            env += " " + shlex.quote(f"PATH={self.path_prepend}") + ':"$PATH"'
        pumped = ["-S", pump, self.log_dir, "--", *self.argv]
        return f'{env} "$ASUP_PYTHON" {shlex.join(pumped)}'


@dataclass(frozen=True)
class SlurmGroup:
    """One het group: one replica, or (procs_per_node) every replica of a role."""

    group: int
    replicas: tuple[SlurmReplica, ...]
    directives: tuple[str, ...]
    launcher_log: str
    first_task: int  # the step-wide rank of this group's first task
    step_options: tuple[str, ...] = ()  # srun options of this group only (--mpi, pyxis)
    in_batch: bool = False  # mpirun: the replica runs in the batch script, not under srun

    def srun_group(self, het: bool, pump: str) -> str:
        """This group's part of the srun line; ``het`` False for a one-group (plain) job."""
        launcher = [
            *([f"--het-group={self.group}"] if het else []),
            f"--output={self.launcher_log}",
            *self.step_options,
        ]
        if len(self.replicas) == 1:
            return f"{shlex.join(launcher)} {self.replicas[0].command(pump)}"
        # Several tasks run one command: each picks its replica by its rank.
        cases = "".join(
            f"{self.first_task + i}) exec {r.command(pump)} ;;\n"
            for i, r in enumerate(self.replicas)
        )
        body = (
            f'case "${TASK_INDEX}" in\n{cases}'
            f'*) echo "asupervisor: no replica for task ${TASK_INDEX}" >&2; exit 1 ;;\nesac'
        )
        return f"{shlex.join(launcher)} sh -c {shlex.quote(body)}"


def procs_per_node(metadata: Mapping[str, Any], default: int | None = None) -> int | None:
    """The role's own ``procs_per_node``, else the run option ``ntasks_per_node`` (``default``)."""
    if PROCS_PER_NODE not in metadata:
        return default
    value = metadata.get(PROCS_PER_NODE)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def group_keys(app: AppDef, per_node: int | None = None) -> list[list[tuple[str, int]]]:
    """The replicas of each het group, in group order (what each Slurm component runs).

    ``per_node``: the run option ``ntasks_per_node`` the app was rendered with.
    """
    out: list[list[tuple[str, int]]] = []
    for role in app.roles:
        keys = [(role.name, k) for k in range(role.num_replicas)]
        if procs_per_node(role.metadata, per_node) is not None:
            out.append(keys)
        else:
            out.extend([key] for key in keys)
    return out


@dataclass(frozen=True)
class SlurmRequest(Request):
    app_dir: str = ""
    source_dir: str = ""
    workdir: str = ""
    job_dir: str | None = None
    max_retries: int = 0
    replicas: tuple[SlurmReplica, ...] = ()
    groups: tuple[SlurmGroup, ...] = ()
    script: str = ""

    def __str__(self) -> str:
        return self.script

    @property
    def job_names(self) -> tuple[str, ...]:
        """The name of each het component, as the script sets it (``--job-name``)."""
        return tuple(
            next((d.partition("=")[2] for d in g.directives if d.startswith("--job-name=")), "")
            for g in self.groups
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "app_dir": self.app_dir,
            "workdir": self.workdir,
            "job_dir": self.job_dir,
            "max_retries": self.max_retries,
            "groups": [[[r.role, r.replica_id] for r in g.replicas] for g in self.groups],
            "job_names": list(self.job_names),
            "replicas": [
                {
                    "role": r.role,
                    "replica_id": r.replica_id,
                    "group": r.group,
                    "log_dir": r.log_dir,
                    "error_file": r.error_file(self.workdir),
                }
                for r in self.replicas
            ],
            "script": self.script,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], app: AppDef) -> SlurmRequest:
        """What following the job again needs of the request an app's record holds.

        Not the whole request: no replica's command or environment is recorded (the
        environment may hold secrets), and following needs neither. Raises
        ``LookupError``, ``TypeError`` or ``ValueError`` for a record without it
        (an earlier asupervisor recorded no replicas).
        """
        replicas = {
            (str(r["role"]), int(r["replica_id"])): SlurmReplica(
                role=str(r["role"]),
                replica_id=int(r["replica_id"]),
                group=int(r["group"]),
                argv=(),
                env={"TORCHELASTIC_ERROR_FILE": str(r["error_file"])},
                log_dir=str(r["log_dir"]),
            )
            for r in d["replicas"]
        }
        names = [str(n) for n in d["job_names"]]
        groups = tuple(
            SlurmGroup(
                group=i,
                replicas=tuple(replicas[(str(role), int(k))] for role, k in members),
                directives=(f"--job-name={names[i]}",),
                launcher_log="",
                first_task=0,
            )
            for i, members in enumerate(d["groups"])
        )
        job_dir = d.get("job_dir")
        return cls(
            **Request.fields_from_json(d, app),
            app_dir=str(d["app_dir"]),
            workdir=str(d["workdir"]),
            job_dir=None if job_dir is None else str(job_dir),
            max_retries=int(d["max_retries"]),
            replicas=tuple(replicas.values()),
            groups=groups,
            script=str(d["script"]),
        )


DEPENDENCY_MARK = "# asupervisor waits for: "
"""Marks, in a dry run's script, each app waited for; launch puts its job id there."""


def dependencies(script: str) -> list[tuple[str, str]]:
    """(kind, handle) of each app the script waits for, in order."""
    return [
        (kind, handle)
        for line in script.splitlines()
        if line.startswith(DEPENDENCY_MARK)
        for kind, _, handle in [line[len(DEPENDENCY_MARK) :].partition("=")]
    ]


def with_dependencies(script: str, job_ids: Mapping[str, int]) -> str:
    """The script to submit: its marks become one ``--dependency`` (job ids by handle).

    ``--kill-on-invalid-dep=yes``: a dependency that can never be satisfied (an
    ``afterok`` app that failed) cancels the job instead of leaving it pending
    for ever with reason DependencyNeverSatisfied.
    """
    kinds: dict[str, list[str]] = {}
    for kind, handle in dependencies(script):
        kinds.setdefault(kind, []).append(str(job_ids[handle]))
    if not kinds:
        return script
    spec = ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in kinds.items())
    lines = [line for line in script.split("\n") if not line.startswith(DEPENDENCY_MARK)]
    at = next(i for i, line in enumerate(script.split("\n")) if line.startswith(DEPENDENCY_MARK))
    lines[at:at] = [f"#SBATCH --dependency={spec}", "#SBATCH --kill-on-invalid-dep=yes"]
    return "\n".join(lines)


def pump_path(app_dir: Path | str) -> str:
    """Where launch ships the log pump: in the app directory, which the nodes share."""
    return f"{app_dir}/.asupervisor/run_pump.py"


def owner_comment(session: str, app_id: str, comment: str | None) -> str:
    """The tag that tells our jobs from everyone else's in squeue and sacct."""
    tag = f"{OWNER_TAG}:{session}/{app_id}"
    return f"{tag} {comment}" if comment else tag


def _resource_directives(
    res: Resource,
    per_node: int | None,
    nodes: int,
    cfg: ResolvedCfg,
    facts: ClusterFacts,
    nodelist: list[str],
) -> list[str]:
    """What one group asks for: one task, or ``nodes`` x ``per_node`` tasks (per-task resources)."""
    tasks = per_node or 1
    out = (
        ["--ntasks=1"]
        if per_node is None
        else [f"--nodes={nodes}", f"--ntasks-per-node={per_node}"]
    )
    if res.cpu > 0:
        out.append(f"--cpus-per-task={res.cpu}")
    partition = cfg.get_str("partition")
    memory = facts.partition_memory(partition)
    if res.memMB > 0 and not (memory is not None and memory <= SMALL_MEMORY_MB):
        out.append(f"--mem={res.memMB * tasks}")  # --mem is per node
    gres = cfg.get_list("gres") or ()
    gpus_per_node = cfg.get_str("gpus_per_node")
    # An explicit GPU request (typed, per node) replaces the one Resource.gpu implies.
    explicit_gpus = gpus_per_node or any(g.split(":")[0] == "gpu" for g in gres)
    if res.gpu > 0 and not explicit_gpus:
        out.append(
            f"--gpus-per-node={res.gpu * tasks}"
            if facts.version >= (24, 11)
            else f"--gpus-per-task={res.gpu}"
        )
    if gpus_per_node:
        out.append(f"--gpus-per-node={gpus_per_node}")
    if gres:
        out.append(f"--gres={','.join(gres)}")
    for key in ("partition", "constraint", "qos", "account", "reservation"):
        value = cfg.get_str(key)
        if value:
            out.append(f"--{key}={value}")
    # Node choices are per het group: --nodelist means "all of these" to each component.
    if nodelist:
        out.append(f"--nodelist={','.join(nodelist)}")
    exclude = cfg.get_list("exclude")
    if exclude:
        out.append(f"--exclude={','.join(exclude)}")
    if cfg.get_bool("exclusive", False):
        out.append("--exclusive")
    return out


def app_problems(app: AppDef, cfg: ResolvedCfg, facts: ClusterFacts) -> list[Problem]:
    """What Slurm cannot run of ``app`` under ``cfg`` (its grouping, the nodes named, MPI,
    containers): ``SlurmBackend.check_app`` lists it in a dry run with the options'
    own problems, ``render`` refuses it. Neither the dry run's context nor the cluster
    is asked (``facts`` are what the backend knows); a rule over an option in
    ``cfg.unresolved`` is skipped."""
    problems = _grouping_problems(app, cfg)
    if not problems:  # the nodes each group takes are known only for a valid grouping
        problems += _nodelist_problems(app, cfg)
    problems += _check_mpi(app)
    for i, role in enumerate(app.roles):
        problems += _image_problems(i, role, cfg, facts)
    return problems


def _group_sizes(app: AppDef, cfg: ResolvedCfg) -> list[int]:
    """The nodes each het group takes, in order (for a grouping ``app_problems`` passed)."""
    sizes: list[int] = []
    default = cfg.get_int("ntasks_per_node")
    for role in app.roles:
        per_node = procs_per_node(role.metadata, default)
        if role.metadata.get(MPI) == "mpirun":
            sizes.append(_mpirun_nodes(role))
        elif per_node is None:
            sizes += [1] * role.num_replicas
        else:
            sizes.append(max(role.num_replicas // per_node, 1))
    return sizes


def _named_nodes(cfg: ResolvedCfg) -> list[str]:
    """The nodes ``nodelist`` names (a malformed item, ``check_cfg``'s to name, gives none)."""
    return [n for item in cfg.get_list("nodelist") or () for n in expand_hostlist(item) or ()]


def _nodelist_problems(app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
    """More nodes named than the app's het groups take."""
    if {"nodelist", "ntasks_per_node"} & cfg.unresolved:
        return []  # the count or the groups are not known
    named, sizes = len(_named_nodes(cfg)), sum(_group_sizes(app, cfg))
    if named <= sizes:
        return []
    return [
        Problem(
            "cfg.nodelist",
            f"{named} nodes named, but the app runs on {sizes} "
            "(each het group takes as many as it has nodes, in order)",
        )
    ]


def _nodelists(app: AppDef, cfg: ResolvedCfg) -> list[list[str]]:
    """The nodes ``nodelist`` gives each het group, in order (``_nodelist_problems`` passed)."""
    names = _named_nodes(cfg)
    out = []
    for size in _group_sizes(app, cfg):
        out.append(names[:size])
        names = names[size:]
    return out


def _grouping_problems(app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
    """Each grouped role's tasks per node: a positive integer dividing its replicas."""
    # An unresolved ntasks_per_node is at its default (None): no role is grouped by it.
    default = cfg.get_int("ntasks_per_node")
    problems = []
    for i, role in enumerate(app.roles):
        if role.metadata.get(MPI) == "mpirun":
            continue  # its one replica runs mpirun over the role's nodes x procs_per_node
        if PROCS_PER_NODE not in role.metadata and default is None:
            continue
        per_node = procs_per_node(role.metadata, default)
        where = (
            f"roles[{i}].metadata[{PROCS_PER_NODE!r}]"
            if PROCS_PER_NODE in role.metadata
            else "cfg.ntasks_per_node"
        )
        of = "" if PROCS_PER_NODE in role.metadata else f"role {role.name!r}: "
        if per_node is None or per_node < 1:
            problems.append(Problem(where, "must be a positive integer"))
        elif role.num_replicas % per_node:
            problems.append(
                Problem(where, f"{of}{per_node} does not divide num_replicas={role.num_replicas}")
            )
    return problems


def _mpirun_nodes(role: Role) -> int:
    nodes = role.metadata.get(MPI_NODES, 1)
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else 1


def _check_mpi(app: AppDef) -> list[Problem]:
    """The MPI metadata of each role: a known plugin; mpirun alone in its app, one replica."""
    problems = []
    for i, role in enumerate(app.roles):
        if MPI not in role.metadata:
            continue
        plugin = role.metadata[MPI]
        where = f"roles[{i}].metadata[{MPI!r}]"
        if plugin not in MPI_PLUGINS:
            problems.append(Problem(where, f"{plugin!r}: expected one of {', '.join(MPI_PLUGINS)}"))
        elif plugin == "mpirun":
            if len(app.roles) > 1 or role.num_replicas != 1:
                problems.append(
                    Problem(
                        where,
                        "mpirun runs as the app's only replica (one role, num_replicas=1), "
                        "in the batch script on the allocation's first node",
                    )
                )
            nodes = role.metadata.get(MPI_NODES, 1)
            if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
                problems.append(
                    Problem(f"roles[{i}].metadata[{MPI_NODES!r}]", "must be a positive integer")
                )
            per_node = procs_per_node(role.metadata, 1)
            if per_node is None or per_node < 1:
                where = f"roles[{i}].metadata[{PROCS_PER_NODE!r}]"
                problems.append(Problem(where, "must be a positive integer"))
            if role.image:
                problems.append(
                    Problem(
                        f"roles[{i}].image",
                        "mpirun runs in the batch script, outside any container: "
                        "use the pmix or pmi2 plugin to run ranks in a container",
                    )
                )
    return problems


_NO_PYXIS = (
    "this cluster's srun has no --container-image (the pyxis plugin is not installed), "
    "so the image cannot be run; set the run option image_is_tag=true if the image is "
    "only a tag (nothing is then run in a container)"
)


def _rendered(role: Role, cfg: ResolvedCfg) -> bool:
    """Whether the role runs in a container (its image is not only a tag)."""
    return bool(role.image) and not cfg.get_bool("image_is_tag", False)


def _image_problems(i: int, role: Role, cfg: ResolvedCfg, facts: ClusterFacts) -> list[Problem]:
    """Role ``i``'s image and mounts: a container pyxis can run, mounts it can give."""
    if role.image and "image_is_tag" in cfg.unresolved:
        return []  # whether it runs in a container is not known
    rendered = _rendered(role, cfg)
    problems: list[Problem] = []
    if rendered and facts.pyxis is False:
        problems.append(Problem(f"roles[{i}].image", f"{role.image!r}: {_NO_PYXIS}"))
    if role.mounts and not (rendered and facts.pyxis is not False):
        why = "the image is only a tag (image_is_tag)" if role.image else "the role has no image"
        problems.append(
            Problem(
                f"roles[{i}].mounts",
                f"mounts on Slurm are container mounts (pyxis --container-mounts), and {why}",
            )
        )
    if not rendered or problems:
        return problems
    for j, mount in enumerate(role.mounts):
        where = f"roles[{i}].mounts[{j}]"
        if not isinstance(mount, BindMount | DeviceMount):
            problems.append(
                Problem(where, "pyxis (enroot) has no named volumes: use a BindMount of a path")
            )
        elif _unmountable(mount.src_path) or _unmountable(mount.dst_path):
            problems.append(Problem(where, f"pyxis cannot mount it: {_COLON}"))
    return problems


def _implicit_mount_problems(i: int, role: Role, app_dir: Path, workdir: str) -> list[Problem]:
    """The directories every container of role ``i`` gets, known only in the dry run: the
    app's (logs, the log pump) and the working one, as on the node."""
    implicit = (
        ("the app's directory (log_dir/session/app id)", str(app_dir)),
        ("the working directory (job_dir, else the current one)", str(workdir)),
    )
    return [
        Problem(f"roles[{i}].image", f"pyxis cannot mount {what} {path!r}: {_COLON}")
        for what, path in implicit
        if _unmountable(path)
    ]


def _container_options(role: Role, app_dir: Path, workdir: str) -> tuple[str, ...]:
    """The pyxis srun options of a role run in a container, whose mounts passed
    ``_image_problems`` and ``_implicit_mount_problems``."""
    mounts = [f"{app_dir}:{app_dir}", f"{workdir}:{workdir}"]
    for mount in role.mounts:
        if isinstance(mount, BindMount):
            mounts.append(f"{mount.src_path}:{mount.dst_path}" + (":ro" if mount.read_only else ""))
        elif isinstance(mount, DeviceMount):
            mounts.append(f"{mount.src_path}:{mount.dst_path}")
    return (
        f"--container-image={role.image}",
        f"--container-mounts={','.join(mounts)}",
        f"--container-workdir={workdir}",
    )


_COLON = "a path with ',' or ':' in it cannot be given to --container-mounts"


def _unmountable(path: str) -> bool:
    """',' separates pyxis's mounts and ':' a mount's parts: neither can be in a path."""
    return "," in path or ":" in path


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
    default_per_node = cfg.get_int("ntasks_per_node")
    # Absolute (relative to the dry run's directory): compute nodes and other processes read it.
    log_root = Path(ctx.cwd, cfg.get_str("log_dir") or default_log_dir)
    app_dir = log_root / ctx.session / ctx.app_id
    workdir = job_dir or ctx.cwd
    # The same rules as ``check_app``'s: a backend used directly is refused what a dry
    # run would list.
    problems = app_problems(app, cfg, facts)
    containers: list[tuple[str, ...]] = []
    for i, role in enumerate(app.roles):
        in_container = _rendered(role, cfg) and facts.pyxis is not False
        if in_container:
            problems += _implicit_mount_problems(i, role, app_dir, workdir)
        containers.append(_container_options(role, app_dir, workdir) if in_container else ())
    if problems:
        raise SpecError(problems, context="cannot run the app on Slurm")
    nodelists = _nodelists(app, cfg)
    replicas: list[SlurmReplica] = []
    groups: list[SlurmGroup] = []
    tasks = 0
    for role, container in zip(app.roles, containers, strict=True):
        per_node = procs_per_node(role.metadata, default_per_node)
        plugin = role.metadata.get(MPI)
        step_options = (*([f"--mpi={plugin}"] if plugin in ("pmix", "pmi2") else []), *container)
        role_replicas: list[SlurmReplica] = []
        for k in range(role.num_replicas):
            values = macros.Values(
                img_root=role.image or workdir,
                app_id=ctx.app_id,
                replica_id=str(k),
                rank0_env=RANK0_ENV,
            )
            resolved = values.apply(role)
            replica_dir = app_dir / role.name / str(k)
            role_env = dict(resolved.env)
            role_path = role_env.pop("PATH", "")
            env = {
                "PYTHONUNBUFFERED": "1",
                # Defaults only: a role's own error file and log dir are kept (as TorchX does).
                "TORCHELASTIC_ERROR_FILE": str(replica_dir / "error.json"),
                "PET_LOG_DIR": str(replica_dir),
                **role_env,
                "ASUPERVISOR_APP_ID": ctx.app_id,
                "ASUPERVISOR_SESSION": ctx.session,
                "ASUPERVISOR_ROLE": role.name,
                "ASUPERVISOR_REPLICA_ID": str(k),
                "ASUPERVISOR_NUM_REPLICAS": str(role.num_replicas),
            }
            group = len(groups) + (0 if per_node is not None else len(role_replicas))
            role_replicas.append(
                SlurmReplica(
                    role=role.name,
                    replica_id=k,
                    group=group,
                    argv=(resolved.entrypoint, *resolved.args),
                    env=env,
                    log_dir=str(replica_dir),
                    path_prepend=role_path.strip(os.pathsep),
                )
            )
        if plugin == "mpirun":
            batches = [role_replicas]
            nodes = _mpirun_nodes(role)
            per_node = per_node or 1
            name = role.name
        elif per_node is not None:
            batches = [role_replicas]
            nodes = role.num_replicas // per_node
            name = role.name
        else:
            batches = [[r] for r in role_replicas]
            nodes = 1
            name = ""
        for batch in batches:
            directives = (
                f"--job-name={name or f'{role.name}-{batch[0].replica_id}'}",
                *_resource_directives(
                    role.resource, per_node, nodes, cfg, facts, nodelists[len(groups)]
                ),
            )
            log = (
                f"{app_dir}/{role.name}/launcher.log"
                if per_node is not None
                else f"{batch[0].log_dir}/launcher.log"
            )
            groups.append(
                SlurmGroup(
                    len(groups),
                    tuple(batch),
                    directives,
                    log,
                    tasks,
                    step_options=step_options,
                    in_batch=plugin == "mpirun",
                )
            )
            tasks += len(batch)
        replicas.extend(role_replicas)
    # TorchX's rule: the job may be retried as often as its least patient role allows.
    max_retries = min((r.max_retries for r in app.roles), default=0)
    if not cfg.get_bool("requeue_on_failure", True):
        max_retries = 0
    script = _script(app, cfg, ctx, groups, app_dir, workdir, max_retries)
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
        groups=tuple(groups),
        script=script,
    )


def _script(
    app: AppDef,
    cfg: ResolvedCfg,
    ctx: DryrunContext,
    groups: list[SlurmGroup],
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
        # Always requeueable, so a preempted or node-failed job goes back to the
        # queue (RUNNING -> PENDING) whatever its retries; failures are retried
        # by the script below only while retries are left.
        "--requeue",
    ]
    for key in ("time", "mail-user"):
        value = cfg.get_str(key)
        if value:
            job_level.append(f"--{key}={value}")
    events = mail_types(cfg.get_str("mail-type") or "")
    if events:
        job_level.append(f"--mail-type={','.join(events)}")
    if cfg.get_bool("hold", False):
        job_level.append("--hold")
    lines = ["#!/bin/bash", f"# asupervisor app {ctx.app_id} ({app.name}), session {ctx.session}"]
    for group in groups:
        if group.group > 0:
            lines.append("#SBATCH hetjob")
        directives = list(group.directives) + (job_level if group.group == 0 else [])
        lines.extend(f"#SBATCH {q(d)}" for d in directives)
        if group.group == 0:
            lines.extend(
                f"{DEPENDENCY_MARK}{kind}={handle}"
                for kind in DEPENDENCY_KINDS
                for handle in cfg.get_list(kind) or ()
            )
    het = len(groups) > 1
    pump = pump_path(app_dir)
    if groups[0].in_batch:
        # mpirun: on the allocation's first node, with the whole allocation's SLURM_*
        # variables; it starts its daemons on every node through srun itself.
        launch = [
            "# mpirun runs here, on the first node; it starts the ranks through Slurm itself.",
            f"{groups[0].replicas[0].command(pump)} >>{q(groups[0].launcher_log)} 2>&1",
        ]
        ended = "mpirun"
    else:
        parts = " \\\n    : ".join(g.srun_group(het, pump) for g in groups)
        launch = ["srun --kill-on-bad-exit=1 --wait=60 --open-mode=append \\", f"    {parts}"]
        ended = "srun"
    lines += [
        "",
        "export SLURM_UNBUFFEREDIO=1",
        'export ASUP_PYTHON="${ASUPERVISOR_PYTHON:-python3}"',
        'export ASUPERVISOR_ATTEMPT="${SLURM_RESTART_COUNT:-0}"',
        "# Rank 0's host: the first node of het group 0 (the whole job when not het).",
        'rank0_nodes="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"',
        'rank0=$(scontrol show hostnames "$rank0_nodes" 2>/dev/null | head -n 1)',
        f'export {RANK0_ENV}="${{rank0:-$rank0_nodes}}"',
        f'export ASUPERVISOR_RANK0_HOST="${RANK0_ENV}"',
        "",
        *launch,
        "exitcode=$?",
        f'echo "asupervisor: {ended} exited with code $exitcode"',
        f'if [ "$exitcode" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {max_retries} ]; then',
        "    # Only a run that failed by itself: one Slurm is ending (its time limit, a",
        "    # scancel) is no longer RUNNING, and a requeue that beat Slurm's kill of this",
        "    # script would run it again (a time limit is retried by a Supervisor's requeue).",
        '    if scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null \\',
        '        | grep -q "JobState=RUNNING "; then',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "    fi",
        "fi",
        'exit "$exitcode"',
        "",
    ]
    return "\n".join(lines)
