"""``asupervisor run``: launch a component or a command, and follow it."""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import click

from supervisor.cli import codes
from supervisor.cli.components import call_component, command_app, load_component
from supervisor.cli.errors import run_async
from supervisor.cli.follow import LogQuery, follow_logs, print_transitions
from supervisor.cli.options import backend_option
from supervisor.cli.render import (
    console,
    echo_json,
    failure_line,
    print_status,
    status_json,
    std_stream,
    use_color,
)
from supervisor.components import BUILTINS, TORCHX_NAMES
from supervisor.runopts import parse_cfg_string
from supervisor.specs import AppDef
from supervisor.status import AppStatus, AppTimes
from supervisor.supervisor import Supervisor

__all__ = ["RunCommand", "RunPlan", "execute", "run"]

_DASHDASH = "asupervisor.dashdash"
_log = logging.getLogger(__name__)

RUN_HELP = f"""Launch TARGET and supervise it.

\b
TARGET is one of:
  -- COMMAND [ARGS...]           a one-role app running COMMAND
  NAME [OPTIONS] [ARGS...]       a built-in component: {", ".join(BUILTINS)}
                                 (TorchX's {", ".join(TORCHX_NAMES)} too)
  package.module:function ...    a component in an importable module
  path/to/file.py:function ...   a component in a file

A component's parameters are its options: `asupervisor run echo --help`.
Options of `run` itself go before TARGET.

Without --dryrun the handle is printed at once. Local replicas live only as
long as this process supervises them, so `run` stays until the app ends even
without --wait (quietly then); Slurm keeps its jobs, so there `run` returns
once the job is submitted (exit 0) unless --wait or --log is given.
--wait prints every transition to stderr and the final status table on
stdout; --log prints every replica's output (`role/k | line`) and implies
--wait. Ctrl-C, SIGTERM or SIGHUP (its terminal closed) cancels the app,
waits for its replicas to stop, and exits 130, 143 or 129.

\b
Exit codes, once the app ended: 0 SUCCEEDED, 1 FAILED (or a launch
error), 2 usage error (invalid app or --cfg), 3 CANCELLED, 4 UNKNOWN,
130 SIGINT, 143 SIGTERM, 129 SIGHUP. Every non-zero code comes with one line on
stderr, `Error: HANDLE STATE: cause` for an app that did not succeed.
"""


def _builtins_epilog() -> str:
    lines = ["\b", "Built-in components:"]
    width = max(len(name) for name in BUILTINS)
    for name, fn in BUILTINS.items():
        first = (inspect.getdoc(fn) or "").partition("\n")[0]
        lines.append(f"  {name.ljust(width)}  {first}")
    return "\n".join(lines)


@dataclass(frozen=True)
class RunPlan:
    """Everything ``run`` decided before doing any I/O."""

    app: AppDef
    backend: str = "local"
    cfg: str | None = None
    dryrun: bool = False
    wait: bool = False
    log: bool = False
    as_json: bool = False


class RunCommand(click.Command):
    """Remembers whether TARGET came after ``--`` (click drops the ``--`` itself)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        raw = list(args)
        rest = super().parse_args(ctx, args)
        at = len(raw) - len(rest) - 1
        ctx.meta[_DASHDASH] = at >= 0 and raw[at] == "--" and raw[at + 1 :] == rest
        return rest


@click.command(
    "run",
    cls=RunCommand,
    help=RUN_HELP,
    epilog=_builtins_epilog(),
    options_metavar="[OPTIONS] TARGET [ARGS]...",
    context_settings={"allow_extra_args": True, "allow_interspersed_args": False},
)
@backend_option(help="where to run the app")
@click.option(
    "--cfg",
    metavar="K=V,K2=A;B",
    multiple=True,
    help="run options (see `asupervisor runopts`); repeat it to add more",
)
@click.option("--dryrun", is_flag=True, help="print the request; launch nothing")
@click.option("--wait", is_flag=True, help="print transitions and the final status")
@click.option("--log", is_flag=True, help="print every replica's output (implies --wait)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
@click.pass_context
def run(
    ctx: click.Context,
    backend: str,
    cfg: tuple[str, ...],
    dryrun: bool,
    wait: bool,
    log: bool,
    as_json: bool,
) -> None:
    argv: list[str] = list(ctx.args)
    if ctx.meta.get(_DASHDASH):
        app = command_app(argv)
    elif not argv:
        raise click.UsageError("missing TARGET: a component, or -- COMMAND", ctx)
    else:
        target, *rest = argv
        app = call_component(load_component(target), target, rest, ctx)
    # Every --cfg counts, as one string: a key given in two of them is refused as
    # one given twice in one is, never silently replaced.
    joined = ",".join(part for part in cfg if part) or None
    plan = RunPlan(app, backend, joined, dryrun, wait or log, log, as_json)
    obj: dict[str, Any] = ctx.find_root().obj or {}

    async def main() -> int:
        return await execute(plan, obj.get("session"), obj.get("state_dir"))

    ctx.exit(run_async(main))


_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What cancels the app: Ctrl-C, a kill, the terminal closing (SIGHUP, which otherwise
ended this process at once and left the app UNKNOWN, its replicas killed unrecorded)."""


def _handled_signals() -> list[signal.Signals]:
    """``_STOPPING``, except one this process was started ignoring (``cmd &``, nohup)."""
    return [s for s in _STOPPING if signal.getsignal(s) is not signal.SIG_IGN]


@dataclass
class _Interrupt:
    """The first stopping signal seen; it decides the exit code."""

    signum: int | None = None


async def execute(plan: RunPlan, session: str | None, state_dir: Path | None) -> int:
    """Dry-run or launch ``plan.app``; the exit code once it is done."""
    async with Supervisor(session, state_dir=state_dir) as sv:
        given = parse_cfg_string(plan.cfg, sv.run_opts(plan.backend)) if plan.cfg else {}
        await sv.prepare(plan.backend)  # e.g. Slurm's version and partitions shape the script
        info = sv.dryrun(plan.app, plan.backend, given)
        if plan.dryrun:
            if plan.as_json:
                echo_json({"backend": info.backend, **info.request.to_json()})
            else:
                click.echo(str(info))
            return codes.OK
        interrupt = _Interrupt()
        # Opened before the launch: a signal from here on cancels the app.
        with anyio.open_signal_receiver(*_handled_signals()) as signals:
            _log.info("launching %s on %s", plan.app.name, plan.backend)
            handle = await sv.schedule(info)
            _log.info("launched %s", handle)
            if plan.as_json:
                echo_json({"handle": handle}, compact=True)
            else:
                click.echo(handle)
            if not plan.wait and sv.backend(plan.backend).durable:
                return codes.OK  # the scheduler keeps the app; follow it with status/log
            async with anyio.create_task_group() as tg:
                tg.start_soon(_on_signals, sv, handle, signals, interrupt)
                final = await _follow(sv, handle, plan)
                tg.cancel_scope.cancel()
        if plan.wait:
            described = await sv.describe(handle)
            times = described.times if described is not None else AppTimes()
            if plan.as_json:
                echo_json(status_json(handle, final, times), compact=True)
            else:
                print_status(console(), handle, final, times)
        if interrupt.signum is not None:
            name = signal.Signals(interrupt.signum).name
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                click.echo(f"Error: {name}: {failure_line(handle, final)}", err=True)
            return codes.exit_code_for_signal(interrupt.signum)
        code = codes.exit_code_for(final.state)
        if code != codes.OK:
            # One line whether or not --wait printed the transitions: scripts read stderr's end.
            click.echo(f"Error: {failure_line(handle, final)}", err=True)
        return code


async def _follow(sv: Supervisor, handle: str, plan: RunPlan) -> AppStatus:
    async with anyio.create_task_group() as tg:
        if plan.wait:
            tg.start_soon(print_transitions, sv, handle, console(stderr=True))
        if plan.log:
            replicas = [(r.name, k) for r in plan.app.roles for k in range(r.num_replicas)]
            tg.start_soon(_logs, sv, handle, replicas, use_color(std_stream()), plan.as_json)
        final = await sv.wait(handle)
    return final  # noqa: RET504 - mypy needs a return after the task group


async def _logs(
    sv: Supervisor, handle: str, replicas: list[tuple[str, int]], color: bool, as_json: bool
) -> None:
    query = LogQuery(follow=True)
    await follow_logs(
        sv, handle, replicas, query, std_stream(), prefix=True, color=color, as_json=as_json
    )


async def _on_signals(
    sv: Supervisor, handle: str, signals: AsyncIterator[signal.Signals], interrupt: _Interrupt
) -> None:
    err = console(stderr=True)
    async for signum in signals:
        name = signal.Signals(signum).name
        if interrupt.signum is None:
            interrupt.signum = signum
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                err.print(
                    f"{name}: cancelling {handle}; waiting for its replicas to stop",
                    markup=False,
                )
            await sv.cancel(handle)
        else:
            with contextlib.suppress(OSError):
                err.print(
                    f"{name}: already cancelling {handle}; waiting for its replicas",
                    markup=False,
                )
