"""How long ended apps' records and logs stay on disk: ``Supervisor(retention=...)``.

A service that runs for weeks would fill its state directory with the
records and logs of every app it ever ran. With a ``Retention``, the
Supervisor removes, every ``interval`` seconds and off the event loop, the
records, logs and index entry of the settled apps of its session that are
older than ``max_age`` (since they ended) or beyond the newest ``max_count``;
``asupervisor gc`` does the same once. An app that is not settled, or whose
end is not recorded while its supervising process lives, is never removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.errors import Problem, SpecError

__all__ = ["Retention"]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Retention:
    """Keep at most ``max_count`` settled apps, none ended more than ``max_age`` s ago.

    Either limit may be None (no limit of that kind); an app beyond either is
    removed. ``interval``: seconds between two sweeps.
    """

    max_age: float | None = None
    max_count: int | None = None
    interval: float = 600.0

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        # ``not x >= 0``: NaN too, which compares false with every age (nothing removed).
        if self.max_age is not None and (not _number(self.max_age) or not self.max_age >= 0):
            problems.append(Problem("retention.max_age", f"must be seconds >= 0, {self.max_age!r}"))
        count = self.max_count
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or count < 0
        ):
            problems.append(Problem("retention.max_count", f"must be an int >= 0, {count!r}"))
        if not _number(self.interval) or not self.interval > 0:
            problems.append(
                Problem("retention.interval", f"must be seconds > 0, {self.interval!r}")
            )
        if self.max_age is None and self.max_count is None:
            problems.append(Problem("retention", "give max_age, max_count or both"))
        if problems:
            raise SpecError(problems, context="invalid retention")
