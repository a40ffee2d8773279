"""Taking an app over from an owner that is gone: the lease, then what resuming it needs.

Shared by the backends whose apps outlive their owner (``Backend.adopt``):
the lease is taken in the app's store (``AppStore.take_over``), then the
request, the last status and the journal are read; when reading fails, the
lease is given back before the error goes on, so another process may try.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

from supervisor.backends.store import AppRecord, AppStore, Owner
from supervisor.errors import DamagedRecordError
from supervisor.states import AppState
from supervisor.status import AppStatus, Transition

__all__ = ["TakenOver", "take_over"]

R = TypeVar("R")


@dataclass(frozen=True)
class TakenOver(Generic[R]):
    record: AppRecord
    request: R
    recorded: AppStatus
    """The last recorded status (SUBMITTED when its owner recorded none)."""
    history: Sequence[Transition]
    give_up: Callable[[], Awaitable[None]]
    """Hand the app back: its lease released (the next reader judges it again)."""


async def take_over(
    store: AppStore,
    owner: Owner,
    parse_request: Callable[[AppRecord], R],
    *,
    lock_waiters: anyio.CapacityLimiter | None = None,
) -> TakenOver[R] | None:
    """Take the app's lease for ``owner`` and read its records; None when it cannot be
    taken (see ``AppStore.take_over``). ``DamagedRecordError`` for a request that
    ``parse_request`` cannot read (``LookupError``, ``TypeError``, ``ValueError``).
    ``lock_waiters``: the threads that may wait for the app's finalize lock, for a backend
    whose holder of that lock needs default threads (Docker's)."""
    record = await anyio.to_thread.run_sync(store.take_over, owner, limiter=lock_waiters)
    if record is None:
        return None

    async def give_up() -> None:
        await anyio.to_thread.run_sync(store.mark_released)

    try:
        try:
            request = parse_request(record)
        except (LookupError, TypeError, ValueError, AttributeError) as e:
            raise DamagedRecordError(
                str(store.app_dir / "app.json"),
                f"it holds no request this version can follow the app with: {e}",
            ) from e
        recorded = await anyio.to_thread.run_sync(store.read_state)
        history = await anyio.to_thread.run_sync(store.read_transitions)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await give_up()
        raise
    status = recorded[0] if recorded is not None else AppStatus(AppState.SUBMITTED)
    return TakenOver(record, request, status, history, give_up)
