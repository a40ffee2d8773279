"""MkDocs hook: render click help text the way click prints it.

mkdocs-click pastes a command's help into the page as Markdown, so click's
``\\b`` paragraphs (kept as typed: tables of targets, exit codes) get re-wrapped
and their ``[ARGS...]`` read as reference links (``mkdocs build --strict`` then
fails). This renders each ``\\b`` paragraph as a text block and escapes brackets
elsewhere, so the page shows what ``asupervisor CMD --help`` shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import click
import mkdocs_click._docs as click_docs


def _description(ctx: click.Context, remove_ascii_art: bool = False) -> Iterator[str]:
    help_string = ctx.command.help or ctx.command.short_help
    if not help_string:
        return
    for paragraph in inspect.cleandoc(help_string).split("\n\n"):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            yield "```text"
            yield from lines[1:]
            yield "```"
        else:
            yield from (line.replace("[", "\\[") for line in lines)
        yield ""


def on_config(config: Any) -> Any:
    click_docs._make_description = _description
    return config
