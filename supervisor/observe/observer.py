"""The one object an app actor reports to; it feeds the log, the metrics and the bus."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.observe import metrics, records
from supervisor.observe.bus import EventBus
from supervisor.status import Transition

__all__ = ["Observer"]


class Observer:
    """Shared by every actor of one Supervisor; each call is synchronous and never blocks."""

    def __init__(self) -> None:
        self.bus = EventBus()

    def transitions(self, handle: str, backend: str, transitions: Sequence[Transition]) -> None:
        records.log_transitions(handle, transitions)
        metrics.count_transitions(backend, transitions)
        self.bus.publish(handle, transitions)

    def restart(self, handle: str, backend: str, keys: Sequence[tuple[str, int]], why: str) -> None:
        records.log_action(handle, "restart", keys, why)
        metrics.count_restarts(backend, len(keys))

    def stop(self, handle: str, keys: Sequence[tuple[str, int]], why: str) -> None:
        records.log_action(handle, "stop", keys, why)

    def internal_error(self, handle: str, doing: str, error: BaseException) -> None:
        records.log_internal_error(handle, doing, error)
