"""``--since``/``--until`` values: ISO-8601 datetimes, epoch seconds or durations ago."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime

import click

__all__ = ["TimeSpec", "parse_duration", "parse_time"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d|w)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(text: str) -> float | None:
    """Seconds in ``90s``, ``10m``, ``2h``, ``1h30m``, ``1d``, ``500ms``; None if not one."""
    compact = text.strip().lower()
    if not _DURATION.fullmatch(compact):
        return None
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(compact))


def parse_time(text: str, now: float | None = None) -> datetime | float:
    """A point in time for the log filters.

    ``10m`` means ten minutes before ``now`` (epoch seconds, default: the
    clock); a bare number is epoch seconds; anything else must be an
    ISO-8601 datetime (naive means local time). Raises ``ValueError``.
    """
    stripped = text.strip()
    ago = parse_duration(stripped)
    if ago is not None:
        return (time.time() if now is None else now) - ago
    if _NUMBER.fullmatch(stripped):
        return float(stripped)
    try:
        return datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use ISO-8601 (2024-05-01T12:00:00), "
            "epoch seconds (1714564800) or a duration ago (30s, 10m, 2h, 1d)"
        ) from None


class TimeSpec(click.ParamType[datetime | float]):
    """A click type around ``parse_time``."""

    name = "TIME"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime | float:
        if isinstance(value, datetime | float):
            return value
        try:
            return parse_time(str(value), self._clock())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
