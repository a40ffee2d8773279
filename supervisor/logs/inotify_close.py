"""Closing an inotify instance in a worker thread, never on the event loop's.

The kernel lets go of an instance that held watches only after a grace period
(``fsnotify_destroy_group`` waits for the marks' destruction), inside ``close``:
13 ms measured here, a stall of every task of a service when it happens on the
loop's thread (at each end of a foreign app's ``wait``, of a Docker app's cancel
watch, of a follower with a watch of its own).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from asyncinotify import Inotify

__all__ = ["close_inotify", "open_inotify"]


async def close_inotify(inotify: Inotify) -> None:
    """Close ``inotify`` off the loop; shielded, so a cancelled caller still closes it.

    Nothing may read it any more: asyncinotify registers its descriptor with the
    loop only while a read waits, and that read's end unregisters it.
    """
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(inotify.close)


@contextlib.asynccontextmanager
async def open_inotify() -> AsyncIterator[Inotify]:
    """An inotify instance for the block, closed by ``close_inotify`` after it."""
    inotify = Inotify()
    try:
        yield inotify
    finally:
        await close_inotify(inotify)
