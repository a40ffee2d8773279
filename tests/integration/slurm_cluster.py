"""Bringing up (once per test session) the real local Slurm cluster the Slurm tests run on.

``ASUPERVISOR_SLURM_CLUSTER=skip`` keeps every Slurm test away from the cluster:
``tests/conftest.py`` marks each one (the ``slurm`` marker, or any
``tests/integration/test_slurm_*.py``) skipped with ``skip_reason()`` at collection,
before a fixture could run, and ``ensure_cluster`` refuses too, for a test that
reaches it some other way.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-cluster"
FACTS = Path("/run/asupervisor-slurm.json")
SKIP_ENV = "ASUPERVISOR_SLURM_CLUSTER"
T = TypeVar("T")


def skip_reason() -> str | None:
    """Why the Slurm tests must not touch the cluster, or None when they may."""
    if os.environ.get(SKIP_ENV, "").strip().lower() == "skip":
        return f"{SKIP_ENV}=skip: the Slurm tests do not use (or reconfigure) the local cluster"
    return None


def is_slurm_test(item: pytest.Item) -> bool:
    """Marked ``slurm`` (or ``slurm_exclusive``), or in an integration module named for Slurm."""
    path = Path(str(item.path))
    in_slurm_module = path.parent.name == "integration" and path.name.startswith("test_slurm_")
    marked = any(item.get_closest_marker(m) is not None for m in ("slurm", "slurm_exclusive"))
    return marked or in_slurm_module


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def ensure_cluster(accounting: bool = True) -> dict[str, object]:
    """The cluster's facts; brings it up (or switches its accounting) when needed.

    Skips, printing why, only when the cluster truly cannot start here, or when
    ``ASUPERVISOR_SLURM_CLUSTER=skip`` says not to touch it.
    """
    reason = skip_reason()
    if reason is not None:
        print(reason)
        pytest.skip(reason)
    facts = json.loads(FACTS.read_text()) if FACTS.exists() else {}
    healthy = _run("status", timeout=60).returncode == 0 and _nodes_resolve()
    if not healthy or bool(facts.get("accounting")) != accounting:
        args = ["up"] if accounting else ["up", "--no-accounting"]
        done = _run(*args)
        if done.returncode != 0:
            message = f"the local Slurm cluster could not start:\n{done.stdout}\n{done.stderr}"
            print(message)
            pytest.skip(message)
        facts = json.loads(FACTS.read_text())
    return facts


def _nodes_resolve() -> bool:
    """Node names resolve (an older `up` did not add them to /etc/hosts)."""
    try:
        socket.gethostbyname("n1")
    except OSError:
        return False
    return True


async def until_running(sv: Supervisor, handle: str) -> None:
    """Return once the app (not just one replica) reached RUNNING."""
    async for t in sv.watch(handle):
        if t.role is None and t.dest == "RUNNING":
            return


async def until(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float, what: str
) -> T:
    """Probe until ``done`` holds: Slurm's queue has no event to wait on."""
    last: T | None = None
    try:
        with anyio.fail_after(timeout):
            while True:
                last = await probe()
                if done(last):
                    return last
                await anyio.sleep(0.5)
    except TimeoutError:
        pytest.fail(f"{what}: not within {timeout:.0f} s; last seen: {last!r}")
