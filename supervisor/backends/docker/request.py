"""Pure rendering of an AppDef into container and network requests (the docker ``dryrun``).

Each replica becomes one container named ``{app_id}-{role}-{k}`` on the app's
own user network (or on an existing one it joins, the ``network`` option), so
replicas find each other by name through the engine's DNS; the first
replica's name is the rank-0 host. A name must be a DNS label to be resolved
(at most 63 letters, digits and ``-``): a longer one, or one with other
characters, is cut and ends in a hash of the full name (``container_name``),
the one function every name a replica resolves comes from. Everything an engine needs
is decided here and frozen in the request, in the Engine API's own JSON
shape, except what changes per attempt (the attempt label and
``ASUPERVISOR_ATTEMPT``), which ``ContainerSpec.config`` adds.

Labels carry the session, app, role, replica and attempt, so any process
can find an app's containers on the engine, and the app directory, so it can
find the app's records and logs.

The replica's host log directory is bind-mounted at ``/asupervisor/replica``:
``error.json`` written there (``TORCHELASTIC_ERROR_FILE``) is read back by the
backend when the replica fails.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.backends.base import DryrunContext, Request
from supervisor.backends.docker.options import DEFAULT_STOP_GRACE
from supervisor.errors import Problem, SpecError
from supervisor.runopts import ResolvedCfg
from supervisor.specs import AppDef, BindMount, DeviceMount, Role, VolumeMount, macros

__all__ = [
    "CONTAINER_REPLICA_DIR",
    "LABEL",
    "NAMED_DEVICES",
    "RANK0_ENV",
    "ContainerSpec",
    "DockerRequest",
    "check_docker_app",
    "check_docker_cfg",
    "container_name",
    "render",
]

RANK0_ENV = "TORCHX_RANK0_HOST"
CONTAINER_REPLICA_DIR = "/asupervisor/replica"


class LABEL:
    """Label keys set on every container and network this backend creates."""

    PREFIX = "io.asupervisor."
    SESSION = PREFIX + "session"
    APP_ID = PREFIX + "app_id"
    ROLE = PREFIX + "role"
    REPLICA_ID = PREFIX + "replica_id"
    ATTEMPT = PREFIX + "attempt"
    APP_DIR = PREFIX + "app_dir"


@dataclass(frozen=True)
class ContainerSpec:
    """One replica's container, less what each attempt adds."""

    role: str
    replica_id: int
    name: str
    image: str
    log_dir: str
    body: Mapping[str, Any]  # POST /containers/create body, without the attempt

    def config(self, attempt: int) -> dict[str, Any]:
        """The create body for ``attempt``: a deep copy, so the request stays frozen."""
        body: dict[str, Any] = json.loads(json.dumps(self.body))
        body["Env"] = [*body["Env"], f"ASUPERVISOR_ATTEMPT={attempt}"]
        body["Labels"] = {**body["Labels"], LABEL.ATTEMPT: str(attempt)}
        return body

    @property
    def error_file(self) -> str:
        """Where, on this host, the replica's structured error is read back.

        The role may name its own TORCHELASTIC_ERROR_FILE (kept, as TorchX
        does); only a file under the replica's mounted directory can be read
        from outside the container, so any other choice reads as no file.
        """
        env = dict(item.partition("=")[::2] for item in self.body.get("Env", ()))
        chosen = env.get("TORCHELASTIC_ERROR_FILE", "")
        inside = chosen.removeprefix(CONTAINER_REPLICA_DIR + "/")
        if chosen and inside == chosen:
            inside = ".asupervisor-unreadable-error-file"  # outside the mount
        return str(Path(self.log_dir) / (inside or "error.json"))

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "replica_id": self.replica_id,
            "name": self.name,
            "image": self.image,
            "log_dir": self.log_dir,
            "body": self.body,
        }


@dataclass(frozen=True)
class DockerRequest(Request):
    host: str = ""
    app_dir: str = ""
    network: str = ""
    network_body: Mapping[str, Any] = field(default_factory=dict)
    """The create body of the app's own network; empty when it joins an existing one."""
    stop_grace: float = DEFAULT_STOP_GRACE
    containers: tuple[ContainerSpec, ...] = ()

    def __str__(self) -> str:
        lines = [
            f"docker app {self.app_id} (session {self.session}) on {self.host}",
            f"  app dir: {self.app_dir}",
            f"  network: {self.network} (internal: {self.network_body.get('Internal')})"
            if self.owns_network
            else f"  network: {self.network} (joined: neither created nor removed)",
        ]
        for c in self.containers:
            argv = [*c.body["Entrypoint"], *c.body["Cmd"]]
            lines.append(f"  {c.role}/{c.replica_id}: container {c.name} image {c.image}: {argv}")
        return "\n".join(lines)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], app: AppDef) -> DockerRequest:
        """The request an app's record holds (``to_json``): to follow the app again.

        Raises ``LookupError``, ``TypeError`` or ``ValueError`` for a record that is not one.
        """
        return cls(
            **Request.fields_from_json(d, app),
            host=str(d["host"]),
            app_dir=str(d["app_dir"]),
            network=str(d["network"]),
            network_body=dict(d.get("network_body") or {}),
            stop_grace=float(d["stop_grace"]),
            containers=tuple(
                ContainerSpec(
                    role=str(c["role"]),
                    replica_id=int(c["replica_id"]),
                    name=str(c["name"]),
                    image=str(c["image"]),
                    log_dir=str(c["log_dir"]),
                    body=dict(c["body"]),
                )
                for c in d["containers"]
            ),
        )

    @property
    def owns_network(self) -> bool:
        """The network is the app's own: created at launch, removed at its end."""
        return bool(self.network_body)

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "host": self.host,
            "app_dir": self.app_dir,
            "network": self.network,
            "network_body": dict(self.network_body),
            "stop_grace": self.stop_grace,
            "containers": [c.to_json() for c in self.containers],
        }


DNS_LABEL_MAX = 63
_DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?")
_NOT_DNS = re.compile(r"[^A-Za-z0-9-]+")


_NETWORK_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_NOT_NETWORK = re.compile(r"[^A-Za-z0-9_.-]+")


def network_name(app_id: str) -> str:
    """``asupervisor-{app_id}``, or, for an app id an engine would refuse in a network's
    name (``[A-Za-z0-9][A-Za-z0-9_.-]*``: an explicit id may hold a space or a ':'), the
    same with those characters as ``-`` and the hash of the id, so names stay unique."""
    if _NETWORK_NAME.fullmatch(app_id):
        return f"asupervisor-{app_id}"
    digest = hashlib.sha256(app_id.encode()).hexdigest()[:8]
    return f"asupervisor-{_NOT_NETWORK.sub('-', app_id)}-{digest}"


def container_name(app_id: str, role: str, replica_id: int) -> str:
    """``{app_id}-{role}-{k}``, or, when that is not a DNS label, a label made from it.

    Engines resolve a peer's name only when it is one DNS label (RFC 1035: at
    most 63 letters, digits and inner ``-``). Any other name is cut, its other
    characters become ``-``, and it ends in ``-{hash}-{k}``, the hash of the
    full name: names stay unique and show the replica. Every name a replica
    resolves (its peers, rank 0) comes from here.
    """
    full = f"{app_id}-{role}-{replica_id}"
    if len(full) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = f"-{digest}-{replica_id}"
    head = _NOT_DNS.sub("-", f"{app_id}-{role}").strip("-")
    head = head[: DNS_LABEL_MAX - len(tail)].rstrip("-")
    return f"{head}{tail}" if head else tail.lstrip("-")


def _uverbs(count: int) -> list[DeviceMount]:
    return [
        DeviceMount(f"/dev/infiniband/uverbs{i}", f"/dev/infiniband/uverbs{i}")
        for i in range(count)
    ]


def _neuron(count: int) -> list[DeviceMount]:
    return [DeviceMount(f"/dev/neuron{i}", f"/dev/neuron{i}") for i in range(count)]


#: ``Resource.devices`` names this backend maps to host devices, as TorchX's docker
#: scheduler does: n EFA adapters are the host's first n uverbs devices, n Neuron
#: devices its first n /dev/neuron devices, each passed through with rwm.
NAMED_DEVICES: Mapping[str, Callable[[int], list[DeviceMount]]] = {
    "vpc.amazonaws.com/efa": _uverbs,
    "aws.amazon.com/neurondevice": _neuron,
}


def _mounts(role: Role, replica_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(HostConfig.Mounts, HostConfig.Devices) for a role, the replica directory first."""
    mounts: list[dict[str, Any]] = [
        {"Type": "bind", "Source": str(replica_dir), "Target": CONTAINER_REPLICA_DIR}
    ]
    devices: list[dict[str, Any]] = []
    named = [m for name, n in role.resource.devices.items() for m in NAMED_DEVICES[name](n)]
    for m in [*role.mounts, *named]:
        if isinstance(m, BindMount):
            bind = {"Type": "bind", "Source": m.src_path, "Target": m.dst_path}
            mounts.append({**bind, "ReadOnly": m.read_only})
        elif isinstance(m, VolumeMount):
            mounts.append(
                {"Type": "volume", "Source": m.src, "Target": m.dst_path, "ReadOnly": m.read_only}
            )
        elif isinstance(m, DeviceMount):
            devices.append(
                {
                    "PathOnHost": m.src_path,
                    "PathInContainer": m.dst_path,
                    "CgroupPermissions": m.permissions,
                }
            )
    return mounts, devices


_ENGINE_SCHEME = re.compile(r"(unix|tcp|http|https|ssh|npipe)://.")
"""The addresses the engine client (aiodocker) takes."""
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
"""The volume names dockerd takes (Podman takes them too)."""


def _missing_sources(app: AppDef) -> list[Problem]:
    """Bind and device sources that do not exist, for an engine on this machine (a unix
    socket): one ``stat`` per such mount, before anything is made.

    Podman creates a missing bind source (empty, owned by root) and runs the
    container on it, and refuses a missing device at the submit; dockerd refuses
    the bind's container, and starts none for the device (a made-up exit 127). A
    mistyped path must fail the same way on both.
    """
    return [
        Problem(
            f"roles[{i}].mounts[{j}].src_path",
            f"{m.src_path!r} does not exist on this machine "
            + (
                "(Podman would create it empty, dockerd refuses it)"
                if isinstance(m, BindMount)
                else "(no engine can give the container that device)"
            ),
        )
        for i, role in enumerate(app.roles)
        for j, m in enumerate(role.mounts)
        if isinstance(m, BindMount | DeviceMount) and not os.path.exists(m.src_path)
    ]


def _volume_names(app: AppDef) -> list[Problem]:
    """Volume names both engines take (refused at the container's create otherwise, as a
    submit's failure naming no mount)."""
    return [
        Problem(
            f"roles[{i}].mounts[{j}].src",
            f"{m.src!r} is not a volume name (a letter or digit, then at least one of "
            "letters, digits, '_', '.', '-')",
        )
        for i, role in enumerate(app.roles)
        for j, m in enumerate(role.mounts)
        if isinstance(m, VolumeMount) and not _VOLUME_NAME.fullmatch(m.src)
    ]


def check_docker_cfg(cfg: ResolvedCfg, host: str) -> list[Problem]:
    """The problems of the run options alone (``DockerBackend.check_cfg``): the engine's
    address and the ``env`` option; ``host`` is the address they resolve to."""
    return _cfg_env(cfg, host)[1]


def _cfg_env(cfg: ResolvedCfg, host: str) -> tuple[dict[str, str], list[Problem]]:
    """The ``env`` option's variables, and the problems of the run options alone."""
    problems = []
    if not _ENGINE_SCHEME.match(host):
        # The client refuses it only when it is first used, in the engine's event
        # follower: a submit's failure then, not a dry run's.
        where = "" if cfg.get_str("host") else " (from $DOCKER_HOST)"
        problems.append(
            Problem(
                "cfg.host",
                f"{host!r}{where} names no engine: use unix:///path.sock, tcp://host:port, "
                "http(s)://host:port or ssh://user@host",
            )
        )
    env: dict[str, str] = {}
    for i, item in enumerate(cfg.get_list("env", ())):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            problems.append(
                Problem(f"cfg.env[{i}]", f"expected NAME=VALUE (e.g. A=1;B=2), got {item!r}")
            )
        else:
            env[name.strip()] = value
    return env, problems


def check_docker_app(app: AppDef, cfg: ResolvedCfg, host: str) -> list[Problem]:
    """What an engine would refuse of the app, or silently not honour, known without
    asking one (``DockerBackend.check_app``; ``render`` refuses the same): volume names,
    named devices, and the sources of bind and device mounts on an engine on this
    machine. ``host``: the address ``cfg`` resolves to (not judged when ``cfg.host``
    did not resolve)."""
    problems = _volume_names(app)
    if host.startswith("unix://") and "host" not in cfg.unresolved:
        problems += _missing_sources(app)
    for i, role in enumerate(app.roles):
        unknown = sorted(name for name in role.resource.devices if name not in NAMED_DEVICES)
        if unknown:
            problems.append(
                Problem(
                    f"roles[{i}].resource.devices",
                    f"backend 'docker' maps only {', '.join(sorted(NAMED_DEVICES))} to host "
                    f"devices, not {', '.join(map(repr, unknown))}; use a DeviceMount",
                )
            )
    return problems


def _check(app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext, host: str) -> dict[str, str]:
    """What an engine would silently ignore (Podman drops GPU requests) is refused here,
    with what the ``env`` option does not say right, an engine address no client can
    reach and what ``check_docker_app`` finds; returns that option's variables."""
    env, problems = _cfg_env(cfg, host)
    problems += check_docker_app(app, cfg, host)
    # The machine's GPUs are the dry run's context (``DryrunContext.gpu_count``), which
    # ``check_app`` is not given: this rule is made here only.
    for i, role in enumerate(app.roles):
        res = role.resource
        if res.gpu > 0 and res.gpu > ctx.gpu_count:
            problems.append(
                Problem(
                    f"roles[{i}].resource.gpu",
                    f"asks for {res.gpu} GPU(s) per replica but this machine has "
                    f"{ctx.gpu_count}; some engines would run it without any",
                )
            )
    if problems:
        raise SpecError(problems, context="the docker backend cannot honour this app")
    return env


def _host_config(role: Role, replica_dir: Path, network: str, privileged: bool) -> dict[str, Any]:
    mounts, devices = _mounts(role, replica_dir)
    host: dict[str, Any] = {
        "NetworkMode": network,
        # An init as PID 1 forwards SIGTERM to the entrypoint and reaps its children.
        "Init": True,
        "Mounts": mounts,
    }
    if devices:
        host["Devices"] = devices
    if privileged:
        host["Privileged"] = True
    res = role.resource
    if res.memMB > 0:
        host["Memory"] = res.memMB * 1024 * 1024
        # /dev/shm as large as the memory (as TorchX): the engines' 64 MB default
        # breaks the data loaders and NCCL of a training job.
        host["ShmSize"] = res.memMB * 1024 * 1024
    if res.cpu > 0:
        host["NanoCpus"] = res.cpu * 1_000_000_000
    if res.gpu > 0:
        host["DeviceRequests"] = [
            # The capabilities TorchX asks for: the NVIDIA runtime mounts the CUDA
            # libraries (compute) and nvidia-smi (utility) for them.
            {
                "Driver": "",
                "Count": res.gpu,
                "DeviceIDs": None,
                "Capabilities": [["compute", "utility"]],
            }
        ]
    return host


def render(
    app: AppDef,
    cfg: ResolvedCfg,
    ctx: DryrunContext,
    *,
    host: str,
    default_log_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> DockerRequest:
    """``environ``: the submitting process's variables, where ``copy_env`` copies from."""
    cfg_env = _check(app, cfg, ctx, host)
    copied = {
        name: value
        for name, value in sorted((environ or {}).items())
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in cfg.get_list("copy_env", ()))
    }
    joined = cfg.get_str("network")
    privileged = cfg.get_bool("privileged", False)
    # Absolute (relative to the dry run's directory): other processes read it.
    log_root = Path(ctx.cwd, cfg.get_str("log_dir") or default_log_dir)
    app_dir = log_root / ctx.session / ctx.app_id
    network = joined or network_name(ctx.app_id)
    base_labels = {
        LABEL.SESSION: ctx.session,
        LABEL.APP_ID: ctx.app_id,
        LABEL.APP_DIR: str(app_dir),
    }
    first = app.roles[0]
    rank0 = container_name(ctx.app_id, first.name, 0)
    specs = []
    for role in app.roles:
        for k in range(role.num_replicas):
            resolved = macros.Values(
                img_root="", app_id=ctx.app_id, replica_id=str(k), rank0_env=RANK0_ENV
            ).apply(role)
            name = container_name(ctx.app_id, role.name, k)
            replica_dir = app_dir / role.name / str(k)
            env = {
                "PYTHONUNBUFFERED": "1",
                # Defaults only: a role's own error file and log dir are kept (as TorchX does).
                "TORCHELASTIC_ERROR_FILE": f"{CONTAINER_REPLICA_DIR}/error.json",
                "PET_LOG_DIR": CONTAINER_REPLICA_DIR,
                # As TorchX: copy_env, then the env option over it, then the role's env.
                **copied,
                **cfg_env,
                **resolved.env,
                "ASUPERVISOR_APP_ID": ctx.app_id,
                "ASUPERVISOR_SESSION": ctx.session,
                "ASUPERVISOR_ROLE": role.name,
                "ASUPERVISOR_REPLICA_ID": str(k),
                "ASUPERVISOR_NUM_REPLICAS": str(role.num_replicas),
                "ASUPERVISOR_RANK0_HOST": rank0,
                RANK0_ENV: rank0,
            }
            body = {
                "Image": role.image,
                "Entrypoint": [resolved.entrypoint],
                "Cmd": list(resolved.args),
                "Env": [f"{k_}={v}" for k_, v in env.items()],
                "Hostname": name,
                "Labels": {
                    **base_labels,
                    LABEL.ROLE: role.name,
                    LABEL.REPLICA_ID: str(k),
                },
                "HostConfig": _host_config(role, replica_dir, network, privileged),
                "NetworkingConfig": {"EndpointsConfig": {network: {"Aliases": [name]}}},
            }
            specs.append(
                ContainerSpec(
                    role=role.name,
                    replica_id=k,
                    name=name,
                    image=role.image,
                    log_dir=str(replica_dir),
                    body=body,
                )
            )
    return DockerRequest(
        backend="docker",
        session=ctx.session,
        app_id=ctx.app_id,
        app=app,
        cfg=cfg,
        host=host,
        app_dir=str(app_dir),
        network=network,
        network_body={}
        if joined
        else {
            "Name": network,
            "Driver": "bridge",
            "Internal": cfg.get_bool("internal_network", True),
            "CheckDuplicate": True,
            "Labels": dict(base_labels),
        },
        stop_grace=cfg.get_float("stop_grace", DEFAULT_STOP_GRACE),
        containers=tuple(specs),
    )
