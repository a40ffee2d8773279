"""Render a results JSON into markdown tables and PNG plots.

    bench/.venv/bin/python -m bench.report [RESULTS.json] [--out-md PATH] [--plots DIR]

By default a full run renders into ``docs/benchmarks.md`` and
``docs/bench/*.png``; a ``--quick`` run into ``bench/results/quick/`` so that
smoke runs never overwrite the committed figures. In an existing markdown
file only the part between the ``BEGIN GENERATED`` and ``END GENERATED``
markers is replaced: the hand-written analysis around it stays.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.case_apps import TARGET_RATIO as APPS_TARGET_RATIO
from bench.util import REPO, Json, median_of, ratio, write_json

BEGIN = "<!-- BEGIN GENERATED (bench/report.py) -->"
END = "<!-- END GENERATED -->"

WAIT_TARGET_RATIO = 2.0
"""asupervisor's wait latency over a bare anyio ``process.wait()``'s, at the same N."""
SUBMIT_TORCHX_TARGET_RATIO = 1.0
"""asupervisor's submit latency over TorchX ``local_cwd``'s: faster at every N."""
SUBMIT_POPEN_TARGET_RATIO = 1.5
SUBMIT_POPEN_FROM_N = 100
"""The Popen target is set for N >= 100 only: below, the fixed cost of an app weighs most."""
CPU_TARGET_PCT = 1.0
LOG_TARGET_RATE = 1_000_000
LOG_RATE_BEFORE_AIOFILES = 2_310_000
"""Lines/s with the ``regex`` mode's pattern before the followers read through aiofiles
(the run of 2026-11-23 19:24Z): issue 15 asks the rate to stay within 10 % of it."""
SLURM_JOB_INFO_PER_TICK = 1.0
SLURM_END_TARGET_S = 1.0
DOCKER_WAIT_TARGET_S = 0.050
DOCKER_FOLLOW_TARGET_S = 1.0
"""Issue 16: ``log -f`` of an app another process launched ends within 1 s of its end."""
FSM_EVENT_TARGET_S = 20e-6
FSM_BUILD_TARGET_S = 0.060
LOOP_LAG_TARGET_S = 0.020

COLORS = {
    "asupervisor": "#1f77b4",
    "asupervisor-cli": "#6baed6",
    "asupervisor-nologs": "#c6dbef",
    "asupervisor-service": "#17becf",
    "torchx": "#d62728",
    "torchx-cli": "#d62728",
    "torchx-wait1": "#d62728",
    "torchx-wait10": "#ff9896",
    "anyio": "#7f7f7f",
    "anyio-open-process": "#bcbd22",
    "popen": "#7f7f7f",
    "grep": "#7f7f7f",
    "pipe": "#7f7f7f",
    "asupervisor → slurmctld": "#1f77b4",
    "asupervisor → slurmdbd": "#9ecae1",
    "TorchX → slurmctld": "#d62728",
    "TorchX → slurmdbd": "#ff9896",
}


# ------------------------------------------------------------------------- formatting
def fmt_s(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 0.001:
        return f"{value * 1000:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M/s"
    return f"{value / 1e3:.0f} k/s"


def fmt_num(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{unit}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}×" if value >= 10 else f"{value:.2f}×"


def cell(stats: Json | None, fmt: Callable[[float | None], str]) -> str:
    """``median (min–max)`` of a stats dict; ``–`` when missing."""
    if not stats or not stats.get("n"):
        return "–"
    if stats["n"] == 1:
        return f"{fmt(stats['median'])} (1 run)"
    return f"**{fmt(stats['median'])}** ({fmt(stats['min'])} – {fmt(stats['max'])})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def find(rows: Sequence[Json], **match: Any) -> Json | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def row_cell(row: Json | None, fmt: Callable[[float | None], str], key: str = "stats") -> str:
    if row is None:
        return "not run"
    if "error" in row:
        return f"failed: {str(row['error'])[:80]}"
    value = row.get(key)
    return cell(value if isinstance(value, dict) else None, fmt)


# ---------------------------------------------------------------------------- sections
def _scratch_row(scratch: Any) -> list[list[str]]:
    """Where the children wrote their records and logs (runs before this fact have none)."""
    if not isinstance(scratch, dict):
        return []
    return [
        [
            "scratch directory",
            f"{scratch.get('dir')} (`TMPDIR`; creating and writing a small file there:"
            f" {scratch.get('file_create_us')} µs)",
        ]
    ]


def machine_section(results: Json, source: str) -> list[str]:
    m = results["machine"]
    versions = m.get("versions", {})
    dirty = " (uncommitted changes)" if m.get("git_dirty") else ""
    load_start = ", ".join(f"{x:.2f}" for x in m.get("loadavg_at_start", []))
    load_end = ", ".join(f"{x:.2f}" for x in m.get("loadavg_at_end", []))
    mem = m.get("memory_mib")
    return [
        f"Run **{m['date']}** with `{results['command']}`"
        f" ({results.get('elapsed_s', 0) / 60:.1f} min; results: `{source}`).",
        "",
        *table(
            ["machine", ""],
            [
                ["CPU", f"{m.get('nproc')} × {m.get('cpu_model')}"],
                ["memory", f"{mem / 1024:.1f} GiB" if mem else "?"],
                ["kernel / OS", f"{m.get('kernel')} / {m.get('os')}"],
                ["Python", str(m.get("python"))],
                [
                    "versions",
                    f"asupervisor {versions.get('asupervisor')} (git {m.get('git_commit')}"
                    f"{dirty}), TorchX {versions.get('torchx')}, anyio {versions.get('anyio')}",
                ],
                ["load average (1, 5, 15 min)", f"at start {load_start}; at end {load_end}"],
                *_scratch_row(m.get("scratch")),
                [
                    "limits",
                    f"RLIMIT_NOFILE hard {m.get('nofile_hard_limit')} (each child raises its soft"
                    f" limit to it); inotify max_user_instances"
                    f" {m.get('inotify_max_user_instances')}",
                ],
            ],
        ),
        "",
        "Figures are **median** (min – max) over the repetitions; ratios divide"
        " medians by the baseline's median at the same N, measured in the same run.",
        *merged_note(results),
    ]


def merged_note(results: Json) -> list[str]:
    """Which cases come from earlier runs (a ``--cases`` run merges into latest.json)."""
    merged = results.get("merged_from") or {}
    if not merged:
        return []
    runs: dict[tuple[str, str], list[str]] = {}
    for case, run in merged.items():
        runs.setdefault((str(run.get("date")), str(run.get("command"))), []).append(case)
    parts = [
        f"{', '.join(f'*{c}*' for c in cases)} from the run of {date} (`{command}`)"
        for (date, command), cases in runs.items()
    ]
    this = ", ".join(f"*{c}*" for c in results["cases"] if c not in merged)
    return [
        "",
        f"This run measured {this}; the other cases are kept from earlier runs"
        f" (machine and load as then): {'; '.join(parts)}.",
    ]


def targets_section(results: Json) -> list[str]:
    cases = results["cases"]
    rows: list[list[str]] = []
    rows += wait_targets(cases.get("wait", {}))
    rows += submit_targets(cases.get("submit", {}))
    sup = cases.get("supervise", {}).get("rows", [])
    for impl in ("asupervisor", "asupervisor-cli", "asupervisor-nologs"):
        row = find(sup, impl=impl, n=1000)
        if row is None:
            continue
        pct = median_of({"stats": row.get("steady_pct")})
        what = {
            "asupervisor": "library, logs followed",
            "asupervisor-cli": "`run --log`",
            "asupervisor-nologs": "library, no log following",
        }[impl]
        rows.append(
            [
                f"1,000 sleeping replicas < 1 % of a core ({what})",
                fmt_num(pct, 2, " %"),
                verdict(
                    pct, CPU_TARGET_PCT, lower_is_better=True, fmt=lambda v: fmt_num(v, 2, " %")
                ),
            ]
        )
    logs = cases.get("logs", {}).get("rows", [])
    for mode in ("regex", "regex-all"):
        row = find(logs, impl="asupervisor", mode=mode)
        if row is None:
            continue
        rate = median_of(row)
        rows.append(
            [
                f"≥ 1,000,000 log lines/s with a regex (`{row.get('regex')}`)",
                fmt_rate(rate),
                verdict(rate, LOG_TARGET_RATE, lower_is_better=False, fmt=fmt_rate),
            ]
        )
        if mode == "regex":
            floor = 0.9 * LOG_RATE_BEFORE_AIOFILES
            rows.append(
                [
                    f"log lines/s with a regex (`{row.get('regex')}`) within 10 % of the "
                    f"{fmt_rate(LOG_RATE_BEFORE_AIOFILES)} before aiofiles (another run's figure)",
                    fmt_rate(rate),
                    verdict(rate, floor, lower_is_better=False, fmt=fmt_rate),
                ]
            )
    rows += slurm_targets(cases.get("slurm", {}))
    rows += docker_targets(cases.get("docker", {}))
    rows += fsm_targets(cases.get("fsm", {}))
    rows += loop_lag_targets(cases.get("loop_lag", {}))
    rows += memory_apps_targets(cases.get("memory_apps", {}))
    rows += list_index_targets(cases.get("list_index", {}))
    rows += apps_targets(cases.get("apps", {}))
    return table(["target", "measured (median)", "verdict"], rows)


def ratio_target(
    what: str,
    ours: Json | None,
    baseline: Json | None,
    baseline_name: str,
    target: float,
) -> list[str]:
    """A target row on the ratio of two rows' medians (ours over a baseline's, same N)."""
    r = ratio(median_of(ours), median_of(baseline))
    return [
        what,
        f"{fmt_s(median_of(ours))} = {fmt_ratio(r)} {baseline_name}",
        verdict(r, target, lower_is_better=True, fmt=fmt_ratio),
    ]


def ratio_targets(
    rows: list[Json],
    impl: str,
    baseline: str,
    baseline_name: str,
    target: float,
    what: Callable[[int], str],
    least_n: int = 0,
) -> list[list[str]]:
    """``ratio_target`` for each N that ``impl`` was measured at (from ``least_n`` on)."""
    return [
        ratio_target(
            what(row["n"]),
            row,
            find(rows, impl=baseline, n=row["n"]),
            baseline_name,
            target,
        )
        for row in rows
        if row.get("impl") == impl and row["n"] >= least_n
    ]


def wait_targets(case: Json) -> list[list[str]]:
    return ratio_targets(
        case.get("rows", []),
        "asupervisor",
        "anyio",
        "anyio",
        WAIT_TARGET_RATIO,
        lambda n: (
            f"wait after the last exit within {WAIT_TARGET_RATIO:g}× a bare anyio"
            f" `process.wait()`, N={n:,}"
        ),
    )


def submit_targets(case: Json) -> list[list[str]]:
    rows = case.get("rows", [])
    quiet = case.get("service_quiet_s", 0.3)
    out = ratio_targets(
        rows,
        "asupervisor",
        "torchx",
        "TorchX",
        SUBMIT_TORCHX_TARGET_RATIO,
        lambda n: f"submit faster than TorchX `local_cwd`, N={n:,}",
    )
    out += ratio_targets(
        rows,
        "asupervisor-service",
        "torchx",
        "TorchX",
        SUBMIT_TORCHX_TARGET_RATIO,
        lambda n: (
            f"submit in a running service (one Supervisor, {quiet:g} s between submits)"
            f" faster than TorchX `local_cwd`, N={n:,}"
        ),
    )
    what = f"submit within {SUBMIT_POPEN_TARGET_RATIO:g}× a Popen loop"
    large = ratio_targets(
        rows,
        "asupervisor",
        "popen",
        "Popen",
        SUBMIT_POPEN_TARGET_RATIO,
        lambda n: f"{what}, N={n:,}",
        least_n=SUBMIT_POPEN_FROM_N,
    )
    if any(row.get("impl") == "asupervisor" for row in rows) and not large:
        large = [
            [
                f"{what} at N ≥ {SUBMIT_POPEN_FROM_N:,}",
                f"no N ≥ {SUBMIT_POPEN_FROM_N:,} in this run",
                "not measured",
            ]
        ]
    return out + large


def apps_targets(case: Json) -> list[list[str]]:
    target = case.get("target_ratio", APPS_TARGET_RATIO)
    return ratio_targets(
        case.get("rows", []),
        "many-apps",
        "one-app",
        "one app",
        target,
        lambda n: (
            f"CPU per replica of {n:,} one-replica apps within {target:g}× that of"
            f" one {n:,}-replica app"
        ),
    )


def apps_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    body = []
    for n in sorted({r["n"] for r in rows}):
        found = [find(rows, impl=impl, n=n) for impl in ("one-app", "many-apps")]
        many = found[1]
        body.append(
            [
                f"{n:,}",
                *(row_cell(row, fmt_s) for row in found),
                fmt_ratio(many.get("ratio_to_baseline") if many else None),
                *(row_cell(row, fmt_s, "helper_per_replica") for row in found),
                *(row_cell(row, fmt_s, "elapsed") for row in found),
            ]
        )
    header = [
        "N replicas",
        "CPU per replica: one app of N",
        "CPU per replica: N apps of one",
        "N apps / one app",
        "of which reaper: one app",
        "of which reaper: N apps",
        "wall: one app",
        "wall: N apps",
    ]
    return [
        "CPU per replica (`true`) from the first submit to the last wait returning:"
        " one app of N replicas (`submit` then `wait`, the baseline) against N apps of one"
        f" replica, each submitted and waited for, {case.get('in_flight', '?')} in flight."
        " The CPU is the supervising process's (`getrusage`, every thread) plus its"
        " reaper's (`/proc`, 10 ms ticks), never the replicas'; each repetition has a"
        " Supervisor and `state_dir` of its own, with a warm-up app first (imports and"
        " the reaper's start left out). *wall*: the whole run of N replicas.",
        "",
        *table(header, body),
    ]


def fmt_us(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e6:.1f} µs"


def fsm_targets(case: Json) -> list[list[str]]:
    rows = case.get("rows", [])
    out = []
    for row in rows:
        if row.get("impl") != "asupervisor":
            continue
        med = median_of(row)
        ratio_ = fmt_ratio(row.get("ratio_to_baseline"))
        out.append(
            [
                f"CPU per replica event through the FSM ≤ 20 µs, N={row['n']:,}",
                f"{fmt_us(med)} = {ratio_} a `transitions` trigger",
                verdict(med, FSM_EVENT_TARGET_S, lower_is_better=True, fmt=fmt_us),
            ]
        )
    row = find(rows, impl="asupervisor", n=1000)
    if row is not None:
        build = median_of(row, "build")
        out.append(
            [
                "building the machines of a 1,000-replica app ≤ 60 ms",
                fmt_s(build),
                verdict(build, FSM_BUILD_TARGET_S, lower_is_better=True, fmt=fmt_s),
            ]
        )
    return out


def fsm_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    impls = ["asupervisor", "transitions", "dict"]
    body = []
    for n in sorted({r["n"] for r in rows}):
        line = [f"{n:,}"]
        for impl in impls:
            line.append(row_cell(find(rows, impl=impl, n=n), fmt_us))
        row = find(rows, impl="asupervisor", n=n)
        line.append(fmt_ratio(row.get("ratio_to_baseline") if row else None))
        for impl in ("asupervisor", "transitions"):
            line.append(row_cell(find(rows, impl=impl, n=n), fmt_s, key="build"))
        body.append(line)
    header = [
        "N",
        *(f"per event: {i}" for i in impls),
        "asupervisor / transitions",
        "build: asupervisor",
        "build: transitions",
    ]
    return [
        "CPU (`process_time`) per replica event of an N-replica app fed every replica's"
        " `Submitted`, `Started` and `Exited(0)`, no process started: asupervisor's"
        " `AppFSM.apply` (PENDING filled in, the app's own transitions included);"
        " the baseline is `transitions`' own `Machine`, one trigger method called per"
        " event; *dict* is one `(state, trigger) -> state` lookup per event. *build*: the"
        " CPU to create the machines before the first event (`AppFSM(roles)`; for"
        " `transitions`, a `Machine` with the N replicas as models), all in one block"
        " of the caller's event loop.",
        "",
        *table(header, body),
    ]


def loop_lag_targets(case: Json) -> list[list[str]]:
    rows: list[list[str]] = []
    for row in case.get("rows", []):
        if "error" in row:
            continue
        period_ms = 1000 * row.get("line_period_s", 0.01)
        for phase, what in (
            ("submit", f"while {row['n']:,} replicas start"),
            (
                "follow",
                f"while {row['followers']:,} `log_iter` followers read"
                f" (a line per replica every {period_ms:g} ms)",
            ),
        ):
            excess = row.get(f"{phase}_excess_s")
            floor = (row.get("floor") or {}).get("max") if phase == "submit" else None
            beside = "" if floor is None else f"; a bare Popen loop of as many: {fmt_s(floor)}"
            clear = (row.get(f"{phase}_clear") or {}).get("max")
            if clear is not None:
                beside += f"; {_full_collections(row, phase)}, {fmt_s(clear)} without one"
            rows.append(
                [
                    f"loop stall <= 20 ms above idle, {what}",
                    f"{fmt_s(row[phase]['max'])} worst (idle {fmt_s(row['idle']['max'])}{beside})",
                    "met (no stall above idle)"
                    if excess is not None and excess <= 0
                    else verdict(excess, LOOP_LAG_TARGET_S, lower_is_better=True, fmt=fmt_s),
                ]
            )
    return rows


def _full_collections(row: Json, phase: str) -> str:
    """How many full garbage collections ran in ``phase`` (all repetitions), and the longest."""
    counts = row.get(f"{phase}_full_collections") or []
    longest = row.get(f"{phase}_full_collection_longest_s")
    passes = f"{sum(counts)} full collection{'' if sum(counts) == 1 else 's'}"
    return passes if longest is None else f"{passes} (longest {fmt_s(longest)})"


def memory_apps_targets(case: Json) -> list[list[str]]:
    rows: list[list[str]] = []
    target = case.get("target_growth_mib", 10.0)
    for row in case.get("rows", []):
        if "error" in row:
            continue
        growth = row.get("growth_mib")
        rows.append(
            [
                f"RSS after {row['apps_last']:,} short apps within {target:g} MB of after"
                f" {row['apps_first']:,}",
                f"+{fmt_num(growth, 1, ' MiB')} ({fmt_num(row.get('rss_first_mib'), 1)}"
                f" → {fmt_num(row.get('rss_last_mib'), 1)} MiB)",
                verdict(growth, target, lower_is_better=True, fmt=lambda v: fmt_num(v, 1, " MiB")),
            ]
        )
    return rows


def memory_apps_section(case: Json) -> list[str]:
    body = []
    for row in case.get("rows", []):
        if "error" in row:
            body.append([f"{row['n']:,}", "failed", "", "", "", ""])
            continue
        body.append(
            [
                f"{row['apps_last']:,}",
                fmt_num(row.get("rss_first_mib"), 1, " MiB"),
                fmt_num(row.get("rss_last_mib"), 1, " MiB"),
                fmt_num(row.get("growth_mib"), 2, " MiB"),
                fmt_num(row.get("per_app_kib"), 2, " KiB"),
                f"{row.get('held_last')}",
            ]
        )
    header = ["N apps", "RSS after 100", "RSS after N", "growth", "per app", "held at end"]
    return [
        "One Supervisor runs N short local apps (`true`, 8 in flight), each waited for;"
        " RSS (`VmRSS`, after a garbage collection) after the first 100 and after all N."
        " *held at end*: `len(sv.followed())`, the apps still in memory.",
        "",
        *table(header, body),
    ]


def list_index_targets(case: Json) -> list[list[str]]:
    rows: list[list[str]] = []
    target = case.get("target_s", 0.1)
    for row in case.get("rows", []):
        if "error" in row:
            continue
        med = median_of({"stats": row.get("all")})
        rows.append(
            [
                f"`list` of {row['n']:,} apps in <= {fmt_s(target)}",
                fmt_s(med),
                verdict(med, target, lower_is_better=True, fmt=fmt_s),
            ]
        )
    return rows


def list_index_section(case: Json) -> list[str]:
    body = []
    for row in case.get("rows", []):
        if "error" in row:
            body.append([f"{row['n']:,}", "failed", "", "", ""])
            continue
        body.append(
            [f"{row['n']:,}", *(cell(row.get(q), fmt_s) for q in ("all", "state", "name", "limit"))]
        )
    header = ["N apps", "all", "`state=SUCCEEDED`", "`name='short-1*'`", "`limit=20`"]
    return [
        '`await sv.list("local", ...)` in a fresh Supervisor of another session, after N'
        " short apps ended: settled apps come from their index entries (one small read and"
        " two `stat`s each), never from their records.",
        "",
        *table(header, body),
    ]


def loop_lag_section(case: Json) -> list[str]:
    body = []
    for row in case.get("rows", []):
        if "error" in row:
            body.append([f"{row['n']:,}", str(row["followers"]), "", "failed"] + [""] * 7)
            continue
        body.append(
            [
                f"{row['n']:,}",
                f"{row['followers']:,}",
                f"{1000 * row.get('line_period_s', 0.01):g} ms",
                cell(row["idle"], fmt_s),
                cell(row.get("floor"), fmt_s),
                cell(row["submit"], fmt_s),
                cell(row["follow"], fmt_s),
                fmt_s(row.get("submit_excess_s")),
                fmt_s(row.get("follow_excess_s")),
                "; ".join(
                    f"{phase}: {_full_collections(row, phase)},"
                    f" {fmt_s((row.get(f'{phase}_clear') or {}).get('max'))} without one"
                    for phase in ("submit", "follow")
                    if row.get(f"{phase}_clear")
                ),
                ", ".join(
                    f"{phase} {fmt_s(row.get(f'{phase}_worst_queued_s'))}"
                    for phase in ("floor", "submit", "follow")
                    if row.get(phase)
                ),
            ]
        )
    header = [
        "N replicas",
        "followers",
        "line every",
        "idle",
        "floor: a bare Popen loop of N in another process",
        "submit",
        "follow",
        "submit − idle (worst)",
        "follow − idle (worst)",
        "the garbage collector's full passes; worst stall of the ticks none overlapped",
        "of the worst: waiting for a CPU",
    ]
    return [
        "Worst lateness of a 5 ms ticker in the host's event loop, per phase:"
        " *idle* (the Supervisor open, nothing to do), *floor* (the same, while another"
        " process starts N `sleep 60` with a bare loop of `Popen`, case 2's baseline: what"
        " N processes starting beside it cost a loop that only sleeps, no library code"
        " involved), *submit* (one app of N"
        " `sleep 60` replicas, from the call to its return) and *follow* (F"
        " `log_iter(should_tail=True)` followers of replicas printing a line every"
        " *line every*); the excess columns take the worst repetition against the worst"
        " idle window. The full passes of the garbage collector (generation 2, noted through"
        " `gc.callbacks`, all repetitions) hold the GIL for a time that grows with the whole"
        " heap of the host's process, the host's own objects included; the library's"
        " allocations decide how often one comes, not how long it takes. Beside them, the"
        " worst stall of the ticks that no full pass overlapped."
        " The last column: how much of the worst stall the loop's thread"
        " was runnable but waiting for a CPU (its schedstat `run_delay`), time the"
        " kernel gave to other processes, the replicas included.",
        "",
        *table(header, body),
    ]


def docker_targets(case: Json) -> list[list[str]]:
    rows: list[list[str]] = []
    found = case.get("rows", [])
    for row in found:
        if row.get("impl") == "asupervisor-log-f":
            med = median_of(row)
            rows.append(
                [
                    "docker: `asupervisor log -f` of an app whose Supervisor closed ends within"
                    f" {fmt_s(DOCKER_FOLLOW_TARGET_S)} of the engine's `die`",
                    fmt_s(med),
                    verdict(med, DOCKER_FOLLOW_TARGET_S, lower_is_better=True, fmt=fmt_s),
                ]
            )
        if row.get("impl") != "asupervisor":
            continue
        med = median_of(row)
        rows.append(
            [
                f"docker: wait within 50 ms of the engine's `die`, N={row['n']}",
                fmt_s(med),
                verdict(med, DOCKER_WAIT_TARGET_S, lower_is_better=True, fmt=fmt_s),
            ]
        )
        if row["n"] < 10:
            continue  # the submit target is about 10 replicas (one network per app costs more at 1)
        torchx = find(found, impl="torchx", n=row["n"])
        ours = median_of({"stats": row.get("submit")})
        theirs = median_of({"stats": (torchx or {}).get("submit")})
        r = ours / theirs if ours and theirs else None
        rows.append(
            [
                f"docker: submit no slower than TorchX `local_docker`, N={row['n']}",
                f"{fmt_s(ours)} = {fmt_ratio(r)} TorchX",
                verdict(r, 1.0, lower_is_better=True, fmt=fmt_ratio),
            ]
        )
    return rows


def docker_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    impls = ["asupervisor", "torchx", "docker-py"]
    body = []
    for n in sorted({r["n"] for r in rows}):
        line = [f"{n:,}"]
        for key in ("submit", "stats", "stamp_latency"):
            for impl in impls:
                row = find(rows, impl=impl, n=n)
                line.append(fmt_s(median_of({"stats": (row or {}).get(key)})))
        body.append(line)
    header = [
        "N",
        *(f"submit: {i}" for i in impls),
        *(f"`die` -> wait: {i}" for i in impls),
        *(f"exit stamp -> wait: {i}" for i in impls),
    ]
    return [
        "N containers of `localhost/sv-test:py` on dockerd (scripts/docker-engines), each"
        " sleeping to a common deadline, stamping the wall clock into a bind mount and"
        " exiting. *submit*: the launch call; *`die` -> wait*: from the engine's `die`"
        " event of the last container (read from the event stream by another thread) to"
        " the wait returning; *exit stamp -> wait*: from the last stamp, which adds the"
        " interpreter's shutdown and the engine's teardown. TorchX is `local_docker`"
        " with `wait_interval=1`; the baseline is docker-py's `containers.run` loop and"
        " a blocking `container.wait()` per container.",
        "",
        *table(header, body),
        *_follower_line(find(rows, impl="asupervisor-log-f", n=1)),
    ]


def _follower_line(row: Json | None) -> list[str]:
    if row is None:
        return []
    return [
        "",
        "`asupervisor log -f` in another process, of one container whose Supervisor"
        " closed after submitting it: from the `die` event to the follower's exit,"
        f" {fmt_s(median_of(row))} (median of {row.get('reps')}).",
    ]


def slurm_targets(case: Json) -> list[list[str]]:
    rows: list[list[str]] = []
    for row in case.get("rows", []):
        if row.get("impl") != "asupervisor" or "error" in row:
            continue
        per_tick = row.get("job_info_per_tick")
        rows.append(
            [
                f"Slurm: REQUEST_JOB_INFO one per tick whatever N, N={row['n']} apps",
                f"{fmt_num(per_tick)} per tick ({row.get('job_info')} in"
                f" {row.get('squeue_in_window')} ticks)",
                verdict(
                    per_tick,
                    SLURM_JOB_INFO_PER_TICK,
                    lower_is_better=True,
                    fmt=lambda v: fmt_num(v, 2, " per tick"),
                ),
            ]
        )
    delay = case.get("delay") or {}
    poll = median_of({"stats": delay.get("poll")})
    if poll is not None:
        rows.append(
            [
                "Slurm: a job's end seen within one tick (1 s when active):"
                " COMPLETED in squeue → `wait()` returns",
                f"{fmt_s(poll)} (from the job's last output: "
                f"{fmt_s(median_of({'stats': delay.get('stats')}))})",
                verdict(poll, SLURM_END_TARGET_S, lower_is_better=True, fmt=fmt_s),
            ]
        )
    return rows


def verdict(
    value: float | None,
    target: float,
    *,
    lower_is_better: bool,
    fmt: Callable[[float | None], str],
) -> str:
    if value is None:
        return "not measured"
    met = value <= target if lower_is_better else value >= target
    factor = value / target if lower_is_better else target / value if value else math.inf
    if met:
        return f"met ({fmt_ratio(1 / factor if factor else None)} margin)"
    return f"**missed** by {fmt_ratio(factor)} ({fmt(value)} vs {fmt(target)})"


def by_n_body(rows: list[Json], impls: list[str], ratio_impls: tuple[str, ...]) -> list[list[str]]:
    """One line per N: each implementation's cell, then the ratios of ``ratio_impls``."""
    body = []
    for n in sorted({r["n"] for r in rows}):
        line = [f"{n:,}"]
        for impl in impls:
            line.append(row_cell(find(rows, impl=impl, n=n), fmt_s))
        for impl in ratio_impls:
            row = find(rows, impl=impl, n=n)
            line.append(fmt_ratio(row.get("ratio_to_baseline") if row else None))
        body.append(line)
    return body


def wait_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    impls = ["asupervisor", "torchx-wait1", "torchx-wait10", "anyio"]
    body = by_n_body(rows, impls, ("asupervisor", "torchx-wait1"))
    header = [
        "N",
        "asupervisor `sv.wait`",
        "TorchX `wait(wait_interval=1)`",
        "TorchX `wait()` (10 s)",
        "baseline `process.wait()`",
        "ours / baseline",
        "TorchX(1 s) / baseline",
    ]
    lines = [
        "Time from the last replica's exit (each replica stamps the wall clock just"
        " before exiting; all N exit together at a deadline) to the wait returning."
        " Repetitions per cell are in the results JSON; TorchX's 10 s poll runs only"
        " for N ≤ 10 and TorchX at N=1,000 once, as those runs take tens of seconds"
        " each (most of it joining one log thread per replica).",
        "",
        *table(header, body),
        "",
        "![wait latency](bench/wait_latency.png)",
    ]
    spread = [
        f"N={r['n']:,}: {fmt_s(median_of({'stats': r.get('exit_spread')}))}"
        for r in rows
        if r.get("impl") == "asupervisor" and r.get("exit_spread")
    ]
    if spread:
        lines += [
            "",
            "Spread of the exits (first to last stamp, median): " + "; ".join(spread) + ".",
        ]
    return lines


def submit_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    impls = ["asupervisor", "asupervisor-service", "torchx", "popen", "anyio-open-process"]
    body = by_n_body(rows, impls, ("asupervisor", "asupervisor-service", "torchx"))
    largest = max((r["n"] for r in rows), default=0)
    quiet = case.get("service_quiet_s", 0.3)
    header = [
        "N",
        "asupervisor `submit`",
        "asupervisor in a running service",
        "TorchX `runner.run`",
        "baseline Popen loop",
        "`anyio.open_process` loop",
        "ours / Popen",
        "service / Popen",
        "TorchX / Popen",
    ]
    per = [
        f"{impl} {fmt_num(median_of({'stats': r.get('per_replica_ms')}), 2, ' ms')}"
        for impl in impls
        if (r := find(rows, impl=impl, n=largest)) and r.get("per_replica_ms")
    ]
    lines = [
        "Time for the submit call to return with N replicas running (`sleep 60`,"
        " stopped afterwards, untimed). A warm-up submit in each child keeps"
        " one-time costs (imports, asupervisor's reaper start) out. *asupervisor"
        " `submit`* runs its repetitions back to back in one Supervisor; *in a running"
        f" service* keeps one Supervisor too but waits {quiet:g} s, nothing running,"
        " before each submit, as a service that submits now and then does (*not run*:"
        " that N was not measured).",
        "",
        *table(header, body),
        "",
    ]
    if per:
        lines += [f"Per replica at N={largest:,}: " + ", ".join(per) + ".", ""]
    lines.append("![submit latency](bench/submit_latency.png)")
    return lines


def supervise_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    impls = ["asupervisor", "asupervisor-cli", "asupervisor-nologs", "torchx-cli", "anyio"]
    labels = case.get("impls", {})
    body = []
    for n in sorted({r["n"] for r in rows}):
        for impl in impls:
            row = find(rows, impl=impl, n=n)
            if row is None:
                continue
            if "error" in row:
                body.append(
                    [f"{n:,}", labels.get(impl, impl), f"failed: {row['error'][:80]}", "", "", ""]
                )
                continue
            skipped = row.get("steady_skipped")
            steady = row_cell(row, lambda v: fmt_num(v, 2, " %"), "steady_pct")
            if skipped and not row.get("steady_pct", {}).get("n"):
                steady = f"no window ({skipped[0]})"
            body.append(
                [
                    f"{n:,}",
                    labels.get(impl, impl),
                    steady,
                    row_cell(row, lambda v: fmt_num(v, 2, " s"), "total_cpu"),
                    fmt_ratio(row.get("steady_ratio_to_baseline")),
                    fmt_ratio(row.get("total_ratio_to_baseline")),
                ]
            )
    header = [
        "N",
        "supervisor",
        "steady CPU, % of one core",
        "total CPU (spawn → end)",
        "steady / baseline",
        "total / baseline",
    ]
    return [
        f"N replicas of `sleep {case.get('seconds', 10):g}`, every replica's log followed,"
        " supervised to the end by one process. *Steady* is the CPU of the supervising"
        " process and its helpers (asupervisor's reaper) from 1 s after the last spawn to"
        " 1 s before the first exit, as % of one core; *total* is CPU seconds from the first"
        " spawn to the end. The replicas' own CPU is never counted.",
        "",
        *table(header, body),
        "",
        "![supervision cost](bench/supervision_cpu.png)",
    ]


def memory_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    idle = case.get("idle", {})
    impls = ["asupervisor", "asupervisor-cli", "asupervisor-nologs", "torchx-cli", "anyio"]
    labels = case.get("impls", {})
    body = []
    for n in sorted({r["n"] for r in rows}):
        for impl in impls:
            row = find(rows, impl=impl, n=n)
            if row is None or "error" in row:
                continue
            body.append(
                [
                    f"{n:,}",
                    labels.get(impl, impl),
                    row_cell(row, lambda v: fmt_num(v, 1, " MiB"), "maxrss_mib"),
                    fmt_num(row.get("idle_rss_mib"), 1, " MiB"),
                    row_cell(row, lambda v: fmt_num(v, 1, " KiB"), "rss_per_replica_kib"),
                    fmt_ratio(row.get("rss_ratio_to_baseline")),
                ]
            )
    idle_what = "; ".join(f"{impl}: {what}" for impl, what in sorted(idle.items()))
    return [
        "Peak RSS (`ru_maxrss`) of the supervising process in the runs above; per"
        " replica = (peak − idle) / N, where *idle* is the peak RSS of a process that"
        " imported the same code and dry-ran the same app of N replicas, launching"
        f" nothing ({idle_what}).",
        "",
        *table(
            ["N", "supervisor", "peak RSS", "idle RSS", "per replica", "per replica / baseline"],
            body,
        ),
        "",
        "![memory per replica](bench/memory.png)",
    ]


def logs_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    modes = case.get("modes", {})
    body = []
    for mode, regex in modes.items():
        line = [f"{mode}" + (f" (`{regex}`)" if regex else "")]
        for impl in ("asupervisor", "torchx", "grep"):
            line.append(row_cell(find(rows, impl=impl, mode=mode), fmt_rate))
        ours = find(rows, impl="asupervisor", mode=mode)
        tx = find(rows, impl="torchx", mode=mode)
        line.append(fmt_ratio(ratio(median_of(ours), median_of(tx))))
        line.append(fmt_ratio(ours.get("ratio_to_baseline") if ours else None))
        yielded = ", ".join(
            f"{impl} {r['yielded']:,}"
            for impl in ("asupervisor", "torchx", "grep")
            if (r := find(rows, impl=impl, mode=mode)) and "yielded" in r
        )
        line.append(yielded)
        body.append(line)
    lines = [
        f"Lines of a {case.get('lines', 0):,}-line `combined.log`"
        f" ({case.get('bytes', 0) / 1e6:.0f} MB, page cache warm) read per second.",
        "",
        *table(
            [
                "mode",
                "asupervisor `iter_log_lines`",
                "TorchX `LogIterator` (+ split, filter)",
                "baseline `grep -c`",
                "ours / TorchX",
                "ours / grep",
                "lines yielded",
            ],
            body,
        ),
        "",
        "![log throughput](bench/log_throughput.png)",
    ]
    tail = case.get("tail")
    if tail:
        trows = tail.get("rows", [])
        tbody = []
        for impl in ("asupervisor", "torchx", "pipe"):
            row = find(trows, impl=impl)
            if row is None:
                continue
            tbody.append(
                [
                    tail.get("impls", {}).get(impl, impl),
                    row_cell(row, fmt_s),
                    fmt_s(row.get("p90")),
                    fmt_ratio(row.get("ratio_to_baseline")),
                ]
            )
        first = trows[0] if trows else {}
        lines += [
            "",
            f"Tail latency: a replica prints the wall clock on a line,"
            f" {first.get('lines_per_rep', '?')} lines {tail.get('gap_s', 0) * 1000:.0f} ms apart,"
            f" {first.get('reps', '?')} runs; the follower subtracts it when the line is yielded."
            " Median (min – max) over all lines.",
            "",
            *table(["follower", "latency", "p90", "/ baseline"], tbody),
            "",
            "![tail latency](bench/tail_latency.png)",
        ]
    return lines


def slurm_section(case: Json) -> list[str]:
    rows = case.get("rows", [])
    window = case.get("window_s", 0)
    ns = sorted({r["n"] for r in rows if r.get("impl") != "idle"})
    body = []
    for n in ns:
        ours = find(rows, impl="asupervisor", n=n)
        tx = find(rows, impl="torchx", n=n)
        line = [f"{n:,}"]
        if ours is None or "error" in ours:
            line += [row_cell(ours, fmt_s), "", "", ""]
        else:
            line += [
                f"{fmt_num(ours.get('job_info_per_tick'))}"
                f" ({ours.get('job_info')} in {ours.get('squeue_in_window')} ticks)",
                fmt_num(ours.get("job_info_per_s"), 3),
                fmt_num(ours.get("dbd_total_per_s"), 2),
                fmt_s(ours.get("interval_s_at_end")),
            ]
        if tx is None or "error" in tx:
            line += [row_cell(tx, fmt_s), "", "", ""]
        else:
            errors = f", {tx['errors']} failed" if tx.get("errors") else ""
            line += [
                f"{fmt_num(tx.get('describes_per_s'), 1)} ({tx.get('describes')}{errors})",
                fmt_num(tx.get("job_info_per_s"), 3),
                f"{fmt_num(tx.get('dbd_total_per_s'), 1)}"
                f" ({fmt_num(tx.get('dbd_jobs_per_s'), 1)} job queries)",
                cell(tx.get("describe_s"), fmt_s),
            ]
        if any(r and r.get("disturbed") for r in (ours, tx)):
            line[0] += " ⚠"
        body.append(line)
    header = [
        "N apps",
        "ours: REQUEST_JOB_INFO per tick",
        "ours: REQUEST_JOB_INFO /s",
        "ours: slurmdbd RPCs /s",
        "ours: poll pause at the end",
        "TorchX: describes /s (in window)",
        "TorchX: REQUEST_JOB_INFO /s",
        "TorchX: slurmdbd RPCs /s",
        "TorchX: one describe",
    ]
    lines = [
        f"N apps of one replica `sleep 600` (submitted with asupervisor), tracked for"
        f" {window:g} s each way: by the Supervisor that submitted them (one shared poller,"
        f" default settings: the window starts once nothing has changed for a few seconds,"
        f" so the poller has backed off), then by a loop calling TorchX 0.7.0's"
        f" `SlurmScheduler.describe(job_id)` for every app each {case.get('interval_s', 1):g} s"
        " (what `Runner.wait(wait_interval=1)` does per app; its default is 10 s, a tenth of"
        " the rate). slurmctld's RPCs come from `sdiag` (reset with `sdiag -r` before each"
        " window), slurmdbd's from `sacctmgr show stats` (before/after); the readings"
        " themselves are left out. REQUEST_JOB_INFO counts `_SINGLE` too. TorchX 0.7.0's"
        " `describe` runs `sacct`, which asks slurmdbd, never slurmctld.",
        "",
        *table(header, body),
    ]
    idle = find(rows, impl="idle")
    if idle and "error" not in idle:
        lines += [
            "",
            f"Background (the cluster is shared), {idle.get('seconds', 0):.0f} s with nobody"
            f" polling: {idle.get('job_info')} REQUEST_JOB_INFO, {idle.get('ctld_total')}"
            f" slurmctld RPCs, {idle.get('dbd_total')} slurmdbd RPCs; they are not subtracted"
            " above.",
        ]
    if any(r.get("disturbed") for r in rows):
        lines += ["", "⚠ someone else reset `sdiag` during that window: its counts are low."]
    lines += ["", "![Slurm RPCs](bench/slurm_rpcs.png)"]
    delay = case.get("delay")
    if delay:
        lines += ["", f"End of a job → `wait()` returns ({delay.get('reps', '?')} jobs):", ""]
        if "error" in delay:
            lines.append(f"failed: {str(delay['error'])[:200]}")
        else:
            parts = [
                ("job's last output (`time.time()`, then exit) → `wait()` returns", "stats"),
                ("… of which: last output → squeue shows COMPLETED (Slurm)", "slurm_end"),
                ("… of which: COMPLETED shown → `wait()` returns (ours)", "poll"),
                ("poller's pause before the tick that saw the end", "pause_before_tick"),
                ("that tick's squeue returned → `wait()` returns", "tick_to_wait"),
            ]
            lines += table(
                ["what", "median (min – max)"],
                [[what, cell(delay.get(key), fmt_s)] for what, key in parts],
            )
            settings = case.get("poller") or {}
            if settings:
                lines += [
                    "",
                    f"Job: one replica sleeping {delay.get('sleep_s', 3):g} s; default poller"
                    f" settings (fast {settings.get('fast')} s, at most"
                    f" {settings.get('running')} s while a job runs, slow"
                    f" {settings.get('slow')} s, growth {settings.get('growth')}×).",
                ]
    return lines


def plan_section(results: Json) -> list[str]:
    lines = [
        "Repetitions, as `(implementation, N, repetitions)` per case, then a case's own"
        " settings of that run, if any (`bench/run.py` holds the plans):",
        "",
    ]
    for case, spec in results.get("plan", {}).items():
        runs = spec.get("runs")
        if runs:
            text = ", ".join(
                f"{impl} N={n:,}×{reps}" + "".join(f" {x}" for x in rest)
                for impl, n, reps, *rest in runs
            )
        else:
            text = ", ".join(f"{k}={v}" for k, v in spec.items())
        extra = {k: v for k, v in spec.items() if k != "runs"} if runs else {}
        if extra:
            text += "; " + ", ".join(f"{k}={v}" for k, v in extra.items())
        elapsed = results["cases"].get(case, {}).get("elapsed_s")
        took = f" ({elapsed / 60:.1f} min)" if isinstance(elapsed, int | float) else ""
        earlier = (results.get("merged_from") or {}).get(case)
        if earlier:
            took += f" (run of {earlier.get('date')})"
        lines.append(f"- **{case}**{took}: {text}")
    return lines


def render_markdown(results: Json, source: str) -> str:
    cases = results["cases"]
    out: list[str] = [BEGIN, "", *machine_section(results, source), ""]
    out += ["### Targets", "", *targets_section(results), ""]
    sections: list[tuple[str, str, Callable[[Json], list[str]]]] = [
        ("wait", "### 1. Wait latency", wait_section),
        ("submit", "### 2. Submit latency", submit_section),
        ("supervise", "### 3. Supervision cost", supervise_section),
        ("supervise", "### 4. Memory", memory_section),
        ("logs", "### 5. Logs", logs_section),
        ("slurm", "### 6. Slurm", slurm_section),
        ("docker", "### 7. Docker", docker_section),
        ("fsm", "### 8. State machines", fsm_section),
        ("loop_lag", "### 9. Event loop lag", loop_lag_section),
        ("memory_apps", "### 10. Memory of a long-running service", memory_apps_section),
        ("list_index", "### 11. Listing from the index", list_index_section),
        ("apps", "### 12. CPU per replica: many apps against one", apps_section),
    ]
    for key, title, render in sections:
        case = cases.get(key)
        if case is None:
            continue
        out += [title, ""]
        if "error" in case:
            out += ["```", str(case["error"]).strip(), "```", ""]
            continue
        out += [*render(case), ""]
    out += ["### Repetitions", "", *plan_section(results), "", END]
    return "\n".join(out) + "\n"


def merge(existing: str | None, generated: str) -> str:
    """Replace the generated block of ``existing`` (or start a new document)."""
    if existing and BEGIN in existing and END in existing:
        head, rest = existing.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + generated.rstrip("\n") + tail
    return "# Benchmarks\n\n" + generated


# --------------------------------------------------------------------------- plots
def plots(results: Json, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    directory.mkdir(parents=True, exist_ok=True)
    cases = results["cases"]
    made: list[Path] = []
    for name, fn in (
        ("wait", _plot_wait),
        ("submit", _plot_submit),
        ("supervise", _plot_supervise),
        ("logs", _plot_logs),
        ("slurm", _plot_slurm),
    ):
        case = cases.get(name)
        if case is None or "error" in case:
            continue
        made += fn(case, directory)
    return made


def _line_plot(
    case: Json, impls: Sequence[str], path: Path, title: str, ylabel: str, hline: float | None
) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    labels = case.get("impls", {})
    for impl in impls:
        rows = sorted(
            (r for r in case["rows"] if r.get("impl") == impl and r.get("stats", {}).get("n")),
            key=lambda r: r["n"],
        )
        if not rows:
            continue
        xs = [r["n"] for r in rows]
        med = [r["stats"]["median"] * 1000 for r in rows]
        lo = [m - r["stats"]["min"] * 1000 for m, r in zip(med, rows, strict=True)]
        hi = [r["stats"]["max"] * 1000 - m for m, r in zip(med, rows, strict=True)]
        ax.errorbar(
            xs,
            med,
            yerr=[lo, hi],
            marker="o",
            capsize=3,
            label=labels.get(impl, impl),
            color=COLORS.get(impl),
        )
    if hline is not None:
        ax.axhline(hline, color="green", linestyle="--", linewidth=1, label="target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot_wait(case: Json, directory: Path) -> list[Path]:
    impls = ["asupervisor", "torchx-wait1", "torchx-wait10", "anyio"]
    return [
        _line_plot(
            case,
            impls,
            directory / "wait_latency.png",
            "last replica exit → wait() returns (median, min–max)",
            "ms",
            None,  # the target is a ratio to the anyio line, drawn already
        )
    ]


def _plot_submit(case: Json, directory: Path) -> list[Path]:
    impls = ["asupervisor", "asupervisor-service", "torchx", "popen", "anyio-open-process"]
    return [
        _line_plot(
            case,
            impls,
            directory / "submit_latency.png",
            "submit of N replicas (median, min–max)",
            "ms",
            None,
        )
    ]


def _bars(
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[Json | None]]],
    path: Path,
    title: str,
    ylabel: str,
    hline: float | None = None,
    log: bool = True,
) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    width = 0.8 / max(1, len(series))
    for i, (impl, stats_list) in enumerate(series):
        xs, meds, lo, hi = [], [], [], []
        for g, stats in enumerate(stats_list):
            if not stats or not stats.get("n") or stats.get("median") is None:
                continue
            xs.append(g + (i - (len(series) - 1) / 2) * width)
            meds.append(stats["median"])
            lo.append(stats["median"] - stats["min"])
            hi.append(stats["max"] - stats["median"])
        if xs:
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=2, label=impl, color=COLORS.get(impl))
    if hline is not None:
        ax.axhline(hline, color="green", linestyle="--", linewidth=1, label="target")
    ax.set_xticks(range(len(groups)), groups)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot_supervise(case: Json, directory: Path) -> list[Path]:
    rows = [r for r in case["rows"] if "error" not in r]
    ns = sorted({r["n"] for r in rows})
    impls = ["asupervisor", "asupervisor-cli", "asupervisor-nologs", "torchx-cli", "anyio"]
    groups = [f"N={n:,}" for n in ns]

    def series(key: str) -> list[tuple[str, list[Json | None]]]:
        out: list[tuple[str, list[Json | None]]] = []
        for impl in impls:
            stats: list[Json | None] = []
            for n in ns:
                row = find(rows, impl=impl, n=n)
                stats.append(row.get(key) if row else None)
            if any(stats):
                out.append((impl, stats))
        return out

    return [
        _bars(
            groups,
            series("steady_pct"),
            directory / "supervision_cpu.png",
            "CPU while N replicas sleep (steady window)",
            "% of one core",
            CPU_TARGET_PCT,
        ),
        _bars(
            groups,
            series("rss_per_replica_kib"),
            directory / "memory.png",
            "peak RSS per supervised replica (idle process subtracted)",
            "KiB",
            None,
            log=False,
        ),
    ]


def _plot_logs(case: Json, directory: Path) -> list[Path]:
    modes = list(case.get("modes", {}))
    rows = case["rows"]
    series: list[tuple[str, list[Json | None]]] = []
    for impl in ("asupervisor", "torchx", "grep"):
        stats: list[Json | None] = []
        for mode in modes:
            row = find(rows, impl=impl, mode=mode)
            stats.append(row.get("stats") if row else None)
        series.append((impl, stats))
    made = [
        _bars(
            modes,
            series,
            directory / "log_throughput.png",
            f"reading a {case.get('lines', 0):,}-line log",
            "lines/s",
            LOG_TARGET_RATE,
        )
    ]
    tail = case.get("tail")
    if tail:
        tseries: list[tuple[str, list[Json | None]]] = []
        for row in tail.get("rows", []):
            latency: Json | None = row.get("stats")
            if latency and latency.get("n"):
                scaled = {k: latency[k] * 1000 for k in ("median", "min", "max")}
                tseries.append((row["impl"], [{"n": latency["n"], **scaled}]))
        made.append(
            _bars(
                ["tail latency"],
                tseries,
                directory / "tail_latency.png",
                "line written → yielded by the follower",
                "ms",
            )
        )
    return made


def _plot_slurm(case: Json, directory: Path) -> list[Path]:
    rows = [r for r in case.get("rows", []) if "error" not in r and r.get("impl") != "idle"]
    ns = sorted({r["n"] for r in rows})
    series: list[tuple[str, list[Json | None]]] = []
    for impl, who in (("asupervisor", "asupervisor"), ("torchx", "TorchX")):
        for daemon, key in (("slurmctld", "job_info"), ("slurmdbd", "dbd_total")):
            stats: list[Json | None] = []
            for n in ns:
                row = find(rows, impl=impl, n=n)
                seconds = row.get("seconds") if row else None
                value = row.get(key) / seconds if row and seconds and row.get(key) else None
                stats.append({"n": 1, "median": value, "min": value, "max": value})
            series.append((f"{who} → {daemon}", stats))
    return [
        _bars(
            [f"N={n:,} apps" for n in ns],
            series,
            directory / "slurm_rpcs.png",
            f"RPCs per second while tracking N apps ({case.get('window_s', 0):g} s; no bar: none)",
            "slurmctld: REQUEST_JOB_INFO / s; slurmdbd: all RPCs / s",
        )
    ]


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("results", nargs="?", type=Path, help="default: bench/results/latest.json")
    parser.add_argument("--out-md", type=Path, help="markdown file to write or update")
    parser.add_argument("--plots", type=Path, help="directory for the PNGs")
    args = parser.parse_args(argv)
    path: Path = args.results or REPO / "bench" / "results" / "latest.json"
    results: Json = json.loads(path.read_text())
    if results.get("quick"):
        out_md = args.out_md or REPO / "bench" / "results" / "quick" / "benchmarks.md"
        plot_dir = args.plots or out_md.parent / "bench"
    else:
        out_md = args.out_md or REPO / "docs" / "benchmarks.md"
        plot_dir = args.plots or REPO / "docs" / "bench"
    try:
        source = str(path.resolve().relative_to(REPO))
    except ValueError:
        source = str(path)
    generated = render_markdown(results, source)
    existing = out_md.read_text() if out_md.exists() else None
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(merge(existing, generated))
    made = plots(results, plot_dir)
    if not results.get("quick"):
        # The published run: what the page shows, and what a fresh clone's --cases run keeps.
        write_json(plot_dir / "results.json", results)
    print(f"wrote {out_md} and {len(made)} plots in {plot_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
