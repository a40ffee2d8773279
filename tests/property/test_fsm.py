"""Hypothesis over the pure decision core: tables, ingestion, rules, AppFSM (all synchronous)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from supervisor.events import Exited, Lost, Queued, ReplicaEvent, Requeued, Started, Submitted
from supervisor.fsm.app import AppFSM, RoleSpec
from supervisor.fsm.rules import derive_app_state
from supervisor.fsm.tables import APP_TRANSITIONS, REPLICA_TRANSITIONS, S, TransitionRow
from supervisor.specs import RetryPolicy
from supervisor.states import TERMINAL, AppState

role_specs = st.lists(
    st.builds(
        RoleSpec,
        name=st.sampled_from(["a", "b", "c"]),
        num_replicas=st.integers(1, 3),
        max_retries=st.integers(0, 2),
        retry_policy=st.sampled_from(list(RetryPolicy)),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda r: r.name,
)


def _legal(table: Sequence[TransitionRow[S]]) -> set[tuple[str, str, str]]:
    return {(row.trigger, src.name, row.dest.name) for row in table for src in row.source}


REPLICA_LEGAL = _legal(REPLICA_TRANSITIONS)
APP_LEGAL = _legal(APP_TRANSITIONS)


class AppMachineRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fsm: AppFSM | None = None
        self.checked = 0
        self.terminal_seen: dict[object, str] = {}
        self.cancelled = False

    @initialize(roles=role_specs)
    def setup(self, roles: list[RoleSpec]) -> None:
        self.fsm = AppFSM(roles)
        self.roles = roles
        self.before = self.fsm.state

    def _model(self, data: st.DataObject) -> tuple[str, int, int]:
        assert self.fsm is not None
        key = data.draw(st.sampled_from(sorted(self.fsm.replicas)))
        model = self.fsm.replicas[key]
        attempt = data.draw(
            st.sampled_from([model.attempt, max(model.attempt - 1, 0), model.attempt + 1])
        )
        return key[0], key[1], attempt

    @rule(
        data=st.data(), kind=st.sampled_from(["submitted", "queued", "started", "lost", "requeued"])
    )
    def progress(self, data: st.DataObject, kind: str) -> None:
        assert self.fsm is not None
        role, k, attempt = self._model(data)
        event: ReplicaEvent
        if kind == "submitted":
            event = Submitted(role=role, replica_id=k, attempt=attempt)
        elif kind == "queued":
            event = Queued(role=role, replica_id=k, attempt=attempt)
        elif kind == "started":
            event = Started(role=role, replica_id=k, attempt=attempt, hostname="h")
        elif kind == "lost":
            event = Lost(role=role, replica_id=k, attempt=attempt, reason="gone")
        else:
            event = Requeued(role=role, replica_id=k, attempt=attempt, reason="preempted")
        self.before = self.fsm.state
        self.fsm.apply(event)

    @rule(data=st.data(), code=st.sampled_from([0, 1, 3, -9, None]))
    def exited(self, data: st.DataObject, code: int | None) -> None:
        assert self.fsm is not None
        role, k, attempt = self._model(data)
        self.before = self.fsm.state
        self.fsm.apply(Exited(role=role, replica_id=k, attempt=attempt, exit_code=code))

    @rule()
    def cancel(self) -> None:
        assert self.fsm is not None
        self.cancelled = True
        self.before = self.fsm.state
        self.fsm.cancel()

    @invariant()
    def transitions_are_in_the_table(self) -> None:
        if self.fsm is None:
            return
        for t in self.fsm.history[self.checked :]:
            legal = APP_LEGAL if t.role is None else REPLICA_LEGAL
            assert (t.trigger, t.source, t.dest) in legal, t
        self.checked = len(self.fsm.history)

    @invariant()
    def terminal_states_absorb(self) -> None:
        if self.fsm is None:
            return
        for key, model in self.fsm.replicas.items():
            if key in self.terminal_seen:
                assert model.state.name == self.terminal_seen[key]
            elif model.state.name in TERMINAL:
                self.terminal_seen[key] = model.state.name
        if "app" in self.terminal_seen:
            assert self.fsm.state.name == self.terminal_seen["app"]
        elif self.fsm.is_terminal:
            self.terminal_seen["app"] = self.fsm.state.name

    @invariant()
    def restarts_within_budget(self) -> None:
        if self.fsm is None:
            return
        for role in self.roles:
            assert self.fsm.role_restarts[role.name] <= role.max_retries

    @invariant()
    def app_state_follows_replicas(self) -> None:
        if self.fsm is None:
            return
        # One rule, from the replicas' states, the cancel and where the app was before the step.
        derived = derive_app_state(
            (m.state for m in self.fsm.replicas.values()), self.fsm.cancel_requested, self.before
        )
        assert self.fsm.state == derived
        all_terminal = all(m.state.name in TERMINAL for m in self.fsm.replicas.values())
        assert self.fsm.is_terminal == all_terminal

    @invariant()
    def cancelled_only_through_cancel(self) -> None:
        if self.fsm is None:
            return
        if not self.cancelled:
            assert self.fsm.state is not AppState.CANCELLED


AppMachineRules.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestAppMachine = AppMachineRules.TestCase


# --------------------------------------------------------------- interleavings
@st.composite
def runs_and_interleavings(
    draw: st.DrawFn,
) -> tuple[list[RoleSpec], list[ReplicaEvent], list[ReplicaEvent]]:
    """Per-replica event sequences, and one way of interleaving them.

    Retry budgets are shared by a role's replicas, so roles with retries get a
    single replica: then each replica's fate depends on its own events only.
    """
    roles = draw(role_specs)
    roles = [
        r if r.max_retries == 0 else RoleSpec(r.name, 1, r.max_retries, RetryPolicy.REPLICA)
        for r in roles
    ]
    per_replica: list[list[ReplicaEvent]] = []
    for role in roles:
        for k in range(role.num_replicas):
            seq: list[ReplicaEvent] = [Submitted(role=role.name, replica_id=k)]
            for attempt in range(role.max_retries + 1):
                code = draw(st.sampled_from([0, 0, 1, -9]))
                seq.append(Started(role=role.name, replica_id=k, attempt=attempt))
                seq.append(Exited(role=role.name, replica_id=k, attempt=attempt, exit_code=code))
                if code == 0:
                    break
            per_replica.append(seq)
    order = draw(st.permutations([i for i, seq in enumerate(per_replica) for _ in seq]))
    cursors = [0] * len(per_replica)
    interleaved: list[ReplicaEvent] = []
    for i in order:
        interleaved.append(per_replica[i][cursors[i]])
        cursors[i] += 1
    sequential = [e for seq in per_replica for e in seq]
    return roles, sequential, interleaved


def _final_state(roles: list[RoleSpec], events: list[ReplicaEvent]) -> AppState:
    fsm = AppFSM(roles)
    for e in events:
        fsm.apply(e)
    return fsm.state


@settings(max_examples=200, deadline=None)
@given(runs_and_interleavings())
def test_app_state_is_independent_of_interleaving(
    case: tuple[list[RoleSpec], list[ReplicaEvent], list[ReplicaEvent]],
) -> None:
    roles, sequential, interleaved = case
    assert _final_state(roles, sequential) == _final_state(roles, interleaved)


# ------------------------------------------------------------------- resume
@st.composite
def runs_split(draw: st.DrawFn) -> tuple[list[RoleSpec], list[ReplicaEvent], int]:
    """Any events of any replicas, and where an owner died amid them."""
    roles = draw(role_specs)
    keys = [(r.name, k) for r in roles for k in range(r.num_replicas)]
    events: list[ReplicaEvent] = []
    for _ in range(draw(st.integers(0, 30))):
        role, k = draw(st.sampled_from(keys))
        attempt = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["submitted", "queued", "started", "lost", "exited"]))
        if kind == "submitted":
            events.append(Submitted(role=role, replica_id=k, attempt=attempt))
        elif kind == "queued":
            events.append(Queued(role=role, replica_id=k, attempt=attempt))
        elif kind == "started":
            events.append(Started(role=role, replica_id=k, attempt=attempt, hostname="h"))
        elif kind == "lost":
            events.append(Lost(role=role, replica_id=k, attempt=attempt, reason="gone"))
        else:
            code = draw(st.sampled_from([0, 1, -9, None]))
            events.append(Exited(role=role, replica_id=k, attempt=attempt, exit_code=code))
    return roles, events, draw(st.integers(0, len(events)))


def _decided(fsm: AppFSM) -> tuple[object, ...]:
    replicas = tuple(
        (key, m.state, m.attempt, m.restarts, m.exit_code)
        for key, m in sorted(fsm.replicas.items())
    )
    return fsm.state, fsm.num_restarts, dict(fsm.role_restarts), replicas


@settings(max_examples=300, deadline=None)
@given(runs_split())
def test_an_app_resumed_from_its_records_decides_as_if_never_interrupted(
    case: tuple[list[RoleSpec], list[ReplicaEvent], int],
) -> None:
    """``attach``: an owner dies after ``split`` events; a new one resumes from its records
    (the status and the journal) and sees the rest. Every decision, and every transition
    from then on, is the one the first owner would have made."""
    roles, events, split = case
    whole = AppFSM(roles, clock=lambda: 0.0)
    for e in events[:split]:
        whole.apply(e)
    resumed = AppFSM(roles, clock=lambda: 0.0)
    resumed.resume(whole.snapshot(), list(whole.history))
    assert _decided(resumed) == _decided(whole)
    assert resumed.history == whole.history  # nothing invented at the take-over
    for e in events[split:]:
        assert whole.apply(e) == resumed.apply(e)
        assert _decided(resumed) == _decided(whole)
    assert resumed.history == whole.history
