"""Run the benchmark cases and write their results as JSON.

    bench/.venv/bin/python -m bench.run [--quick] [--cases wait,submit,...,list_index,apps]

Normally started by ``bash scripts/bench``, which also builds ``bench/.venv``
and renders the report. Writes ``bench/results/<date>.json`` and
``bench/results/latest.json`` (``--quick``: ``<date>-quick.json`` and
``latest-quick.json``) and prints the path of the file to render on stdout;
progress goes to stderr. The results file is rewritten after every case, so
an interrupted run keeps what it measured. A run of some of the cases
(``--cases``) merges into the existing ``latest*.json``: the other cases keep
their last results (``merged_from`` says from which run), and the path printed
is then that of ``latest*.json``, so that the report keeps every case.

Each entry of a plan's ``runs`` is ``(implementation, N, repetitions)``. The
full plan keeps the whole run near a quarter of an hour on 2 cores: TorchX's
slow paths (its 10 s ``wait`` poll, its 1,000-replica runs, which spend most
of their time joining one log thread per replica) get fewer repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    case_apps,
    case_docker,
    case_fsm,
    case_list_index,
    case_logs,
    case_loop_lag,
    case_memory_apps,
    case_slurm,
    case_submit,
    case_supervise,
    case_wait,
)
from bench.util import REPO, Json, kept_scratch, log, machine_info, write_json

RESULTS = REPO / "bench" / "results"
PUBLISHED = REPO / "docs" / "bench" / "results.json"
"""The run docs/benchmarks.md shows (bench.report copies it there)."""

CASES: dict[str, Callable[[dict[str, Any]], Json]] = {
    "wait": case_wait.run_case,
    "submit": case_submit.run_case,
    "supervise": case_supervise.run_case,
    "logs": case_logs.run_case,
    "slurm": case_slurm.run_case,
    "docker": case_docker.run_case,
    "fsm": case_fsm.run_case,
    "loop_lag": case_loop_lag.run_case,
    "memory_apps": case_memory_apps.run_case,
    "list_index": case_list_index.run_case,
    "apps": case_apps.run_case,
}

# ``rounds``: each row's repetitions over that many children, the rows of one N side by
# side in each round (``bench.util.run_rows``), for the cases whose targets are ratios.
FULL: dict[str, dict[str, Any]] = {
    "wait": {
        "rounds": 3,
        "runs": [
            *(("asupervisor", n, 5) for n in (1, 10, 100, 1000)),
            *(("anyio", n, 5) for n in (1, 10, 100, 1000)),
            *(("torchx-wait1", n, 5) for n in (1, 10, 100)),
            ("torchx-wait1", 1000, 1),
            *(("torchx-wait10", n, 3) for n in (1, 10)),
        ],
    },
    "submit": {
        "rounds": 3,
        # 15 repetitions up to 100 replicas (a second or two each): the medians of 5 moved
        # by 10 % from run to run at 100, across a target's line.
        "runs": [
            *(
                (impl, n, 15 if n <= 100 else 5)
                for impl in ("popen", "anyio-open-process", "asupervisor")
                for n in (1, 10, 100, 1000)
            ),
            # One Supervisor, 0.3 s quiet before each submit: a service's submits.
            *(("asupervisor-service", n, 15) for n in (1, 10)),
            *(("torchx", n, 15) for n in (1, 10, 100)),
            ("torchx", 1000, 3),
        ],
    },
    "supervise": {
        "seconds": 10.0,
        "runs": [
            ("anyio", 100, 3),
            ("asupervisor", 100, 3),
            ("asupervisor-cli", 100, 3),
            ("asupervisor-nologs", 100, 2),
            ("torchx-cli", 100, 3),
            ("anyio", 1000, 3),
            ("asupervisor", 1000, 3),
            ("asupervisor-cli", 1000, 2),
            ("asupervisor-nologs", 1000, 2),
            ("torchx-cli", 1000, 1),
        ],
    },
    "logs": {
        "lines": 1_000_000,
        "reps": 5,
        "torchx_reps": 5,
        "tail_lines": 50,
        "tail_gap_s": 0.05,
        "tail_reps": 3,
    },
    # Needs the cluster of scripts/slurm-cluster, as root. About 8 minutes: two 60 s
    # windows per N, one idle window, five jobs of `sleep 3`.
    "slurm": {"ns": [1, 10, 50], "window_s": 60.0, "idle_s": 20.0, "delay_reps": 5},
    # Needs dockerd of scripts/docker-engines (as root). About 3 minutes.
    "docker": {
        "runs": [
            *((impl, n, 5) for impl in ("asupervisor", "torchx", "docker-py") for n in (1, 10)),
            ("asupervisor-log-f", 1, 5),
        ],
    },
    # No process started: the decision core alone, about 1 minute.
    "fsm": {
        "runs": [(impl, n, 7) for impl in case_fsm.IMPLS for n in (1, 10, 100, 1000)],
    },
    # 1,000 replicas started, 100 log followers: about a minute. The second row's replicas
    # print every 100 ms, not 10: the same library work on a machine that is not saturated.
    "loop_lag": {
        "runs": [("asupervisor", 1000, 3), ("asupervisor", 1000, 3, 0.1)],
        "followers": 100,
        "idle_s": 2.0,
        "follow_s": 3.0,
    },
    # 10,000 short apps (`true`) in one Supervisor: about 6 minutes on 2 cores.
    "memory_apps": {"runs": [("asupervisor", 10_000, 1)], "in_flight": 8},
    # 1,000 short apps run, then listed 5 times per query: about a minute.
    "list_index": {"runs": [("asupervisor", 1000, 5)]},
    # 1,000 replicas of `true` as one app, then as 1,000 apps: under a minute.
    "apps": {"rounds": 3, "runs": [(impl, 1000, 3) for impl in case_apps.IMPLS]},
}

QUICK: dict[str, dict[str, Any]] = {
    "wait": {
        "runs": [
            *(("asupervisor", n, 2) for n in (1, 10)),
            *(("anyio", n, 2) for n in (1, 10)),
            *(("torchx-wait1", n, 2) for n in (1, 10)),
            ("torchx-wait10", 1, 1),
        ],
    },
    "submit": {
        "runs": [
            *(
                (impl, n, 2)
                for impl in ("popen", "anyio-open-process", "asupervisor", "torchx")
                # N=100: the Popen target is about N >= 100.
                for n in (1, 10, 100)
            ),
            ("asupervisor-service", 1, 2),
        ],
    },
    "supervise": {
        "seconds": 4.0,
        "runs": [
            (impl, 10, 1)
            for impl in (
                "anyio",
                "asupervisor",
                "asupervisor-cli",
                "asupervisor-nologs",
                "torchx-cli",
            )
        ],
    },
    "logs": {
        "lines": 100_000,
        "reps": 2,
        "torchx_reps": 1,
        "tail_lines": 10,
        "tail_gap_s": 0.05,
        "tail_reps": 1,
    },
    "slurm": {"ns": [1, 10], "window_s": 10.0, "idle_s": 5.0, "delay_reps": 2},
    "docker": {
        "runs": [
            *((impl, n, 2) for impl in ("asupervisor", "torchx", "docker-py") for n in (1, 10)),
            ("asupervisor-log-f", 1, 2),
        ],
    },
    "fsm": {
        "runs": [(impl, n, 3) for impl in case_fsm.IMPLS for n in (1, 10, 100, 1000)],
    },
    "loop_lag": {
        "runs": [("asupervisor", 200, 1)],
        "followers": 20,
        "idle_s": 1.0,
        "follow_s": 2.0,
    },
    "memory_apps": {"runs": [("asupervisor", 1000, 1)], "in_flight": 8},
    "list_index": {"runs": [("asupervisor", 200, 2)]},
    "apps": {"runs": [(impl, 100, 1) for impl in case_apps.IMPLS]},
}


def _plan_json(plan: dict[str, dict[str, Any]]) -> Json:
    return {
        case: {k: ([list(r) for r in v] if k == "runs" else v) for k, v in spec.items()}
        for case, spec in plan.items()
    }


SLOW_SCRATCH_US = 100.0
"""Creating a small file in the scratch directory costs about 20 us on a file system at
rest; past this, every figure that writes files is inflated (see ``_warn_if_scratch_is_slow``)."""


def _warn_if_scratch_is_slow(scratch: Json) -> None:
    """Say so before a run whose file-writing figures would not be comparable.

    On ext4 without a journal, creating a file skips every inode freed in the last
    30 s: after a test run or another bench run, it may cost 0.2-1 ms instead of 20 us
    for a while (see "Running" in docs/benchmarks.md).
    """
    cost = float(scratch["file_create_us"])
    if cost > SLOW_SCRATCH_US:
        log(
            f"warning: creating a file in {scratch['dir']} takes {cost:.0f} us (about 20 on a"
            " file system at rest): the figures of cases that write files will be inflated;"
            " see 'Running' in docs/benchmarks.md"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny N, few repetitions")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated subset of: {', '.join(CASES)}",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    selected = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in selected if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")

    plan = QUICK if args.quick else FULL
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    suffix = "-quick" if args.quick else ""
    args.results_dir.mkdir(parents=True, exist_ok=True)
    dated = args.results_dir / f"{stamp}{suffix}.json"
    latest = args.results_dir / f"latest{suffix}.json"
    shown = ["bash", "scripts/bench", *(argv if argv is not None else sys.argv[1:])]
    results: Json = {
        "schema": 1,
        "command": shlex.join(shown),
        "quick": args.quick,
        "machine": machine_info(),
        "plan": _plan_json({c: plan[c] for c in selected}),
        "cases": {},
    }
    _warn_if_scratch_is_slow(results["machine"]["scratch"])
    started = time.monotonic()
    with kept_scratch():
        _run_cases(selected, plan, results, dated, started)
    results["machine"]["loadavg_at_end"] = list(os.getloadavg())
    results["elapsed_s"] = time.monotonic() - started
    write_json(dated, results)
    rendered = dated
    # A fresh clone has no latest.json: a --cases run then merges over the published run.
    earlier = latest if latest.exists() or args.quick else PUBLISHED
    merged = merge_into_latest(earlier, results) if set(selected) != set(CASES) else None
    if merged is not None:
        write_json(latest, merged)
        rendered = latest
        log(f"merged into {latest}: kept {', '.join(merged['merged_from'])} from earlier runs")
    else:
        write_json(latest, results)
    log(f"all cases done in {results['elapsed_s'] / 60:.1f} min: {dated}")
    print(rendered)
    return 0


def _run_cases(
    selected: list[str],
    plan: dict[str, dict[str, Any]],
    results: Json,
    dated: Path,
    started: float,
) -> None:
    """Each selected case in turn, ``results`` written after each (a later failure keeps them)."""
    for name in selected:
        log(f"case {name} ...")
        t0 = time.monotonic()
        try:
            case = CASES[name](plan[name])
        except Exception:
            case = {"error": traceback.format_exc(limit=5)}
            log(f"case {name} failed:\n{case['error']}")
        case["elapsed_s"] = time.monotonic() - t0
        results["cases"][name] = case
        log(f"case {name} done in {case['elapsed_s']:.0f} s")
        results["elapsed_s"] = time.monotonic() - started
        write_json(dated, results)


def merge_into_latest(latest: Path, results: Json) -> Json | None:
    """``results`` (some of the cases) over the cases of ``latest``; None if nothing to keep.

    The merged file's run facts (machine, command, elapsed) are this run's;
    ``merged_from`` names, for every case kept from an earlier run, that run.
    """
    try:
        previous: Json = json.loads(latest.read_text())
    except (OSError, ValueError):
        return None
    if previous.get("quick") != results["quick"] or not isinstance(previous.get("cases"), dict):
        return None
    earlier = previous.get("merged_from", {})
    machine = previous.get("machine", {})
    run_of_previous = {
        "date": machine.get("date"),
        "command": previous.get("command"),
        "git_commit": machine.get("git_commit"),
    }
    kept = [name for name in previous["cases"] if name not in results["cases"]]
    if not kept:
        return None
    order = list(CASES) + [name for name in previous["cases"] if name not in CASES]
    cases: Json = {}
    plan: Json = {}
    merged_from: Json = {}
    for name in order:
        if name in results["cases"]:
            cases[name] = results["cases"][name]
            plan[name] = results["plan"].get(name)
        elif name in previous["cases"]:
            cases[name] = previous["cases"][name]
            plan[name] = previous.get("plan", {}).get(name)
            merged_from[name] = earlier.get(name, run_of_previous)
    return {
        **results,
        "plan": {k: v for k, v in plan.items() if v is not None},
        "cases": cases,
        "merged_from": merged_from,
    }


if __name__ == "__main__":
    sys.exit(main())
