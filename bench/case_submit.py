"""Case 2, submit latency: how long launching an app of N replicas takes.

Replicas run ``sleep 60`` and are stopped after the measurement (teardown is
not timed). Each child first submits one untimed app of one replica, so
first-use costs (asupervisor's reaper and log thread, TorchX's scheduler
instance, imports) stay out of the figures.

Implementations:

* ``asupervisor``: ``await sv.submit(app, "local")`` (validation, dry run, the
  app's records on disk, N spawns with their pipes and pidfds), the
  repetitions back to back in one Supervisor;
* ``asupervisor-service``: the same submit as a long-running service makes it:
  one Supervisor (its own ``state_dir``) for all repetitions, a warm-up app,
  then before each timed submit a quiet while of ``QUIET_S`` (0.3 s) with
  nothing running. The ``asupervisor`` row's back-to-back submits never leave
  such a while, and a real service does: after one, the local reaper's first
  move of itself into an app's cgroup used to wait an RCU grace period
  (5-15 ms per submit; fixed since, a lone spawn is forked straight into the
  cgroup with clone3), which only this row would show;
* ``torchx``: ``runner.run(app, "local_cwd", cfg)`` (dry run and schedule:
  N spawns writing to log files, one ``Tee`` thread per replica);
* ``popen`` (baseline): a loop of ``subprocess.Popen`` with stdout/stderr
  pipes in a new session, as a supervisor that captures output needs;
* ``anyio-open-process``: a loop of ``await anyio.open_process(...)``, same
  arguments.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from bench.util import (
    Json,
    add_ratios,
    child_parser,
    raise_nofile,
    run_rows,
    scratch,
    summarize,
    write_json,
)

if TYPE_CHECKING:
    from supervisor import AppDef

BASELINE = "popen"
IMPLS = {
    "asupervisor": "asupervisor `await sv.submit(app, 'local')`",
    "asupervisor-service": "asupervisor in a running service (0.3 s quiet before each submit)",
    "torchx": "TorchX `runner.run(app, 'local_cwd')`",
    "popen": "baseline: loop of `subprocess.Popen`",
    "anyio-open-process": "loop of `await anyio.open_process`",
}
ARGV = ("sleep", "60")
QUIET_S = 0.3
"""``asupervisor-service``: the quiet while, nothing running, before each timed submit."""


def _app(replicas: int) -> AppDef:
    from supervisor import AppDef, Role

    role = Role(name="r", entrypoint=ARGV[0], args=ARGV[1:], num_replicas=replicas)
    return AppDef(name="submit", roles=[role])


async def _asupervisor(n: int, reps: int, tmp: Path, quiet_s: float = 0.0) -> list[float]:
    """One Supervisor for every repetition; ``quiet_s`` idle before each submit (a service's
    pace, see the docstring), none for back-to-back submits."""
    from supervisor import Supervisor

    out: list[float] = []
    async with Supervisor(session="bench", state_dir=tmp / "state") as sv:
        warm = await sv.submit(_app(1), "local")
        await sv.cancel(warm)
        await sv.wait(warm)
        for _ in range(reps):
            await anyio.sleep(quiet_s)
            started = time.perf_counter()
            handle = await sv.submit(_app(n), "local")
            out.append(time.perf_counter() - started)
            await sv.cancel(handle)
            await sv.wait(handle)
    return out


def _torchx(n: int, reps: int, tmp: Path) -> list[float]:
    from torchx import specs
    from torchx.runner import get_runner

    from bench.torchx_util import quiet_torchx, torchx_teardown

    quiet_torchx()

    def app(replicas: int) -> specs.AppDef:
        role = specs.Role(
            name="r",
            image=str(tmp),
            entrypoint=ARGV[0],
            args=list(ARGV[1:]),
            num_replicas=replicas,
        )
        return specs.AppDef(name="submit", roles=[role])

    out: list[float] = []
    for rep in range(reps):
        runner = get_runner()
        try:
            if rep == 0:
                runner.run(app(1), "local_cwd", cfg={"log_dir": str(tmp / "warm")})
            started = time.perf_counter()
            runner.run(app(n), "local_cwd", cfg={"log_dir": str(tmp / f"logs-{rep}")})
            out.append(time.perf_counter() - started)
        finally:
            torchx_teardown(runner)
    return out


def _popen(n: int, reps: int) -> list[float]:
    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ARGV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    out: list[float] = []
    _stop_popen([spawn()])
    for _ in range(reps):
        started = time.perf_counter()
        procs = [spawn() for _ in range(n)]
        out.append(time.perf_counter() - started)
        _stop_popen(procs)
    return out


def _stop_popen(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


async def _anyio(n: int, reps: int) -> list[float]:
    async def spawn() -> anyio.abc.Process:
        return await anyio.open_process(
            ARGV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    async def stop(procs: list[anyio.abc.Process]) -> None:
        for proc in procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            await proc.aclose()

    out: list[float] = []
    await stop([await spawn()])
    for _ in range(reps):
        started = time.perf_counter()
        procs = [await spawn() for _ in range(n)]
        out.append(time.perf_counter() - started)
        await stop(procs)
    return out


def child() -> None:
    parser = child_parser(__doc__ or "")
    args = parser.parse_args()
    raise_nofile()
    with scratch() as tmp:
        if args.impl == "asupervisor":
            samples = anyio.run(_asupervisor, args.n, args.reps, tmp)
        elif args.impl == "asupervisor-service":
            samples = anyio.run(_asupervisor, args.n, args.reps, tmp, QUIET_S)
        elif args.impl == "torchx":
            samples = _torchx(args.n, args.reps, tmp)
        elif args.impl == "popen":
            samples = _popen(args.n, args.reps)
        elif args.impl == "anyio-open-process":
            samples = anyio.run(_anyio, args.n, args.reps)
        else:
            parser.error(f"unknown --impl {args.impl}")
    write_json(args.out, {"samples": samples})


def _fill(row: Json, result: Json, n: int) -> None:
    row["stats"] = summarize(result["samples"])
    row["per_replica_ms"] = summarize([s / n * 1000 for s in result["samples"]])


def run_case(plan: dict[str, Any]) -> Json:
    rows = run_rows("case_submit", plan, _fill)
    add_ratios(rows, BASELINE)
    return {
        "title": "submit latency: launching an app of N replicas",
        "unit": "s",
        "baseline": BASELINE,
        "impls": IMPLS,
        "service_quiet_s": QUIET_S,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
