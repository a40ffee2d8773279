from __future__ import annotations

from pathlib import Path

import pytest
from transitions.core import MachineError

from supervisor.fsm.diagram import render_fsm_doc
from supervisor.fsm.ingest import APP_PATHS, REPLICA_PATHS, Drop, Plan, Steps
from supervisor.fsm.machines import APP_ENGINE, REPLICA_ENGINE, AppModel, ReplicaModel
from supervisor.states import ReplicaState

R = ReplicaState


def plan(current: ReplicaState, target: ReplicaState, final: str) -> Plan:
    return REPLICA_PATHS[(current, target, frozenset({final}))]


DOC = Path(__file__).resolve().parents[2] / "docs" / "fsm.md"


def test_committed_diagram_matches_the_tables() -> None:
    assert DOC.read_text() == render_fsm_doc(), (
        "run: python -m supervisor.fsm.diagram > docs/fsm.md"
    )


def test_skipped_states_are_filled_in() -> None:
    assert plan(R.SUBMITTED, R.RUNNING, "start") == Steps(("queue", "start"))
    assert plan(R.UNSUBMITTED, R.SUCCEEDED, "succeed") == Steps(
        ("submit", "queue", "start", "succeed")
    )


def test_stale_duplicate_and_absorbed_events_are_dropped() -> None:
    assert plan(R.RUNNING, R.PENDING, "queue") == Drop("stale")
    assert plan(R.RUNNING, R.RUNNING, "start") == Drop("duplicate")
    assert plan(R.FAILED, R.RUNNING, "start") == Drop("absorbed")


def test_requeue_is_a_decision_not_an_inference() -> None:
    assert plan(R.RUNNING, R.PENDING, "requeue") == Steps(("requeue",))
    # Only a Requeued report leads back to PENDING: a late Queued cannot.
    assert plan(R.RUNNING, R.PENDING, "queue") == Drop("stale")
    # A requeue reported before the start was seen implies the run it ended.
    assert plan(R.SUBMITTED, R.PENDING, "requeue") == Steps(("queue", "start", "requeue"))


def test_every_precomputed_path_is_one_the_machine_takes() -> None:
    """The paths are worked out from the tables once; the engine must accept each step."""
    for (current, target, _), step in REPLICA_PATHS.items():
        if isinstance(step, Drop):
            continue
        model = ReplicaModel("r", 0)
        model.state = current
        for trigger in step.triggers:
            REPLICA_ENGINE.fire(model, trigger)
        assert model.state is target
    for (app_current, app_target, _), app_step in APP_PATHS.items():
        if isinstance(app_step, Drop):
            continue
        app = AppModel()
        app.state = app_current
        for trigger in app_step.triggers:
            APP_ENGINE.fire(app, trigger)
        assert app.state is app_target


def test_the_engine_refuses_a_transition_the_table_does_not_list() -> None:
    model = ReplicaModel("r", 0)
    with pytest.raises(MachineError):
        REPLICA_ENGINE.fire(model, "start")  # UNSUBMITTED has no start
    assert model.state is R.UNSUBMITTED
