"""Case 1, wait latency: from the last replica's exit to ``wait`` returning.

Every replica sleeps until a common deadline, appends the wall time to a
stamp file and exits, so all N replicas end in one burst, as a gang does.
The figure is ``time.time()`` right after the wait returned minus the latest
stamp. The deadline is set far enough after the submit that every replica is
running before the first one exits (adapted to the submit time of the
previous repetition).

Implementations:

* ``asupervisor``: ``await sv.wait(handle)``;
* ``torchx-wait10``: TorchX's ``Runner.wait`` with its default 10 s poll;
* ``torchx-wait1``: ``Runner.wait(wait_interval=1)``, what ``torchx run`` uses;
* ``anyio`` (baseline): N bare children from ``anyio.open_process``, awaiting
  every ``process.wait()``.

For the polling variants the deadline of repetition k of R gets an offset of
(k + 1/2) / R poll intervals, so the exits fall at phases spread evenly over
the poll (otherwise the latency would be the same fraction of the interval
every time); the median is then about half an interval, as for an app that
ends at a random moment.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from bench.util import (
    Json,
    add_ratios,
    child_parser,
    deadline_us,
    raise_nofile,
    read_stamps,
    run_rows,
    scratch,
    summarize,
    write_json,
    write_stamp_script,
)

BASELINE = "anyio"
IMPLS = {
    "asupervisor": "asupervisor `await sv.wait(h)`",
    "torchx-wait1": "TorchX `Runner.wait(wait_interval=1)`",
    "torchx-wait10": "TorchX `Runner.wait()` (default 10 s poll)",
    "anyio": "baseline: `await process.wait()` (anyio)",
}
POLL_INTERVAL = {"torchx-wait1": 1.0, "torchx-wait10": 10.0}
ENV = {"LC_ALL": "C"}  # EPOCHREALTIME uses the locale's decimal point


class _Lead:
    """Seconds between submitting and the replicas' common exit."""

    def __init__(self, n: int) -> None:
        self.seconds = 0.4 + n * 0.006

    def update(self, submit_s: float) -> None:
        self.seconds = max(0.3, 1.5 * submit_s + 0.3)


def _sample(done_at: float, stamps: list[float], n: int, submit_s: float) -> Json:
    if len(stamps) != n:
        raise RuntimeError(f"{len(stamps)} of {n} replicas stamped their exit")
    return {
        "latency_s": done_at - max(stamps),
        "exit_spread_s": max(stamps) - min(stamps),
        "submit_s": submit_s,
    }


async def _asupervisor(n: int, reps: int, tmp: Path) -> list[Json]:
    from supervisor import AppDef, Role, Supervisor

    script = write_stamp_script(tmp)
    lead = _Lead(n)
    out: list[Json] = []
    for rep in range(reps):
        stamps = tmp / f"stamps-{rep}"
        args = ["bash", str(script), str(deadline_us(lead.seconds)), str(stamps)]
        app = AppDef(
            name="wait",
            roles=[Role(name="r", entrypoint=args[0], args=args[1:], env=ENV, num_replicas=n)],
        )
        async with Supervisor(session="bench", state_dir=tmp / f"state-{rep}") as sv:
            started = time.perf_counter()
            handle = await sv.submit(app, "local")
            submit_s = time.perf_counter() - started
            status = await sv.wait(handle)
            done_at = time.time()
            if status.state.name != "SUCCEEDED":
                raise RuntimeError(f"app ended {status.state.name}: {status.msg}")
        out.append(_sample(done_at, read_stamps(stamps), n, submit_s))
        lead.update(submit_s)
    return out


async def _anyio(n: int, reps: int, tmp: Path) -> list[Json]:
    script = write_stamp_script(tmp)
    lead = _Lead(n)
    out: list[Json] = []
    env = {**os.environ, **ENV}
    for rep in range(reps):
        stamps = tmp / f"stamps-{rep}"
        argv = ["bash", str(script), str(deadline_us(lead.seconds)), str(stamps)]
        started = time.perf_counter()
        procs = [
            await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
            for _ in range(n)
        ]
        submit_s = time.perf_counter() - started
        async with anyio.create_task_group() as tg:
            for proc in procs:
                tg.start_soon(proc.wait)
        done_at = time.time()
        for proc in procs:
            await proc.aclose()
        out.append(_sample(done_at, read_stamps(stamps), n, submit_s))
        lead.update(submit_s)
    return out


def _torchx(n: int, reps: int, tmp: Path, interval: float) -> list[Json]:
    from torchx import specs
    from torchx.runner import get_runner

    from bench.torchx_util import quiet_torchx, torchx_teardown

    quiet_torchx()
    script = write_stamp_script(tmp)
    lead = _Lead(n)
    out: list[Json] = []
    for rep in range(reps):
        stamps = tmp / f"stamps-{rep}"
        # Phases spread evenly over the poll interval: with a few repetitions,
        # random phases would make the median a lottery.
        offset = (rep + 0.5) / reps * interval
        args = [str(script), str(deadline_us(lead.seconds + offset)), str(stamps)]
        app = specs.AppDef(
            name="wait",
            roles=[
                specs.Role(
                    name="r",
                    image=str(tmp),
                    entrypoint="bash",
                    args=args,
                    env=ENV,
                    num_replicas=n,
                )
            ],
        )
        runner = get_runner()
        try:
            started = time.perf_counter()
            handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp / f"logs-{rep}")})
            submit_s = time.perf_counter() - started
            status = runner.wait(handle, wait_interval=interval)
            done_at = time.time()
            if status is None or status.state.name != "SUCCEEDED":
                raise RuntimeError(f"app ended {status}")
        finally:
            torchx_teardown(runner)
        out.append(_sample(done_at, read_stamps(stamps), n, submit_s))
        lead.update(submit_s)
    return out


def child() -> None:
    parser = child_parser(__doc__ or "")
    args = parser.parse_args()
    raise_nofile()
    with scratch() as tmp:
        samples: list[Json]
        if args.impl == "asupervisor":
            samples = anyio.run(_asupervisor, args.n, args.reps, tmp)
        elif args.impl == "anyio":
            samples = anyio.run(_anyio, args.n, args.reps, tmp)
        elif args.impl in POLL_INTERVAL:
            samples = _torchx(args.n, args.reps, tmp, POLL_INTERVAL[args.impl])
        else:
            parser.error(f"unknown --impl {args.impl}")
    write_json(args.out, {"samples": samples})


def _fill(row: Json, result: Json, n: int) -> None:
    samples = result["samples"]
    row["stats"] = summarize([s["latency_s"] for s in samples])
    row["exit_spread"] = summarize([s["exit_spread_s"] for s in samples])
    row["submit"] = summarize([s["submit_s"] for s in samples])


def run_case(plan: dict[str, Any]) -> Json:
    """Every (implementation, N) of ``plan["runs"]`` in its own child process."""
    rows = run_rows("case_wait", plan, _fill)
    add_ratios(rows, BASELINE)
    return {
        "title": "wait latency: last replica exit -> wait() returns",
        "unit": "s",
        "baseline": BASELINE,
        "impls": IMPLS,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
