"""The supervisor's side of the watchdog in ``reaper.py``.

Started lazily with the first replica, so a Supervisor that never launches
locally costs nothing. Messages are a few bytes each and the reaper reads
continuously, so writing them to its pipe never waits in practice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio

__all__ = ["Reaper"]

_SCRIPT = Path(__file__).with_name("reaper.py")


class Reaper:
    def __init__(self) -> None:
        self._popen: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None

    def _ensure_started(self) -> int:
        if self._fd is None:
            # -I -S: no site-packages, no user paths: a start in milliseconds.
            self._popen = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert self._popen.stdin is not None
            self._fd = os.dup(self._popen.stdin.fileno())
            self._popen.stdin.close()
        return self._fd

    def register(self, pid: int, pgid: int) -> None:
        os.write(self._ensure_started(), f"+ {pid} {pgid}\n".encode())

    def unregister(self, pid: int) -> None:
        if self._fd is not None:
            os.write(self._fd, f"- {pid}\n".encode())

    async def aclose(self) -> None:
        """Close the pipe (the reaper then stops whatever is still registered) and reap it."""
        if self._fd is None or self._popen is None:
            return
        os.close(self._fd)
        self._fd = None
        pidfd = os.pidfd_open(self._popen.pid)
        try:
            with anyio.CancelScope(shield=True):
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        self._popen.wait()
        self._popen = None
