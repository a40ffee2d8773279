"""Waiting for another process to exit, as an event (a pidfd), never by polling.

Both durable and local backends wake a reader of another process's app when
the app's supervising process dies: its records will not change any more.
"""

from __future__ import annotations

import os

import anyio

from supervisor.backends.store import Owner

__all__ = ["owner_exit", "process_exit"]


async def process_exit(pid: int) -> None:
    """Return when ``pid`` exits; at once if it already has."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def owner_exit(owner: Owner) -> None:
    """Return when an app's supervising process exits; at once if it already has."""
    try:
        pidfd = os.pidfd_open(owner.pid)
    except ProcessLookupError:
        return
    try:
        # The pidfd pins the process; a pid already reused by another is no owner.
        if not await anyio.to_thread.run_sync(owner.alive):
            return
        await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
