"""Cases 3 and 4, supervision cost and memory: N replicas of ``sleep 10``, logs followed.

Each run is one child process that supervises the app to its end the way a
user would, following every replica's log:

* ``asupervisor``: the library: ``submit``, one ``log_iter(should_tail=True)``
  task per replica (lines written to /dev/null), ``wait``;
* ``asupervisor-cli``: ``asupervisor run --log`` (its ``main``, in process);
* ``asupervisor-nologs``: the library, ``submit`` and ``wait`` only (no log
  following): a diagnostic that splits supervision from log following;
* ``torchx-cli``: ``torchx run --scheduler local_cwd`` (its ``main``, in
  process; on local schedulers it always waits and follows the logs);
* ``anyio`` (baseline): N ``anyio.open_process`` children whose stdout and
  stderr pipes are read to the end, then waited for.

Figures, all of the supervising process and its helper processes
(asupervisor's reaper watchdog), never of the replicas:

* ``steady``: CPU in a window from 1 s after the last spawn to 1 s before the
  first replica's exit, as % of one core: the cost of watching sleeping
  replicas (target: < 1 % for 1,000);
* ``total``: CPU seconds from the first spawn to the end (spawning, following,
  reaping, closing);
* ``peak RSS`` (``ru_maxrss``) and, with the RSS of an idle process that
  imported the same code subtracted, the RSS per supervised replica.

CPU comes from ``getrusage(RUSAGE_SELF)`` in the supervising process (every
thread, microsecond resolution) plus ``/proc/<pid>/stat`` of its live
children other than ``sleep`` (the reaper); replicas are reaped into
``RUSAGE_CHILDREN``, which is never read.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.lowlevel

from bench.util import (
    REPO,
    HelperCpu,
    Json,
    add_ratios,
    child_parser,
    cpu_self,
    maxrss_kib,
    raise_nofile,
    ratio,
    run_child,
    scratch,
    summarize,
    write_json,
)

BASELINE = "anyio"
IMPLS = {
    "asupervisor": "asupervisor library: submit + log_iter(should_tail=True) per replica + wait",
    "asupervisor-cli": "`asupervisor run --log`",
    "asupervisor-nologs": "asupervisor library, submit + wait only (diagnostic: no logs followed)",
    "torchx-cli": "`torchx run --scheduler local_cwd` (follows logs)",
    "anyio": "baseline: anyio.open_process, pipes read to EOF, wait",
}
IDLE = {
    "asupervisor": "`sv.dryrun(app)` inside `async with Supervisor()`",
    "asupervisor-cli": "`asupervisor run --dryrun ...`",
    "asupervisor-nologs": "`sv.dryrun(app)` inside `async with Supervisor()`",
    "torchx-cli": "`torchx run --dryrun ...`",
    "anyio": "`import anyio` and an empty event loop",
}
REPLICA_COMMANDS = frozenset({"sleep"})


class Probe:
    """CPU of this process and its helpers: a steady window after the launch, and the total.

    A thread samples; it sleeps between the few samples it takes, so it
    costs the measured process next to nothing.
    """

    def __init__(self, seconds: float, *, scan_helpers: bool) -> None:
        self.seconds = seconds
        self.scan_helpers = scan_helpers
        self.launch_start: float | None = None
        self.launch_end: float | None = None
        self.cpu_before = 0.0
        self.window: Json = {}
        self._helpers = HelperCpu(REPLICA_COMMANDS)
        self._launched = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-probe", daemon=True)
        self._thread.start()

    def _find_helpers(self) -> None:
        """Note this process's helper children once, after the launch.

        Only asupervisor starts one (its reaper); TorchX's local scheduler
        and the baseline start nothing but replicas. Scanning a thousand
        children from a process whose thousands of threads fight over the
        GIL (TorchX) takes seconds, so it is skipped where there is nothing
        to find.
        """
        if self.scan_helpers:
            self._helpers.find()

    def _sample(self) -> tuple[float, float]:
        """(CPU seconds, monotonic time), taken together; the helpers' CPU is added after."""
        cpu, at = cpu_self(), time.monotonic()
        return cpu + self._helpers.read(), at

    def started(self) -> None:
        if self.launch_start is None:
            self.cpu_before = self._sample()[0]
            self.launch_start = time.monotonic()

    def launched(self) -> None:
        if self.launch_end is None:
            self.launch_end = time.monotonic()
            self._launched.set()

    def _run(self) -> None:
        self._launched.wait()
        assert self.launch_start is not None
        assert self.launch_end is not None
        self._find_helpers()
        begin = self.launch_end + 1.0
        end = self.launch_start + self.seconds - 1.0
        if end - max(begin, time.monotonic()) < 1.0:
            spawn = self.launch_end - self.launch_start
            self.window = {"error": f"no 1 s window left (spawning took {spawn:.1f} s)"}
        else:
            time.sleep(max(0.0, begin - time.monotonic()))
            c0, t0 = self._sample()
            time.sleep(max(0.0, end - t0))
            c1, t1 = self._sample()
            self.window = {
                "cpu_s": c1 - c0,
                "seconds": t1 - t0,
                "core_pct": 100 * (c1 - c0) / (t1 - t0),
            }
        # Keep the helpers' CPU current until the end: a reaper that exits
        # with its supervisor is no longer readable afterwards.
        while not self._done.wait(0.5):
            self._helpers.read()

    def finish(self) -> Json:
        total = self._sample()[0] - self.cpu_before
        self._done.set()
        self._thread.join(5)
        spawn = (
            None
            if self.launch_start is None or self.launch_end is None
            else self.launch_end - self.launch_start
        )
        return {
            "steady": self.window,
            "total_cpu_s": total,
            "helper_cpu_s": self._helpers.last,
            "helpers": sorted(set(self._helpers.names.values())),
            "spawn_s": spawn,
            "maxrss_kib": maxrss_kib(),
        }


# ------------------------------------------------------------------ implementations
async def _asupervisor(
    n: int, seconds: float, tmp: Path, probe: Probe, sink: TextIO | None
) -> Json:
    """The library; lines go to ``sink`` (/dev/null), no log following without one."""
    from supervisor import AppDef, Role, Supervisor

    app = AppDef(
        name="sleepers",
        roles=[Role(name="sleep", entrypoint="sleep", args=[f"{seconds:g}"], num_replicas=n)],
    )

    async def follow(sv: Supervisor, handle: str, k: int, out: TextIO) -> None:
        async for line in sv.log_iter(handle, "sleep", k, should_tail=True):
            out.write(line)

    async with Supervisor(session="bench", state_dir=tmp / "state") as sv:
        probe.started()
        handle = await sv.submit(app, "local", cfg={"log_dir": str(tmp / "logs")})
        probe.launched()
        async with anyio.create_task_group() as tg:
            if sink is not None:
                for k in range(n):
                    tg.start_soon(follow, sv, handle, k, sink)
            status = await sv.wait(handle)
        if status.state.name != "SUCCEEDED":
            raise RuntimeError(f"app ended {status.state.name}: {status.msg}")
        return probe.finish()


def _asupervisor_cli(n: int, seconds: float, tmp: Path, probe: Probe) -> Json:
    from supervisor.cli.main import cli
    from supervisor.supervisor import Supervisor

    dryrun = Supervisor.dryrun
    schedule = Supervisor.schedule

    def timed_dryrun(self: Supervisor, *args: Any, **kwargs: Any) -> Any:
        probe.started()
        return dryrun(self, *args, **kwargs)

    async def timed_schedule(self: Supervisor, info: Any) -> str:
        handle = await schedule(self, info)
        probe.launched()
        return handle

    supervisor_cls: Any = Supervisor
    supervisor_cls.dryrun = timed_dryrun
    supervisor_cls.schedule = timed_schedule
    argv = _asupervisor_argv(n, seconds, tmp, "--log")
    code = _call_main(lambda: cli.main(args=argv, prog_name="asupervisor"))
    if code not in (0, None):
        raise RuntimeError(f"asupervisor run exited {code}")
    return probe.finish()


def _asupervisor_argv(n: int, seconds: float, tmp: Path, mode: str) -> list[str]:
    """``asupervisor run MODE`` of the sleepers component (MODE: --log or --dryrun)."""
    return [
        "--session",
        "bench",
        "--state-dir",
        str(tmp / "state"),
        "run",
        mode,
        "--cfg",
        f"log_dir={tmp / 'logs'}",
        str(REPO / "bench" / "components" / "ours.py") + ":sleepers",
        "--n",
        str(n),
        "--seconds",
        f"{seconds:g}",
    ]


def _torchx_argv(n: int, seconds: float, tmp: Path, *extra: str) -> list[str]:
    return [
        "run",
        *extra,
        "--scheduler",
        "local_cwd",
        "--scheduler_args",
        f"log_dir={tmp / 'logs'}",
        str(REPO / "bench" / "components" / "torchx_app.py") + ":sleepers",
        "--n",
        str(n),
        "--seconds",
        f"{seconds:g}",
    ]


def _torchx_cli(n: int, seconds: float, tmp: Path, probe: Probe) -> Json:
    from torchx.cli.main import main
    from torchx.runner.api import Runner
    from torchx.schedulers.local_scheduler import LocalScheduler

    run_component = Runner.run_component
    schedule = LocalScheduler.schedule

    def timed_run_component(self: Runner, *args: Any, **kwargs: Any) -> Any:
        probe.started()
        return run_component(self, *args, **kwargs)

    def timed_schedule(self: LocalScheduler, dryrun_info: Any) -> str:
        app_id: str = schedule(self, dryrun_info)
        probe.launched()
        return app_id

    runner_cls: Any = Runner
    scheduler_cls: Any = LocalScheduler
    runner_cls.run_component = timed_run_component
    scheduler_cls.schedule = timed_schedule
    code = _call_main(lambda: main(_torchx_argv(n, seconds, tmp)))
    if code not in (0, None):
        raise RuntimeError(f"torchx run exited {code}")
    return probe.finish()


async def _anyio(n: int, seconds: float, tmp: Path, probe: Probe) -> Json:
    argv = ["sleep", f"{seconds:g}"]

    async def drain(stream: Any) -> None:
        async for _ in stream:
            pass

    async def follow(proc: anyio.abc.Process) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, proc.stdout)
            tg.start_soon(drain, proc.stderr)
        await proc.wait()
        await proc.aclose()

    probe.started()
    procs = [
        await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    probe.launched()
    async with anyio.create_task_group() as tg:
        for proc in procs:
            tg.start_soon(follow, proc)
    return probe.finish()


def _call_main(main: Callable[[], object]) -> int | None:
    """A command line's exit status (its ``main`` raises SystemExit)."""
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return None


def _idle(impl: str, n: int, seconds: float, tmp: Path) -> Json:
    """The RSS floor: the same process dry-running the same app, launching nothing.

    Everything the run path imports is imported and the request for N
    replicas is rendered, so (peak - idle) / N is what supervising costs.
    """
    if impl in ("asupervisor", "asupervisor-nologs"):
        from supervisor import AppDef, Role, Supervisor

        async def dry() -> None:
            role = Role(name="sleep", entrypoint="sleep", args=[f"{seconds:g}"], num_replicas=n)
            async with Supervisor(session="bench", state_dir=tmp / "state") as sv:
                sv.dryrun(AppDef(name="sleepers", roles=[role]), "local")

        anyio.run(dry)
    elif impl == "asupervisor-cli":
        from supervisor.cli.main import cli

        argv = _asupervisor_argv(n, seconds, tmp, "--dryrun")
        _call_main(lambda: cli.main(args=argv, prog_name="asupervisor"))
    elif impl == "torchx-cli":
        from torchx.cli.main import main

        _call_main(lambda: main(_torchx_argv(n, seconds, tmp, "--dryrun")))
    else:
        anyio.run(anyio.lowlevel.checkpoint)
    return {"maxrss_kib": maxrss_kib()}


def child() -> None:
    parser = child_parser(__doc__ or "")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", action="store_true", help="only the idle RSS of --impl")
    args = parser.parse_args()
    raise_nofile()
    if args.idle:
        with scratch() as tmp:
            write_json(args.out, _idle(args.impl, args.n, args.seconds, tmp))
        return
    with scratch() as tmp:
        probe = Probe(args.seconds, scan_helpers=args.impl.startswith("asupervisor"))
        if args.impl == "asupervisor":
            with open(os.devnull, "w") as sink:
                result = anyio.run(_asupervisor, args.n, args.seconds, tmp, probe, sink)
        elif args.impl == "asupervisor-nologs":
            result = anyio.run(_asupervisor, args.n, args.seconds, tmp, probe, None)
        elif args.impl == "anyio":
            result = anyio.run(_anyio, args.n, args.seconds, tmp, probe)
        elif args.impl == "asupervisor-cli":
            result = _asupervisor_cli(args.n, args.seconds, tmp, probe)
        elif args.impl == "torchx-cli":
            result = _torchx_cli(args.n, args.seconds, tmp, probe)
        else:
            parser.error(f"unknown --impl {args.impl}")
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    write_json(args.out, result)


def run_case(plan: dict[str, Any]) -> Json:
    """Every (implementation, N, repetitions) of ``plan["runs"]``; one child per repetition."""
    seconds = float(plan.get("seconds", 10.0))
    idle: dict[tuple[str, int], Json] = {}
    for impl, n in sorted({(impl, n) for impl, n, _ in plan["runs"]}):
        idle[impl, n] = run_child(
            "case_supervise",
            ["--impl", impl, "--n", str(n), "--seconds", f"{seconds:g}", "--idle"],
            timeout=120,
        )
    rows: list[Json] = []
    for impl, n, reps in plan["runs"]:
        runs = [
            run_child(
                "case_supervise",
                ["--impl", impl, "--n", str(n), "--seconds", f"{seconds:g}"],
                timeout=plan.get("timeout_s", 600),
            )
            for _ in range(reps)
        ]
        rows.append(_row(impl, n, reps, runs, idle[impl, n].get("maxrss_kib")))
    for figure, name in (
        ("steady_pct", "steady"),
        ("total_cpu", "total"),
        ("rss_per_replica_kib", "rss"),
    ):
        by_figure = [dict(r, stats=r.get(figure)) for r in rows]
        add_ratios(by_figure, BASELINE)
        for row, with_ratio in zip(rows, by_figure, strict=True):
            row[f"{name}_ratio_to_baseline"] = with_ratio["ratio_to_baseline"]
    return {
        "title": f"supervision cost and memory: N replicas of `sleep {seconds:g}`, logs followed",
        "unit": "mixed",
        "baseline": BASELINE,
        "impls": IMPLS,
        "idle": {impl: IDLE[impl] for impl, _ in idle},
        "seconds": seconds,
        "rows": rows,
    }


def _row(impl: str, n: int, reps: int, runs: list[Json], idle_kib: int | None) -> Json:
    good = [r for r in runs if "error" not in r]
    row: Json = {"impl": impl, "n": n, "reps": reps}
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        row["errors"] = errors
    if not good:
        row["error"] = errors[0] if errors else "no run"
        return row
    steady = [r["steady"]["core_pct"] for r in good if "core_pct" in r.get("steady", {})]
    row["steady_pct"] = summarize(steady)
    skipped = [r["steady"]["error"] for r in good if "error" in r.get("steady", {})]
    if skipped:
        row["steady_skipped"] = skipped
    row["total_cpu"] = summarize([r["total_cpu_s"] for r in good])
    row["helper_cpu"] = summarize([r["helper_cpu_s"] for r in good])
    row["spawn"] = summarize([r["spawn_s"] for r in good if r.get("spawn_s") is not None])
    row["maxrss_mib"] = summarize([r["maxrss_kib"] / 1024 for r in good])
    row["idle_rss_mib"] = None if idle_kib is None else idle_kib / 1024
    if idle_kib is not None:
        row["rss_per_replica_kib"] = summarize([(r["maxrss_kib"] - idle_kib) / n for r in good])
    row["wall"] = summarize([r["wall_s"] for r in good])
    row["stats"] = row["steady_pct"]
    row["cpu_per_replica_ms"] = ratio(
        1000 * row["total_cpu"]["median"], n if row["total_cpu"]["n"] else None
    )
    return row


if __name__ == "__main__":
    child()
