"""Case memory_apps: a Supervisor's RSS after 100 short apps against after N (10,000).

A service that embeds the Supervisor runs for weeks: every app that ended must
leave memory (its records stay on disk for ``describe``). One child runs N
short local apps (``true``, one replica each) in one Supervisor, a few in
flight at a time, each waited for; after the first 100 and after all N it
collects garbage and reads its own RSS (``VmRSS``). The target: RSS after N
at most 10 MB above RSS after 100. Nothing is asserted; the report gives the
figures and the verdict.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import anyio

from bench.util import Json, child_parser, raise_nofile, run_child, scratch, write_json

TARGET_GROWTH_MIB = 10.0
FIRST = 100


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _measure(n: int, in_flight: int, tmp: Path) -> Json:
    from supervisor import AppDef, Role, Supervisor

    app = AppDef(name="short", roles=[Role(name="r", entrypoint="true")])
    samples: list[tuple[int, float, int]] = []
    async with Supervisor(session="bench", state_dir=tmp / "state") as sv:
        done = 0
        limiter = anyio.Semaphore(in_flight)

        async def one() -> None:
            nonlocal done
            try:
                handle = await sv.submit(app, "local")
                await sv.wait(handle)
            finally:
                limiter.release()
            done += 1

        async def sample() -> None:
            gc.collect()
            await anyio.sleep(0.5)  # the last apps' actors leave memory
            gc.collect()
            samples.append((done, rss_mib(), len(sv.followed())))

        for target in (FIRST, n):
            async with anyio.create_task_group() as tg:
                while done + (in_flight - limiter.value) < target:
                    await limiter.acquire()
                    tg.start_soon(one)
            await sample()
    (first, rss_first, held_first), (last, rss_last, held_last) = samples
    return {
        "apps_first": first,
        "rss_first_mib": rss_first,
        "held_first": held_first,
        "apps_last": last,
        "rss_last_mib": rss_last,
        "held_last": held_last,
        "growth_mib": rss_last - rss_first,
        "per_app_kib": (rss_last - rss_first) * 1024 / max(1, last - first),
    }


def child() -> None:
    parser = child_parser(__doc__ or "")
    parser.add_argument("--in-flight", type=int, default=8)
    args = parser.parse_args()
    raise_nofile()
    with scratch() as tmp:
        result = anyio.run(_measure, args.n, args.in_flight, tmp)
    write_json(args.out, result)


def run_case(plan: dict[str, Any]) -> Json:
    rows: list[Json] = []
    for impl, n, reps in plan["runs"]:
        for _ in range(reps):
            result = run_child(
                "case_memory_apps",
                ["--impl", impl, "--n", str(n), "--reps", "1",
                 "--in-flight", str(plan.get("in_flight", 8))],
                timeout=plan.get("timeout_s", 1800),
            )  # fmt: skip
            rows.append({"impl": impl, "n": n, **result})
    return {
        "title": "memory: RSS after 100 short apps against after N, in one Supervisor",
        "unit": "MiB",
        "target_growth_mib": TARGET_GROWTH_MIB,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
