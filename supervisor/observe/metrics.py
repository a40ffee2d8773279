"""Metrics through the OpenTelemetry metrics API: a no-op without it or without an SDK.

The library only uses the API (the ``otel`` extra installs ``opentelemetry-api``);
the application chooses an SDK, exporters and readers. Instruments are created on
first use from the global meter provider; the API's proxy hands them to an SDK set
up later. Names follow OpenTelemetry's conventions: a dotted ``asupervisor.``
namespace, UCUM units (``s``, ``{app}``), attributes namespaced the same way.

Instruments:

- ``asupervisor.apps`` / ``asupervisor.replicas`` (observable up-down counters):
  apps and replicas followed now, by ``asupervisor.backend`` and ``asupervisor.state``;
- ``asupervisor.transitions`` (counter): by backend, ``asupervisor.scope``
  (``app`` or ``replica``) and the state entered;
- ``asupervisor.retries`` (counter): replica restarts decided, by backend;
- ``asupervisor.submit.duration`` / ``asupervisor.wait.duration`` (histograms, s);
- ``asupervisor.slurm.calls`` (counter): Slurm commands and REST calls, the shared
  poller's included, by ``asupervisor.slurm.command`` and ``asupervisor.slurm.transport``;
- ``asupervisor.docker.engine.events`` (counter): by ``asupervisor.docker.action``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from functools import cache
from types import ModuleType
from typing import Any, Protocol

from supervisor.status import Transition

__all__ = [
    "StateSource",
    "count_engine_event",
    "count_restarts",
    "count_slurm_call",
    "count_transitions",
    "record_submit",
    "record_wait",
    "register_states",
]

METER_NAME = "asupervisor"

BACKEND = "asupervisor.backend"
STATE = "asupervisor.state"
SCOPE = "asupervisor.scope"


class StateSource(Protocol):
    """What the observable counters read at each collection: (backend, state) counts."""

    def app_states(self) -> Iterable[tuple[str, str, int]]: ...

    def replica_states(self) -> Iterable[tuple[str, str, int]]: ...


_sources: weakref.WeakSet[Any] = weakref.WeakSet()


def register_states(source: StateSource) -> Callable[[], None]:
    """Count ``source``'s apps and replicas at each collection; returns the unregister call."""
    _instruments()  # the observable counters exist from the first Supervisor on
    _sources.add(source)
    return lambda: _sources.discard(source)


def _observe(kind: str, observation: Callable[..., Any]) -> Callable[[Any], Iterable[Any]]:
    """The callback of one observable counter.

    A (backend, state) counted once is reported from then on, as 0 when nothing
    is in that state: left out, its series would stop at its last count (the
    SDK drops a stream its callback no longer reports), and a dashboard would
    show the last app that ran as running still.
    """
    reported: set[tuple[str, str]] = set()

    def callback(options: Any) -> Iterable[Any]:
        totals = dict.fromkeys(reported, 0)
        for source in list(_sources):
            rows = source.app_states() if kind == "apps" else source.replica_states()
            for backend, state, count in rows:
                totals[(backend, state)] = totals.get((backend, state), 0) + count
        reported.update(totals)
        return [
            observation(count, {BACKEND: backend, STATE: state})
            for (backend, state), count in totals.items()
        ]

    return callback


class _Instruments:
    def __init__(self, otel: ModuleType) -> None:
        meter = otel.get_meter(METER_NAME)
        self.transitions = meter.create_counter(
            "asupervisor.transitions", unit="{transition}", description="State transitions"
        )
        self.retries = meter.create_counter(
            "asupervisor.retries", unit="{retry}", description="Replica restarts decided"
        )
        self.submit = meter.create_histogram(
            "asupervisor.submit.duration", unit="s", description="Duration of submit calls"
        )
        self.wait = meter.create_histogram(
            "asupervisor.wait.duration", unit="s", description="Duration of wait calls"
        )
        self.slurm_calls = meter.create_counter(
            "asupervisor.slurm.calls",
            unit="{call}",
            description="Slurm commands and slurmrestd requests",
        )
        self.engine_events = meter.create_counter(
            "asupervisor.docker.engine.events",
            unit="{event}",
            description="Container events received from docker engines",
        )
        meter.create_observable_up_down_counter(
            "asupervisor.apps",
            [_observe("apps", otel.Observation)],
            unit="{app}",
            description="Apps followed",
        )
        meter.create_observable_up_down_counter(
            "asupervisor.replicas",
            [_observe("replicas", otel.Observation)],
            unit="{replica}",
            description="Replicas of the apps followed",
        )


@cache
def _instruments() -> _Instruments | None:
    """Imported on first use, not with the package: ``import supervisor`` stays light."""
    try:
        from opentelemetry import metrics as otel
    except ImportError:  # the otel extra is not installed: every call here is a no-op
        return None
    return _Instruments(otel)


def count_transitions(backend: str, transitions: Iterable[Transition]) -> None:
    found = _instruments()
    if found is None:
        return
    for t in transitions:
        scope = "app" if t.role is None else "replica"
        found.transitions.add(1, {BACKEND: backend, SCOPE: scope, STATE: t.dest})


def count_restarts(backend: str, replicas: int) -> None:
    found = _instruments()
    if found is not None and replicas:
        found.retries.add(replicas, {BACKEND: backend})


def record_submit(backend: str, seconds: float) -> None:
    found = _instruments()
    if found is not None:
        found.submit.record(seconds, {BACKEND: backend})


def record_wait(backend: str, seconds: float) -> None:
    found = _instruments()
    if found is not None:
        found.wait.record(seconds, {BACKEND: backend})


def count_slurm_call(transport: str, command: str) -> None:
    found = _instruments()
    if found is not None:
        found.slurm_calls.add(
            1, {"asupervisor.slurm.transport": transport, "asupervisor.slurm.command": command}
        )


def count_engine_event(action: str) -> None:
    found = _instruments()
    if found is not None:
        found.engine_events.add(1, {"asupervisor.docker.action": action})
