"""The decision core of one app: its replica machines, its app machine, its policy.

``AppFSM`` ingests normalized events and user commands, fires the triggers
the tables allow, and answers with the actions a backend must carry out
(stop these replicas, restart those). It does no I/O and knows no backend;
the app actor in ``supervisor.supervisor`` is its only caller, which makes it
the single writer of these machines.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from supervisor.events import (
    Exited,
    Lost,
    Queued,
    ReplicaEvent,
    ReplicaKey,
    Requeued,
    Started,
    Submitted,
)
from supervisor.fsm.ingest import ANY_APP_TRIGGER, APP_PATHS, REPLICA_PATHS, Drop
from supervisor.fsm.machines import APP_ENGINE, REPLICA_ENGINE, AppModel, ReplicaModel, StopReason
from supervisor.fsm.rules import ExitOutcome, derive_from_counts, exit_outcome
from supervisor.specs import RetryPolicy
from supervisor.states import TERMINAL, AppState, ReplicaState
from supervisor.status import AppStatus, ReplicaStatus, RoleStatus, Transition

__all__ = ["Action", "AppFSM", "RestartReplicas", "RoleSpec", "StopReplicas"]


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """The part of a Role the decisions depend on."""

    name: str
    num_replicas: int
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION


@dataclass(frozen=True, slots=True)
class StopReplicas:
    """Stop these replicas; each answers with an ``Exited`` event (code None if nothing ran)."""

    keys: tuple[ReplicaKey, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RestartReplicas:
    """Stop whatever runs of these replicas, then launch them again as the given attempt."""

    attempts: tuple[tuple[ReplicaKey, int], ...]
    reason: str


Action = StopReplicas | RestartReplicas

# The one trigger each observation justifies as the last step of its path.
_SUBMIT = frozenset({"submit"})
_QUEUE = frozenset({"queue"})
_START = frozenset({"start"})
_LOSE = frozenset({"lose"})
_REQUEUE = frozenset({"requeue"})
_OUTCOME = {
    ExitOutcome.SUCCEEDED: (ReplicaState.SUCCEEDED, frozenset({"succeed"})),
    ExitOutcome.CANCELLED: (ReplicaState.CANCELLED, frozenset({"cancel"})),
    ExitOutcome.FAILED: (ReplicaState.FAILED, frozenset({"fail"})),
}


def describe_exit(exit_code: int | None, signal: str | None) -> str:
    if signal:
        return f"killed by {signal}"
    if exit_code is None:
        return "stopped before it ran"
    return f"exited with code {exit_code}"


class AppFSM:
    def __init__(
        self, roles: Sequence[RoleSpec], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self.roles = {r.name: r for r in roles}
        self.replicas: dict[ReplicaKey, ReplicaModel] = {
            (r.name, k): ReplicaModel(r.name, k) for r in roles for k in range(r.num_replicas)
        }
        # Kept up to date on every replica transition, so deriving the app's
        # state costs the same for 1 replica or 1,000.
        self._counts: Counter[ReplicaState] = Counter(
            {ReplicaState.UNSUBMITTED: len(self.replicas)}
        )
        self.app = AppModel()
        self.history: list[Transition] = []
        self.dropped: dict[str, int] = {}
        self.role_restarts = {r.name: 0 for r in roles}
        self.num_restarts = 0
        self._requeued_to = 0  # the highest attempt a requeue brought any replica to
        self.pending_reason = ""  # the scheduler's latest reason for keeping a replica queued
        self.cancel_requested = False
        self.msg = ""
        self.structured_error_msg = ""
        self._snapshot: AppStatus | None = None
        self._failed = False
        self.notice = ""

    # ------------------------------------------------------------------ queries
    @property
    def state(self) -> AppState:
        return self.app.state

    @property
    def is_terminal(self) -> bool:
        return self.app.state.name in TERMINAL

    def replica_counts(self) -> dict[ReplicaState, int]:
        """How many replicas are in each state now (kept up to date, so O(states))."""
        return dict(self._counts)

    def snapshot(self) -> AppStatus:
        """The current status; rebuilt only after a change, so reads are cheap."""
        if self._snapshot is None:
            roles = []
            for role in self.roles.values():
                reps = tuple(
                    ReplicaStatus(
                        id=m.replica_id,
                        state=m.state,
                        role=m.role,
                        hostname=m.hostname,
                        structured_error_msg=m.structured_error_msg,
                        exit_code=m.exit_code,
                        signal=m.signal,
                        restarts=m.restarts,
                        msg=m.msg,
                    )
                    for m in (self.replicas[(role.name, k)] for k in range(role.num_replicas))
                )
                roles.append(RoleStatus(role.name, reps, self.role_restarts[role.name]))
            waiting = (
                f"pending: {self.pending_reason}"
                if self.pending_reason and self.app.state is AppState.PENDING
                else ""
            )
            msg = "; ".join(m for m in (self.msg, waiting, self.notice) if m)
            self._snapshot = AppStatus(
                state=self.app.state,
                num_restarts=self.num_restarts,
                msg=msg,
                structured_error_msg=self.structured_error_msg,
                roles=tuple(roles),
            )
        return self._snapshot

    def set_notice(self, message: str) -> None:
        """A backend condition shown in ``msg`` until cleared; it changes no state."""
        if message != self.notice:
            self.notice = message
            self._snapshot = None

    # ----------------------------------------------------------------- commands
    def apply(self, event: ReplicaEvent) -> list[Action]:
        """Ingest one backend event; return what the backend must do next."""
        self._snapshot = None
        model = self.replicas.get(event.key)
        if model is None:
            self._drop("unknown replica")
            return []
        if event.attempt < model.attempt:
            self._drop("stale attempt")
            return []
        actions: list[Action] = []
        if isinstance(event, Submitted):
            self._advance(model, ReplicaState.SUBMITTED, _SUBMIT, event)
        elif isinstance(event, Queued):
            reason = "" if event.reason in ("", "None") else event.reason
            self._advance(model, ReplicaState.PENDING, _QUEUE, event, reason)
            if model.state is ReplicaState.PENDING and reason:
                # The reason changes while the replica waits (Priority, then Resources):
                # shown in status at once, no transition needed.
                model.msg = reason
                self.pending_reason = reason
        elif isinstance(event, Started):
            if self._advance(model, ReplicaState.RUNNING, _START, event):
                model.hostname = event.hostname
                self.pending_reason = ""
        elif isinstance(event, Lost):
            if self._advance(model, ReplicaState.UNKNOWN, _LOSE, event, event.reason):
                model.msg = event.reason
        elif isinstance(event, Requeued):
            actions += self._on_requeued(model, event)
        elif isinstance(event, Exited):
            actions += self._on_exited(model, event)
        self._update_app(event.at)
        return actions

    def cancel(self, reason: str = "cancelled by request") -> list[Action]:
        """The user's cancel (or the scheduler's, with its reason): stop every live replica.

        Idempotent. ``reason`` becomes the app's message, so a job the scheduler
        cancelled says why (Slurm: a dependency that can never be satisfied).
        """
        if self.is_terminal or self.cancel_requested:
            return []
        self.cancel_requested = True
        self.msg = reason
        to_stop: list[ReplicaKey] = []
        at = self._clock()
        for key, model in self.replicas.items():
            if model.state.name in TERMINAL:
                continue
            model.stop_reason = StopReason.CANCEL
            if model.state is ReplicaState.UNSUBMITTED:
                self._fire(model, "cancel", at, "cancelled before submission")
            else:
                to_stop.append(key)
        self._update_app(at)
        return [StopReplicas(tuple(to_stop), "cancelled by request")] if to_stop else []

    def resume(self, recorded: AppStatus, history: Sequence[Transition]) -> list[Action]:
        """Carry on from the records of an app another process followed (``attach``).

        The journal (``history``) is the truth for states: its owner appends to
        it before it replaces the status, so an owner killed between the two
        left a status one step behind. The status gives what the journal does
        not hold: exit codes, hosts, messages and the retries each role used.
        Returns the gang stop still owed: an owner that died between a failure
        and stopping the failed replica's siblings never carried it out.
        """
        self._snapshot = None
        self.history = list(history)
        for role in recorded.roles:
            if role.role in self.role_restarts:
                self.role_restarts[role.role] = role.restarts
            for r in role.replicas:
                model = self.replicas.get((r.role, r.id))
                if model is None:
                    continue
                model.state = r.state
                model.attempt = model.restarts = r.restarts
                model.hostname, model.msg = r.hostname, r.msg
                model.exit_code, model.signal = r.exit_code, r.signal
                model.structured_error_msg = r.structured_error_msg
        app_state = recorded.state
        for t in history:
            if t.role is None:
                app_state = AppState[t.dest]
                continue
            model = self.replicas.get((t.role, t.replica_id or 0))
            if model is not None:
                model.state = ReplicaState[t.dest]
                model.attempt = max(model.attempt, t.attempt)
            if t.trigger == "requeue":
                self._requeued_to = max(self._requeued_to, t.attempt)
        self.app.state = app_state
        self._counts = Counter(m.state for m in self.replicas.values())
        self.num_restarts = recorded.num_restarts
        self.structured_error_msg = recorded.structured_error_msg
        failed = [m for m in self.replicas.values() if m.state is ReplicaState.FAILED]
        actions: list[Action] = []
        if failed:
            self._failed = True
            self.msg = failed[0].msg
            others = []
            for key, other in self.replicas.items():
                if other.state.name not in TERMINAL:
                    other.stop_reason = StopReason.GANG
                    others.append(key)
            if others:
                actions.append(StopReplicas(tuple(others), f"{self.msg}; stopping the app"))
        self._update_app(self._clock())
        return actions

    # ---------------------------------------------------------------- internals
    def _on_requeued(self, model: ReplicaModel, event: Requeued) -> list[Action]:
        if event.attempt <= model.attempt and model.attempt > 0:
            self._drop("duplicate")
            return []
        # Already PENDING: the run that was requeued ended between two looks, never seen
        # to start. No transition, but the attempt still moves on.
        waiting = model.state is ReplicaState.PENDING
        if waiting or self._advance(model, ReplicaState.PENDING, _REQUEUE, event, event.reason):
            new_attempt = max(event.attempt, model.attempt + 1)
            counted = max(self._requeued_to, model.attempt)  # restarts already counted
            gained = new_attempt - model.attempt
            model.attempt = new_attempt
            model.restarts += gained
            model.msg = event.reason
            # One requeue moves every replica of the job to the next attempt: it is one
            # restart of the app, however many replicas report it.
            if new_attempt > counted:
                self.num_restarts += new_attempt - counted
            self._requeued_to = max(self._requeued_to, new_attempt)
        return []

    def _on_exited(self, model: ReplicaModel, event: Exited) -> list[Action]:
        if model.state.name in TERMINAL:
            self._drop("absorbed")
            return []
        role = self.roles[model.role]
        outcome = exit_outcome(
            event.exit_code,
            stopping=model.stop_reason is not None,
            # A whole-job requeue seen without its failure (the scheduler requeued a run
            # that failed between two looks) used a retry as well, as Slurm counts it.
            retries_left=max(self.role_restarts[role.name], self._requeued_to) < role.max_retries,
        )
        model.exit_code = event.exit_code
        model.signal = event.signal
        model.structured_error_msg = event.structured_error_msg
        what = _exit_reason(model, event)
        model.msg = event.msg or ("" if outcome is ExitOutcome.SUCCEEDED else what)
        if outcome is ExitOutcome.RESTART:
            return self._restart(model, role, event.at, what)
        target, finals = _OUTCOME[outcome]
        self._advance(model, target, finals, event, model.msg)
        if self._failed and event.structured_error_msg and not self.structured_error_msg:
            # The root cause is the first failure, unless a later one wrote an error file
            # (a gang on Slurm reports its members' failures together, in no useful order).
            self.msg = what
            self.structured_error_msg = event.structured_error_msg
        if outcome is not ExitOutcome.FAILED:
            return []
        if not self._failed:
            self._failed = True
            self.msg = what
            self.structured_error_msg = event.structured_error_msg
        others = []
        for key, other in self.replicas.items():
            if other.state.name not in TERMINAL and other.stop_reason is None:
                other.stop_reason = StopReason.GANG
                others.append(key)
        return [StopReplicas(tuple(others), f"{what}; stopping the app")] if others else []

    def _restart(self, failed: ReplicaModel, role: RoleSpec, at: float, what: str) -> list[Action]:
        if role.retry_policy is RetryPolicy.REPLICA:
            scope = [failed]
        elif role.retry_policy is RetryPolicy.ROLE:
            scope = [m for m in self.replicas.values() if m.role == role.name]
        else:
            scope = list(self.replicas.values())
        scope = [m for m in scope if m.state.name not in TERMINAL and m.stop_reason is None]
        self.role_restarts[role.name] += 1
        self.num_restarts += 1
        reason = (
            f"{what}; restart {self.role_restarts[role.name]}/{role.max_retries} "
            f"({role.retry_policy.value})"
        )
        attempts = []
        for m in scope:
            m.attempt += 1
            m.restarts += 1
            if m.state in (ReplicaState.RUNNING, ReplicaState.UNKNOWN):
                self._fire(m, "restart", at, reason)
            attempts.append(((m.role, m.replica_id), m.attempt))
        self._snapshot = None
        return [RestartReplicas(tuple(attempts), reason)]

    def _advance(
        self,
        model: ReplicaModel,
        target: ReplicaState,
        finals: frozenset[str],
        event: ReplicaEvent,
        msg: str = "",
    ) -> bool:
        step = REPLICA_PATHS[(model.state, target, finals)]
        if isinstance(step, Drop):
            self._drop(step.reason)
            return False
        for trig in step.triggers:
            self._fire(model, trig, event.at, msg)
        return True

    def _fire(self, model: ReplicaModel, trigger: str, at: float, msg: str) -> None:
        source = model.state
        REPLICA_ENGINE.fire(model, trigger)
        dest = model.state
        self._counts[source] -= 1
        self._counts[dest] += 1
        # ``_name_``, not ``name``: the enum's ``name`` is a descriptor, slow on this path.
        self._record(at, source._name_, dest._name_, trigger, model, msg)

    def _update_app(self, at: float) -> None:
        current = self.app.state
        target = derive_from_counts(self._counts, self.cancel_requested, current)
        step = APP_PATHS[(current, target, ANY_APP_TRIGGER)]
        if isinstance(step, Drop):
            return
        for trig in step.triggers:
            source = self.app.state
            APP_ENGINE.fire(self.app, trig)
            self._record(at, source._name_, self.app.state._name_, trig, None, self.msg)

    def _record(
        self,
        at: float,
        source: str,
        dest: str,
        trigger: str,
        model: ReplicaModel | None,
        msg: str,
    ) -> None:
        self._snapshot = None
        self.history.append(
            Transition(
                seq=len(self.history),
                at=at,
                source=source,
                dest=dest,
                trigger=trigger,
                role=model.role if model else None,
                replica_id=model.replica_id if model else None,
                attempt=model.attempt if model else 0,
                msg=msg,
            )
        )

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def _exit_reason(model: ReplicaModel, event: Exited) -> str:
    """What the app says of a replica's exit: its code, and the backend's reason with it.

    The code alone hid the cause the backend knew ("killed by SIGKILL" for a
    container killed at its memory limit, "exited with code 127" for a program
    that could not start, "killed by SIGTERM" for Slurm's time limit). Backends
    word their reason "role/k: why"; the prefix is said once.
    """
    name = f"{model.role}/{model.replica_id}"
    if event.exit_code is None and event.signal is None and event.msg:
        return event.msg  # e.g. an exit status the backend could not learn
    what = f"{name} {describe_exit(event.exit_code, event.signal)}"
    return f"{what}: {event.msg.removeprefix(f'{name}: ')}" if event.msg else what
