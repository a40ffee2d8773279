from __future__ import annotations

from pathlib import Path

from supervisor.fsm.diagram import render_fsm_doc
from supervisor.fsm.ingest import Drop, Steps, plan
from supervisor.fsm.tables import REPLICA_TRANSITIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "fsm.md"


def test_committed_diagram_matches_the_tables() -> None:
    assert DOC.read_text() == render_fsm_doc(), (
        "run: python -m supervisor.fsm.diagram > docs/fsm.md"
    )


def test_skipped_states_are_filled_in() -> None:
    assert plan(REPLICA_TRANSITIONS, "SUBMITTED", "RUNNING", ("start",)) == Steps(
        ("queue", "start")
    )
    assert plan(REPLICA_TRANSITIONS, "UNSUBMITTED", "SUCCEEDED", ("succeed",)) == Steps(
        ("submit", "queue", "start", "succeed")
    )


def test_stale_duplicate_and_absorbed_events_are_dropped() -> None:
    assert plan(REPLICA_TRANSITIONS, "RUNNING", "PENDING", ("queue",)) == Drop("stale")
    assert plan(REPLICA_TRANSITIONS, "RUNNING", "RUNNING", ("start",)) == Drop("duplicate")
    assert plan(REPLICA_TRANSITIONS, "FAILED", "RUNNING", ("start",)) == Drop("absorbed")


def test_requeue_is_a_decision_not_an_inference() -> None:
    assert plan(REPLICA_TRANSITIONS, "RUNNING", "PENDING", ("requeue",)) == Steps(("requeue",))
    # Only a Requeued report leads back to PENDING: a late Queued cannot.
    assert plan(REPLICA_TRANSITIONS, "RUNNING", "PENDING", ("queue",)) == Drop("stale")
    # A requeue reported before the start was seen implies the run it ended.
    assert plan(REPLICA_TRANSITIONS, "SUBMITTED", "PENDING", ("requeue",)) == Steps(
        ("queue", "start", "requeue")
    )
