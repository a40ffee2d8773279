"""The supervision case's app for ``asupervisor run --log bench/components/ours.py:sleepers``."""

from __future__ import annotations

from supervisor import AppDef, Role


def sleepers(n: int = 100, seconds: str = "10") -> AppDef:
    """N replicas of ``sleep SECONDS``.

    Args:
        n: how many replicas
        seconds: how long each sleeps
    """
    return AppDef(
        name="sleepers",
        roles=[Role(name="sleep", entrypoint="sleep", args=[seconds], num_replicas=n)],
    )
