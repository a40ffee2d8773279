"""Small building blocks shared by the conformance cases: apps, logs, the CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from supervisor import AppDef, AppState, Role, Supervisor

from .target import Target

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli.main"]

# Until the file $CONF_DIR/$1 exists (at most 60 s; then exit 9 so a stuck case shows).
WAIT_FOR = (
    'wait_for() { i=0; while [ ! -e "$CONF_DIR/$1" ]; do '
    "i=$((i+1)); [ $i -gt 600 ] && exit 9; sleep 0.1; done; }; "
)
ME = '"$ASUPERVISOR_ROLE-$ASUPERVISOR_REPLICA_ID"'

# Runs until cancelled; on SIGTERM it says so (the grace period lets it) and exits.
TRAPS_TERM = (
    "trap 'echo got TERM; exit 143' TERM; "
    'echo ready; touch "$CONF_DIR/ready"; '
    "while :; do sleep 0.2; done"
)


def app(*roles: Role, name: str = "conf") -> AppDef:
    return AppDef(name=name, roles=list(roles))


async def lines(sv: Supervisor, handle: str, role: str, k: int = 0, **kw: Any) -> list[str]:
    """Every line of one replica's output so far (no following)."""
    return [line async for line in sv.log_iter(handle, role, k, **kw)]


async def first_line(
    sv: Supervisor, handle: str, role: str, k: int = 0, regex: str | None = None
) -> str:
    """Follow one replica's output until a line (matching ``regex``) arrives: event-driven."""
    async for line in sv.log_iter(handle, role, k, regex=regex, should_tail=True):
        return line
    raise AssertionError(f"{handle} {role}/{k} ended without printing a line matching {regex!r}")


def cli_env(target: Target) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **target.cli_env()}


async def cli(target: Target, *args: str) -> tuple[int, str, str]:
    """Run ``asupervisor ARGS`` in a process of its own: (exit code, stdout, stderr)."""
    done = await anyio.run_process([*CLI, *args], env=cli_env(target), check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def cli_json(target: Target, *args: str, code: int = 0) -> Any:
    """``asupervisor ARGS --json``, parsed; ``code`` is the exit code it must give (status and
    describe exit by the app's state: 3 for CANCELLED, as ``run --wait`` does)."""
    got, out, err = await cli(target, *args, "--json")
    assert got == code, err
    return json.loads(out)


def replica_states(status: Any) -> dict[str, AppState]:
    """``{"role/k": state}`` of a status, for readable assertion messages."""
    return {f"{rs.role}/{r.id}": r.state for rs in status.roles for r in rs.replicas}
