"""One thread that runs a backend's blocking record writes, in order, for the event loop.

Why not ``anyio.to_thread.run_sync``: its hop takes two turns of the loop
before the call is even queued (a checkpoint, then the capacity limiter's)
and costs about 220 us here against 100 for a queue put and a future, and the
final record's hop is on the path of every ``wait``. One thread also keeps
the records of a backend in the order they were asked for.

A call runs to its end once queued, even if its caller is cancelled: the
caller waits for it (shielded), as it would for ``run_sync``, so a record is
never half written when its writer moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["SerialWorker"]

_T = TypeVar("_T")
_Call = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any] | None", Callable[..., Any], tuple[Any, ...]
]


def _serve(calls: queue.SimpleQueue[_Call | None], ended: list[int]) -> None:
    while (call := calls.get()) is not None:
        _run(*call, ended)
        # Nothing of a call outlives it here: the last one (an app's ``_release_files``,
        # bound to its runtime) would keep the ended app's every object alive until the
        # next record, for the garbage collector to walk.
        del call


def _run(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any] | None,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    ended: list[int],
) -> None:
    failure: BaseException | None = None
    result: Any = None
    try:
        result = function(*args)
    except BaseException as exc:  # handed to the caller, whatever it is
        failure = exc
    # Counted before the caller hears of it: a call it saw end is not pending any more
    # (this thread is the counter's one writer: see ``SerialWorker.pending``).
    ended[0] += 1
    if failure is None:
        if future is not None:
            _report(loop, _succeed, future, result)
    elif future is None:
        _report_unawaited(loop, function, failure)
    else:
        _report(loop, _fail, future, failure)


def _report_unawaited(
    loop: asyncio.AbstractEventLoop, function: Callable[..., Any], exc: BaseException
) -> None:
    """A posted call raised (its contract is not to): the loop's exception handler hears it."""
    message = f"a call posted to a records' thread raised: {function!r}"
    context = {"message": message, "exception": exc}
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody can hear it
        loop.call_soon_threadsafe(loop.call_exception_handler, context)


def _report(
    loop: asyncio.AbstractEventLoop,
    how: Callable[[asyncio.Future[Any], Any], None],
    future: asyncio.Future[Any],
    value: Any,
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(how, future, value)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class SerialWorker:
    """Runs blocking calls one after another in a thread of its own, started at first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        # Calls queued (by the loop's thread) and calls ended (by the worker's): each
        # counter has one writer, so ``idle`` needs no lock.
        self._queued = 0
        self._ended = [0]

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` in the worker's thread, after the calls queued before it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        if not self._queue(loop, future, function, args):
            raise RuntimeError(f"{self._name} is closed")
        with anyio.CancelScope(shield=True):
            await future
        return future.result()

    def post(self, function: Callable[..., object], *args: Any) -> bool:
        """Queue ``function(*args)`` with nobody waiting for it; False if the worker is closed.

        For work done ahead that a later ``run`` would otherwise do: the loop is
        not woken when it ends, and what it returns is dropped. ``function``
        handles its own errors (what it raises all the same reaches the loop's
        exception handler).
        """
        return self._queue(asyncio.get_running_loop(), None, function, args)

    def _queue(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any] | None,
        function: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                # A daemon: a Supervisor left unclosed must not hold the interpreter's exit
                # (it joins every other thread first). Cut short there, a record is the old
                # one still: its new file only takes the old one's place once written.
                self._thread = threading.Thread(
                    target=_serve, args=(self._calls, self._ended), name=self._name, daemon=True
                )
                self._thread.start()
                weakref.finalize(self, self._calls.put, None)
            self._queued += 1
            self._calls.put((loop, future, function, args))
        return True

    @property
    def pending(self) -> int:
        """Calls queued or running: a call queued now runs after that many."""
        return self._queued - self._ended[0]

    async def aclose(self) -> None:
        """Run what was queued, then stop the thread (waited for off the loop)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._calls.put(None)
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)
