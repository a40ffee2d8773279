"""Seeing and acting on a cluster: ``cluster``, ``list --cluster``, ``cancel`` by filter.

``cluster`` shows partitions and nodes as ``sinfo`` does; ``list --cluster``
every job the scheduler holds, anyone's, ours marked with their handle;
``cancel --state/--partition/--all`` cancels this session's apps only (never
another session's, never a job the library did not launch), after showing
them and asking (``--yes`` skips the question; without a terminal to ask on,
it refuses).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from supervisor.cli.errors import CliError, UsageFailure
from supervisor.cli.render import state_text
from supervisor.cluster import ClusterInfo, ClusterJob
from supervisor.status import ListAppResponse

__all__ = [
    "cluster_jobs_json",
    "confirm_cancel",
    "print_cluster",
    "print_cluster_jobs",
    "print_matches",
]

_NODE_STYLE = {"idle": "green", "mixed": "cyan", "allocated": "yellow", "down": "bold red"}


def print_cluster(out: Console, info: ClusterInfo) -> None:
    """Two tables: partitions (``*`` marks the default), then nodes."""
    out.print(Text(f"Slurm {info.version}", style="dim"))
    parts = Table(box=None, pad_edge=False)
    for column in ("partition", "state", "nodes", "cpus", "nodelist"):
        parts.add_column(column, justify="right" if column in ("nodes", "cpus") else "left")
    for p in info.partitions:
        name = p.name + ("*" if p.default else "")
        up = "green" if p.state == "UP" else "bold red"
        parts.add_row(name, Text(p.state, up), str(p.total_nodes), str(p.total_cpus), p.nodes)
    out.print(parts)
    out.print()
    nodes = Table(box=None, pad_edge=False)
    for column in ("node", "state", "cpus (alloc/total)", "memory MB (alloc/total)", "gres"):
        nodes.add_column(column)
    nodes.add_column("partitions")
    with_reason = any(n.reason for n in info.nodes)
    if with_reason:
        nodes.add_column("reason", overflow="fold")
    for n in info.nodes:
        base = n.state.split("+")[0]
        row: list[Text | str] = [
            n.name,
            Text(n.state, _NODE_STYLE.get(base, "")),
            f"{n.alloc_cpus}/{n.cpus}",
            f"{n.alloc_memory_mb}/{n.memory_mb}",
            n.gres or "-",
            ",".join(n.partitions),
        ]
        nodes.add_row(*row, *([n.reason] if with_reason else []))
    out.print(nodes)


def cluster_jobs_json(jobs: Sequence[ClusterJob]) -> list[dict[str, Any]]:
    return [j.to_json() for j in jobs]


def print_cluster_jobs(out: Console, jobs: Sequence[ClusterJob]) -> None:
    """Every job, ``squeue``-like; ours show their handle, others ``-``."""
    if not jobs:
        out.print("no jobs")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("job id", "partition", "name", "user", "state", "nodes/reason", "handle"):
        table.add_column(column, no_wrap=column in ("job id", "handle"))
    for j in jobs:
        where = j.nodes or (f"({j.reason})" if j.reason else "")
        handle = Text(j.handle, "bold") if j.handle else Text("-", "dim")
        table.add_row(str(j.job_id), j.partition, j.name, j.user, j.state, where, handle)
    out.print(table)


def print_matches(out: Console, apps: Sequence[ListAppResponse]) -> None:
    """What a cancel by filter is about to stop."""
    table = Table(box=None, pad_edge=False)
    table.add_column("handle", no_wrap=True)
    table.add_column("name")
    table.add_column("state")
    for a in apps:
        table.add_row(Text(a.app_handle), Text(a.name), state_text(a.state))
    out.print(table)


def confirm_cancel(count: int, yes: bool) -> None:
    """Ask before cancelling; ``--yes`` skips it, and without a terminal it is refused (exit 2).

    A "no", or no answer (end of input), is ``Error: nothing cancelled: ...`` and exit 1,
    one ``Error:`` line as for every non-zero exit (click's own abort printed
    ``Aborted!``); Ctrl-C at the question is an interruption (130), as elsewhere.
    """
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageFailure(
            f"not cancelling {count} app(s) without a confirmation: stdin is not a terminal "
            "to ask on; pass --yes"
        )
    noun = "app" if count == 1 else "apps"
    try:
        confirmed = click.confirm(f"Cancel these {count} {noun}?", err=True)
    except click.Abort as exc:
        click.echo(err=True)  # the question's line ends, as an answer would end it
        # click turns both Ctrl-C and end of input into Abort; what it caught stays
        # the context.
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise CliError("nothing cancelled: no answer") from None
    if not confirmed:
        raise CliError("nothing cancelled: the answer was no")
