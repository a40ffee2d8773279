"""Watchdog process that stops local replicas when their supervisor dies.

Nothing inside a process survives SIGKILL, and the library may not install
signal handlers, so a separate process keeps the promise that no replica
outlives its supervisor. The supervisor starts one reaper (in its own
session, so a signal to the supervisor's process group spares it) and tells
it over a pipe which process groups exist::

    + <pid> <pgid>\\n    a replica was started
    - <pid>\\n           it ended and was reaped

The reaper only reads. When the pipe reaches end-of-file (the supervisor
closed it, exited, or was killed), every group still registered gets SIGTERM,
then SIGKILL after a short grace. Waiting uses pidfds and poll, never sleeps.

This file runs as a script with ``python -I -S`` and imports nothing from
the package, so it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

GRACE_SECONDS = 1.0


def _read_registry(stream: int) -> dict[int, tuple[int, int | None]]:
    """Follow the supervisor's messages until end-of-file; return groups still alive."""
    live: dict[int, tuple[int, int | None]] = {}
    buffer = b""
    while True:
        chunk = os.read(stream, 65536)
        if not chunk:
            return live
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == b"+":
                pid, pgid = int(parts[1]), int(parts[2])
                try:
                    pidfd: int | None = os.pidfd_open(pid)
                except OSError:
                    pidfd = None
                live[pid] = (pgid, pidfd)
            elif len(parts) == 2 and parts[0] == b"-":
                _, pidfd = live.pop(int(parts[1]), (0, None))
                if pidfd is not None:
                    os.close(pidfd)


def _signal_groups(groups: dict[int, tuple[int, int | None]], sig: int) -> None:
    for pgid, _ in groups.values():
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)


def _wait_exits(groups: dict[int, tuple[int, int | None]], seconds: float) -> None:
    """Return when every leader has exited or ``seconds`` have passed."""
    poller = select.poll()
    pending = {fd for _, fd in groups.values() if fd is not None}
    for fd in pending:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + seconds
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for fd, _ in poller.poll(left * 1000):
            pending.discard(fd)
            poller.unregister(fd)


def main() -> int:
    groups = _read_registry(sys.stdin.fileno())
    if groups:
        _signal_groups(groups, signal.SIGTERM)
        _wait_exits(groups, GRACE_SECONDS)
        _signal_groups(groups, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    # Started with start_new_session=True: Ctrl-C in the supervisor's terminal
    # does not reach this process, so it needs no signal handling of its own.
    sys.exit(main())
