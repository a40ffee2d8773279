"""``--since``/``--until``: ISO-8601, epoch seconds, or a duration ago."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest

from supervisor.cli.timespec import TimeSpec, parse_duration, parse_time

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (" 10M ", 600.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "m", "10x", "-5m", "10 m", "1h-30m", "h1"])
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_a_duration_means_that_long_ago() -> None:
    assert parse_time("10m", NOW) == NOW - 600
    assert parse_time("30s", NOW) == NOW - 30
    assert parse_time("2h", NOW) == NOW - 7200


def test_a_bare_number_is_epoch_seconds() -> None:
    assert parse_time("1700000000", NOW) == 1_700_000_000.0
    assert parse_time("12.5", NOW) == 12.5


def test_iso_datetimes_are_kept_as_datetimes() -> None:
    aware = parse_time("2024-05-01T12:00:00+02:00", NOW)
    assert aware == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    utc = parse_time("2024-05-01T12:00:00Z", NOW)
    assert isinstance(utc, datetime) and utc.utcoffset() == timedelta(0)
    naive = parse_time("2024-05-01 12:00", NOW)
    assert naive == datetime(2024, 5, 1, 12, 0)  # naive: local time, as the reader documents
    assert parse_time("2024-05-01", NOW) == datetime(2024, 5, 1)


@pytest.mark.parametrize("text", ["yesterday", "10 minutes", "2024-13-01", "-10"])
def test_bad_times_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_time(text, NOW)


def test_the_click_type_uses_its_clock_and_fails_as_a_usage_error() -> None:
    spec = TimeSpec(clock=lambda: NOW)
    assert spec.convert("1h", None, None) == NOW - 3600
    assert spec.convert(5.0, None, None) == 5.0
    with pytest.raises(click.BadParameter, match="not a time"):
        spec.convert("soon", None, None)
