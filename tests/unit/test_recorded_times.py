"""Which time a backend records for what its engine or node saw: theirs, within the host's.

The engines, the cluster and their times are real in the integration tests (a loop held
while a container or a Slurm replica ends); here, the skewed clocks the local engines
and cluster cannot show (an engine reached over TCP, or a node, may run on a clock of its
own), and the Slurm rule for a start seen in the same look as its end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from supervisor.backends.docker.engine import event_time
from supervisor.backends.slurm.times import ReplicaTimes, read_pump_starts
from supervisor.events import Exited, Lost, Started, recorded_time


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"timeNano": 1_795_000_000_123_456_789, "time": 1_795_000_000}, 1_795_000_000.1234568),
        ({"time": 1_795_000_000}, 1_795_000_000.0),
        ({}, None),
        ({"timeNano": 0, "time": 0}, None),
        ({"timeNano": True}, None),
        ({"timeNano": "1795000000123456789"}, None),
    ],
)
def test_the_events_time_is_its_nanoseconds_else_its_seconds_else_none(
    event: dict[str, object], expected: float | None
) -> None:
    assert event_time(event) == pytest.approx(expected)


def test_the_engines_time_is_recorded_when_the_hosts_clock_allows_it() -> None:
    before = time.time()
    assert recorded_time(before - 5.0, before - 10.0) == before - 5.0


def test_an_engine_clock_ahead_of_the_host_never_records_the_future() -> None:
    before = time.time()
    recorded = recorded_time(before + 3600.0, 0.0)
    assert before <= recorded <= time.time()


def test_an_engine_clock_behind_never_ends_a_replica_before_its_recorded_start() -> None:
    started = time.time() - 1.0
    assert recorded_time(started - 3600.0, started) == started


def test_no_engine_time_is_the_hosts_now() -> None:
    before = time.time()
    assert before <= recorded_time(None, 0.0) <= time.time()


def test_a_slurm_replica_seen_starting_and_ending_in_one_look_takes_both_pump_times() -> None:
    times = ReplicaTimes()
    now = time.time()
    started = times.stamped(Started(role="r", replica_id=0, attempt=1), now - 3.0, now - 1.0)
    ended = times.stamped(
        Exited(role="r", replica_id=0, attempt=1, exit_code=0), now - 3.0, now - 1.0
    )
    assert (started.at, ended.at) == (now - 3.0, now - 1.0)
    assert (started.attempt, ended.attempt) == (1, 1)  # nothing else changes


def test_a_slurm_start_seen_alone_takes_its_start_record() -> None:
    times = ReplicaTimes()
    now = time.time()
    assert times.stamped(Started(role="r", replica_id=0), now - 5.0).at == now - 5.0
    # A node clock ahead of the host's: never a start in the host's future.
    ahead = times.stamped(Started(role="r", replica_id=1), now + 3600.0)
    assert now <= ahead.at <= time.time()


def test_a_slurm_start_with_no_record_keeps_its_time_and_no_end_goes_before_it() -> None:
    times = ReplicaTimes()
    seen = times.stamped(Started(role="r", replica_id=0))  # a look saw it, no record read
    assert seen.at <= time.time()
    # A node clock behind the host's: its end is not recorded before the start seen here.
    behind = times.stamped(
        Exited(role="r", replica_id=0, exit_code=0), seen.at - 60.0, seen.at - 30.0
    )
    assert behind.at == seen.at
    # The next attempt's end is bounded by that attempt's start only.
    other = times.stamped(
        Exited(role="r", replica_id=0, attempt=1, exit_code=0), None, seen.at - 30.0
    )
    assert other.at == seen.at - 30.0


def test_a_slurm_event_with_no_pump_record_keeps_the_time_it_was_seen() -> None:
    times = ReplicaTimes()
    exited = Exited(role="r", replica_id=0, exit_code=0)
    lost = Lost(role="r", replica_id=1, reason="gone")
    assert times.stamped(exited) is exited
    assert times.stamped(lost, None, 1.0) is lost


def test_start_records_are_read_for_their_attempt_only(tmp_path: Path) -> None:
    for k, record in enumerate(
        [
            {"attempt": 1, "started": 1_795_000_000.25},
            {"attempt": 0, "started": 1_795_000_000.5},  # the previous attempt's
            {"attempt": 1, "started": True},  # cannot be a time
        ]
    ):
        (tmp_path / str(k)).mkdir()
        (tmp_path / str(k) / "start.json").write_text(json.dumps(record))
    (tmp_path / "3").mkdir()  # none written yet
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "start.json").write_text('{"attempt": 1, "star')  # half of one
    log_dirs = {("r", k): str(tmp_path / str(k)) for k in range(5)}
    starts = [Started(role="r", replica_id=k, attempt=1) for k in range(6)]  # 5: no dir
    assert read_pump_starts(starts, log_dirs) == {(("r", 0), 1): 1_795_000_000.25}
