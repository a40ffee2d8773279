"""The data model: what an app is, independent of where it runs.

Names and meanings follow TorchX's ``specs`` (AppDef, Role, Resource,
RetryPolicy, macros, mounts) so its users can port code by changing an import.
Unlike TorchX these objects are frozen: ``dryrun`` and ``schedule`` can share
them without copying, and a caller's AppDef is never mutated behind its back.
Containers passed in as lists and dicts are stored as tuples and read-only
mappings. Nothing here does I/O or looks at the environment.

Constructors accept anything and never raise; ``validate`` is what reports
problems, all at once and with field paths.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from supervisor.errors import InvalidHandleError

__all__ = [
    "MPI",
    "MPI_NODES",
    "MPI_PLUGINS",
    "NULL_RESOURCE",
    "PROCS_PER_NODE",
    "AppDef",
    "AppHandle",
    "BindMount",
    "DeviceMount",
    "Mount",
    "Resource",
    "RetryPolicy",
    "Role",
    "VolumeMount",
    "macros",
    "make_app_id",
    "make_handle",
    "parse_handle",
]


def _frozen_seq(value: Any) -> Any:
    """Store lists as tuples; leave anything else for validation to judge."""
    if isinstance(value, list | tuple):
        return tuple(value)
    return value


def _frozen_map(value: Any) -> Any:
    """Store dicts as read-only copies; leave anything else for validation."""
    if isinstance(value, Mapping):
        return MappingProxyType(dict(value))
    return value


class RetryPolicy(str, enum.Enum):
    """What is restarted when a replica fails and its role has retries left."""

    REPLICA = "REPLICA"  # only the failed replica
    ROLE = "ROLE"  # every unfinished replica of the failed replica's role
    APPLICATION = "APPLICATION"  # every unfinished replica of the app

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Resource:
    """Per-replica request. ``-1`` everywhere means "unset" (TorchX's NULL_RESOURCE).

    ``cpu=0`` and ``memMB=0`` are accepted as TorchX accepts them: no request
    (no limit), as ``-1``.
    """

    cpu: int = -1
    gpu: int = -1
    memMB: int = -1
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    devices: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "capabilities", _frozen_map(self.capabilities))
        object.__setattr__(self, "devices", _frozen_map(self.devices))

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """A copy of ``original`` with ``capabilities`` merged over its own (TorchX's).

        Called as ``Resource.copy(res, key=value)``; ``original`` is not changed.
        """
        return dataclasses.replace(original, capabilities={**original.capabilities, **capabilities})


NULL_RESOURCE = Resource()

PROCS_PER_NODE = "asupervisor/procs_per_node"
"""Role metadata: this many consecutive replicas share a node (the Slurm backend makes
the role one het group). Declared here, with the data model, because components set
it and backends read it, and neither may import the other."""
MPI = "asupervisor/mpi"
"""Role metadata: how the role's replicas start as MPI ranks (one of :data:`MPI_PLUGINS`;
the ``mpi`` component sets it, the Slurm backend renders it)."""
MPI_PLUGINS = ("pmix", "pmi2", "mpirun")
MPI_NODES = "asupervisor/mpi_nodes"
"""Role metadata (``mpirun``): the nodes to allocate; with PROCS_PER_NODE, tasks on each."""


@dataclass(frozen=True)
class BindMount:
    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass(frozen=True)
class VolumeMount:
    src: str
    dst_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceMount:
    src_path: str
    dst_path: str
    permissions: str = "rwm"


Mount = BindMount | VolumeMount | DeviceMount


@dataclass(frozen=True)
class Role:
    """A set of identical replicas running one entrypoint."""

    name: str
    image: str = ""
    entrypoint: str = ""
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = NULL_RESOURCE
    port_map: Mapping[str, int] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", _frozen_seq(self.args))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "port_map", _frozen_map(self.port_map))
        object.__setattr__(self, "metadata", _frozen_map(self.metadata))
        object.__setattr__(self, "mounts", _frozen_seq(self.mounts))

    def with_env(self, env: Mapping[str, str]) -> Role:
        """A copy with ``env`` merged over this role's (TorchX code does ``role.env.update``)."""
        return dataclasses.replace(self, env={**self.env, **env})


@dataclass(frozen=True)
class AppDef:
    """An application: named roles, launched and supervised together."""

    name: str
    roles: Sequence[Role] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", _frozen_seq(self.roles))
        object.__setattr__(self, "metadata", _frozen_map(self.metadata))

    def replace_role(self, name: str, **changes: Any) -> AppDef:
        """A copy whose role ``name`` has ``changes`` (any Role field) applied.

        The frozen counterpart of TorchX's ``app.roles[i].num_replicas = 4``;
        ValueError when no role has that name.
        """
        if name not in {r.name for r in self.roles}:
            known = ", ".join(repr(r.name) for r in self.roles) or "none"
            raise ValueError(f"no role named {name!r} (roles: {known})")
        fields = [f.name for f in dataclasses.fields(Role)]
        unknown = [key for key in changes if key not in fields]
        if unknown:  # (a bare TypeError from the constructor, before)
            raise ValueError(
                f"Role has no field {', '.join(map(repr, unknown))} (fields: {', '.join(fields)})"
            )
        roles = [dataclasses.replace(r, **changes) if r.name == name else r for r in self.roles]
        return dataclasses.replace(self, roles=roles)

    def with_env(
        self, env: Mapping[str, str], *, roles: str | Sequence[str] | None = None
    ) -> AppDef:
        """A copy with ``env`` merged into every role's environment (or only ``roles``':
        a role's name, or several)."""
        if isinstance(roles, str):  # one name, not its letters
            roles = (roles,)
        unknown = sorted(set(roles or ()) - {r.name for r in self.roles})
        if unknown:
            raise ValueError(f"no role named {', '.join(map(repr, unknown))}")
        chosen = {r.name for r in self.roles} if roles is None else set(roles)
        updated = [r.with_env(env) if r.name in chosen else r for r in self.roles]
        return dataclasses.replace(self, roles=updated)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, kept on disk beside each app so other processes can read it."""
        return {
            "name": self.name,
            "metadata": dict(self.metadata),
            "roles": [_role_to_json(r) for r in self.roles],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AppDef:
        return cls(
            name=data["name"],
            metadata=data.get("metadata", {}),
            roles=[_role_from_json(r) for r in data.get("roles", [])],
        )


_MOUNT_KINDS: dict[str, type[BindMount] | type[VolumeMount] | type[DeviceMount]] = {
    "bind": BindMount,
    "volume": VolumeMount,
    "device": DeviceMount,
}


def _role_to_json(role: Role) -> dict[str, Any]:
    mounts = []
    for m in role.mounts:
        kind = next(k for k, t in _MOUNT_KINDS.items() if isinstance(m, t))
        mounts.append({"kind": kind, **dataclasses.asdict(m)})
    res = role.resource
    return {
        "name": role.name,
        "image": role.image,
        "entrypoint": role.entrypoint,
        "args": list(role.args),
        "env": dict(role.env),
        "num_replicas": role.num_replicas,
        "min_replicas": role.min_replicas,
        "max_retries": role.max_retries,
        "retry_policy": str(role.retry_policy),
        "resource": {
            "cpu": res.cpu,
            "gpu": res.gpu,
            "memMB": res.memMB,
            "capabilities": dict(res.capabilities),
            "devices": dict(res.devices),
        },
        "port_map": dict(role.port_map),
        "metadata": dict(role.metadata),
        "mounts": mounts,
    }


def _role_from_json(data: Mapping[str, Any]) -> Role:
    mounts: list[Mount] = []
    for m in data.get("mounts", []):
        fields = {k: v for k, v in m.items() if k != "kind"}
        mounts.append(_MOUNT_KINDS[m["kind"]](**fields))
    return Role(
        name=data["name"],
        image=data.get("image", ""),
        entrypoint=data.get("entrypoint", ""),
        args=data.get("args", []),
        env=data.get("env", {}),
        num_replicas=data.get("num_replicas", 1),
        min_replicas=data.get("min_replicas"),
        max_retries=data.get("max_retries", 0),
        retry_policy=RetryPolicy(data.get("retry_policy", "APPLICATION")),
        resource=Resource(**data.get("resource", {})),
        port_map=data.get("port_map", {}),
        metadata=data.get("metadata", {}),
        mounts=mounts,
    )


class macros:  # noqa: N801 - TorchX's name; users write macros.app_id
    """Placeholders substituted per replica in args, env values and metadata.

    ``$$`` escapes a dollar sign; an unknown ``$name`` is left as it is, so shell
    snippets such as ``$HOME`` in args survive untouched.
    """

    img_root: ClassVar[str] = "${img_root}"
    app_id: ClassVar[str] = "${app_id}"
    replica_id: ClassVar[str] = "${replica_id}"
    rank0_env: ClassVar[str] = "${rank0_env}"

    @dataclass(frozen=True)
    class Values:
        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str

        @functools.cached_property
        def _mapping(self) -> dict[str, str]:
            # Once per replica, not per string: ``dataclasses.asdict`` per string was most
            # of a dry run's time (a 100-replica app's substitutions took 1.5 ms of 2.4).
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

        def substitute(self, text: str) -> str:
            if "$" not in text:  # most strings: nothing to substitute, not even ``$$``
                return text
            return string.Template(text).safe_substitute(self._mapping)

        def apply(self, role: Role) -> Role:
            """A copy of ``role`` with macros resolved; entrypoint, image, env keys stay literal.

            Metadata is substituted at any depth: every string inside nested
            mappings, lists and tuples (their keys stay literal, as in TorchX).
            New containers are built, so the caller's nested objects are never
            changed. A role with no metadata and no macro is returned as it is
            (it is frozen): most roles, and a copy per replica cost a dry run
            more than its substitutions.
            """
            args = tuple(self.substitute(a) for a in role.args)
            env = {k: self.substitute(v) for k, v in role.env.items()}
            if not role.metadata and args == tuple(role.args) and env == role.env:
                return role
            metadata = {k: self._nested(v) for k, v in role.metadata.items()}
            return dataclasses.replace(role, args=args, env=env, metadata=metadata)

        def _nested(self, value: Any, depth: int = 0) -> Any:
            if isinstance(value, str):
                return self.substitute(value)
            if depth >= _MAX_METADATA_DEPTH:
                return value  # deeper (or cyclic) structures are left as they are
            if isinstance(value, Mapping):
                return {k: self._nested(v, depth + 1) for k, v in value.items()}
            if isinstance(value, list | tuple):
                items = [self._nested(v, depth + 1) for v in value]
                return items if isinstance(value, list) else tuple(items)
            return value


_MAX_METADATA_DEPTH = 50


_APP_ID_UNSAFE = re.compile(r"[^a-z0-9-]+")


def make_app_id(name: str, token: str) -> str:
    """``{name}-{token}`` with the name reduced to characters every backend accepts."""
    base = _APP_ID_UNSAFE.sub("-", name.lower()).strip("-")[:40] or "app"
    return f"{base}-{token}"


_BACKEND_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]*")


@dataclass(frozen=True, slots=True)
class AppHandle:
    """A parsed ``{backend}://{session}/{app_id}``; ``str()`` gives the handle back."""

    backend: str
    session: str
    app_id: str

    def __str__(self) -> str:
        return f"{self.backend}://{self.session}/{self.app_id}"


def make_handle(backend: str, session: str, app_id: str) -> str:
    """Build a handle, refusing parts that would not parse back to themselves."""
    handle = AppHandle(backend, session, app_id)
    _check_parts(handle, str(handle))
    return str(handle)


def parse_handle(handle: str) -> AppHandle:
    """Strict inverse of ``make_handle``.

    The session may not contain ``/``; the app id is everything after the first
    ``/`` that follows it, so ids containing ``/`` round-trip (TorchX's greedy
    regex splits them wrongly).
    """
    if not isinstance(handle, str):
        raise InvalidHandleError(f"a handle is a string, got {type(handle).__name__}")
    backend, sep, rest = handle.partition("://")
    if not sep:
        raise InvalidHandleError(f"{handle!r} is not of the form backend://session/app_id")
    session, sep, app_id = rest.partition("/")
    if not sep:
        raise InvalidHandleError(f"{handle!r} has no '/' between session and app id")
    parsed = AppHandle(backend, session, app_id)
    _check_parts(parsed, handle)
    return parsed


def _check_parts(parts: AppHandle, text: str) -> None:
    if not _BACKEND_NAME.fullmatch(parts.backend):
        raise InvalidHandleError(f"{text!r}: backend {parts.backend!r} is not a valid name")
    if not parts.session or "/" in parts.session or parts.session in (".", ".."):
        raise InvalidHandleError(
            f"{_short(text)}: the session must be non-empty, contain no '/' and not be '.' or '..'"
        )
    if not parts.app_id:
        raise InvalidHandleError(f"{_short(text)}: the app id is empty")
    if parts.app_id in (".", "..") or "\0" in text:
        raise InvalidHandleError(f"{_short(text)}: the app id {parts.app_id!r} is not allowed")
    # A part this long names no app: answer so here rather than with ENAMETOOLONG later.
    if len(parts.session) > _MAX_HANDLE_PART or len(parts.app_id) > _MAX_HANDLE_PART:
        raise InvalidHandleError(
            f"{_short(text)}: session and app id may be at most {_MAX_HANDLE_PART} characters"
        )


_MAX_HANDLE_PART = 200


def _short(text: str) -> str:
    """A handle quoted for an error message, cut to a readable length."""
    return repr(text) if len(text) <= 120 else repr(text[:100] + "...")
