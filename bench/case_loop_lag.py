"""Case 8, loop lag: how long the host's event loop stalls while the library works.

A service that embeds the Supervisor shares its event loop with it: every
millisecond the library holds the loop is a millisecond no request is served.
A ticker task sleeps 5 ms in a loop and records, for every tick, how much
later than asked it woke up; the figure is the **worst** such stall in a
phase. The same child measures four phases, in this order, in one event loop:

* ``idle``: the ticker alone, with the Supervisor open and its reaper warm
  (what the machine's own noise costs);
* ``floor``: the ticker alone again, while *another process* starts the same
  N replicas with a bare loop of ``subprocess.Popen`` (pipes, a session each:
  case 2's baseline), from its first spawn to its last. No library code runs
  in the host meanwhile: this is what the machine itself does to a loop that
  only sleeps while N processes start beside it, so what ``submit`` shows
  above it is the library's. A reference, not a target (about idle's here:
  the kernel shares the CPUs between sessions, and the host has one of its own);
* ``submit``: ``await sv.submit(app, "local")`` of one app of N replicas
  (``sleep 60``), from the call until it returns with every replica spawned;
  the app is then cancelled and waited for (not measured);
* ``follow``: F ``log_iter(..., should_tail=True)`` followers, one per replica
  of an app whose replicas each print a line every 10 ms (``--line-period-s``)
  for a few seconds, every follower consuming its lines, for the window given.

For each phase the ticker also records the garbage collector's *full*
collections (generation 2, through ``gc.callbacks``): how many ran and the
longest, and the worst stall of the ticks that no full collection overlapped.
A full pass holds the GIL for a time that grows with every object of the host's
heap (the host's own included); the library's allocations decide how often one
comes, not how long it takes. The target is still read on the worst stall of all.

For each phase the ticker also records how much of its worst stall the loop's
thread spent *runnable but not running* (``run_delay`` in the thread's
``/proc`` schedstat): time the kernel gave the CPU to other processes, which
no change inside the host's process can take back. A stall made of that is the
machine being saturated; a stall the thread spent on the CPU is the host's own
work.

The target: the worst stall of ``submit`` and of ``follow`` at most 20 ms
above the worst stall of ``idle`` in the same run. Nothing is asserted; the
report gives the figures and the verdict.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.text import TextReceiveStream

from bench.util import Json, child_parser, raise_nofile, run_child, scratch, summarize, write_json

PERIOD_S = 0.005
TARGET_EXCESS_S = 0.020
PHASES = ("idle", "floor", "submit", "follow")
# Another process that, once its Python is up and it is told to on its stdin, starts N
# replicas as case 2's Popen baseline does (each in a session of its own, as the library's
# replicas), says so on its stdout when the last one runs, and kills them all at the end
# of its stdin. Any it left behind carry the bench's tag, which ``run_child`` kills. The
# open-files limit the bench raised is inherited.
SPAWNER = (
    "import subprocess, sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "children = [subprocess.Popen(['sleep', '60'], stdin=subprocess.DEVNULL,\n"
    "    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)\n"
    "    for _ in range(int(sys.argv[1]))]\n"
    "print('started', flush=True)\n"
    "sys.stdin.read()\n"
    "for child in children:\n"
    "    child.kill()\n"
    "for child in children:\n"
    "    child.wait()\n"
)
# A replica that prints a numbered line every 10 ms for about ``argv[1]`` seconds. In
# Python, not a shell loop: a shell forks ``sleep`` for every line, and 100 of them fork
# 10,000 times a second, which saturates 2 cores and stalls the ticker by itself
# (0.9 s with no follower at all), whatever the library does.
TALKER = (
    "import sys, time\n"
    "period = float(sys.argv[2])\n"
    "for i in range(int(float(sys.argv[1]) / period)):\n"
    "    print('line', i, flush=True)\n"
    "    time.sleep(period)\n"
)
LINE_PERIOD_S = 0.01
"""How often each talker prints, unless ``--line-period-s`` says otherwise."""


def _run_delay_ns(fd: int) -> int:
    """Nanoseconds this thread has waited on a run queue so far (its schedstat's 2nd field)."""
    return int(os.pread(fd, 128, 0).split()[1])


class FullCollections:
    """The garbage collector's full passes (generation 2), noted through ``gc.callbacks``.

    A pass holds the GIL in whichever thread triggered it, so the loop's thread
    cannot run during one: a tick that woke after a pass ended, and slept
    before it, was stalled by it.
    """

    def __init__(self) -> None:
        self.last_end = float("-inf")
        self.passes: list[float] = []
        self._started = 0.0

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def reset(self) -> None:
        self.passes = []

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.last_end = time.perf_counter()
            self.passes.append(self.last_end - self._started)


class Ticker:
    """Sleeps ``PERIOD_S`` in a loop; ``worst`` is the largest lateness seen while armed.

    ``worst_queued``: of that worst stall, the seconds the loop's thread was
    runnable but waiting for a CPU (None where schedstat is missing).
    ``worst_clear``: the largest lateness of the ticks no full collection overlapped.
    """

    def __init__(self, collections: FullCollections) -> None:
        self.collections = collections
        self.reset()

    def reset(self) -> None:
        self.worst, self.worst_queued, self.worst_clear, self.ticks = 0.0, None, 0.0, 0
        self.collections.reset()

    async def run(self) -> None:
        try:
            fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = None
        try:
            while True:
                queued = 0 if fd is None else _run_delay_ns(fd)
                asked = time.perf_counter()
                await anyio.sleep(PERIOD_S)
                woke = time.perf_counter()
                late = woke - asked - PERIOD_S
                self.ticks += 1
                if self.collections.last_end < asked:
                    self.worst_clear = max(self.worst_clear, late)
                if late > self.worst:
                    self.worst = late
                    if fd is not None:
                        self.worst_queued = (_run_delay_ns(fd) - queued) / 1e9
        finally:
            if fd is not None:
                os.close(fd)


async def _bare_spawn(n: int, ticker: Ticker, record: Callable[[str], None]) -> None:
    """The ``floor`` phase: the ticker's worst while ``SPAWNER`` starts N replicas.

    Recorded as soon as the last one runs; their kill and reaping come after.
    """
    spawner = await anyio.open_process([sys.executable, "-I", "-c", SPAWNER, str(n)])
    try:
        assert spawner.stdin is not None
        assert spawner.stdout is not None
        lines = TextReceiveStream(spawner.stdout)
        said = await lines.receive()
        if not said.startswith("ready"):
            raise RuntimeError(f"the bare spawner said {said!r}")
        ticker.reset()
        await spawner.stdin.send(b"go\n")
        said = await lines.receive()
        record("floor")
        if not said.startswith("started"):
            raise RuntimeError(f"the bare spawner said {said!r}")
        await spawner.stdin.aclose()
        with anyio.fail_after(30):
            await spawner.wait()
    finally:
        if spawner.returncode is None:  # it failed on the way: its replicas carry the tag
            spawner.kill()
        await spawner.aclose()


async def _measure(
    n: int,
    followers: int,
    reps: int,
    idle_s: float,
    follow_s: float,
    line_period_s: float,
    tmp: Path,
    collections: FullCollections,
) -> Json:
    from supervisor import AppDef, Role, Supervisor

    out: dict[str, list[float]] = {phase: [] for phase in PHASES}
    queued: dict[str, list[float | None]] = {phase: [] for phase in PHASES}
    ticks: dict[str, list[int]] = {phase: [] for phase in PHASES}
    clear: dict[str, list[float]] = {phase: [] for phase in PHASES}
    passes: dict[str, list[list[float]]] = {phase: [] for phase in PHASES}
    ticker = Ticker(collections)

    def record(phase: str) -> None:
        out[phase].append(ticker.worst)
        queued[phase].append(ticker.worst_queued)
        ticks[phase].append(ticker.ticks)
        clear[phase].append(ticker.worst_clear)
        passes[phase].append(list(collections.passes))

    async with (
        Supervisor(session="bench", state_dir=tmp / "state") as sv,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(ticker.run)
        sleeper = Role(name="r", entrypoint="sleep", args=["60"], num_replicas=1)
        warm = await sv.submit(AppDef(name="warm", roles=[sleeper]), "local")
        await sv.cancel(warm)
        await sv.wait(warm)
        for _ in range(reps):
            ticker.reset()
            await anyio.sleep(idle_s)
            record("idle")

            await _bare_spawn(n, ticker, record)

            app = AppDef(
                name="lag", roles=[Role(name="r", entrypoint="sleep", args=["60"], num_replicas=n)]
            )
            ticker.reset()
            handle = await sv.submit(app, "local")
            record("submit")
            await sv.cancel(handle)
            await sv.wait(handle)

            talker = Role(
                name="t",
                entrypoint=sys.executable,
                args=["-c", TALKER, str(follow_s + 1), str(line_period_s)],
                num_replicas=followers,
            )
            handle = await sv.submit(AppDef(name="follow", roles=[talker]), "local")

            async def follow(handle: str, k: int) -> None:
                async for _ in sv.log_iter(handle, "t", k, should_tail=True):
                    pass

            with anyio.move_on_after(follow_s + 5):
                async with anyio.create_task_group() as readers:
                    for k in range(followers):
                        readers.start_soon(follow, handle, k)
                    await anyio.sleep(0.5)  # every follower open and reading
                    ticker.reset()
                    await anyio.sleep(follow_s)
                    record("follow")
                    readers.cancel_scope.cancel()
            await sv.cancel(handle)
            await sv.wait(handle)
        tg.cancel_scope.cancel()
    return {
        "worst": out,
        "worst_queued": queued,
        "ticks": ticks,
        "worst_clear": clear,
        "full_collections": passes,
    }


def child() -> None:
    parser = child_parser(__doc__ or "")
    parser.add_argument("--followers", type=int, default=100)
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--follow-s", type=float, default=3.0)
    parser.add_argument("--line-period-s", type=float, default=LINE_PERIOD_S)
    args = parser.parse_args()
    raise_nofile()
    with scratch() as tmp, FullCollections() as collections:
        result = anyio.run(
            _measure,
            args.n,
            args.followers,
            args.reps,
            args.idle_s,
            args.follow_s,
            args.line_period_s,
            tmp,
            collections,
        )
    write_json(args.out, result)


def _queued_in_worst(worst: list[float], queued: list[float | None]) -> float | None:
    """The run-queue wait inside the worst stall of all repetitions."""
    if not worst:
        return None
    return queued[max(range(len(worst)), key=worst.__getitem__)]


def run_case(plan: dict[str, Any]) -> Json:
    rows: list[Json] = []
    for impl, n, reps, *rest in plan["runs"]:
        followers = plan.get("followers", 100)
        line_period_s = float(rest[0]) if rest else LINE_PERIOD_S
        result = run_child(
            "case_loop_lag",
            [
                "--impl", impl, "--n", str(n), "--reps", str(reps),
                "--followers", str(followers),
                "--idle-s", str(plan.get("idle_s", 2.0)),
                "--follow-s", str(plan.get("follow_s", 3.0)),
                "--line-period-s", str(line_period_s),
            ],
            timeout=plan.get("timeout_s", 900),
        )  # fmt: skip
        row: Json = {
            "impl": impl,
            "n": n,
            "followers": followers,
            "line_period_s": line_period_s,
            "reps": reps,
        }
        row["wall_s"] = result.get("wall_s")
        if "error" in result:
            row["error"] = result["error"]
            rows.append(row)
            continue
        for phase in PHASES:
            row[phase] = summarize(result["worst"][phase])
            row[f"{phase}_ticks"] = result["ticks"][phase]
            row[f"{phase}_worst_queued_s"] = _queued_in_worst(
                result["worst"][phase], result["worst_queued"][phase]
            )
            row[f"{phase}_clear"] = summarize(result["worst_clear"][phase])
            passes = result["full_collections"][phase]
            row[f"{phase}_full_collections"] = [len(rep) for rep in passes]
            row[f"{phase}_full_collection_longest_s"] = max(
                (s for rep in passes for s in rep), default=None
            )
        idle = row["idle"]["max"]
        for phase in ("submit", "follow"):
            # The worst repetition against the noisiest idle window: a fair, pessimistic excess.
            worst = row[phase]["max"]
            row[f"{phase}_excess_s"] = None if worst is None or idle is None else worst - idle
        rows.append(row)
    return {
        "title": "loop lag: worst stall of a 5 ms ticker in the host's event loop",
        "unit": "s",
        "period_s": PERIOD_S,
        "target_excess_s": TARGET_EXCESS_S,
        "rows": rows,
    }


if __name__ == "__main__":
    child()
