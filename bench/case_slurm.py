"""Case 6, Slurm: controller RPCs while tracking N apps, and a job's end to ``wait()``.

Runs against the real cluster of ``scripts/slurm-cluster`` (as root: ``sdiag -r``
needs it) and fails with a message when that is not usable. Every job gets a
time limit, and every job of the case's session is cancelled afterwards, in a
``finally``.

**RPCs.** For each N, N apps of one replica ``sleep 600`` are submitted with
asupervisor and followed by the same kind of jobs on both sides:

* ``asupervisor``: the submitting Supervisor itself follows them (its one
  shared poller, default ``PollerSettings``) once every app is PENDING or
  RUNNING and has not changed for a few seconds; the window starts right after
  one of its ticks, so only whole ticks fall in it;
* ``torchx``: then, in another process, while the same jobs still run, a loop
  that every second (``Runner.wait(wait_interval=1)``; its default is 10 s)
  calls ``SlurmScheduler("bench").describe(job_id)`` for each job, one after
  another; a sweep that overruns the second is followed by the next at once.

Around each window ``sdiag -r`` resets slurmctld's counters and ``sdiag`` is
read right after the reset and right after the window; the figures are the
difference (``REQUEST_STATS_INFO``, the reading itself, left out). TorchX 0.7.0's
``describe`` runs ``sacct``, which asks slurmdbd rather than slurmctld, so
slurmdbd's counters (``sacctmgr show stats``, never reset here) are read the
same way, minus what two bare readings cost. An ``idle`` window with nobody
polling gives the cluster's background (other users of the shared cluster).
If anyone else resets ``sdiag`` during a window, that window is marked
``disturbed``.

**End to wait.** A job of one replica sleeps 3 s, prints ``time.time()``
and exits; the figure is the wall clock when ``await sv.wait()`` returned
minus that stamp (default poller settings). A probe thread polling
``squeue -j`` every 50 ms splits it into Slurm's own part (stamp to the job
showing COMPLETED) and ours (COMPLETED shown to ``wait`` returning); every
``squeue`` of our poller is timed, so the pause before the tick that saw the
end is recorded too.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from bench.util import (
    REPO,
    TAG_ENV,
    Json,
    child_parser,
    log,
    run_child,
    scratch,
    summarize,
    write_json,
)

IMPLS = {
    "asupervisor": "asupervisor: one Supervisor following the N apps (one shared poller)",
    "torchx": "TorchX `SlurmScheduler.describe(job_id)` per app, every 1 s",
    "idle": "nobody polling (the shared cluster's background)",
}
SLEEP_S = 600
DELAY_SLEEP_S = 3.0
SETTLE_S = 3.0  # every app unchanged this long before the window starts
LIVE = {"PENDING", "RUNNING"}
NOT_FINAL = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}  # COMPLETING: still running
STAMP = "asv-bench-end"
# The replica of the delay job: sleep, print the wall clock, exit.
DELAY_CODE = (
    f"import time; time.sleep({DELAY_SLEEP_S}); print({STAMP!r}, repr(time.time()), flush=True)"
)
ACTIVE_SQUEUE_STATES = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED,REQUEUED"
_RPC_LINE = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


# ---------------------------------------------------------------- daemon counters
def _command(*argv: str, timeout: float = 30) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _by_type(text: str) -> dict[str, int]:
    """The counts of sdiag's (or ``sacctmgr show stats``') RPC table by message type."""
    start = text.find("Remote Procedure Call statistics by message type")
    end = text.find("Remote Procedure Call statistics by user")
    if start < 0:
        raise RuntimeError("no RPC statistics in the output")
    section = text[start : end if end > start else None]
    return {m.group(1): int(m.group(2)) for m in _RPC_LINE.finditer(section)}


def read_ctld() -> tuple[str, dict[str, int]]:
    """(``Data since`` line, counts by type) from ``sdiag``."""
    text = _command("sdiag")
    since = next((line for line in text.splitlines() if line.startswith("Data since")), "")
    return since, _by_type(text)


def read_dbd() -> dict[str, int]:
    return _by_type(_command("sacctmgr", "show", "stats"))


def _diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    keys = sorted(set(before) | set(after))
    out = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    return {k: v for k, v in out.items() if v}


class Window:
    """slurmctld and slurmdbd RPCs between ``begin`` and ``end``."""

    def __init__(self, dbd_overhead: dict[str, int] | None = None) -> None:
        self.dbd_overhead = dbd_overhead or {}
        self.started = 0.0

    def begin(self) -> None:
        _command("sdiag", "-r")
        self.since, self.ctld0 = read_ctld()
        self.dbd0 = read_dbd()
        self.started = time.monotonic()

    def end(self) -> Json:
        seconds = time.monotonic() - self.started
        since, ctld1 = read_ctld()
        dbd1 = read_dbd()
        ctld = _diff(self.ctld0, ctld1)
        ctld.pop("REQUEST_STATS_INFO", None)
        dbd = _diff(self.dbd0, dbd1)
        for key, value in self.dbd_overhead.items():
            dbd[key] = dbd.get(key, 0) - value
        dbd = {k: v for k, v in dbd.items() if v}
        return {
            "seconds": seconds,
            "disturbed": since != self.since,  # someone else reset sdiag meanwhile
            "ctld": ctld,
            "dbd": dbd,
            "job_info": ctld.get("REQUEST_JOB_INFO", 0) + ctld.get("REQUEST_JOB_INFO_SINGLE", 0),
            "ctld_total": sum(ctld.values()),
            "dbd_jobs": dbd.get("DBD_GET_JOBS_COND", 0),
            "dbd_total": sum(dbd.values()),
        }


def dbd_overhead() -> dict[str, int]:
    """What two bare ``sacctmgr show stats`` readings add to slurmdbd's counters."""
    first = read_dbd()
    return _diff(first, read_dbd())


# ------------------------------------------------------------- a timed transport
def _timed_transport() -> Any:
    from supervisor.backends.slurm.transport import CliTransport

    class TimedCli(CliTransport):
        """The CLI transport, recording when each squeue ran and what it said of our jobs."""

        def __init__(self) -> None:
            super().__init__()
            self.job_ids: list[int] = []
            self.queues: list[Json] = []  # {"start", "end" (wall clock), "states"}
            self.tick_done = anyio.Event()
            self.in_flight = False

        async def submit(self, script: str, workdir: str) -> int:
            job_id = await super().submit(script, workdir)
            self.job_ids.append(job_id)
            return job_id

        async def queue(self) -> Any:
            start = time.time()
            self.in_flight = True
            try:
                records = await super().queue()
            finally:
                self.in_flight = False
            mine = set(self.job_ids)
            states = {r.het_job_id: r.state for r in records if r.het_job_id in mine}
            self.queues.append({"start": start, "end": time.time(), "states": states})
            self.tick_done.set()
            self.tick_done = anyio.Event()
            return records

    return TimedCli()


def _supervisor(state_dir: Path, session: str, transport: Any) -> Any:
    from supervisor import Supervisor
    from supervisor.backends.slurm.backend import SlurmBackend

    return Supervisor(
        session=session,
        state_dir=state_dir,
        backends={"slurm": partial(SlurmBackend, transport=transport)},
    )


def _app(name: str, argv: list[str]) -> Any:
    from supervisor import AppDef, Role

    return AppDef(name=name, roles=[Role(name="r", entrypoint=argv[0], args=argv[1:])])


# ------------------------------------------------------------------- the children
async def _asupervisor(n: int, window_s: float, state_dir: Path, session: str) -> Json:
    transport = _timed_transport()
    overhead = dbd_overhead()
    async with _supervisor(state_dir, session, transport) as sv:
        handles = []
        started = time.perf_counter()
        for _ in range(n):
            app = _app("sleeper", ["sleep", str(SLEEP_S)])
            handles.append(await sv.submit(app, "slurm", cfg={"time": "15"}))
        submit_s = time.perf_counter() - started
        # Settle: every app PENDING or RUNNING, nothing changed for SETTLE_S.
        deadline = time.monotonic() + 120
        last: list[str] = []
        since = time.monotonic()
        while True:
            states = [sv.status(h).state.name for h in handles]
            if states != last:
                last, since = states, time.monotonic()
            if any(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states):
                raise RuntimeError(f"an app ended before the window: {Counter(states)}")
            if all(s in LIVE for s in states) and time.monotonic() - since >= SETTLE_S:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the apps did not settle in 120 s")
            await anyio.sleep(0.1)
        # Start right after a tick, so that the window holds whole ticks only.
        with anyio.fail_after(60):
            await transport.tick_done.wait()
        stats0 = dict(sv.statistics()["slurm"])
        window = Window(overhead)
        await anyio.to_thread.run_sync(window.begin)
        t0 = time.time()
        await anyio.sleep(window_s)
        with anyio.fail_after(60):
            while transport.in_flight:  # a tick under way belongs to the window
                await transport.tick_done.wait()
        result = await anyio.to_thread.run_sync(window.end)
        t1 = time.time()
        stats1 = dict(sv.statistics()["slurm"])
        final = Counter(sv.status(h).state.name for h in handles)
    in_window = [q for q in transport.queues if t0 <= q["start"] <= t1]
    running = Counter(q["states"].get(j, "?") for q in in_window[-1:] for j in transport.job_ids)
    return {
        **result,
        "n": n,
        "job_ids": transport.job_ids,
        "submit_s": submit_s,
        "ticks": stats1.get("ticks", 0) - stats0.get("ticks", 0),
        "queue_calls": stats1["queue_calls"] - stats0["queue_calls"],
        "accounting_calls": stats1["accounting_calls"] - stats0["accounting_calls"],
        "squeue_in_window": len(in_window),
        "squeue_s": summarize([q["end"] - q["start"] for q in in_window]),
        "interval_s_at_end": stats1.get("interval_s"),
        "app_states": dict(final),
        "job_states": dict(running),
    }


def _torchx(job_ids: list[str], window_s: float, interval: float) -> Json:
    from torchx.schedulers.slurm_scheduler import SlurmScheduler

    from bench.torchx_util import quiet_torchx

    quiet_torchx()
    scheduler = SlurmScheduler("bench")
    overhead = dbd_overhead()
    window = Window(overhead)
    times: list[float] = []
    states: Counter[str] = Counter()
    errors: list[str] = []
    sweeps = 0
    window.begin()
    start = time.monotonic()
    stop = start + window_s
    next_sweep = start
    while time.monotonic() < stop:
        now = time.monotonic()
        if now < next_sweep:
            time.sleep(min(next_sweep, stop) - now)
            continue
        sweeps += 1
        for job in job_ids:
            if time.monotonic() >= stop:
                break
            t = time.perf_counter()
            try:
                response = scheduler.describe(job)
                states[response.state.name if response else "None"] += 1
            except Exception as e:  # counted and reported: the loop goes on
                errors.append(f"{type(e).__name__}: {e}"[:200])
            times.append(time.perf_counter() - t)
        next_sweep += interval
        if next_sweep < time.monotonic():  # overran: the next sweep starts at once
            next_sweep = time.monotonic()
    result = window.end()
    return {
        **result,
        "n": len(job_ids),
        "describes": len(times),
        "sweeps": sweeps,
        "describe_s": summarize(times),
        "describe_states": dict(states),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


def _idle(window_s: float) -> Json:
    window = Window(dbd_overhead())
    window.begin()
    time.sleep(window_s)
    return window.end()


class _Probe:
    """A thread polling ``squeue -j`` until the job shows a final state; wall clock of each."""

    def __init__(self, job_id: int, period: float = 0.05) -> None:
        self.job_id = job_id
        self.period = period
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        argv = ["squeue", "-h", "-t", "all", "-j", str(self.job_id), "-o", "%T"]
        while not self._stop.is_set():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
                now = time.time()
                state = out.stdout.strip().split("\n")[0] if out.returncode == 0 else ""
                if state:
                    self.first_seen.setdefault(state, now)
                    if state not in NOT_FINAL:
                        return
            self._stop.wait(self.period)

    def close(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(15)
        return self.first_seen


async def _delay(reps: int, state_dir: Path, session: str) -> list[Json]:
    transport = _timed_transport()
    out: list[Json] = []
    async with _supervisor(state_dir, session, transport) as sv:
        for _ in range(reps):
            app = _app("ender", [sys.executable, "-c", DELAY_CODE])
            submitted = time.time()
            handle = await sv.submit(app, "slurm", cfg={"time": "5"})
            job = transport.job_ids[-1]
            probe = _Probe(job)
            try:
                status = await sv.wait(handle, timeout=180)
                done_at = time.time()
            finally:
                seen = await anyio.to_thread.run_sync(probe.close)
            if status.state.name != "SUCCEEDED":
                raise RuntimeError(f"job {job} ended {status.state.name}: {status.msg}")
            lines = [line async for line in sv.log_iter(handle, "r", 0, streams="stdout")]
            stamps = [float(line.split()[1]) for line in lines if line.startswith(STAMP)]
            if not stamps:
                raise RuntimeError(f"job {job} printed no stamp: {lines[-3:]}")
            stamp = stamps[-1]
            ended = min((t for s, t in seen.items() if s not in NOT_FINAL), default=None)
            ticks = [q for q in transport.queues if submitted <= q["start"] <= done_at]
            saw = next((q for q in ticks if q["states"].get(job, "PENDING") not in NOT_FINAL), None)
            before = [q for q in ticks if saw is not None and q["end"] < saw["start"]]
            out.append(
                {
                    "job_id": job,
                    "delay_s": done_at - stamp,
                    "slurm_end_s": (ended - stamp) if ended else None,
                    "poll_s": (done_at - ended) if ended else None,
                    "completing_seen_s": (
                        seen["COMPLETING"] - stamp if "COMPLETING" in seen else None
                    ),
                    "pause_before_tick_s": (
                        saw["start"] - before[-1]["end"] if saw and before else None
                    ),
                    "tick_to_wait_s": done_at - saw["end"] if saw else None,
                    "ticks": len(ticks),
                    "tick_starts_s": [round(q["start"] - submitted, 3) for q in ticks],
                    "stamp_s": stamp - submitted,
                    "states_seen_s": {s: round(t - submitted, 3) for s, t in seen.items()},
                }
            )
    return out


def child() -> None:
    parser = child_parser(__doc__ or "")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--session", default="bench")
    parser.add_argument("--jobs", default="")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    # The jobs must outlive this child: sbatch hands the submitter's environment to
    # them, and run_child kills whatever still carries the tag when the child ends.
    os.environ.pop(TAG_ENV, None)
    result: Json
    if args.impl == "asupervisor":
        result = anyio.run(_asupervisor, args.n, args.window, args.state_dir, args.session)
    elif args.impl == "torchx":
        jobs = [j for j in args.jobs.split(",") if j]
        result = _torchx(jobs, args.window, args.interval)
    elif args.impl == "idle":
        result = _idle(args.window)
    elif args.impl == "delay":
        result = {"samples": anyio.run(_delay, args.reps, args.state_dir, args.session)}
    else:
        parser.error(f"unknown --impl {args.impl}")
    write_json(args.out, result)


# --------------------------------------------------------------------- the driver
def _slurm_cluster(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-cluster"), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cluster_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sdiag -r)"
    try:
        done = _slurm_cluster("status", timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"scripts/slurm-cluster status: {e}"
    if done.returncode != 0:
        return "scripts/slurm-cluster status says not usable: " + done.stdout.strip()[-300:]
    return None


def _session_jobs(session: str) -> list[str]:
    """Job ids of this session's jobs the controller still holds as active."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run(
            ["squeue", "-h", "-t", ACTIVE_SQUEUE_STATES, "-o", "%i|%k"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        tag = f"asupervisor:{session}/"
        return [
            line.split("|", 1)[0].split("+")[0]
            for line in out.splitlines()
            if "|" in line and line.split("|", 1)[1].startswith(tag)
        ]
    return []


def cancel_session(session: str, wait_s: float = 60) -> int:
    """scancel every active job of ``session`` and wait until none is left; how many."""
    jobs = _session_jobs(session)
    if jobs:
        subprocess.run(["scancel", *sorted(set(jobs))], capture_output=True, timeout=60)
        deadline = time.monotonic() + wait_s
        while _session_jobs(session) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _session_jobs(session)
        if left:
            log(f"  slurm: jobs still active after scancel: {' '.join(left)}")
    return len(set(jobs))


def _row(impl: str, n: int, result: Json) -> Json:
    row: Json = {"impl": impl, "n": n}
    if "error" in result:
        row["error"] = result["error"]
        return row
    row.update({k: v for k, v in result.items() if k not in ("job_ids", "n")})
    seconds = result.get("seconds") or 0.0
    row["job_info_per_s"] = result["job_info"] / seconds if seconds else None
    row["dbd_jobs_per_s"] = result["dbd_jobs"] / seconds if seconds else None
    row["dbd_total_per_s"] = result["dbd_total"] / seconds if seconds else None
    if impl == "asupervisor":
        ticks = result.get("squeue_in_window") or 0
        row["job_info_per_tick"] = result["job_info"] / ticks if ticks else None
    elif impl == "torchx":
        describes = result.get("describes") or 0
        row["describes_per_s"] = describes / seconds if seconds else None
        row["job_info_per_describe"] = result["job_info"] / describes if describes else None
        row["dbd_jobs_per_describe"] = result["dbd_jobs"] / describes if describes else None
        row["dbd_total_per_describe"] = result["dbd_total"] / describes if describes else None
    return row


def _bring_up_cluster() -> None:
    """On a fresh machine (as root) the suite starts the cluster itself, as scripts/test does."""
    log("  slurm: the local cluster is not usable; bringing it up (scripts/slurm-cluster up)")
    done = _slurm_cluster("up", timeout=1200)
    if done.returncode != 0:
        log(f"  slurm: scripts/slurm-cluster up failed: {(done.stdout + done.stderr)[-500:]}")


def run_case(plan: dict[str, Any]) -> Json:
    problem = _cluster_problem()
    if problem and os.geteuid() == 0:
        _bring_up_cluster()
        problem = _cluster_problem()
    if problem:
        raise RuntimeError(f"no usable Slurm cluster: {problem}")
    window = float(plan["window_s"])
    interval = float(plan.get("interval_s", 1.0))
    session = f"bslurm{os.getpid()}x{int(time.time())}"
    rows: list[Json] = []
    out: Json = {
        "title": "Slurm: controller RPCs while tracking N apps; job end -> wait() returns",
        "window_s": window,
        "interval_s": interval,
        "impls": IMPLS,
        "session": session,
        "rows": rows,
    }
    timeout = window + 240
    with scratch("asv-bench-slurm-") as tmp:
        common = ["--state-dir", str(tmp), "--session", session]
        try:
            idle_s = float(plan.get("idle_s", window))
            log(f"  slurm: idle window {idle_s:g} s")
            idle = run_child("case_slurm", ["--impl", "idle", "--window", str(idle_s)], timeout=120)
            rows.append(_row("idle", 0, idle))
            for n in plan["ns"]:
                log(f"  slurm: N={n}: asupervisor window {window:g} s")
                ours = run_child(
                    "case_slurm",
                    ["--impl", "asupervisor", "--n", str(n), "--window", str(window), *common],
                    timeout=timeout,
                )
                rows.append(_row("asupervisor", n, ours))
                jobs = [str(j) for j in ours.get("job_ids", [])]
                if jobs:
                    log(f"  slurm: N={n}: TorchX describe loop {window:g} s")
                    torchx = run_child(
                        "case_slurm",
                        [
                            "--impl",
                            "torchx",
                            "--jobs",
                            ",".join(jobs),
                            "--window",
                            str(window),
                            "--interval",
                            str(interval),
                        ],
                        timeout=timeout,
                    )
                    rows.append(_row("torchx", n, torchx))
                cancelled = cancel_session(session)
                log(f"  slurm: N={n}: cancelled {cancelled} jobs")
            reps = int(plan["delay_reps"])
            log(f"  slurm: end -> wait delay, {reps} jobs of sleep {DELAY_SLEEP_S:g}")
            delay = run_child(
                "case_slurm",
                ["--impl", "delay", "--reps", str(reps), *common],
                timeout=120 + 60 * reps,
            )
        finally:
            cancel_session(session)
    if "error" in delay:
        out["delay"] = {"error": delay["error"]}
    else:
        samples = delay["samples"]

        def pick(key: str) -> Json:
            return summarize([s[key] for s in samples if s.get(key) is not None])

        out["delay"] = {
            "reps": reps,
            "sleep_s": DELAY_SLEEP_S,
            "stats": pick("delay_s"),
            "slurm_end": pick("slurm_end_s"),
            "poll": pick("poll_s"),
            "pause_before_tick": pick("pause_before_tick_s"),
            "tick_to_wait": pick("tick_to_wait_s"),
            "samples": samples,
        }
    out["poller"] = _poller_defaults()
    return out


def _poller_defaults() -> Json:
    from dataclasses import asdict

    from supervisor.backends.slurm.poller import PollerSettings

    return asdict(PollerSettings())


if __name__ == "__main__":
    child()
