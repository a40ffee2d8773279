"""What the CLI derives for people and programs: an app's times and its one failure line."""

from __future__ import annotations

import io
import os
import sys

import pytest
from rich.console import Console

from supervisor.backends.slurm.poller import JobView
from supervisor.backends.slurm.records import JobRecord
from supervisor.backends.slurm.translate import ViewTranslator
from supervisor.cli.render import (
    console,
    failure_line,
    plain_line,
    std_stream,
    times_json,
    times_text,
    transition_text,
    use_color,
)
from supervisor.events import ReplicaEvent
from supervisor.fsm.app import AppFSM, RoleSpec
from supervisor.states import AppState, ReplicaState
from supervisor.status import AppStatus, AppTimes, ReplicaStatus, RoleStatus, Transition


def _t(seq: int, at: float, source: str, dest: str, role: str | None = None) -> Transition:
    return Transition(seq, at, source, dest, "t", role, 0 if role else None)


def test_times_come_from_the_app_level_transitions() -> None:
    history = [
        _t(0, 10.0, "UNSUBMITTED", "SUBMITTED", "w"),
        _t(1, 10.5, "UNSUBMITTED", "SUBMITTED"),
        _t(2, 11.0, "SUBMITTED", "RUNNING", "w"),
        _t(3, 12.0, "SUBMITTED", "RUNNING"),
        _t(4, 13.0, "RUNNING", "FAILED", "w"),
        _t(5, 13.5, "RUNNING", "RUNNING"),  # a restart: the first RUNNING stays
        _t(6, 14.0, "RUNNING", "FAILED"),
    ]
    assert AppTimes.from_transitions(history) == AppTimes(10.5, 12.0, 14.0)
    assert AppTimes.from_transitions(history[:4]) == AppTimes(10.5, 12.0, None)
    assert AppTimes.from_transitions([]) == AppTimes()


def test_an_app_that_never_ran_has_no_start() -> None:
    history = [_t(0, 1.0, "UNSUBMITTED", "SUBMITTED"), _t(1, 2.0, "SUBMITTED", "FAILED")]
    assert AppTimes.from_transitions(history) == AppTimes(1.0, None, 2.0)
    assert times_json(AppTimes(1.0, None, 2.0)) == {
        "submitted": "1970-01-01T00:00:01.000+00:00",
        "started": None,
        "ended": "1970-01-01T00:00:02.000+00:00",
    }
    text = times_text(AppTimes(1.0, None, 2.5))
    assert text.startswith("submitted ") and "started" not in text and text.endswith("(1.5s)")


def test_the_failure_line_names_the_root_cause() -> None:
    failed = ReplicaStatus(1, ReplicaState.FAILED, "w", msg="w/1: cannot start 'x': gone")
    ok = ReplicaStatus(0, ReplicaState.SUCCEEDED, "w")
    status = AppStatus(AppState.FAILED, msg="w/1 exited", roles=[RoleStatus("w", [ok, failed])])
    assert failure_line("local://s/a", status) == "local://s/a FAILED: w/1: cannot start 'x': gone"
    cancelled = AppStatus(AppState.CANCELLED)
    assert failure_line("local://s/a", cancelled) == "local://s/a CANCELLED"


def _slurm_failure(*records: JobRecord) -> AppStatus:
    """An app's status as the Slurm backend builds it: its job's records through the
    backend's translator and the app's FSM. (Records by hand: a job that failed with a
    given code or signal, seen by one poll.)"""
    translator = ViewTranslator(10, [("trainer", 0)])
    fsm = AppFSM([RoleSpec("trainer", 1)])
    running = JobRecord(10, 10, 0, "RUNNING", nodes="n1")
    for record in (running, *records):
        for event in translator.events(JobView(10, (record,), "queue")):
            assert isinstance(event, ReplicaEvent)
            fsm.apply(event)
    return fsm.snapshot()


def test_a_slurm_failure_line_gives_the_exit_code_as_local_and_docker_ones_do() -> None:
    """A Slurm replica's msg is its Slurm state, which the line gave alone: "trainer/0:
    Slurm state FAILED", where a local one says "trainer/0 exited with code 3"."""
    failed = _slurm_failure(JobRecord(10, 10, 0, "FAILED", exit_code=3, nodes="n1"))
    assert failure_line("slurm://s/a", failed) == (
        "slurm://s/a FAILED: trainer/0 exited with code 3: Slurm state FAILED"
    )
    assert failure_line("slurm://s/a", failed).removeprefix("slurm://s/a FAILED: ") == failed.msg
    killed = _slurm_failure(
        JobRecord(10, 10, 0, "TIMEOUT", reason="TimeLimit", signal=15, nodes="n1")
    )
    assert failure_line("slurm://s/a", killed) == (
        "slurm://s/a FAILED: trainer/0 killed by SIGTERM: Slurm state TIMEOUT (TimeLimit)"
    )
    # Said once where the replica's msg already says it, and nothing made up without a code.
    local = ReplicaStatus(0, ReplicaState.FAILED, "w", exit_code=3, msg="w/0 exited with code 3")
    status = AppStatus(AppState.FAILED, roles=[RoleStatus("w", [local])])
    assert failure_line("local://s/a", status) == "local://s/a FAILED: w/0 exited with code 3"
    lost = ReplicaStatus(0, ReplicaState.FAILED, "w", msg="w/0: its exit status is lost")
    status = AppStatus(AppState.FAILED, roles=[RoleStatus("w", [lost])])
    assert failure_line("local://s/a", status) == "local://s/a FAILED: w/0: its exit status is lost"


@pytest.mark.parametrize(
    "msg",
    [
        "",
        "exited with code 3",
        "tab\there\tand\tthere",
        "cr\rbell\a backspace\b vt\v ff\f",
        "[bold]not markup[/bold] :smile:",
        "wide 漢字 and 🎉",
        "trailing   ",
        "two\nlines\twith a tab",
    ],
)
def test_a_plain_transition_line_is_what_rich_prints_without_styles(msg: str) -> None:
    """`run` writes transitions itself where no style is written (rich's print cost 0.22 ms
    a line): the characters must be exactly rich's, control codes dropped, tabs expanded."""
    t = Transition(
        seq=1,
        at=1_700_000_000.25,
        source="RUNNING",
        dest="FAILED",
        trigger="x",
        role="trainer",
        replica_id=1,
        msg=msg,
    )
    out = io.StringIO()
    Console(file=out, highlight=False, width=80, color_system=None).print(
        transition_text(t), soft_wrap=True
    )
    assert plain_line(transition_text(t)) == out.getvalue()


@pytest.mark.parametrize("stderr", [False, True])
def test_a_stream_closed_at_start_is_written_to_nowhere(
    stderr: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python sets sys.stdout/sys.stderr to None when the descriptor was closed at start
    (``2>&-``): a console on it raised AttributeError on ``isatty()``."""
    monkeypatch.setattr(sys, "stderr" if stderr else "stdout", None)
    stream = std_stream(stderr)
    assert stream is std_stream(stderr)  # opened once
    assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
    assert not use_color(stream)
    console(stderr).print("[bold]goes nowhere[/bold]")
