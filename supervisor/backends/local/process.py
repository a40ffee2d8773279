"""One spawned attempt of a local replica: its process group, its exit, its output.

Replicas are children of the reaper process (``reaper.py``), which reports
each exit over its socket, so there is no polling and no watcher thread per
child, and the host's own SIGCHLD handling cannot lose an exit status.
Output arrives through two pipes read when the loop says they are readable
and is handed, with its arrival time, to the backend's LogSink.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping
from typing import Literal

import anyio

from supervisor.backends.local.reaper_client import ExitReport, Reaper
from supervisor.logs import LogSink, ReplicaLog

__all__ = ["ReplicaProcess", "signal_name"]

DRAIN_TIMEOUT = 2.0

StreamName = Literal["stdout", "stderr"]


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class ReplicaProcess:
    """A child of the reaper, in its own session: its whole process group is signalled at once.

    The reaper is its parent, so its exit status comes from the reaper and the
    host's SIGCHLD handling cannot take it; signals go through the reaper too,
    which never signals a group whose leader it has already reaped.
    """

    def __init__(
        self,
        pid: int,
        report: ExitReport,
        pipes: dict[StreamName, int],
        *,
        reaper: Reaper,
        sink: LogSink,
        log: ReplicaLog,
    ) -> None:
        self.pid = pid
        self.pgid = pid  # a session leader leads its group
        self._report = report
        self._pipes = pipes
        self._reaper = reaper
        self._sink = sink
        self._log = log
        self.returncode: int | None = None
        self.unknown_reason = ""
        self.exited = report.done
        self._pipes_closed = anyio.Event()

    @classmethod
    async def start(
        cls,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        group: str,
        reaper: Reaper,
        sink: LogSink,
        log: ReplicaLog,
        alone: bool = False,
    ) -> ReplicaProcess:
        """Spawn through the reaper; OSError if it cannot start, BackendError if no reaper.

        ``alone``: no other replica of the app is being started with this one.
        """
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        try:
            pid, report = await reaper.spawn(
                argv, cwd=cwd, env=env, group=group, stdout=w_out, stderr=w_err, alone=alone
            )
        except BaseException:
            os.close(r_out)
            os.close(r_err)
            raise
        finally:
            # The reaper holds its own copies (passed as SCM_RIGHTS): the pipes
            # end when the replica and whatever it started close theirs.
            os.close(w_out)
            os.close(w_err)
        for fd in (r_out, r_err):
            os.set_blocking(fd, False)
        pipes: dict[StreamName, int] = {"stdout": r_out, "stderr": r_err}
        return cls(pid, report, pipes, reaper=reaper, sink=sink, log=log)

    async def follow(self) -> int | None:
        """Copy output until both pipes close and wait for the exit; return the code.

        None when the exit status is unknown (``unknown_reason`` says why).
        Run as one task per attempt. Pipes left open by a process that escaped
        the group are abandoned ``DRAIN_TIMEOUT`` seconds after the exit.
        """
        async with anyio.create_task_group() as tg:
            for stream, fd in self._pipes.items():
                tg.start_soon(self._pump, stream, fd)
            await self._report.done.wait()
            # The reaper killed what the leader left in its group before reaping it.
            code = self.returncode = self._report.returncode
            self.unknown_reason = self._report.reason
            with anyio.move_on_after(DRAIN_TIMEOUT):
                await self._pipes_closed.wait()
            tg.cancel_scope.cancel()
        for stream, fd in list(self._pipes.items()):
            os.close(fd)
            self._sink.end_stream(self._log, stream)
        self._pipes.clear()
        return code

    async def _pump(self, stream: StreamName, fd: int) -> None:
        """Copy one pipe to the sink from a reader callback that stays registered.

        The callback reads each chunk as the loop finds the pipe readable: no task
        switch, and no selector registration and removal per chunk, whose system
        calls each give up the GIL (with a hundred talkative replicas that hand-over
        was the host loop's worst stall). A replica outrunning the disk is paused
        (the reader removed) until the sink has room: memory does not grow.
        """
        loop = asyncio.get_running_loop()
        paused = asyncio.Event()
        ended = False
        failed: list[Exception] = []  # raised in this task, not lost in the loop's handler

        def readable() -> None:
            nonlocal ended
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            try:
                if data:
                    self._sink.write(self._log, stream, data, time.time())
                    if self._sink.has_room():
                        return
                else:
                    ended = True
            except Exception as e:
                failed.append(e)
            loop.remove_reader(fd)
            paused.set()

        try:
            while not ended:
                await self._sink.room()
                paused.clear()
                loop.add_reader(fd, readable)
                await paused.wait()
                if failed:
                    raise failed[0]
        finally:
            loop.remove_reader(fd)
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
        self._reaper.kill([self.pid], sig)
