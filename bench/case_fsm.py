"""Case 7, fsm: CPU per replica event through the state machines, and building them.

No process is started: this measures the decision core alone. Per event, an
app of N replicas (one role) gets every replica's ``Submitted``, then every
``Started``, then every ``Exited(0)`` (3N events; ``Started`` from SUBMITTED
fills in PENDING, and the app's own transitions ride along), timed with
``time.process_time`` over enough apps to make about 3,000 events, the best
of the repetitions' medians kept as the figure. Implementations:

* ``asupervisor``: ``AppFSM.apply`` (what the app actor runs per event);
* ``transitions`` (baseline): ``transitions``' synchronous ``Machine`` with the
  replica table as strings, the N replicas as its models, one trigger method
  called per event (``model.submit()``, ...): the floor of firing through that
  library as it is used out of the box;
* ``dict``: one dict lookup ``(state, trigger) -> state`` per event, the floor
  of any table-driven machine in Python.

Build: the CPU to create the machines of a 1,000-replica app before its first
event (``AppFSM(roles)``; for ``transitions``, a ``Machine`` with 1,000
models). It runs synchronously, so it is also the longest block of the event
loop it causes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.util import Json, add_ratios, child_parser, run_rows, summarize, write_json

BASELINE = "transitions"
IMPLS = {
    "asupervisor": "asupervisor `AppFSM.apply` (per replica event)",
    "transitions": "baseline: `transitions` `Machine`, one trigger per event",
    "dict": "a dict lookup `(state, trigger) -> state` per event",
}
TRIGGERS = ("submit", "start", "succeed")  # one per event: Submitted, Started, Exited(0)
_EVENTS_PER_SAMPLE = 3000


def _asupervisor(n: int) -> tuple[float, float]:
    """(CPU seconds per event, CPU seconds to build the app's machines)."""
    from supervisor.events import Exited, ReplicaEvent, Started, Submitted
    from supervisor.fsm.app import AppFSM, RoleSpec

    events: list[ReplicaEvent] = [Submitted(role="r", replica_id=k) for k in range(n)]
    events += [Started(role="r", replica_id=k, attempt=0, hostname="h") for k in range(n)]
    events += [Exited(role="r", replica_id=k, attempt=0, exit_code=0) for k in range(n)]
    apps = max(1, _EVENTS_PER_SAMPLE // len(events))
    spent = built = 0.0
    for _ in range(apps):
        t0 = time.process_time()
        fsm = AppFSM([RoleSpec("r", n)])
        t1 = time.process_time()
        for event in events:
            fsm.apply(event)
        spent += time.process_time() - t1
        built += t1 - t0
        if fsm.state.name != "SUCCEEDED":
            raise RuntimeError(f"app ended {fsm.state.name}")
    return spent / (apps * len(events)), built / apps


def _transitions(n: int) -> tuple[float, float]:
    from transitions import Machine

    from supervisor.fsm.tables import REPLICA_TRANSITIONS

    rows = [
        {"trigger": r.trigger, "source": [s.name for s in r.source], "dest": r.dest.name}
        for r in REPLICA_TRANSITIONS
    ]
    # submit, start straight from SUBMITTED, succeed: one trigger per event.
    rows.append({"trigger": "start", "source": ["SUBMITTED"], "dest": "RUNNING"})
    states = ["UNSUBMITTED", "SUBMITTED", "PENDING", "RUNNING"]
    states += ["SUCCEEDED", "FAILED", "CANCELLED", "UNKNOWN"]
    apps = max(1, _EVENTS_PER_SAMPLE // (3 * n))
    spent = built = 0.0
    for _ in range(apps):

        class Model:
            pass

        models: list[Any] = [Model() for _ in range(n)]
        t0 = time.process_time()
        Machine(
            model=models,
            states=states,
            transitions=rows,
            initial="UNSUBMITTED",
            auto_transitions=False,
        )
        t1 = time.process_time()
        for trigger in TRIGGERS:
            for model in models:
                getattr(model, trigger)()
        spent += time.process_time() - t1
        built += t1 - t0
    return spent / (apps * 3 * n), built / apps


def _dict(n: int) -> tuple[float, float]:
    table = {("UNSUBMITTED", "submit"): "SUBMITTED", ("SUBMITTED", "start"): "RUNNING"}
    table[("RUNNING", "succeed")] = "SUCCEEDED"
    apps = max(1, _EVENTS_PER_SAMPLE // (3 * n))
    spent = built = 0.0
    for _ in range(apps):
        t0 = time.process_time()
        states = ["UNSUBMITTED"] * n
        t1 = time.process_time()
        for trigger in TRIGGERS:
            for k in range(n):
                states[k] = table[(states[k], trigger)]
        spent += time.process_time() - t1
        built += t1 - t0
    return spent / (apps * 3 * n), built / apps


MEASURE = {"asupervisor": _asupervisor, "transitions": _transitions, "dict": _dict}


def child() -> None:
    args = child_parser(__doc__ or "").parse_args()
    measure = MEASURE[args.impl]
    measure(args.n)  # warm: imports, the tables' paths, the allocator
    per_event: list[float] = []
    build: list[float] = []
    for _ in range(args.reps):
        event_s, build_s = measure(args.n)
        per_event.append(event_s)
        build.append(build_s)
    write_json(args.out, {"per_event_s": per_event, "build_s": build})


def _fill(row: Json, result: Json, n: int) -> None:
    row["stats"] = summarize(result["per_event_s"])
    row["best_us"] = min(result["per_event_s"]) * 1e6
    row["build"] = summarize(result["build_s"])
    row["build_median_ms"] = statistics.median(result["build_s"]) * 1e3


def run_case(plan: dict[str, Any]) -> Json:
    rows = run_rows("case_fsm", plan, _fill)
    add_ratios(rows, BASELINE)
    add_ratios(rows, BASELINE, stat="build")
    return {"baseline": BASELINE, "impls": IMPLS, "rows": rows}


if __name__ == "__main__":
    child()
