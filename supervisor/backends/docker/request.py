"""Pure rendering of an AppDef into container and network requests (the docker ``dryrun``).

Each replica becomes one container named ``{app_id}-{role}-{k}`` on the app's
own user network, so replicas find each other by name through the engine's
DNS; the first replica's name is the rank-0 host. Everything an engine needs
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

import json
from collections.abc import Mapping
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
    "RANK0_ENV",
    "ContainerSpec",
    "DockerRequest",
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
    stop_grace: float = DEFAULT_STOP_GRACE
    containers: tuple[ContainerSpec, ...] = ()

    def __str__(self) -> str:
        lines = [
            f"docker app {self.app_id} (session {self.session}) on {self.host}",
            f"  app dir: {self.app_dir}",
            f"  network: {self.network} (internal: {self.network_body.get('Internal')})",
        ]
        for c in self.containers:
            argv = [*c.body["Entrypoint"], *c.body["Cmd"]]
            lines.append(f"  {c.role}/{c.replica_id}: container {c.name} image {c.image}: {argv}")
        return "\n".join(lines)

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


def container_name(app_id: str, role: str, replica_id: int) -> str:
    return f"{app_id}-{role}-{replica_id}"


def _mounts(role: Role, replica_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(HostConfig.Mounts, HostConfig.Devices) for a role, the replica directory first."""
    mounts: list[dict[str, Any]] = [
        {"Type": "bind", "Source": str(replica_dir), "Target": CONTAINER_REPLICA_DIR}
    ]
    devices: list[dict[str, Any]] = []
    for m in role.mounts:
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


def _check_resources(app: AppDef, ctx: DryrunContext) -> None:
    """What an engine would silently ignore (Podman drops GPU requests) is refused here."""
    problems = []
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
        if res.devices:
            problems.append(
                Problem(
                    f"roles[{i}].resource.devices",
                    "named devices are not supported by backend 'docker'; use a DeviceMount",
                )
            )
    if problems:
        raise SpecError(problems, context="the docker backend cannot honour this app")


def _host_config(role: Role, replica_dir: Path, network: str) -> dict[str, Any]:
    mounts, devices = _mounts(role, replica_dir)
    host: dict[str, Any] = {
        "NetworkMode": network,
        # An init as PID 1 forwards SIGTERM to the entrypoint and reaps its children.
        "Init": True,
        "Mounts": mounts,
    }
    if devices:
        host["Devices"] = devices
    res = role.resource
    if res.memMB > 0:
        host["Memory"] = res.memMB * 1024 * 1024
    if res.cpu > 0:
        host["NanoCpus"] = res.cpu * 1_000_000_000
    if res.gpu > 0:
        host["DeviceRequests"] = [
            {"Driver": "", "Count": res.gpu, "DeviceIDs": None, "Capabilities": [["gpu"]]}
        ]
    return host


def render(
    app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext, *, host: str, default_log_dir: Path
) -> DockerRequest:
    _check_resources(app, ctx)
    # Absolute (relative to the dry run's directory): other processes read it.
    log_root = Path(ctx.cwd, cfg.get_str("log_dir") or default_log_dir)
    app_dir = log_root / ctx.session / ctx.app_id
    network = f"asupervisor-{ctx.app_id}"
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
                "Hostname": name[:63],
                "Labels": {
                    **base_labels,
                    LABEL.ROLE: role.name,
                    LABEL.REPLICA_ID: str(k),
                },
                "HostConfig": _host_config(role, replica_dir, network),
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
        network_body={
            "Name": network,
            "Driver": "bridge",
            "Internal": cfg.get_bool("internal_network", True),
            "CheckDuplicate": True,
            "Labels": dict(base_labels),
        },
        stop_grace=cfg.get_float("stop_grace", DEFAULT_STOP_GRACE),
        containers=tuple(specs),
    )
