"""Small helpers shared by the integration tests (real processes, real files)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from supervisor import AppDef, AppState, RetryPolicy, Role, Supervisor, Transition

PY = sys.executable


def py_role(
    name: str,
    code: str,
    *,
    num_replicas: int = 1,
    max_retries: int = 0,
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Role:
    """A role whose replicas run a snippet of Python."""
    return Role(
        name=name,
        entrypoint=PY,
        args=["-c", code, *args],
        env=env or {},
        num_replicas=num_replicas,
        max_retries=max_retries,
        retry_policy=retry_policy,
    )


def app(*roles: Role, name: str = "test") -> AppDef:
    return AppDef(name=name, roles=list(roles))


def pid_gone_within(pid: int, seconds: float) -> bool:
    """True once ``pid`` has exited (pidfd readable), waiting at most ``seconds``; event-based."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], seconds)
        return bool(readable)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def running_with(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if token.encode() in cmdline and stat.rpartition(")")[2].split()[0] != "Z":
            found.append(int(entry))
    return found


async def until(check: Callable[[], bool], seconds: float) -> None:
    """Return once ``check()`` holds; fail after ``seconds``.

    For what offers no event to wait on: processes of the system, the tasks
    the Supervisor runs.
    """
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - nothing to wait on but the check
            await anyio.sleep(0.01)


@dataclass(frozen=True)
class HeldRun:
    """When a replica said "up" and the loop was let go, and what was recorded of it."""

    up: float
    held_until: float
    started: float
    ended: float


async def hold_while_it_ends(
    sv: Supervisor, handle: str, role: str, hold_s: float, final: AppState
) -> HeldRun:
    """Once replica 0 of ``role`` printed "up", hold the loop ``hold_s`` (a service busy
    elsewhere) while it ends; the app must end ``final``. Its recorded start and end
    (replica 0 is the app's only one) are returned with when the hold began and ended.
    """
    async for line in sv.log_iter(handle, role, 0, should_tail=True):
        assert line == "up\n"
        break
    up = time.time()
    time.sleep(hold_s)  # noqa: ASYNC251 (holds the loop on purpose: the replica ends)
    held_until = time.time()
    status = await sv.wait(handle, timeout=90)
    assert status.state is final, status
    described = await sv.describe(handle)
    assert described is not None
    times = described.times
    assert times.started is not None and times.ended is not None
    (ended,) = [t for t in described.transitions if t.role == role and t.dest == final.name]
    assert ended.at == times.ended
    return HeldRun(up, held_until, times.started, times.ended)


def _hold_until_started(state_dir: Path, role: str) -> tuple[dict[str, Any], float]:
    """Blocking (holds the loop on purpose): until 2 s after the pump of Slurm replica 0 of
    ``role`` recorded its start (``start.json``): (its record, when the hold ended)."""
    deadline = time.time() + 90
    record: object = None
    while not isinstance(record, dict):
        assert time.time() < deadline, f"no start.json of {role}/0 within 90 s"
        time.sleep(0.05)
        for path in state_dir.glob(f"**/{role}/0/start.json"):
            with contextlib.suppress(OSError, ValueError):  # being written
                record = json.loads(path.read_text())
    time.sleep(2.0)
    return record, time.time()


async def start_seen_after_a_hold(
    sv: Supervisor, cfg: dict[str, str], state_dir: Path
) -> tuple[Transition, dict[str, Any], float]:
    """Submit a Slurm app of one replica (``r``, sleeping), hold the loop from then until
    2 s after its pump recorded its start (no look runs meanwhile), then cancel it:
    (the replica's move to RUNNING, the pump's record, when the hold ended)."""
    role = Role(name="r", entrypoint="sleep", args=["60"])
    handle = await sv.submit(AppDef(name="late", roles=[role]), "slurm", cfg)
    record, held_until = _hold_until_started(state_dir, "r")
    running = None
    async for t in sv.watch(handle):
        if t.role == "r" and t.replica_id == 0 and t.dest == "RUNNING":
            running = t
            break
    assert running is not None, f"{handle} ended with no start of r/0"
    await sv.cancel(handle)
    assert (await sv.wait(handle, timeout=90)).state is AppState.CANCELLED
    return running, record, held_until
