"""Pure rendering of an AppDef into local process launches (the local ``dryrun``).

Everything a replica's process needs is decided here and frozen in the
request: argv, working directory, the environment *overlay* (applied over
the supervisor's environment at spawn time, so that the request stays a
pure function of its inputs), GPU assignment and log locations.

Environment each replica sees, beyond the role's own ``env``:

=============================  ==========================================
``ASUPERVISOR_APP_ID``         the app id
``ASUPERVISOR_SESSION``        the Supervisor's session name
``ASUPERVISOR_ROLE``           the replica's role name
``ASUPERVISOR_REPLICA_ID``     its index within the role (0-based)
``ASUPERVISOR_NUM_REPLICAS``   how many replicas the role has
``ASUPERVISOR_RANK0_HOST``     host of the app's first replica
``ASUPERVISOR_ATTEMPT``        0, then 1, 2, ... after restarts (set at spawn)
``TORCHX_RANK0_HOST``          same as ASUPERVISOR_RANK0_HOST (``${rank0_env}``)
``TORCHX_JOB_ID``              the app's handle, ``local://{session}/{app_id}``
``TORCHELASTIC_ERROR_FILE``    where the replica may write a structured error
``PET_LOG_DIR``                the replica's log directory
``PYTHONUNBUFFERED``           ``1``, so Python output reaches the logs at once
=============================  ==========================================

The last three are defaults: a value the role's ``env`` gives wins (TorchX keeps
a role's own ``TORCHELASTIC_ERROR_FILE`` too), and the error file read after a
failure is then the role's. A role's ``PATH`` is joined in front of the
inherited ``PATH`` (by TorchX's ``join_PATH`` rules) where TorchX replaces it,
so ``sh`` and ``python`` still resolve (docs/torchx.md lists it).

Working directory and image, as TorchX's local schedulers: a role whose
``image`` looks like a path (starts with ``/`` or ``.``, or contains ``/``) and
names an existing directory runs *in* that directory (``local_dir``): ``cwd``
and ``${img_root}`` are the directory, so a relative entrypoint is found there.
Any other image is ignored (``local_cwd``): ``cwd`` and ``${img_root}`` are the
dry run's working directory. The working directory is then appended to
``PATH`` (binaries on ``PATH`` win), or put first with ``prepend_cwd``; a
replica whose inherited environment has no ``PATH`` gets ``PATH={cwd}``.

What the overlay is applied over is the run option ``env_policy``:

* ``inherit`` (the default, as TorchX): the supervising process's whole
  environment;
* ``clean``: nothing; the replica sees the variables above, its role's
  ``env`` and ``PATH=/bin:/usr/bin`` (``os.defpath``; the role's ``PATH`` and
  ``prepend_cwd`` still go in front), so a secret of the service never
  reaches it;
* ``allow``: only the supervising process's variables whose names match one
  of ``env_allow`` (exact names or shell globs, e.g. ``HOME;LANG;LC_*``);
  ``PATH`` is the inherited one if allowed, else ``/bin:/usr/bin``.

A relative ``log_dir`` is taken relative to the working directory of the dry
run and stored absolute, so another process (the CLI elsewhere) finds the app.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from supervisor.backends.base import DryrunContext, Request
from supervisor.errors import Problem, SpecError
from supervisor.runopts import (
    DEFAULT_STOP_GRACE,
    OptType,
    ResolvedCfg,
    RunOpt,
    RunOpts,
    stop_grace_opt,
)
from supervisor.specs import PROCS_PER_NODE, AppDef, AppHandle, Role, macros

__all__ = [
    "CLEAN_PATH",
    "DEFAULT_MAX_REPLICAS",
    "ENV_POLICIES",
    "JOB_ID_ENV",
    "RANK0_ENV",
    "LocalRequest",
    "ReplicaLaunch",
    "is_path_like",
    "join_path",
    "local_run_opts",
    "render",
    "replica_base_env",
]

RANK0_ENV = "TORCHX_RANK0_HOST"
#: TorchX's variable for the handle of the app a replica belongs to.
JOB_ID_ENV = "TORCHX_JOB_ID"
#: Replicas one role may ask for unless ``cfg max_replicas_per_role`` says more: each is
#: a process on this machine, and a typo like ``10**6`` would otherwise spend a minute
#: and most of a GiB rendering the dry run alone.
DEFAULT_MAX_REPLICAS = 1024
#: What a replica starts from besides its overlay (see the module docstring).
ENV_POLICIES = ("inherit", "clean", "allow")
#: The ``PATH`` of a replica whose policy does not pass the inherited one.
CLEAN_PATH = os.defpath
# A variable name, or a shell glob over names: letters, digits, '_' and * ? [ ] !.
_ENV_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!]+")


@functools.cache  # immutable, and asked for by every dryrun
def local_run_opts() -> RunOpts:
    return RunOpts(
        [
            RunOpt(
                name="log_dir",
                type=OptType.STR,
                default=None,
                help="directory for logs and state; apps go to {log_dir}/{session}/{app_id} "
                "(default: <state dir>/logs)",
            ),
            RunOpt(
                name="prepend_cwd",
                type=OptType.BOOL,
                default=False,
                help="put the working directory first on each replica's PATH (else it goes last)",
            ),
            RunOpt(
                name="auto_set_cuda_visible_devices",
                type=OptType.BOOL,
                default=False,
                help="give each replica asking for GPUs its own contiguous block of devices "
                "through CUDA_VISIBLE_DEVICES, when enough exist; replicas sharing a node "
                "(ddp's rank mode) share its block, which their LOCAL_RANK indexes",
            ),
            stop_grace_opt(),
            RunOpt(
                name="env_policy",
                type=OptType.STR,
                default="inherit",
                help="what each replica's environment starts from: inherit (all of this "
                "process's variables), clean (none; PATH=/bin:/usr/bin) or allow (only "
                "those env_allow names)",
                choices=ENV_POLICIES,
            ),
            RunOpt(
                name="env_allow",
                type=OptType.LIST,
                default=None,
                help="with env_policy=allow: the variables passed on, by name or shell "
                "glob (e.g. HOME;LANG;LC_*)",
            ),
            RunOpt(
                name="max_replicas_per_role",
                type=OptType.INT,
                default=DEFAULT_MAX_REPLICAS,
                help="the most replicas one role may have; raise it to run more processes",
                minimum=1,
            ),
        ]
    )


def env_cfg_problems(cfg: ResolvedCfg) -> list[Problem]:
    """The problems of ``env_policy`` and ``env_allow``. Each pattern is judged whenever
    it was given: it is ``env_allow``'s own rule, so a bad ``env_policy`` beside it (or one
    it does not go with) hides none of them. How the two go together is judged only once
    both resolved (``cfg.unresolved``); nothing is judged on an unresolved ``env_allow``."""
    if "env_allow" in cfg.unresolved:
        return []
    allow = cfg.get_list("env_allow")
    problems: list[Problem] = []
    if "env_policy" not in cfg.unresolved:
        policy = cfg.get_str("env_policy", "inherit")
        if allow is not None and policy != "allow":
            problems.append(
                Problem("cfg.env_allow", f"only used with env_policy=allow (it is {policy})")
            )
        if policy == "allow" and not allow:
            problems.append(
                Problem(
                    "cfg.env_allow",
                    "env_policy=allow needs the names to pass (e.g. HOME;LANG;LC_*); "
                    "for none at all use env_policy=clean",
                )
            )
    for i, pattern in enumerate(allow or ()):
        if not _ENV_PATTERN.fullmatch(pattern):
            problems.append(
                Problem(
                    f"cfg.env_allow[{i}]",
                    f"{pattern!r} is not a variable name or a glob over names "
                    "(letters, digits, '_', and * ? [ ] !)",
                )
            )
    return problems


def check_env_cfg(cfg: ResolvedCfg) -> tuple[str, tuple[str, ...]]:
    """The policy and allow-list of ``cfg``; SpecError naming the field when they do not fit."""
    problems = env_cfg_problems(cfg)
    if problems:
        raise SpecError(problems, context="invalid run options")
    return cfg.get_str("env_policy", "inherit"), tuple(cfg.get_list("env_allow") or ())


def replica_base_env(
    policy: str, allow: Sequence[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """What a replica's environment starts from, before its overlay, under ``policy``.

    ``environ`` is the supervising process's environment (passed in, so this
    stays pure). Names match case-sensitively, as the kernel compares them.
    """
    if policy == "inherit":
        return dict(environ)
    if policy == "allow":
        base = {k: v for k, v in environ.items() if any(fnmatchcase(k, p) for p in allow)}
    else:
        base = {}
    base.setdefault("PATH", CLEAN_PATH)
    return base


def join_path(*parts: str | None) -> str:
    """``PATH`` pieces joined with ``:``, empty pieces and stray separators dropped."""
    pieces = (part.strip(os.pathsep) for part in parts if part)
    return os.pathsep.join(piece for piece in pieces if piece)


def is_path_like(image: str) -> bool:
    """Whether a role's image reads as a directory path rather than an image name.

    Only such an image is looked up as a directory (``local_dir``): ``python:3.12``
    or ``busybox`` never are, even when a directory of that name happens to exist.
    """
    return image.startswith(("/", ".")) or os.sep in image


@dataclass(frozen=True)
class ReplicaLaunch:
    role: str
    replica_id: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    log_dir: str
    path_prepend: str | None = None
    path_append: str | None = None

    @property
    def error_file(self) -> str:
        """The file a failed replica's structured error is read from (the role's own, if set)."""
        chosen = self.env.get("TORCHELASTIC_ERROR_FILE") or str(Path(self.log_dir) / "error.json")
        return os.path.join(self.cwd, chosen)

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        path = ""
        if self.path_prepend or self.path_append:
            front = f"{shlex.quote(self.path_prepend)}:" if self.path_prepend else ""
            back = f":{shlex.quote(self.path_append)}" if self.path_append else ""
            path = f"PATH={front}$PATH{back} "
        return f"cd {shlex.quote(self.cwd)} && {path}{env} {shlex.join(self.argv)}"

    def spawn_path(self, inherited: str | None) -> str | None:
        """The replica's ``PATH`` given the one its base environment has (None: no PATH)."""
        return join_path(self.path_prepend, inherited, self.path_append) or None

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "replica_id": self.replica_id,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "log_dir": self.log_dir,
            "path_prepend": self.path_prepend,
            "path_append": self.path_append,
        }


@dataclass(frozen=True)
class LocalRequest(Request):
    app_dir: str = ""
    stop_grace: float = DEFAULT_STOP_GRACE
    replicas: tuple[ReplicaLaunch, ...] = field(default_factory=tuple)
    env_policy: str = "inherit"
    env_allow: tuple[str, ...] = ()

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What every replica's environment starts from (``environ``: this process's)."""
        return replica_base_env(self.env_policy, self.env_allow, environ)

    def __str__(self) -> str:
        lines = [
            f"local app {self.app_id} (session {self.session})",
            f"  app dir: {self.app_dir}",
        ]
        if self.env_policy == "clean":
            lines.append(f"  environment: only what is shown below, PATH={CLEAN_PATH}")
        elif self.env_policy == "allow":
            lines.append(
                f"  environment: only {';'.join(self.env_allow)} of this process's, "
                "and what is shown below"
            )
        for r in self.replicas:
            lines.append(f"  {r.role}/{r.replica_id}: {r.command_line()}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "app_dir": self.app_dir,
            "stop_grace": self.stop_grace,
            "replicas": [r.to_json() for r in self.replicas],
            "env_policy": self.env_policy,
            "env_allow": list(self.env_allow),
        }


def _node_size(role: Role) -> int:
    """How many consecutive replicas of ``role`` share a node (``PROCS_PER_NODE``), else 1."""
    value = role.metadata.get(PROCS_PER_NODE)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _gpu_blocks(app: AppDef, gpu_count: int) -> dict[tuple[str, int], str]:
    """Contiguous device blocks, in role order, only when every request fits.

    Replicas that share a node (``PROCS_PER_NODE``: ddp's rank mode) share the node's
    block, the sum of their requests, as torchrun's workers see every device of their
    node: their LOCAL_RANK indexes it (``torch.cuda.set_device(LOCAL_RANK)``), which a
    block of one device each left out of range from local rank 1 on.
    """
    wanted: list[tuple[list[tuple[str, int]], int]] = []
    for role in app.roles:
        if role.resource.gpu <= 0:
            continue
        size = _node_size(role)
        for first in range(0, role.num_replicas, size):
            keys = [(role.name, k) for k in range(first, min(first + size, role.num_replicas))]
            wanted.append((keys, role.resource.gpu * len(keys)))
    if not wanted or sum(g for _, g in wanted) > gpu_count:
        return {}
    blocks: dict[tuple[str, int], str] = {}
    nxt = 0
    for keys, g in wanted:
        block = ",".join(str(d) for d in range(nxt, nxt + g))
        blocks.update((key, block) for key in keys)
        nxt += g
    return blocks


def render(
    app: AppDef,
    cfg: ResolvedCfg,
    ctx: DryrunContext,
    default_log_dir: Path,
    image_dirs: Mapping[str, str] | None = None,
) -> LocalRequest:
    """The local request for ``app``.

    ``image_dirs`` maps each role image that is a directory (see ``is_path_like``)
    to its absolute path; the caller looks them up, so this stays pure.
    """
    image_dirs = image_dirs or {}
    env_policy, env_allow = check_env_cfg(cfg)
    # Absolute, so the records point at the same place from any directory.
    log_root = Path(os.path.normpath(Path(ctx.cwd, cfg.get_str("log_dir") or default_log_dir)))
    app_dir = log_root / ctx.session / ctx.app_id
    app_dir_text = str(app_dir)
    prepend_cwd = cfg.get_bool("prepend_cwd", False)
    auto_gpus = cfg.get_bool("auto_set_cuda_visible_devices", False)
    gpus = _gpu_blocks(app, ctx.gpu_count) if auto_gpus else {}
    job_id = str(AppHandle(ctx.backend or "local", ctx.session, ctx.app_id))
    launches = []
    for role in app.roles:
        # local_dir when the image is a directory, else local_cwd (the image is ignored).
        workdir = image_dirs.get(role.image, ctx.cwd)
        for k in range(role.num_replicas):
            values = macros.Values(
                img_root=workdir,
                app_id=ctx.app_id,
                replica_id=str(k),
                rank0_env=RANK0_ENV,
            )
            resolved = values.apply(role)
            # Joined as strings: pathlib's joins were a fifth of a big app's dry run.
            replica_dir = os.path.join(app_dir_text, role.name, str(k))
            role_env = dict(resolved.env)
            role_path = role_env.pop("PATH", None)
            env: dict[str, str] = {
                "PYTHONUNBUFFERED": "1",
                "TORCHELASTIC_ERROR_FILE": os.path.join(replica_dir, "error.json"),
                "PET_LOG_DIR": replica_dir,
                **role_env,
            }
            env.update(
                {
                    "ASUPERVISOR_APP_ID": ctx.app_id,
                    "ASUPERVISOR_SESSION": ctx.session,
                    "ASUPERVISOR_ROLE": role.name,
                    "ASUPERVISOR_REPLICA_ID": str(k),
                    "ASUPERVISOR_NUM_REPLICAS": str(role.num_replicas),
                    "ASUPERVISOR_RANK0_HOST": "localhost",
                    RANK0_ENV: "localhost",
                    JOB_ID_ENV: job_id,
                }
            )
            path_prepend = join_path(workdir if prepend_cwd else None, role_path)
            if (role.name, k) in gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[(role.name, k)]
            launches.append(
                ReplicaLaunch(
                    role=role.name,
                    replica_id=k,
                    argv=(resolved.entrypoint, *resolved.args),
                    env=env,
                    cwd=workdir,
                    log_dir=replica_dir,
                    path_prepend=path_prepend or None,
                    path_append=None if prepend_cwd else workdir,
                )
            )
    return LocalRequest(
        backend="local",
        session=ctx.session,
        app_id=ctx.app_id,
        app=app,
        cfg=cfg,
        app_dir=str(app_dir),
        stop_grace=cfg.get_float("stop_grace", DEFAULT_STOP_GRACE),
        replicas=tuple(launches),
        env_policy=env_policy,
        env_allow=env_allow,
    )
