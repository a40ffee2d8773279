"""The final statuses of ended apps, kept for ``status()`` after their actors left memory.

Bounded twice: by apps, and by the replicas their statuses hold. A count of
apps alone let a service that runs big apps keep 256 of them, a thousand
``ReplicaStatus`` each: a quarter of a million objects that every full pass of
the garbage collector walks (about 0.5 us each on a small VM, while the host's
event loop waits), for statuses that ``describe`` reads from the records anyway.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from supervisor.status import AppStatus

__all__ = ["FinishedStatuses"]

MAX_APPS: Final = 256
"""Apps whose final status is kept, the latest ones."""
MAX_REPLICAS: Final = 4096
"""Replica statuses kept in all; the latest app is kept whatever its size."""


class FinishedStatuses:
    """The latest ended apps' final statuses, oldest dropped first."""

    def __init__(self) -> None:
        self._statuses: OrderedDict[str, AppStatus] = OrderedDict()
        self._replicas = 0

    def get(self, handle: str) -> AppStatus | None:
        return self._statuses.get(handle)

    def drop(self, handle: str) -> None:
        """Forget ``handle`` (``gc`` removed its records): ``status`` and ``wait`` answer
        it as ``describe`` does then, not from a status whose app is gone."""
        old = self._statuses.pop(handle, None)
        if old is not None:
            self._replicas -= _replicas(old)

    def put(self, handle: str, status: AppStatus) -> None:
        old = self._statuses.pop(handle, None)
        if old is not None:
            self._replicas -= _replicas(old)
        self._statuses[handle] = status
        self._replicas += _replicas(status)
        while len(self._statuses) > 1 and (
            len(self._statuses) > MAX_APPS or self._replicas > MAX_REPLICAS
        ):
            _, dropped = self._statuses.popitem(last=False)
            self._replicas -= _replicas(dropped)


def _replicas(status: AppStatus) -> int:
    return sum(len(role.replicas) for role in status.roles)
