"""Exit codes of the CLI, and the mapping from an app's final state to one."""

from __future__ import annotations

import signal

from supervisor.states import AppState

__all__ = [
    "CANCELLED",
    "FAILED",
    "OK",
    "UNKNOWN",
    "USAGE",
    "exit_code_for",
    "exit_code_for_signal",
]

OK = 0
FAILED = 1  # also: no such app, backend errors
USAGE = 2  # click's own code for usage errors; also invalid apps and run options
CANCELLED = 3
UNKNOWN = 4

_BY_STATE = {
    AppState.SUCCEEDED: OK,
    AppState.FAILED: FAILED,
    AppState.CANCELLED: CANCELLED,
    AppState.UNKNOWN: UNKNOWN,
}


def exit_code_for(state: AppState) -> int:
    """0 SUCCEEDED, 1 FAILED, 3 CANCELLED, 4 UNKNOWN; a non-final state (never expected) is 4."""
    return _BY_STATE.get(state, UNKNOWN)


def exit_code_for_signal(signum: int) -> int:
    """The shell convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signal.Signals(signum))
