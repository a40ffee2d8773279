"""Printing what happens while an app runs: replica output and transitions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

import anyio
from rich.console import Console

from supervisor.cli.render import plain_line, replica_prefix, transition_text
from supervisor.logs import Stream
from supervisor.supervisor import Supervisor

__all__ = ["LogQuery", "follow_logs", "print_transitions"]


@dataclass(frozen=True)
class LogQuery:
    """The filters of ``log`` (``run --log`` uses the defaults with ``follow=True``)."""

    follow: bool = False
    regex: str | None = None
    since: datetime | float | None = None
    until: datetime | float | None = None
    streams: Stream | None = None


async def follow_logs(
    sv: Supervisor,
    handle: str,
    replicas: Sequence[tuple[str, int]],
    query: LogQuery,
    out: TextIO,
    *,
    prefix: bool,
    color: bool = False,
    as_json: bool = False,
) -> None:
    """Print the replicas' lines, each line whole: one replica after the other, or,
    when following, all concurrently until every one ended.

    With ``prefix`` each line starts ``role/k | `` and a last line without
    its newline gets one, so replicas never share a line. With ``as_json``
    each line is a JSON object ``{"role", "replica_id", "line"}``, the line
    without its ending (``\\n`` or ``\\r\\n``): one record is one line, as the
    text output shows it.
    """
    labels = [
        replica_prefix(role, k, index, color) if prefix else ""
        for index, (role, k) in enumerate(replicas)
    ]
    if not query.follow:
        # What is there now: one replica after the other reads best.
        for (role, k), label in zip(replicas, labels, strict=True):
            await _one(sv, handle, role, k, query, out, label, prefix, as_json)
    else:
        async with anyio.create_task_group() as tg:
            for (role, k), label in zip(replicas, labels, strict=True):
                tg.start_soon(_one, sv, handle, role, k, query, out, label, prefix, as_json)
    out.flush()


async def _one(
    sv: Supervisor,
    handle: str,
    role: str,
    k: int,
    query: LogQuery,
    out: TextIO,
    label: str,
    prefix: bool,
    as_json: bool,
) -> None:
    lines = sv.log_iter(
        handle,
        role,
        k,
        regex=query.regex,
        since=query.since,
        until=query.until,
        should_tail=query.follow,
        streams=query.streams,
    )
    async for line in lines:
        if as_json:
            text = line.removesuffix("\n").removesuffix("\r") if line.endswith("\n") else line
            out.write(json.dumps({"role": role, "replica_id": k, "line": text}) + "\n")
        elif prefix and not line.endswith("\n"):
            out.write(f"{label}{line}\n")
        else:
            out.write(label + line)
        if query.follow:
            out.flush()


async def print_transitions(sv: Supervisor, handle: str, err: Console) -> None:
    """Every transition of an app launched here, as it happens, until the app ends.

    Where ``err`` writes no style (not a terminal, or ``NO_COLOR``), each line is
    the text's characters as rich would write them, written without rich: its
    print costs about 0.22 ms a line, and a thousand replicas starting make 3,000
    transitions, most of a second of a core.
    """
    plain = err.color_system is None
    async for t in sv.watch(handle):
        text = transition_text(t)
        if plain:
            err.file.write(plain_line(text))
        else:
            err.print(text, soft_wrap=True)
