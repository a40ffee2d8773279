"""Mermaid diagrams rendered from the transition tables (see docs/fsm.md)."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.fsm.tables import APP_TRANSITIONS, REPLICA_TRANSITIONS, S, TransitionRow
from supervisor.states import TERMINAL

__all__ = ["mermaid", "render_fsm_doc"]


def mermaid(table: Sequence[TransitionRow[S]], title: str) -> str:
    lines = ["```mermaid", "---", f"title: {title}", "---", "stateDiagram-v2"]
    lines.append("    [*] --> UNSUBMITTED")
    for row in table:
        for src in row.source:
            lines.append(f"    {src.name} --> {row.dest.name}: {row.trigger}")
    for state in sorted(TERMINAL):
        lines.append(f"    {state} --> [*]")
    lines.append("```")
    return "\n".join(lines)


def render_fsm_doc() -> str:
    """The whole of docs/fsm.md; a test checks the committed file equals this."""
    return "\n".join(
        [
            "# State machines",
            "",
            "Generated from `supervisor/fsm/tables.py` by",
            "`python -m supervisor.fsm.diagram > docs/fsm.md`; do not edit by hand.",
            "",
            "Terminal states (SUCCEEDED, FAILED, CANCELLED) absorb every later event.",
            "`submit`, `queue` and `start` may be taken in a row to fill in states a",
            "backend skipped; `restart` (a retry), `requeue` (preemption, node failure)",
            "and `cancel` happen only on a decision, never inferred.",
            "",
            "## Replica",
            "",
            mermaid(REPLICA_TRANSITIONS, "replica"),
            "",
            "## App",
            "",
            "The app's state is derived from its replicas' states",
            "(`supervisor/fsm/rules.py`): terminal only once every replica is;",
            "FAILED if any replica failed for good; CANCELLED after a cancel;",
            "SUCCEEDED when every replica exited 0. Otherwise UNKNOWN if any replica",
            "is; RUNNING if any runs or has finished (replicas that a cancel ended while",
            "they waited do not start an app that never ran: it keeps its state until",
            "the rest end); then PENDING, then SUBMITTED. The app's machine takes the",
            "shortest path the table allows to that state.",
            "",
            mermaid(APP_TRANSITIONS, "app"),
            "",
        ]
    )


if __name__ == "__main__":
    print(render_fsm_doc(), end="")
