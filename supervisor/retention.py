"""How long ended apps' records and logs stay on disk: ``Supervisor(retention=...)``.

A service that runs for weeks would fill its state directory with the
records and logs of every app it ever ran. With a ``Retention``, the
Supervisor removes, every ``interval`` seconds and off the event loop, the
records, logs and index entry of the settled apps of its session that are
older than ``max_age`` (since they ended) or beyond the ``max_count`` that ended last;
``asupervisor gc`` does the same once. An app that is not settled, or whose
end is not recorded while its supervising process lives, is never removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.errors import Problem, SpecError

__all__ = ["Retention", "limit_problems"]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def limit_problems(
    max_age: object, max_count: object, *, age: str, count: str, prefix: str = ""
) -> list[Problem]:
    """What is wrong with an age limit and a count limit (either may be None, not
    both), each named as its caller spells it: ``prefix + age``, ``prefix + count``
    (``Retention``: ``retention.max_age``; ``gc``: ``older_than``)."""
    problems: list[Problem] = []
    # ``not x >= 0``: NaN too, which compares false with every age (nothing removed).
    if max_age is not None and (
        not isinstance(max_age, int | float) or isinstance(max_age, bool) or not max_age >= 0
    ):
        problems.append(Problem(prefix + age, f"must be seconds >= 0, {max_age!r}"))
    if max_count is not None and (
        not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 0
    ):
        problems.append(Problem(prefix + count, f"must be an int >= 0, {max_count!r}"))
    if max_age is None and max_count is None:
        problems.append(Problem(prefix.rstrip(".") or age, f"give {age}, {count} or both"))
    return problems


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
        problems = limit_problems(
            self.max_age, self.max_count, age="max_age", count="max_count", prefix="retention."
        )
        if not _number(self.interval) or not self.interval > 0:
            problems.append(
                Problem("retention.interval", f"must be seconds > 0, {self.interval!r}")
            )
        if problems:
            raise SpecError(problems, context="invalid retention")
