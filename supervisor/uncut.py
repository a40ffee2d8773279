"""Work that an asyncio-native cancel of its caller cannot cut short.

anyio's ``CancelScope(shield=True)`` holds off anyio's own cancels only. One of
asyncio's (a caller's ``asyncio.timeout``, a task's ``cancel()``, the runner's
Ctrl-C) goes through it into the awaited code. For the few steps that must not
stop half-way (a launch: containers created and started, nothing recorded; the
shutdown: its task group never cancelled, so leaving ``async with`` waited for
ever) that is worse than the wait: they run in a task of their own, and such a
cancel only interrupts the caller's wait for them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

_T = TypeVar("_T")


async def run_uncut(
    tg: TaskGroup, name: str, work: Callable[[], Awaitable[_T]]
) -> tuple[_T, BaseException | None]:
    """``work()`` in a shielded task of ``tg``, waited for to its end whatever befalls the
    caller: its result, and the cancel that reached the caller meanwhile (the caller's to
    raise once it has done what must follow), or None.

    Raises what ``work`` raised; the caller's cancel instead, if there was one (with
    the failure as its cause: ``close`` raising a backend's failure is not lost).
    """
    done = anyio.Event()
    results: list[_T] = []
    failures: list[BaseException] = []

    async def run() -> None:
        try:
            with anyio.CancelScope(shield=True):
                results.append(await work())
        except BaseException as e:  # the caller's to raise, not the task group's
            failures.append(e)
        finally:
            done.set()

    try:
        tg.start_soon(run, name=name)
    except RuntimeError:  # ``tg`` has ended already (a crash): here, as it can be
        await run()
    cut: BaseException | None = None
    while not done.is_set():
        try:
            with anyio.CancelScope(shield=True):
                await done.wait()
        except BaseException as e:  # an asyncio-native cancel of the caller: work goes on
            cut = cut or e
    if failures:
        if cut is None:
            raise failures[0]
        raise cut from failures[0]  # the caller's cancel goes on; the failure stays told
    return results[0], cut
