"""One spawned attempt of a local replica: its process group, its exit, its output.

Exits are observed through a pidfd made readable by the kernel the moment the
process ends, so there is no polling and no watcher thread per child (the
asyncio child watcher of Python 3.11 would start one thread per process).
Output arrives through two pipes read when the loop says they are readable
and is handed, with its arrival time, to the backend's LogSink.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Literal

import anyio

from supervisor.logs import LogSink, ReplicaLog

__all__ = ["ReplicaProcess", "signal_name"]

DRAIN_TIMEOUT = 2.0

StreamName = Literal["stdout", "stderr"]


def signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ReplicaProcess:
    """Spawned in its own session, so its whole process group can be signalled at once."""

    def __init__(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        sink: LogSink,
        log: ReplicaLog,
    ) -> None:
        self._sink = sink
        self._log = log
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        try:
            # Popen here is a fork+exec, as asyncio's own subprocess support does
            # on the loop; it returns once the child has exec'd.
            self._popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=w_out,
                stderr=w_err,
                start_new_session=True,
            )
        except BaseException:
            os.close(r_out)
            os.close(r_err)
            raise
        finally:
            os.close(w_out)
            os.close(w_err)
        self.pid = self._popen.pid
        self.pgid = self.pid  # start_new_session makes it the group leader
        self._pidfd = os.pidfd_open(self.pid)
        self._pipes: dict[StreamName, int] = {"stdout": r_out, "stderr": r_err}
        for fd in self._pipes.values():
            os.set_blocking(fd, False)
        self.returncode: int | None = None
        self.exited = anyio.Event()
        self._pipes_closed = anyio.Event()

    async def follow(self) -> int:
        """Copy output until both pipes close and wait for the exit; return the code.

        Run as one task per attempt. Pipes left open by a process that escaped
        the group are abandoned ``DRAIN_TIMEOUT`` seconds after the exit.
        """
        async with anyio.create_task_group() as tg:
            for stream, fd in self._pipes.items():
                tg.start_soon(self._pump, stream, fd)
            await anyio.wait_readable(self._pidfd)
            os.close(self._pidfd)
            # The leader is a zombie until reaped, so its pgid cannot be reused
            # yet: anything it left behind in its group is killed now.
            self._kill_group(signal.SIGKILL)
            code = self.returncode = self._popen.wait()
            self.exited.set()
            with anyio.move_on_after(DRAIN_TIMEOUT):
                await self._pipes_closed.wait()
            tg.cancel_scope.cancel()
        for stream, fd in list(self._pipes.items()):
            os.close(fd)
            self._sink.end_stream(self._log, stream)
        self._pipes.clear()
        return code

    async def _pump(self, stream: StreamName, fd: int) -> None:
        while True:
            await self._sink.room()  # a replica outrunning the disk waits, memory does not grow
            await anyio.wait_readable(fd)
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                break
            self._sink.write(self._log, stream, data, time.time())
        del self._pipes[stream]
        os.close(fd)
        self._sink.end_stream(self._log, stream)
        if not self._pipes:
            self._pipes_closed.set()

    async def terminate(self, grace: float) -> None:
        """SIGTERM to the group, SIGKILL after ``grace`` seconds; returns once it exited."""
        if self.exited.is_set():
            return
        self._kill_group(signal.SIGTERM)
        with anyio.move_on_after(grace):
            await self.exited.wait()
        if not self.exited.is_set():
            self._kill_group(signal.SIGKILL)
            await self.exited.wait()

    def kill_now(self) -> None:
        if not self.exited.is_set():
            self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.returncode is not None:
            return  # reaped: the group id may belong to someone else now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)
