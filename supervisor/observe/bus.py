"""``Supervisor.events()``: every transition of every followed app, as one async stream.

Publishing never blocks and never waits for a reader: the actor that publishes is
the single writer of its app and must not be slowed by a consumer. Each stream
buffers at most ``max_buffer`` events; a reader that falls further behind gets
``EventsOverflowError`` (saying how many it missed) instead of unbounded memory
growth in a service that runs for weeks. A stream nobody holds any more is
dropped with it (weak references), so forgetting ``aclose()`` leaks nothing.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

import anyio

from supervisor.errors import EventsOverflowError
from supervisor.specs import parse_handle
from supervisor.status import Transition

__all__ = ["DEFAULT_MAX_BUFFER", "AppEvent", "EventBus", "EventStream"]

DEFAULT_MAX_BUFFER = 10_000
"""Events one stream holds for its reader before it overflows."""


@dataclass(frozen=True, slots=True)
class AppEvent:
    """One transition of one app: the app's handle and the transition (app or replica level)."""

    handle: str
    transition: Transition

    @property
    def backend(self) -> str:
        return parse_handle(self.handle).backend


@dataclass(slots=True)
class _Gap:
    """Where a stream dropped events, in its queue: the reader is told there, in order."""

    dropped: int


class EventStream:
    """One reader's view of the bus, from the moment it was opened; ends when the bus closes.

    Use as ``async for event in sv.events(): ...``, or ``async with sv.events() as
    stream`` to release it at a known point.
    """

    def __init__(self, bus: EventBus, max_buffer: int) -> None:
        self._bus = bus
        self._max_buffer = max_buffer
        # Events, and a gap where events were dropped: told when the reader reaches it,
        # before any event that came after (a reader that keeps pace after a burst
        # was told of its loss late, or never).
        self._queue: deque[AppEvent | _Gap] = deque()
        self._held = 0  # events in the queue (gaps are not counted against max_buffer)
        self._wakeup = anyio.Event()
        self._closed = False

    # Called by the bus, on the loop, never blocking.
    def _offer(self, events: Iterable[AppEvent]) -> None:
        if self._closed:
            return
        for event in events:
            if self._held < self._max_buffer:
                self._queue.append(event)
                self._held += 1
            elif self._queue and isinstance(self._queue[-1], _Gap):
                self._queue[-1].dropped += 1
            else:
                self._queue.append(_Gap(1))
        self._wakeup.set()

    def _end(self) -> None:
        self._closed = True
        self._wakeup.set()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> AppEvent:
        while True:
            if self._queue:
                item = self._queue.popleft()
                if isinstance(item, AppEvent):
                    self._held -= 1
                    return item
                raise EventsOverflowError(
                    f"this event stream fell {item.dropped} events behind (it holds at most "
                    f"{self._max_buffer}); read faster or open it with a larger max_buffer"
                )
            if self._closed:
                raise StopAsyncIteration
            self._wakeup = anyio.Event()
            await self._wakeup.wait()

    async def aclose(self) -> None:
        """Stop receiving; what is buffered is discarded."""
        self._closed = True
        self._queue.clear()
        self._held = 0
        self._bus._forget(self)

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class EventBus:
    def __init__(self) -> None:
        self._streams: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._closed = False

    def open(self, max_buffer: int = DEFAULT_MAX_BUFFER) -> EventStream:
        stream = EventStream(self, max_buffer)
        if self._closed:
            stream._end()
        else:
            self._streams.add(stream)
        return stream

    def publish(self, handle: str, transitions: Iterable[Transition]) -> None:
        if not self._streams:
            return
        events = [AppEvent(handle, t) for t in transitions]
        for stream in list(self._streams):
            stream._offer(events)

    def close(self) -> None:
        """End every stream once its reader has taken what it holds."""
        self._closed = True
        for stream in list(self._streams):
            stream._end()
        self._streams.clear()

    def _forget(self, stream: EventStream) -> None:
        self._streams.discard(stream)
