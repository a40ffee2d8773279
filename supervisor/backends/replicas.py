"""The stop and restart protocol of a runtime that runs each replica attempt itself.

Local processes and containers follow the same rules, written once here:

* a stop marks the replica stopped for good and ends what runs of it; when
  nothing runs and no restart of it is under way, the stop is answered at once
  with an ``Exited`` without a code (the restart under way answers it instead);
* a restart, one at a time per replica (its lock), ends what runs of it, moves
  it to the given attempt and starts that, unless a stop came meanwhile (then
  it answers the stop); a stop that came while the attempt was starting ends
  the new attempt at once.

A cancel asked refuses every start from then on (``refuse_starts`` marks each
replica stopped at once, before its stop comes): a start checks ``stopped`` just
before it asks for the attempt's process or container, and answers the stop
itself when it finds it set.

A runtime says how to end and start one attempt (``end_attempt``,
``start_attempt``), whether one runs (``attempt_running``) and where its
replicas are kept (``replica_slots``); the rest is here.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Protocol

import anyio

from supervisor.backends.base import AppRuntime, EventSink
from supervisor.errors import BackendError
from supervisor.events import Exited, ReplicaKey

__all__ = ["ReplicaRuntime", "ReplicaSlot", "each"]


class ReplicaSlot(Protocol):
    """What the protocol keeps of each replica, in the runtime's own slot."""

    attempt: int
    stopped: bool

    @property
    def lock(self) -> anyio.Lock:
        """Held while an attempt is started or ended: a stop meanwhile waits for it."""
        ...

    def busy(self) -> bool:
        """An attempt is being started or ended now (its lock is held)."""
        ...


async def each(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` at once; their backend failures come out as one BackendError.

    Not as a task group's exception group: the actor tells a backend failure
    (the app's notice) from a broken supervision by the exception's type.
    """
    failures: list[BackendError] = []

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except BackendError as e:
            failures.append(e)

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise BackendError(
            "; ".join(str(e) for e in failures), transient=all(e.transient for e in failures)
        )


class ReplicaRuntime(AppRuntime):
    """An ``AppRuntime`` whose ``stop`` and ``restart`` follow the shared protocol."""

    emit: EventSink

    @abc.abstractmethod
    def replica_slot(self, key: ReplicaKey) -> ReplicaSlot: ...

    @abc.abstractmethod
    def replica_slots(self) -> Iterable[ReplicaSlot]:
        """Every replica's slot."""

    @abc.abstractmethod
    def attempt_running(self, key: ReplicaKey) -> bool:
        """An attempt of the replica runs now (its exit is not reported yet)."""

    @abc.abstractmethod
    async def end_attempt(self, key: ReplicaKey) -> None:
        """End what runs of the replica (SIGTERM, grace, SIGKILL); return once its exit is
        reported. At once when nothing runs."""

    @abc.abstractmethod
    async def start_attempt(self, key: ReplicaKey) -> None:
        """Start the replica's ``slot.attempt``; it reports its start (or its failure to
        start) itself. Called with the slot's lock held. When it finds the slot
        ``stopped`` just before it asks for the attempt's process or container, it
        starts nothing and answers the stop (an ``Exited`` without a code)."""

    def refuse_starts(self) -> None:
        # Every start checks ``stopped`` just before it asks for the process or container
        # (``start_attempt``), and a restart before it moves on (``_restart_one``): marked
        # now, a cancel asked wins over a restart that had not yet started its attempt,
        # which the stop, some turns of the loop later, did not. Each one not started
        # answers its stop.
        for slot in self.replica_slots():
            slot.stopped = True

    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        await each([partial(self._stop_one, key) for key in keys])

    async def _stop_one(self, key: ReplicaKey) -> None:
        slot = self.replica_slot(key)
        slot.stopped = True
        if self.attempt_running(key):
            await self.end_attempt(key)
        elif not slot.busy():
            # Nothing runs and no restart is under way to answer the stop: answer it here.
            self.emit(Exited(role=key[0], replica_id=key[1], attempt=slot.attempt, exit_code=None))

    async def restart(self, attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
        await each([partial(self._restart_one, key, attempt) for key, attempt in attempts])

    async def _restart_one(self, key: ReplicaKey, attempt: int) -> None:
        slot = self.replica_slot(key)
        async with slot.lock:
            await self.end_attempt(key)
            slot.attempt = attempt
            if slot.stopped:
                self.emit(Exited(role=key[0], replica_id=key[1], attempt=attempt, exit_code=None))
                return
            await self.start_attempt(key)
            if slot.stopped and self.attempt_running(key):
                # A stop that came while this attempt was starting found nothing running
                # and left it to the restart: the new attempt goes at once.
                await self.end_attempt(key)
