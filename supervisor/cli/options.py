"""Options several commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["backend_option"]

F = TypeVar("F", bound=Callable[..., Any])


def backend_option(default: str = "local", help: str | None = None) -> Callable[[F], F]:
    """``--backend``, also ``-s`` and ``--scheduler`` as TorchX spells it, on every command
    that takes one (a TorchX user types ``list -s local_docker`` as ``run -s``)."""
    return click.option(
        "--backend",
        "-s",
        "--scheduler",
        default=default,
        show_default=True,
        help=f"{help or 'the backend'} (-s and --scheduler: as TorchX spells it)",
    )
