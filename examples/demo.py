"""The README's demo: launch a multi-role app locally, show its transitions and logs live.

Run with ``bash scripts/demo`` (sets up the venv first) or ``python examples/demo.py``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_app import demo

from supervisor import AppStatus, Supervisor

console = Console(highlight=False)
COLORS = ["cyan", "magenta", "green", "yellow", "blue"]


async def show_transitions(sv: Supervisor, handle: str) -> None:
    async for t in sv.watch(handle):
        style = "bold" if t.role is None else "dim"
        console.print(f"[{style}]  {t.scope:<12} {t.source} -> {t.dest}  {t.msg}[/{style}]")


async def show_logs(sv: Supervisor, handle: str, role: str, k: int, color: str) -> None:
    async for line in sv.log_iter(handle, role, k, should_tail=True):
        console.print(f"[{color}]{role}/{k:<3}|[/{color}] {line.rstrip()}")


def final_table(status: AppStatus) -> Table:
    table = Table(title=f"final state: {status.state.name} (restarts: {status.num_restarts})")
    for column in ("replica", "state", "exit", "restarts", "host"):
        table.add_column(column)
    for role in status.roles:
        for r in role.replicas:
            exit_text = r.signal or ("" if r.exit_code is None else str(r.exit_code))
            table.add_row(f"{r.role}/{r.id}", r.state.name, exit_text, str(r.restarts), r.hostname)
    return table


async def main() -> int:
    with tempfile.TemporaryDirectory(prefix="asupervisor-demo-") as state:
        async with Supervisor(session="demo", state_dir=state) as sv:
            app = demo()
            info = sv.dryrun(app, "local")
            console.print("[bold]request:[/bold]")
            console.print(str(info), markup=False)
            handle = await sv.schedule(info)
            console.print(f"[bold]launched {handle}[/bold]")
            async with anyio.create_task_group() as tg:
                tg.start_soon(show_transitions, sv, handle)
                i = 0
                for role in app.roles:
                    for k in range(role.num_replicas):
                        tg.start_soon(show_logs, sv, handle, role.name, k, COLORS[i % len(COLORS)])
                        i += 1
            status = await sv.wait(handle)
            console.print(final_table(status))
            return 0 if status.state.name == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
