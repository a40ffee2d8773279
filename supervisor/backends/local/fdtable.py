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

__all__ = ["FDS_PER_REPLICA", "make_room"]

FDS_PER_REPLICA = 5
"""Descriptors the host holds for a starting replica at most: both ends of its two pipes
(the write ends until the reaper holds its own copies) and its log file."""


def make_room(count: int) -> None:
    """Grow the table, in the calling (worker) thread, so that ``count`` more descriptors fit.

    Counted from the lowest free descriptor, which is exact where the table has no
    hole: short by the descriptors in use above the first hole otherwise, which the
    doubling's slack usually covers, and which else grow the table where they are
    opened, as without this. ``F_DUPFD`` takes the lowest free descriptor at or above
    the one asked for, so no descriptor in use is touched.
    """
    try:
        probe = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the lowest free one
    except OSError:
        return  # no descriptor left at all: what the submit opens next says so
    try:
        top = probe + count
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
