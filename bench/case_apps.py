"""Case 12, CPU per replica: N one-replica apps against one app of N replicas.

A service that runs many small jobs submits them as one app each, not as one
gang: every app pays for its own dry run, records on disk, actor, state
machine and wait, where one app of N replicas pays for them once. This case
says how much that costs per replica (target: N one-replica apps within 2x
the CPU per replica of one N-replica app).

Implementations, each in a child process of its own, in
``async with Supervisor(session="bench", state_dir=...)``:

* ``one-app`` (baseline): one app of N replicas of ``true`` (one Role,
  ``num_replicas=N``): ``await sv.submit(...)``, then ``await sv.wait(...)``;
* ``many-apps``: N apps of one replica of ``true``, each submitted and
  waited for in a task of its own, at most ``IN_FLIGHT`` (32) at a time (a
  new task starts only once one ended: ``bench.util.bounded``).

Each repetition opens a fresh Supervisor with a fresh ``state_dir`` (the
apps of earlier repetitions never weigh on later ones) and runs one warm-up
app of one replica first, so imports and the start of asupervisor's reaper
stay out of the figure. The figure is the CPU, from before the first submit
to after the last wait returned, of the supervising process
(``getrusage(RUSAGE_SELF)``: every thread, the clock of
``time.process_time()``) plus that of its helper processes (asupervisor's
reaper, from ``/proc/<pid>/stat`` in 10 ms ticks), divided by N. The
replicas' own CPU is never counted: they are the reaper's children, and its
``cutime`` is never read. Nothing is asserted; the report gives the figures,
the ratio many-apps / one-app at the same N and the verdict.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from bench.util import (
    HelperCpu,
    Json,
    add_ratios,
    bounded,
    child_parser,
    cpu_self,
    raise_nofile,
    run_rows,
    scratch,
    summarize,
    write_json,
)

if TYPE_CHECKING:  # imported in the child only, as every case does
    from supervisor import AppDef, Supervisor

BASELINE = "one-app"
IN_FLIGHT = 32
IMPLS = {
    "one-app": "baseline: one app of N replicas, `submit` + `wait`",
    "many-apps": f"N apps of one replica, `submit` + `wait` each, {IN_FLIGHT} in flight",
}
TARGET_RATIO = 2.0
REPLICA_COMMANDS = frozenset({"true"})
"""Command names of the replicas: every other child of the child process is a helper."""


async def _submit_and_wait(sv: Supervisor, app: AppDef) -> None:
    status = await sv.wait(await sv.submit(app, "local"))
    if status.state.name != "SUCCEEDED":
        raise RuntimeError(f"app ended {status.state.name}: {status.msg}")


async def _repetition(impl: str, n: int, state_dir: Path) -> Json:
    """One measurement, in a Supervisor of its own whose reaper a warm-up app started."""
    from supervisor import AppDef, Role, Supervisor

    single = AppDef(name="single", roles=[Role(name="r", entrypoint="true")])
    gang = AppDef(name="gang", roles=[Role(name="r", entrypoint="true", num_replicas=n)])

    async with Supervisor(session="bench", state_dir=state_dir) as sv:

        async def one(_: int) -> None:
            await _submit_and_wait(sv, single)

        await _submit_and_wait(sv, single)
        helper = HelperCpu(REPLICA_COMMANDS)
        helper.find()
        gc.collect()  # the warm-up's garbage is no part of the measured apps' cost
        cpu0, helper0, wall0 = cpu_self(), helper.read(), time.perf_counter()
        if impl == "one-app":
            await _submit_and_wait(sv, gang)
        else:
            await bounded(n, IN_FLIGHT, one)
        wall1, cpu1, helper1 = time.perf_counter(), cpu_self(), helper.read()
    return {
        "cpu_s": (cpu1 - cpu0) + (helper1 - helper0),
        "helper_cpu_s": helper1 - helper0,
        "wall_s": wall1 - wall0,
        "helpers": sorted(set(helper.names.values())),
    }


async def _measure(impl: str, n: int, reps: int, tmp: Path) -> list[Json]:
    """Every repetition with a fresh ``state_dir``: earlier apps never weigh on later ones."""
    return [await _repetition(impl, n, tmp / f"state-{rep}") for rep in range(reps)]


def child() -> None:
    parser = child_parser(__doc__ or "")
    args = parser.parse_args()
    if args.impl not in IMPLS:
        parser.error(f"unknown --impl {args.impl}")
    raise_nofile()
    with scratch() as tmp:
        samples = anyio.run(_measure, args.impl, args.n, args.reps, tmp)
    write_json(args.out, {"samples": samples})


def _fill(row: Json, result: Json, n: int) -> None:
    samples = result["samples"]
    row["stats"] = summarize([s["cpu_s"] / n for s in samples])
    row["helper_per_replica"] = summarize([s["helper_cpu_s"] / n for s in samples])
    row["cpu"] = summarize([s["cpu_s"] for s in samples])
    row["elapsed"] = summarize([s["wall_s"] for s in samples])
    row["helpers"] = sorted({name for s in samples for name in s["helpers"]})


def run_case(plan: dict[str, Any]) -> Json:
    rows = run_rows("case_apps", plan, _fill)
    add_ratios(rows, BASELINE)
    return {
        "title": "CPU per replica: N one-replica apps against one app of N replicas",
        "unit": "s",
        "baseline": BASELINE,
        "impls": IMPLS,
        "in_flight": IN_FLIGHT,
        "target_ratio": TARGET_RATIO,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
