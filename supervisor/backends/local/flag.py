"""A one-way flag whose event is made only when someone waits for it.

A running local replica keeps two "has it ended" signals for its whole life
(its exit report and its follower's end), and hardly anyone waits on either:
a stop or a close does, once. An ``anyio.Event`` is three objects the host's
garbage collector walks on every full collection (the anyio event, the
asyncio event under it, its waiters' deque); a thousand running replicas held
six thousand of them. A ``Flag`` is one object until it is waited on.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel

__all__ = ["Flag"]


class Flag:
    """Set once, never cleared; ``wait`` as ``anyio.Event.wait`` (a checkpoint when set)."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: anyio.Event | None = None

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            await anyio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()
