"""Validation of an AppDef against what a backend can do.

``specs`` constructors accept anything so that a user sees every mistake at
once, here, instead of one ``TypeError`` per attempt. ``validate`` walks the
whole app, records each problem with its field path (``roles[1].env['A=B']``)
and raises a single ``SpecError``. It is the gate in front of ``dryrun``:
backends may then assume well-typed fields and never re-check them.

Because it sits in front of user input, ``validate`` must raise nothing but
``SpecError``, whatever it is given (a non-AppDef, ``None`` for a tuple, a
mapping whose methods raise): a crash inside validation would hide every
other problem and surface as a bare ``TypeError`` far from its cause. Each
role is checked under a guard that turns an unexpected exception into a
problem at that role's path.

Pure: no I/O, no environment lookups.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Final, TypeGuard

from supervisor.brief import brief as _brief
from supervisor.errors import Problem, SpecError
from supervisor.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
)

__all__ = [
    "MAX_APP_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "Capabilities",
    "check_name",
    "validate",
]

#: Longest session or role name: each becomes a directory name (255 bytes at most on
#: Linux) and part of longer paths and job names, so a generous fixed bound keeps
#: every path the backends build well inside the limits.
MAX_NAME_LENGTH: Final = 64
#: Longest app id; ``make_app_id`` never comes near it, an explicit ``app_id`` may.
MAX_APP_ID_LENGTH: Final = 128


@dataclass(frozen=True)
class Capabilities:
    """What a backend can honor; ``validate`` rejects apps that ask for more.

    ``retry_policies`` lists the policies the backend can carry out; an empty
    set means it cannot retry at all, in which case any ``max_retries > 0`` is
    rejected and the (default) policy of a role without retries is not
    judged. ``max_replicas_per_role`` is ``None`` for no limit.
    ``requires_image`` is set by backends that run containers, where an empty
    image cannot mean "the host". ``replicas_hint`` is appended to the message
    about too many replicas: how to raise the limit, when it can be raised.
    ``mounts_note`` and ``image_note`` qualify, in docs/support.md, how
    mounts and images are used (Slurm: only through pyxis).
    """

    backend: str
    retry_policies: frozenset[RetryPolicy] = field(default_factory=lambda: frozenset(RetryPolicy))
    mounts: bool = False
    max_replicas_per_role: int | None = None
    requires_image: bool = False
    replicas_hint: str = ""
    mounts_note: str = ""
    image_note: str = ""


# A role name becomes a directory name and part of environment variable names.
_ROLE_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_MOUNT_TYPES: Final = (BindMount, VolumeMount, DeviceMount)


def check_name(
    field_name: str, value: object, *, max_length: int = MAX_NAME_LENGTH
) -> list[Problem]:
    """Problems with a name that becomes one path component (a session, an app id).

    ``.`` and ``..`` are refused because ``{log_dir}/{session}/{app_id}`` would
    then point outside the log root, ``/`` because it splits a component, and
    anything longer than ``max_length`` because the path would fail with a bare
    ``OSError`` (name too long) deep inside a launch.
    """
    if not isinstance(value, str):
        return [Problem(field_name, f"must be a string, {_kind(value)}")]
    problems: list[Problem] = []
    if not value:
        problems.append(Problem(field_name, "must be non-empty"))
    elif value in (".", ".."):
        problems.append(Problem(field_name, f"{value!r} is not allowed (it names a directory)"))
    if "/" in value:
        problems.append(Problem(field_name, "must not contain '/'"))
    if any(not ch.isprintable() for ch in value):
        problems.append(Problem(field_name, "must not contain control characters"))
    if len(value) > max_length:
        problems.append(
            Problem(field_name, f"must be at most {max_length} characters, got {len(value)}")
        )
    return problems


def _key(key: object) -> str:
    """A mapping key as it appears in a field path: full ``repr`` for strings, else brief."""
    if isinstance(key, str):
        return str.__repr__(key)
    return _brief(key)


def _unsayable(text: str) -> str:
    """Why no program could be given ``text`` (a lone surrogate, U+D800..U+DFFF, outside
    the range Python uses for undecodable bytes), or "": it failed only at the launch,
    after the app's records were made (``os.fsencode`` refuses it)."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate (U+{ord(text[e.start]):04X}) no program can be given"
    return ""


def _kind(value: object) -> str:
    """``got str 'x'``: the type and a glimpse of a rejected value."""
    return f"got {type(value).__name__} {_brief(value)}"


def _is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool: ``True`` replicas or ports are always a mistake."""
    return isinstance(value, int) and not isinstance(value, bool)


class _Checker:
    """Accumulates problems; each ``check_*`` method looks at one kind of field."""

    def __init__(self, caps: Capabilities) -> None:
        self.caps = caps
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def guarded(self, path: str, check: Callable[[], None]) -> None:
        """Run ``check``; an unexpected exception becomes a problem at ``path``.

        The exception's own text is left out: it may come from user objects
        and is rarely meaningful to the person reading the error.
        """
        try:
            check()
        except Exception as exc:
            self.add(path, f"could not be checked ({type(exc).__name__} while reading it)")

    # -- generic shapes ---------------------------------------------------

    def check_str(
        self, path: str, value: object, *, non_empty: bool = True, what: str = "string"
    ) -> str | None:
        """The string if it is acceptable, else ``None`` after recording why."""
        if not isinstance(value, str):
            self.add(path, f"must be a {what}, {_kind(value)}")
            return None
        if non_empty and not value:
            self.add(path, f"must be a non-empty {what}")
            return None
        if "\0" in value:
            self.add(path, "must not contain a NUL character")
            return None
        if unsayable := _unsayable(value):
            self.add(path, unsayable)
            return None
        return value

    def check_json_mapping(self, path: str, value: object) -> None:
        """String keys and JSON values: the mapping is kept in the app's records as JSON,
        and a value that is not would fail the submit after its directories were made."""
        if not isinstance(value, Mapping):
            self.add(path, f"must be a mapping, {_kind(value)}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                self.add(f"{path}[{_key(key)}]", f"key must be a string, got {type(key).__name__}")
                continue
            try:
                json.dumps(item)
            except (TypeError, ValueError, RecursionError) as exc:
                self.add(f"{path}[{_key(key)}]", f"must be JSON data: {exc}")

    def check_count(
        self, path: str, value: object, *, minimum: int, unset_ok: bool = False
    ) -> bool:
        if not _is_int(value):
            self.add(path, f"must be an int, {_kind(value)}")
            return False
        if unset_ok and value == -1:
            return True
        if value < minimum:
            suffix = ", or -1 for unset" if unset_ok else ""
            self.add(path, f"must be >= {minimum}{suffix}")
            return False
        return True

    # -- app --------------------------------------------------------------

    def check_app(self, app: object) -> None:
        if not isinstance(app, AppDef):
            self.add("app", f"expected an AppDef, got {type(app).__name__}")
            return
        self.guarded("name", lambda: self.check_app_name(app.name))
        self.guarded("metadata", lambda: self.check_json_mapping("metadata", app.metadata))
        self.guarded("roles", lambda: self.check_roles(app.roles))

    def check_app_name(self, name: object) -> None:
        name = self.check_str("name", name)
        if name is None:
            return
        if "/" in name:
            self.add("name", "must not contain '/'")
        if any(c.isspace() for c in name):
            self.add("name", "must not contain whitespace")

    def check_roles(self, roles: object) -> None:
        if not isinstance(roles, tuple | list):
            self.add("roles", f"must be a sequence of Role, {_kind(roles)}")
            return
        if not roles:
            self.add("roles", "at least one role is required")
            return
        first_index: dict[str, int] = {}
        for i, role in enumerate(roles):
            path = f"roles[{i}]"
            if not isinstance(role, Role):
                self.add(path, f"expected a Role, got {type(role).__name__}")
                continue
            name = role.name
            if isinstance(name, str) and name in first_index:
                self.add(
                    f"{path}.name",
                    f"duplicate role name {name!r} (also roles[{first_index[name]}])",
                )
            elif isinstance(name, str):
                first_index[name] = i
            self.guarded(path, partial(self.check_role, path, role))

    # -- role -------------------------------------------------------------

    def check_role(self, path: str, role: Role) -> None:
        caps = self.caps
        name = self.check_str(f"{path}.name", role.name)
        if name is not None and len(name) > MAX_NAME_LENGTH:
            self.add(
                f"{path}.name",
                f"must be at most {MAX_NAME_LENGTH} characters, got {len(name)}",
            )
        elif name is not None and not _ROLE_NAME.fullmatch(name):
            self.add(
                f"{path}.name",
                f"{name!r} is not a valid role name (an ASCII letter, then ASCII letters, "
                "digits, '_' or '-')",
            )
        self.check_str(f"{path}.entrypoint", role.entrypoint)
        image = self.check_str(f"{path}.image", role.image, non_empty=False)
        if image == "" and caps.requires_image:
            self.add(f"{path}.image", f"required by backend {caps.backend!r}")
        self.check_args(f"{path}.args", role.args)
        self.check_env(f"{path}.env", role.env)
        self.check_replicas(path, role)
        self.check_retries(path, role)
        self.check_resource(f"{path}.resource", role.resource)
        self.check_port_map(f"{path}.port_map", role.port_map)
        self.check_json_mapping(f"{path}.metadata", role.metadata)
        self.check_mounts(f"{path}.mounts", role.mounts)

    def check_args(self, path: str, args: object) -> None:
        if isinstance(args, str):
            self.add(path, f"must be a sequence of strings, {_kind(args)}; wrap it in a list")
            return
        if not isinstance(args, tuple | list):
            self.add(path, f"must be a sequence of strings, {_kind(args)}")
            return
        for i, arg in enumerate(args):
            self.check_str(f"{path}[{i}]", arg, non_empty=False)

    def check_env(self, path: str, env: object) -> None:
        if not isinstance(env, Mapping):
            self.add(path, f"must be a mapping of str to str, {_kind(env)}")
            return
        for key, value in env.items():
            item = f"{path}[{_key(key)}]"
            if not isinstance(key, str):
                self.add(item, f"name must be a string, got {type(key).__name__}")
            elif not key or "=" in key or "\0" in key or _unsayable(key):
                self.add(item, "not a valid environment variable name")
            if not isinstance(value, str):
                self.add(item, f"value must be a string, {_kind(value)}")
            elif "\0" in value:
                self.add(item, "value must not contain a NUL character")
            elif unsayable := _unsayable(value):
                self.add(item, f"value {unsayable}")

    def check_replicas(self, path: str, role: Role) -> None:
        caps = self.caps
        num = role.num_replicas
        num_ok = self.check_count(f"{path}.num_replicas", num, minimum=1)
        limit = caps.max_replicas_per_role
        if num_ok and limit is not None and num > limit:
            hint = f" ({caps.replicas_hint})" if caps.replicas_hint else ""
            self.add(
                f"{path}.num_replicas",
                f"must be <= {limit} on backend {caps.backend!r}{hint}",
            )
        low = role.min_replicas
        if low is None:
            return
        low_ok = self.check_count(f"{path}.min_replicas", low, minimum=1)
        if low_ok and num_ok and low > num:
            self.add(f"{path}.min_replicas", f"must be <= num_replicas ({num})")

    def check_retries(self, path: str, role: Role) -> None:
        caps = self.caps
        retries_ok = self.check_count(f"{path}.max_retries", role.max_retries, minimum=0)
        supported = [p for p in RetryPolicy if p in caps.retry_policies]
        policy = role.retry_policy
        if not supported:
            if retries_ok and role.max_retries > 0:
                self.add(
                    f"{path}.max_retries",
                    f"backend {caps.backend!r} cannot retry; must be 0",
                )
            if not isinstance(policy, RetryPolicy):
                self.add(f"{path}.retry_policy", f"must be a RetryPolicy, {_kind(policy)}")
            return
        if not isinstance(policy, RetryPolicy):
            hint = ""
            if isinstance(policy, str) and policy.upper() in RetryPolicy.__members__:
                hint = f"; use RetryPolicy.{policy.upper()}"
            self.add(f"{path}.retry_policy", f"must be a RetryPolicy, {_kind(policy)}{hint}")
        elif policy not in supported:
            names = ", ".join(p.value for p in supported)
            self.add(
                f"{path}.retry_policy",
                f"{policy.value} is not supported by backend {caps.backend!r} (supported: {names})",
            )

    def check_resource(self, path: str, resource: object) -> None:
        if not isinstance(resource, Resource):
            self.add(path, f"expected a Resource, got {type(resource).__name__}")
            return
        # 0 is no request, as TorchX takes it (its schedulers only set what is > 0).
        self.check_count(f"{path}.cpu", resource.cpu, minimum=0, unset_ok=True)
        self.check_count(f"{path}.gpu", resource.gpu, minimum=0, unset_ok=True)
        self.check_count(f"{path}.memMB", resource.memMB, minimum=0, unset_ok=True)
        self.check_json_mapping(f"{path}.capabilities", resource.capabilities)
        devices = resource.devices
        if not isinstance(devices, Mapping):
            self.add(f"{path}.devices", f"must be a mapping of str to int, {_kind(devices)}")
            return
        for key, count in devices.items():
            item = f"{path}.devices[{_key(key)}]"
            if not isinstance(key, str) or not key:
                self.add(item, "device name must be a non-empty string")
            self.check_count(item, count, minimum=0)

    def check_port_map(self, path: str, port_map: object) -> None:
        if not isinstance(port_map, Mapping):
            self.add(path, f"must be a mapping of str to int, {_kind(port_map)}")
            return
        for key, port in port_map.items():
            item = f"{path}[{_key(key)}]"
            if not isinstance(key, str):
                self.add(item, f"name must be a string, got {type(key).__name__}")
            if not _is_int(port) or not 1 <= port <= 65535:
                self.add(item, f"must be a port number in 1..65535, {_kind(port)}")

    def check_mounts(self, path: str, mounts: object) -> None:
        if not isinstance(mounts, tuple | list):
            self.add(path, f"must be a sequence of mounts, {_kind(mounts)}")
            return
        if mounts and not self.caps.mounts:
            self.add(path, f"mounts are not supported by backend {self.caps.backend!r}")
        destinations: dict[object, int] = {}
        for i, mount in enumerate(mounts):
            item = f"{path}[{i}]"
            destination = getattr(mount, "dst_path", None)
            if isinstance(destination, str) and destination in destinations:
                # Refused by the engines only when the container is created, as a
                # submit's failure naming no mount.
                first = destinations[destination]
                self.add(
                    f"{item}.dst_path", f"{destination!r} is mounted already ({path}[{first}])"
                )
            elif isinstance(destination, str):
                destinations[destination] = i
            if isinstance(mount, BindMount):
                self.check_absolute(f"{item}.src_path", mount.src_path)
                self.check_absolute(f"{item}.dst_path", mount.dst_path)
                self.check_bool(f"{item}.read_only", mount.read_only)
            elif isinstance(mount, VolumeMount):
                self.check_str(f"{item}.src", mount.src)
                self.check_absolute(f"{item}.dst_path", mount.dst_path)
                self.check_bool(f"{item}.read_only", mount.read_only)
            elif isinstance(mount, DeviceMount):
                self.check_absolute(f"{item}.src_path", mount.src_path)
                self.check_absolute(f"{item}.dst_path", mount.dst_path)
                perms = self.check_str(f"{item}.permissions", mount.permissions)
                if perms is not None and not set(perms) <= set("rwm"):
                    self.add(f"{item}.permissions", f"must be letters of 'rwm', got {perms!r}")
            else:
                names = ", ".join(t.__name__ for t in _MOUNT_TYPES)
                self.add(item, f"expected one of {names}, got {type(mount).__name__}")

    def check_absolute(self, path: str, value: object) -> None:
        """A mount's path: absolute. A relative one means different places to different
        engines (dockerd refuses it at create, Podman takes it from ``/``)."""
        found = self.check_str(path, value)
        if found is not None and not found.startswith("/"):
            self.add(path, f"must be an absolute path, got {found!r}")

    def check_bool(self, path: str, value: object) -> None:
        if not isinstance(value, bool):
            self.add(path, f"must be a bool, {_kind(value)}")


def _context(app: object) -> str:
    """``invalid app 'name'`` when the name is readable, else ``invalid app``."""
    try:
        name = app.name if isinstance(app, AppDef) else None
    except Exception:
        name = None
    if isinstance(name, str) and name:
        return f"invalid app {_brief(name)}"
    return "invalid app"


def validate(app: object, caps: Capabilities) -> None:
    """Return ``None`` if ``app`` can run on a backend with ``caps``; else raise one ``SpecError``.

    The error lists every problem found, each with its field path, in the
    order the fields appear. Nothing but ``SpecError`` ever escapes.
    """
    checker = _Checker(caps)
    checker.guarded("app", lambda: checker.check_app(app))
    if checker.problems:
        raise SpecError(checker.problems, context=_context(app))
    _warn_lone_restarts(app)


_COLLECTIVE_ENV = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _warn_lone_restarts(app: object) -> None:
    """A rank restarted alone cannot rejoin its peers' collective: say so (it is legal)."""
    for role in getattr(app, "roles", ()):
        collective = "asupervisor/procs_per_node" in role.metadata or any(
            k in role.env for k in _COLLECTIVE_ENV
        )
        if (
            collective
            and role.num_replicas > 1
            and role.max_retries > 0
            and role.retry_policy is RetryPolicy.REPLICA
        ):
            warnings.warn(
                f"role {role.name!r} looks like a collective job (torch.distributed): with "
                "RetryPolicy.REPLICA a restarted rank cannot rejoin the others' process "
                "group; use APPLICATION (or ROLE)",
                UserWarning,
                stacklevel=3,
            )
