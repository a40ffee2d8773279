"""Turning library errors into exit codes, once, around every command."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import click

from supervisor.cli import codes
from supervisor.errors import (
    InvalidHandleError,
    MissingExtraError,
    SpecError,
    SupervisorError,
    UnknownAppError,
    UnknownBackendError,
    only_cause,
)

__all__ = ["CliError", "ExitOnBrokenPipe", "UsageFailure", "run_async", "translate"]

T = TypeVar("T")


class CliError(click.ClickException):
    """A message on stderr (click prints ``Error: ...``) and exit code 1."""

    exit_code = codes.FAILED


class UsageFailure(CliError):
    """Like ``CliError`` but exit code 2: what the user asked for cannot be done as asked."""

    exit_code = codes.USAGE


class Interrupted(CliError):
    """Ctrl-C outside ``run`` (a ``log -f``): ``Error: interrupted (SIGINT)``, exit 130."""

    exit_code = codes.exit_code_for_signal(signal.SIGINT)

    def __init__(self) -> None:
        super().__init__("interrupted (SIGINT)")


def _reader_gone() -> click.exceptions.Exit:
    """Our stdout's reader went away (``| head -1``): exit as a command SIGPIPE killed.

    128 + SIGPIPE (141) and nothing on stderr, as ``seq 1 9 | head -1`` does;
    click's own handling exits 1, which here means the app FAILED. Whatever is
    still buffered for stdout goes to /dev/null, so the flush at exit cannot
    raise again.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return click.exceptions.Exit(codes.exit_code_for_signal(signal.SIGPIPE))


class ExitOnBrokenPipe(click.Group):
    """The root group: a stdout whose reader left ends any command as ``_reader_gone`` says,
    and Ctrl-C outside ``run_async`` (loading a component) as ``Interrupted``, not as
    click's "Aborted!" with exit 1, which reads as FAILED."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _reader_gone() from None
        except KeyboardInterrupt:
            raise Interrupted() from None


def translate(exc: BaseException) -> BaseException:
    """The exception to raise in place of ``exc``: a ``CliError`` for library errors."""
    leaf = only_cause(exc)
    if isinstance(leaf, BrokenPipeError):
        return _reader_gone()
    if isinstance(leaf, KeyboardInterrupt):
        return Interrupted()
    if isinstance(leaf, SpecError | InvalidHandleError | UnknownBackendError):
        return UsageFailure(str(leaf))
    if isinstance(leaf, UnknownAppError | MissingExtraError):
        return CliError(str(leaf))
    if isinstance(leaf, SupervisorError):
        return CliError(f"{type(leaf).__name__}: {leaf}")
    return leaf


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run`` on asyncio, with library errors mapped to exit codes."""
    try:
        return anyio.run(fn, backend="asyncio")
    except BaseException as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc
