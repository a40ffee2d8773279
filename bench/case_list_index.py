"""Case list_index: ``Supervisor.list`` of N (1,000) settled local apps, from the index.

One child runs N short local apps (``true``), then, in a fresh Supervisor of
another session (as the CLI would be), times ``await sv.list("local")`` and
the same with filters (``state=``, ``name=``, ``limit=20``), each several times.
A settled app is listed from its index entry alone (a ``stat`` of its records
shows them untouched), so the figure grows with N index entries, not with the
records behind them. The target: N = 1,000 listed in at most 100 ms. Nothing
is asserted; the report gives the figures and the verdict.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import anyio

from bench.util import (
    Json,
    bounded,
    child_parser,
    raise_nofile,
    run_child,
    scratch,
    summarize,
    write_json,
)

TARGET_S = 0.100
QUERIES: dict[str, dict[str, Any]] = {
    "all": {},
    "state": {"state": "SUCCEEDED"},
    "name": {"name": "short-1*"},
    "limit": {"limit": 20},
}


async def _measure(n: int, reps: int, tmp: Path) -> Json:
    from supervisor import AppDef, Role, Supervisor

    state_dir = tmp / "state"
    async with Supervisor(session="bench", state_dir=state_dir) as sv:

        async def one(i: int) -> None:
            app = AppDef(name=f"short-{i}", roles=[Role(name="r", entrypoint="true")])
            await sv.wait(await sv.submit(app, "local"))

        await bounded(n, 16, one)
    times: dict[str, list[float]] = {q: [] for q in QUERIES}
    counts: dict[str, int] = {}
    async with Supervisor(session="reader", state_dir=state_dir) as reader:
        for _ in range(reps):
            for query, kwargs in QUERIES.items():
                started = time.perf_counter()
                apps = await reader.list("local", **kwargs)
                times[query].append(time.perf_counter() - started)
                counts[query] = len(apps)
    return {"seconds": times, "counts": counts}


def child() -> None:
    parser = child_parser(__doc__ or "")
    args = parser.parse_args()
    raise_nofile()
    with scratch() as tmp:
        result = anyio.run(_measure, args.n, args.reps, tmp)
    write_json(args.out, result)


def run_case(plan: dict[str, Any]) -> Json:
    rows: list[Json] = []
    for impl, n, reps in plan["runs"]:
        result = run_child(
            "case_list_index",
            ["--impl", impl, "--n", str(n), "--reps", str(reps)],
            timeout=plan.get("timeout_s", 1800),
        )
        row: Json = {"impl": impl, "n": n, "reps": reps, "wall_s": result.get("wall_s")}
        if "error" in result:
            row["error"] = result["error"]
        else:
            row["counts"] = result["counts"]
            for query, samples in result["seconds"].items():
                row[query] = summarize(samples)
            row["median_all_s"] = statistics.median(result["seconds"]["all"])
        rows.append(row)
    return {
        "title": "list: N settled local apps listed from the index",
        "unit": "s",
        "target_s": TARGET_S,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
