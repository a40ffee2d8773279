"""Case 5, logs: reading throughput over a 1,000,000-line file, and tail latency.

Throughput (lines of the file per second, however many are yielded), over a
``combined.log`` of about 60 bytes a line made by ``bench/log_throughput.py``,
page cache warm, in three modes: ``plain`` (every line), ``regex`` (a
selective pattern, ``request 0+12``: 1,111 lines match) and ``regex-all``
(``INFO``: every line matches, so every line is also yielded):

* ``asupervisor``: ``iter_log_lines(directory)``, what ``log_iter`` runs;
* ``torchx``: what ``LocalScheduler.log_iter`` builds over a file: its
  ``LogIterator`` (a stub scheduler says the app has ended), then
  ``split_lines_iterator`` and ``filter_regex``;
* ``grep`` (baseline): ``grep -c`` on the file (``grep -c ''`` for plain),
  process start included.

Tail latency: one replica prints ``time.time()`` on a line 50 times, 50 ms
apart; the follower subtracts the stamp from ``time.time()`` when the line is
yielded. ``asupervisor`` follows with ``log_iter(should_tail=True)``,
``torchx`` with ``runner.log_lines(should_tail=True)``, and the baseline reads
the child's stdout pipe directly (``anyio.open_process``).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from bench.util import (
    Json,
    add_ratios,
    child_parser,
    raise_nofile,
    run_child,
    scratch,
    summarize,
    write_json,
)

BASELINE = "grep"
TAIL_BASELINE = "pipe"
MODES = {"plain": None, "regex": r"request 0+12", "regex-all": "INFO"}
IMPLS = {
    "asupervisor": "asupervisor `iter_log_lines` (what `log_iter` runs)",
    "torchx": "TorchX local `LogIterator` + `split_lines_iterator` + `filter_regex`",
    "grep": "baseline: `grep -c` (process start included)",
}
TAIL_IMPLS = {
    "asupervisor": "asupervisor `log_iter(should_tail=True)`",
    "torchx": "TorchX `runner.log_lines(should_tail=True)`",
    "pipe": "baseline: reading the child's stdout pipe (anyio)",
}
WRITER = """\
import sys, time
count, gap = int(sys.argv[1]), float(sys.argv[2])
time.sleep(0.5)
for _ in range(count):
    print(repr(time.time()), flush=True)
    time.sleep(gap)
"""


# ----------------------------------------------------------------------- throughput
def generate(directory: Path, lines: int) -> Path:
    """A ``combined.log`` of ``lines`` lines in ``directory`` (bench/log_throughput.py's)."""
    from bench.log_throughput import _generate

    _generate(directory, lines)
    return directory / "combined.log"


async def _asupervisor_read(path: Path, regex: str | None) -> int:
    from supervisor.logs import Stream, iter_log_lines

    seen = 0
    async for _ in iter_log_lines(path.parent, stream=Stream.COMBINED, regex=regex):
        seen += 1
    return seen


def _torchx_read(path: Path, regex: str | None) -> int:
    from torchx.schedulers.api import filter_regex, split_lines_iterator
    from torchx.schedulers.local_scheduler import LogIterator

    class _Ended:
        """The only scheduler call LogIterator makes: describe() -> None means ended."""

        def describe(self, app_id: str) -> None:
            return None

    scheduler: Any = _Ended()
    iterator: Any = LogIterator("bench", str(path), scheduler, should_tail=False)
    lines: Any = split_lines_iterator(iterator)
    if regex:
        lines = filter_regex(regex, lines)
    return sum(1 for _ in lines)


def _grep(path: Path, regex: str | None) -> int:
    argv = ["grep", "-c", "-E", regex or "", str(path)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):
        raise RuntimeError(out.stderr)
    return int(out.stdout.strip() or 0)


def _import_reader(impl: str) -> None:
    """Import what ``impl`` reads with before the first timing: a first repetition that
    imported it ran at about half the rate of the others (2026-11-28)."""
    if impl == "asupervisor":
        importlib.import_module("supervisor.logs")
    elif impl == "torchx":
        importlib.import_module("torchx.schedulers.local_scheduler")


def _throughput(impl: str, path: Path, regex: str | None, reps: int, total: int) -> Json:
    _import_reader(impl)
    rates: list[float] = []
    yielded = 0
    for _ in range(reps):
        started = time.perf_counter()
        if impl == "asupervisor":
            yielded = anyio.run(_asupervisor_read, path, regex)
        elif impl == "torchx":
            yielded = _torchx_read(path, regex)
        elif impl == "grep":
            yielded = _grep(path, regex)
        else:
            raise ValueError(impl)
        rates.append(total / (time.perf_counter() - started))
    return {"rates": rates, "yielded": yielded}


# ---------------------------------------------------------------------- tail latency
def _writer_argv(tmp: Path, count: int, gap: float) -> list[str]:
    script = tmp / "writer.py"
    script.write_text(WRITER)
    return [sys.executable, str(script), str(count), str(gap)]


def _latency(line: str) -> float | None:
    now = time.time()
    try:
        return now - float(line)
    except ValueError:
        return None


async def _asupervisor_tail(tmp: Path, count: int, gap: float, reps: int) -> list[float]:
    from supervisor import AppDef, Role, Supervisor

    argv = _writer_argv(tmp, count, gap)
    out: list[float] = []
    for rep in range(reps):
        app = AppDef(name="tail", roles=[Role(name="w", entrypoint=argv[0], args=argv[1:])])
        async with Supervisor(session="bench", state_dir=tmp / f"state-{rep}") as sv:
            handle = await sv.submit(app, "local")
            async for line in sv.log_iter(handle, "w", 0, should_tail=True):
                latency = _latency(line)
                if latency is not None:
                    out.append(latency)
            await sv.wait(handle)
    return out


def _torchx_tail(tmp: Path, count: int, gap: float, reps: int) -> list[float]:
    from torchx import specs
    from torchx.runner import get_runner

    from bench.torchx_util import quiet_torchx, torchx_teardown

    quiet_torchx()
    argv = _writer_argv(tmp, count, gap)
    out: list[float] = []
    for rep in range(reps):
        role = specs.Role(name="w", image=str(tmp), entrypoint=argv[0], args=argv[1:])
        app = specs.AppDef(name="tail", roles=[role])
        runner = get_runner()
        try:
            handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp / f"logs-{rep}")})
            for line in runner.log_lines(handle, "w", 0, should_tail=True):
                latency = _latency(line)
                if latency is not None:
                    out.append(latency)
            runner.wait(handle, wait_interval=0.1)
        finally:
            torchx_teardown(runner)
    return out


async def _pipe_tail(tmp: Path, count: int, gap: float, reps: int) -> list[float]:
    from anyio.streams.buffered import BufferedByteReceiveStream

    argv = _writer_argv(tmp, count, gap)
    out: list[float] = []
    for _ in range(reps):
        async with await anyio.open_process(argv, stderr=subprocess.DEVNULL) as proc:
            assert proc.stdout is not None
            reader = BufferedByteReceiveStream(proc.stdout)
            while True:
                try:
                    line = await reader.receive_until(b"\n", 1 << 16)
                except (anyio.IncompleteRead, anyio.EndOfStream):
                    break
                latency = _latency(line.decode())
                if latency is not None:
                    out.append(latency)
            await proc.wait()
    return out


def child() -> None:
    parser = child_parser(__doc__ or "")
    parser.add_argument("--mode", choices=["throughput", "tail"], required=True)
    parser.add_argument("--file", type=Path, help="throughput: the log file")
    parser.add_argument("--regex-mode", choices=list(MODES), default="plain")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--gap", type=float, default=0.05)
    args = parser.parse_args()
    raise_nofile()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.mode == "throughput":
        result = _throughput(args.impl, args.file, MODES[args.regex_mode], args.reps, args.lines)
    else:
        with scratch() as tmp:
            if args.impl == "asupervisor":
                samples = anyio.run(_asupervisor_tail, tmp, args.n, args.gap, args.reps)
            elif args.impl == "torchx":
                samples = _torchx_tail(tmp, args.n, args.gap, args.reps)
            elif args.impl == "pipe":
                samples = anyio.run(_pipe_tail, tmp, args.n, args.gap, args.reps)
            else:
                parser.error(f"unknown --impl {args.impl}")
        result = {"samples": samples}
    write_json(args.out, result)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_case(plan: dict[str, Any]) -> Json:
    lines = int(plan["lines"])
    reps = int(plan["reps"])
    rows: list[Json] = []
    with scratch() as tmp:
        path = generate(tmp, lines)
        size = path.stat().st_size
        for mode in MODES:
            for impl in IMPLS:
                impl_reps = reps if impl != "torchx" else int(plan.get("torchx_reps", reps))
                result = run_child(
                    "case_logs",
                    [
                        "--mode",
                        "throughput",
                        "--impl",
                        impl,
                        "--reps",
                        str(impl_reps),
                        "--file",
                        str(path),
                        "--regex-mode",
                        mode,
                        "--lines",
                        str(lines),
                    ],
                    timeout=plan.get("timeout_s", 900),
                )
                row: Json = {"impl": impl, "mode": mode, "regex": MODES[mode], "reps": impl_reps}
                if "error" in result:
                    row["error"] = result["error"]
                else:
                    row["stats"] = summarize(result["rates"])
                    row["yielded"] = result["yielded"]
                rows.append(row)
    add_ratios(rows, BASELINE, key="mode")
    tail_rows: list[Json] = []
    for impl in TAIL_IMPLS:
        result = run_child(
            "case_logs",
            [
                "--mode",
                "tail",
                "--impl",
                impl,
                "--reps",
                str(plan["tail_reps"]),
                "--n",
                str(plan["tail_lines"]),
                "--gap",
                str(plan["tail_gap_s"]),
            ],
            timeout=plan.get("timeout_s", 900),
        )
        row = {"impl": impl, "reps": plan["tail_reps"], "lines_per_rep": plan["tail_lines"]}
        if "error" in result:
            row["error"] = result["error"]
        else:
            samples = result["samples"]
            row["stats"] = summarize(samples)
            row["p90"] = _percentile(samples, 0.9)
            row["p99"] = _percentile(samples, 0.99)
            del row["stats"]["samples"][200:]
        tail_rows.append(row)
    add_ratios(tail_rows, TAIL_BASELINE, key="reps")
    return {
        "title": "logs: lines/s over a 1,000,000-line file, and tail latency",
        "unit": "lines/s",
        "baseline": BASELINE,
        "impls": IMPLS,
        "lines": lines,
        "bytes": size,
        "modes": MODES,
        "rows": rows,
        "tail": {
            "title": "tail latency: a line written -> the follower yields it",
            "unit": "s",
            "baseline": TAIL_BASELINE,
            "impls": TAIL_IMPLS,
            "gap_s": plan["tail_gap_s"],
            "rows": tail_rows,
        },
    }


if __name__ == "__main__":
    child()
