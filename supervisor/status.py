"""Immutable snapshots handed to users: statuses, transitions, describe and list answers.

Field names follow TorchX (``AppStatus``, ``RoleStatus``, ``ReplicaStatus``,
``DescribeAppResponse``, ``ListAppResponse``) with additions where TorchX
loses information: each replica's exit code, signal and restart count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any

from supervisor.specs import Role
from supervisor.states import TERMINAL, AppState, ReplicaState

__all__ = [
    "AppStatus",
    "AppTimes",
    "DescribeAppResponse",
    "ListAppResponse",
    "ReplicaStatus",
    "RoleStatus",
    "Transition",
]


@dataclass(frozen=True)
class ReplicaStatus:
    id: int
    state: ReplicaState
    role: str
    hostname: str = ""
    structured_error_msg: str = ""
    exit_code: int | None = None
    signal: str | None = None
    restarts: int = 0
    msg: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.name,
            "role": self.role,
            "hostname": self.hostname,
            "structured_error_msg": self.structured_error_msg,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "restarts": self.restarts,
            "msg": self.msg,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReplicaStatus:
        return cls(
            id=d["id"],
            state=ReplicaState[d["state"]],
            role=d["role"],
            hostname=d.get("hostname", ""),
            structured_error_msg=d.get("structured_error_msg", ""),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            restarts=d.get("restarts", 0),
            msg=d.get("msg", ""),
        )


@dataclass(frozen=True)
class RoleStatus:
    role: str
    replicas: Sequence[ReplicaStatus] = ()
    restarts: int = 0
    """How many of the role's retries (``max_retries``) are used: a process that attaches
    to the app carries its retry budget on from here."""

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "replicas": [r.to_json() for r in self.replicas],
            "restarts": self.restarts,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RoleStatus:
        return cls(
            d["role"],
            tuple(ReplicaStatus.from_json(r) for r in d["replicas"]),
            int(d.get("restarts", 0)),
        )


@dataclass(frozen=True)
class AppStatus:
    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles: Sequence[RoleStatus] = ()
    # What the backend knows the app by (Slurm: ``slurm_job_id``); strings, empty elsewhere.
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.state.name in TERMINAL

    @property
    def is_settled(self) -> bool:
        """Nothing more will be learned: it ended, or its backend lost track (UNKNOWN).

        What a waiter stops at; a log follower stops there too.
        """
        return self.is_terminal or self.state.name == "UNKNOWN"

    def replica(self, role: str, replica_id: int) -> ReplicaStatus | None:
        for rs in self.roles:
            if rs.role == role:
                for r in rs.replicas:
                    if r.id == replica_id:
                        return r
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.name,
            "num_restarts": self.num_restarts,
            "msg": self.msg,
            "structured_error_msg": self.structured_error_msg,
            "ui_url": self.ui_url,
            "metadata": dict(self.metadata),
            "roles": [r.to_json() for r in self.roles],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AppStatus:
        return cls(
            state=AppState[d["state"]],
            num_restarts=d.get("num_restarts", 0),
            msg=d.get("msg", ""),
            structured_error_msg=d.get("structured_error_msg", ""),
            ui_url=d.get("ui_url"),
            roles=tuple(RoleStatus.from_json(r) for r in d.get("roles", [])),
            metadata=dict(d.get("metadata") or {}),
        )

    def __str__(self) -> str:
        lines = [f"AppStatus: {self.state.name} (restarts: {self.num_restarts})"]
        if self.msg:
            lines.append(f"  msg: {self.msg}")
        for rs in self.roles:
            for r in rs.replicas:
                extra = []
                if r.hostname:
                    extra.append(f"host={r.hostname}")
                if r.exit_code is not None:
                    extra.append(f"exit={r.exit_code}")
                if r.signal:
                    extra.append(f"signal={r.signal}")
                if r.restarts:
                    extra.append(f"restarts={r.restarts}")
                lines.append(f"  {rs.role}/{r.id}: {r.state.name} {' '.join(extra)}".rstrip())
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change, at app level (``role`` is None) or of one replica.

    Slotted: one is made per transition, on the app actor's path (a third faster).
    """

    seq: int
    at: float
    source: str
    dest: str
    trigger: str
    role: str | None = None
    replica_id: int | None = None
    attempt: int = 0
    msg: str = ""

    @property
    def scope(self) -> str:
        return "app" if self.role is None else f"{self.role}/{self.replica_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "source": self.source,
            "dest": self.dest,
            "trigger": self.trigger,
            "role": self.role,
            "replica_id": self.replica_id,
            "attempt": self.attempt,
            "msg": self.msg,
        }

    def to_json_line(self) -> str:
        """``json.dumps(self.to_json())``, several times faster.

        The journal gets a line per transition in every record, hundreds for a big
        app, and the encoder's per-call setup was most of that record's cost on the
        path of ``wait``. Any field of an unexpected type (or a time that is not a
        finite float) takes ``json.dumps`` itself; a property test pins the two equal.
        """
        seq, at, role, rid, attempt = self.seq, self.at, self.role, self.replica_id, self.attempt
        if not (
            type(seq) is int
            and type(at) is float
            and math.isfinite(at)
            and type(attempt) is int
            and (role is None or type(role) is str)
            and (rid is None or type(rid) is int)
            and type(self.source) is str
            and type(self.dest) is str
            and type(self.trigger) is str
            and type(self.msg) is str
        ):
            return json.dumps(self.to_json())
        return (
            f'{{"seq": {seq}, "at": {at!r}, "source": {_json_string(self.source)}, '
            f'"dest": {_json_string(self.dest)}, "trigger": {_json_string(self.trigger)}, '
            f'"role": {"null" if role is None else _json_string(role)}, '
            f'"replica_id": {"null" if rid is None else rid}, "attempt": {attempt}, '
            f'"msg": {_json_string(self.msg)}}}'
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Transition:
        return cls(**dict(d))


@dataclass(frozen=True)
class AppTimes:
    """When an app was submitted, started running and ended (epoch seconds; None: not yet).

    Derived from the app-level transitions the app recorded, not kept beside
    them, so there is one source of truth: ``submitted`` is the first move to
    SUBMITTED, ``started`` the first to RUNNING (an app that never ran has
    none), ``ended`` the move to a terminal state.
    """

    submitted: float | None = None
    started: float | None = None
    ended: float | None = None

    @classmethod
    def from_transitions(cls, transitions: Iterable[Transition]) -> AppTimes:
        return cls().after(transitions)

    def after(self, transitions: Iterable[Transition]) -> AppTimes:
        """These times, moved on by ``transitions`` (the ones that came after them).

        Lets whoever records an app keep its times as it goes, instead of reading
        the whole journal back when the app ends.
        """
        submitted, started, ended = self.submitted, self.started, self.ended
        for t in transitions:
            if t.role is not None:
                continue
            if t.dest == "SUBMITTED" and submitted is None:
                submitted = t.at
            elif t.dest == "RUNNING" and started is None:
                started = t.at
            elif t.dest in TERMINAL:
                ended = t.at
        return AppTimes(submitted, started, ended)


@dataclass(frozen=True)
class DescribeAppResponse:
    app_id: str
    state: AppState = AppState.UNSUBMITTED
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles_statuses: Sequence[RoleStatus] = ()
    roles: Sequence[Role] = field(default_factory=tuple)
    # Every transition the app recorded, app and replica level, in order (empty when
    # the backend has no record of them).
    transitions: Sequence[Transition] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)  # as AppStatus.metadata

    @property
    def times(self) -> AppTimes:
        return AppTimes.from_transitions(self.transitions)

    @classmethod
    def from_status(
        cls,
        app_id: str,
        status: AppStatus,
        roles: Sequence[Role],
        transitions: Sequence[Transition] = (),
    ) -> DescribeAppResponse:
        return cls(
            app_id=app_id,
            state=status.state,
            num_restarts=status.num_restarts,
            msg=status.msg,
            structured_error_msg=status.structured_error_msg,
            ui_url=status.ui_url,
            roles_statuses=tuple(status.roles),
            roles=tuple(roles),
            transitions=tuple(transitions),
            metadata=dict(status.metadata),
        )

    def to_status(self) -> AppStatus:
        return AppStatus(
            state=self.state,
            num_restarts=self.num_restarts,
            msg=self.msg,
            structured_error_msg=self.structured_error_msg,
            ui_url=self.ui_url,
            roles=tuple(self.roles_statuses),
            metadata=dict(self.metadata),
        )


@dataclass(frozen=True)
class ListAppResponse:
    """One app of ``list``; ``msg`` says why its state is what it is, where there is more
    to say (the status's ``msg``: a damaged record, a scheduler's pending reason)."""

    app_id: str
    state: AppState
    app_handle: str = ""
    name: str = ""
    msg: str = ""
    times: AppTimes = field(default_factory=AppTimes)
