"""Room in this process's table of file descriptors, made before a burst, off the event loop.

Linux grows a process's descriptor table by doubling it, in whichever call first opens
a descriptor that does not fit, and in a process of more than one thread that call then
waits for an RCU grace period (``expand_fdtable``; 8-15 ms measured here) before it
returns. While 1,000 replicas start, the host opens about 4,000 descriptors (each
replica's two pipes and log file): four doublings from 256, each inside a ``pipe`` on
the event loop's thread, each a stall of the loop seen by every task of the service.
A table never shrinks, so growing it once, in a worker thread, before the replicas'
pipes are made, takes those waits off the loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource

__all__ = ["FDS_PER_REPLICA", "make_room", "note_made"]

FDS_PER_REPLICA = 5
"""Descriptors the host holds for a starting replica at most: both ends of its two pipes
(the write ends until the reaper holds its own copies) and its log file."""

_highest_made = -1
"""The highest descriptor a replica's pipes took so far (``note_made``); never lowered."""


def note_made(fd: int) -> None:
    """``fd`` was just made for a replica (on the loop): ``make_room`` counts from above it."""
    global _highest_made
    if fd > _highest_made:
        _highest_made = fd


def make_room(count: int) -> None:
    """Grow the table, in the calling (worker) thread, so that ``count`` more descriptors fit.

    Counted from the lowest free descriptor or from above the highest a replica's
    pipe took (``note_made``), whichever is higher. The lowest free one alone is
    exact only where the table has no hole, and a host that starts apps while
    others run has many (ended replicas' pipes, write ends handed to the reaper):
    with ten-replica apps submitted one after another, the count fell short and
    the table grew inside a ``pipe`` on the loop at 256 and at 512 descriptors
    (8-19 ms each). The highest mark may be stale (its descriptor closed since):
    the table is then grown more than needed, which costs a few KiB once.
    ``F_DUPFD`` takes the lowest free descriptor at or above the one asked for,
    so no descriptor in use is touched.
    """
    try:
        probe = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the lowest free one
    except OSError:
        return  # no descriptor left at all: what the submit opens next says so
    try:
        top = max(probe, _highest_made + 1) + count
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            top = min(top, soft - 1)
        if top <= probe:
            return
        # Refused (EMFILE, no room left under the limit): the replicas' own pipes meet
        # the limit too and their spawns report it; here there is nothing to grow.
        with contextlib.suppress(OSError):
            os.close(fcntl.fcntl(probe, fcntl.F_DUPFD_CLOEXEC, top))
    finally:
        os.close(probe)
