"""What the CLI prints: rich tables for people, plain JSON for programs.

JSON goes through ``click.echo`` untouched by rich, so it never carries
markup or colour codes.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import os
import shlex
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from supervisor.errorfile import ErrorReport, parse_error_file
from supervisor.fsm.app import describe_exit
from supervisor.specs import AppDef, Role
from supervisor.states import AppState, ReplicaState
from supervisor.status import (
    AppStatus,
    AppTimes,
    DescribeAppResponse,
    ListAppResponse,
    ReplicaStatus,
    Transition,
)

__all__ = [
    "console",
    "describe_json",
    "echo_json",
    "failure_line",
    "list_json",
    "plain_line",
    "print_describe",
    "print_list",
    "print_status",
    "replica_prefix",
    "status_json",
    "std_stream",
    "transition_text",
    "use_color",
]

_STATE_STYLE = {
    "SUCCEEDED": "green",
    "FAILED": "bold red",
    "CANCELLED": "yellow",
    "UNKNOWN": "magenta",
    "RUNNING": "cyan",
}
_PREFIX_COLORS = ("cyan", "green", "yellow", "blue", "magenta", "red")
_PIPE_WIDTH = 200  # tables written to a file or pipe: wide enough for handles


@functools.cache
def _devnull() -> TextIO:
    """One write-only /dev/null for the process's life, however many consoles write to it
    (closed at exit: left to the collector then, it is reported as a leak)."""
    nowhere = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - kept for the process's life
    atexit.register(nowhere.close)
    return nowhere


def std_stream(stderr: bool = False) -> TextIO:
    """``sys.stdout`` (or ``sys.stderr``), or /dev/null where Python made it None.

    Python sets the stream to None when its descriptor was closed at start
    (``asupervisor run ... 2>&-``, a daemon started without one); the command then
    runs as usual and what it would have written there goes nowhere. Failing
    instead, on the first ``isatty()``, cancelled the app a ``run`` had just launched
    and made ``list`` exit 1.
    """
    stream = sys.stderr if stderr else sys.stdout
    return stream if stream is not None else _devnull()


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set to anything (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


class _Console(Console):
    """rich's console, except that a reader who left is told as the rest of the CLI tells it.

    rich ends the process itself on a broken pipe, with exit 1, which here says the
    app FAILED; the error goes up instead, to the exit that SIGPIPE would give (141).
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); not a terminal means no colour and no narrow wrap,
    and a stream closed at start means nowhere (``std_stream``).

    With ``NO_COLOR`` no escape code at all is written, bold and dim included (rich
    alone would drop only the colours), the same rule as ``use_color``.
    """
    stream = std_stream(stderr)
    width = None if stream.isatty() or "COLUMNS" in os.environ else _PIPE_WIDTH
    plain = bool(os.environ.get("NO_COLOR"))
    return _Console(
        file=stream,
        stderr=stderr,
        highlight=False,
        width=width,
        no_color=plain or None,
        color_system=None if plain else "auto",
    )


def failure_line(handle: str, status: AppStatus) -> str:
    """The one line on stderr for an app that did not succeed: its state and the root cause."""
    reason = parse_error_file(status.structured_error_msg).headline
    if not reason:
        failed = [r for rs in status.roles for r in rs.replicas if r.state.name == "FAILED"]
        first = failed[0] if failed else None
        if first is not None:
            reason = parse_error_file(first.structured_error_msg).headline or _exit_reason(first)
    reason = reason or status.msg
    return f"{handle} {status.state.name}" + (f": {reason}" if reason else "")


def _exit_reason(replica: ReplicaStatus) -> str:
    """``trainer/1 exited with code 3: why``: the replica's exit and its backend's reason,
    as its transition says them.

    Its ``msg`` alone is the backend's reason where it gave one, without the code: a
    Slurm replica's is always one ("trainer/1: Slurm state FAILED"), so its failure
    line never said how it exited where a local or Docker one did.
    """
    if replica.exit_code is None and replica.signal is None:
        return replica.msg
    name = f"{replica.role}/{replica.id}"
    exited = f"{name} {describe_exit(replica.exit_code, replica.signal)}"
    if not replica.msg or replica.msg.startswith(exited):
        return replica.msg or exited
    return f"{exited}: {replica.msg.removeprefix(f'{name}: ')}"


def _iso(at: float | None) -> str | None:
    """ISO-8601 in UTC with its offset, milliseconds kept; None stays None."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def times_json(times: AppTimes) -> dict[str, str | None]:
    return {
        "submitted": _iso(times.submitted),
        "started": _iso(times.started),
        "ended": _iso(times.ended),
    }


def state_text(state: AppState | ReplicaState) -> Text:
    return Text(state.name, style=_STATE_STYLE.get(state.name, ""))


# ------------------------------------------------------------------ JSON
def echo_json(data: Any, *, compact: bool = False, file: TextIO | None = None) -> None:
    """One JSON document; ``compact`` keeps it on one line (for streams of documents)."""
    text = json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=2)
    click.echo(text, file=file)


def status_json(handle: str, status: AppStatus, times: AppTimes) -> dict[str, Any]:
    """``AppStatus.to_json()`` with the handle and the app's times: ``roles`` holds each
    role's replica statuses."""
    return {"handle": handle, **status.to_json(), **times_json(times)}


def describe_json(handle: str, resp: DescribeAppResponse) -> dict[str, Any]:
    """``status --json`` with each entry of ``roles`` also carrying the role's spec
    (entrypoint, args, num_replicas, retries, ...): one ``roles`` list, keyed by name."""
    status = status_json(handle, resp.to_status(), resp.times)
    specs = AppDef(name=resp.app_id, roles=resp.roles).to_json()["roles"]
    replicas = {rs["role"]: rs["replicas"] for rs in status["roles"]}
    roles = [{**spec, "replicas": replicas.get(spec["name"], [])} for spec in specs]
    return {"handle": handle, "app_id": resp.app_id, **status, "roles": roles}


def list_json(apps: Sequence[ListAppResponse]) -> list[dict[str, Any]]:
    return [
        {
            "handle": a.app_handle,
            "app_id": a.app_id,
            "name": a.name,
            "state": a.state.name,
            "msg": a.msg,
            **times_json(a.times),
        }
        for a in apps
    ]


# ---------------------------------------------------------------- tables
def _local(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def times_text(times: AppTimes) -> str:
    """``submitted 2026-11-23 22:26:55  started ...  ended ... (1.2s)``, local time."""
    parts = [
        f"{name} {_local(at)}"
        for name, at in (
            ("submitted", times.submitted),
            ("started", times.started),
            ("ended", times.ended),
        )
        if at is not None
    ]
    if times.ended is not None and times.submitted is not None:
        parts[-1] += f" ({times.ended - times.submitted:.1f}s)"
    return "  ".join(parts)


def print_status(
    out: Console, handle: str, status: AppStatus, times: AppTimes | None = None
) -> None:
    head = Text.assemble(
        (handle, "bold"), "  ", state_text(status.state), f"  restarts: {status.num_restarts}"
    )
    out.print(head)
    if times is not None and times.submitted is not None:
        out.print(Text(times_text(times), style="dim"))
    if status.metadata:
        out.print(Text("  ".join(f"{k}: {v}" for k, v in status.metadata.items())))
    if status.msg:
        out.print(Text(f"msg: {status.msg}"))
    if status.structured_error_msg:
        _print_error(out, parse_error_file(status.structured_error_msg))
    replicas = [r for rs in status.roles for r in rs.replicas]
    if not replicas:
        return
    with_msg = any(r.msg or r.structured_error_msg for r in replicas)
    table = Table(box=None, pad_edge=False)
    for column in ("role", "id", "state", "host", "exit", "restarts"):
        table.add_column(column, justify="right" if column in ("id", "restarts") else "left")
    if with_msg:
        table.add_column("msg", overflow="fold")
    for r in replicas:
        exit_text = r.signal or ("" if r.exit_code is None else str(r.exit_code))
        row: list[Text | str] = [
            r.role,
            str(r.id),
            state_text(r.state),
            r.hostname,
            exit_text,
            str(r.restarts),
        ]
        if with_msg:
            error = parse_error_file(r.structured_error_msg).headline
            row.append(Text(error or r.msg))
        table.add_row(*row)
    out.print(table)


def _print_error(out: Console, error: ErrorReport) -> None:
    """The root cause's structured error: headline, code and time, then its traceback."""
    facts = [f"code {error.error_code}" if error.error_code else "", error.when]
    suffix = ", ".join(f for f in facts if f)
    out.print(Text(f"error: {error.headline}" + (f" ({suffix})" if suffix else "")))
    if error.traceback:
        for line in error.traceback.splitlines():
            out.print(Text(f"  {line}", style="dim"))


def print_describe(out: Console, handle: str, resp: DescribeAppResponse) -> None:
    print_status(out, handle, resp.to_status(), resp.times)
    table = Table(title=None, box=None, pad_edge=False)
    for column in ("role", "entrypoint", "args", "replicas", "max retries", "retry policy"):
        table.add_column(column, overflow="fold")
    for role in resp.roles:
        table.add_row(*_role_row(role))
    out.print()
    out.print(table)


def _role_row(role: Role) -> list[Text]:
    return [
        Text(role.name),
        Text(role.entrypoint),
        Text(shlex.join(role.args)),
        Text(str(role.num_replicas)),
        Text(str(role.max_retries)),
        Text(str(role.retry_policy)),
    ]


def print_list(out: Console, apps: Sequence[ListAppResponse]) -> None:
    if not apps:
        out.print("no apps")
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("handle", no_wrap=True)
    table.add_column("name")
    table.add_column("state")
    table.add_column("submitted", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("ended", no_wrap=True)
    with_msg = any(a.msg for a in apps)
    if with_msg:
        table.add_column("msg", overflow="fold")
    for a in apps:
        times = (a.times.submitted, a.times.started, a.times.ended)
        when = [_local(at) if at is not None else "" for at in times]
        row: list[Text | str] = [Text(a.app_handle), Text(a.name), state_text(a.state), *when]
        table.add_row(*row, *([Text(a.msg)] if with_msg else []))
    out.print(table)


# ------------------------------------------------------- streaming lines
def transition_text(t: Transition) -> Text:
    """``12:00:01.250  trainer/1  RUNNING -> FAILED  trainer/1 exited with code 3``."""
    when = datetime.fromtimestamp(t.at).strftime("%H:%M:%S.%f")[:-3]
    text = Text.assemble(
        (when, "dim"),
        "  ",
        (t.scope, "bold"),
        "  ",
        (t.source, _STATE_STYLE.get(t.source, "")),
        " -> ",
        (t.dest, _STATE_STYLE.get(t.dest, "")),
    )
    if t.msg:
        text.append(f"  {t.msg}")
    return text


def plain_line(text: Text) -> str:
    """``text`` and a newline, as a console that writes no style prints it (soft wrap).

    Rich drops control codes when a ``Text`` is built, and expands tabs when it
    prints one (8 columns).
    """
    if "\t" in text.plain:
        text = text.copy()
        text.expand_tabs()
    return text.plain + "\n"


def replica_prefix(role: str, replica_id: int, index: int, color: bool) -> str:
    """``role/k | ``, coloured per replica (by ``index``) when ``color``."""
    label = f"{role}/{replica_id} | "
    if not color:
        return label
    return click.style(label, fg=_PREFIX_COLORS[index % len(_PREFIX_COLORS)])
