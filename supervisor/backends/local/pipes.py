"""The output pipes of every local replica, read through one epoll that the loop watches.

Why not ``loop.add_reader`` per pipe: each registration is a handle, a selector
key with its data tuple, and a copy of the context, kept for the replica's whole
life. A thousand running replicas held eight thousand of those, and every full
collection of the host's garbage collector walks each of them (its stall of the
host's loop grows with what it walks). Here a pipe is an entry in one dict and
in one epoll set; the loop watches the epoll's own descriptor, readable while
any pipe is.
"""

from __future__ import annotations

import asyncio
import select
from typing import Protocol

__all__ = ["PipeOwner", "PipeReaders"]

READY_BATCH = 64
"""Pipes served per turn of the loop. Level-triggered: those left for the next turn stay
ready, and epoll serves them first then (it queues a pipe left ready at the back)."""


class PipeOwner(Protocol):
    def readable(self, fd: int) -> None:
        """``fd`` has data or its end: read one chunk of it, now (on the loop)."""


class PipeReaders:
    """One backend's pipes, on one event loop (the first ``add`` picks it)."""

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owners: dict[int, PipeOwner] = {}

    def add(self, fd: int, owner: PipeOwner) -> None:
        """Call ``owner.readable(fd)`` whenever ``fd`` is readable, until ``remove``."""
        if self._epoll is None:
            loop = asyncio.get_running_loop()
            epoll = select.epoll()
            try:
                loop.add_reader(epoll.fileno(), self._ready)
            except BaseException:
                epoll.close()
                raise
            self._epoll, self._loop = epoll, loop
        self._epoll.register(fd, select.EPOLLIN)
        self._owners[fd] = owner

    def remove(self, fd: int) -> None:
        """Stop watching ``fd``; before it is closed (a closed number is soon reused)."""
        if self._owners.pop(fd, None) is not None and self._epoll is not None:
            self._epoll.unregister(fd)

    def _ready(self) -> None:
        assert self._epoll is not None  # the loop calls this only once it is made
        owners = self._owners
        for fd, _ in self._epoll.poll(0, READY_BATCH):
            owner = owners.get(fd)
            if owner is not None:  # else removed by an earlier owner of this batch
                owner.readable(fd)

    def close(self) -> None:
        """No pipe is left (every replica followed to its end): the epoll goes."""
        epoll, loop = self._epoll, self._loop
        self._epoll = self._loop = None
        self._owners.clear()
        if epoll is not None and loop is not None:
            loop.remove_reader(epoll.fileno())
            epoll.close()
