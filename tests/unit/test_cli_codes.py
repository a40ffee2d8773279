"""Exit codes: final states, signals, and library errors."""

from __future__ import annotations

import signal

import click
import pytest

from supervisor import (
    AppState,
    BackendError,
    InvalidHandleError,
    Problem,
    SpecError,
    UnknownAppError,
    UnknownBackendError,
)
from supervisor.cli import codes
from supervisor.cli.errors import CliError, UsageFailure, translate


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (AppState.SUCCEEDED, 0),
        (AppState.FAILED, 1),
        (AppState.CANCELLED, 3),
        (AppState.UNKNOWN, 4),
        (AppState.RUNNING, 4),
    ],
)
def test_final_states(state: AppState, code: int) -> None:
    assert codes.exit_code_for(state) == code


def test_signals_follow_the_shell_convention() -> None:
    assert codes.exit_code_for_signal(signal.SIGINT) == 130
    assert codes.exit_code_for_signal(signal.SIGTERM) == 143


def test_usage_is_clicks_code() -> None:
    assert codes.USAGE == click.UsageError("x").exit_code == 2


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (SpecError([Problem("roles", "empty")]), UsageFailure, 2),
        (InvalidHandleError("bad"), UsageFailure, 2),
        (UnknownBackendError("no backend named 'x'"), UsageFailure, 2),
        (UnknownAppError("no app"), CliError, 1),
        (BackendError("disk full", transient=False), CliError, 1),
    ],
)
def test_library_errors_map_to_codes(exc: Exception, kind: type[CliError], code: int) -> None:
    mapped = translate(exc)
    assert type(mapped) is kind
    assert isinstance(mapped, click.ClickException) and mapped.exit_code == code


def test_errors_are_unwrapped_from_single_member_groups() -> None:
    group = BaseExceptionGroup("tg", [ExceptionGroup("inner", [UnknownAppError("gone")])])
    mapped = translate(group)
    assert isinstance(mapped, CliError) and "gone" in mapped.message


def test_keyboard_interrupt_exits_130_and_others_pass_through() -> None:
    mapped = translate(KeyboardInterrupt())
    assert isinstance(mapped, CliError) and mapped.exit_code == 130
    assert mapped.message == "interrupted (SIGINT)"  # click prints it as "Error: ..."
    boom = RuntimeError("bug")
    assert translate(boom) is boom
    two = ExceptionGroup("two", [RuntimeError("a"), RuntimeError("b")])
    assert translate(two) is two
