"""One spawned attempt of a local replica: its process group, its exit, its output.

Replicas are children of the reaper process (``reaper.py``), which reports
each exit over its socket, so there is no polling and no watcher thread per
child, and the host's own SIGCHLD handling cannot lose an exit status.
Output arrives through two pipes read when the loop says they are readable
and is handed, with its arrival time, to the backend's LogSink.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio

from supervisor.backends.local.fdtable import note_made
from supervisor.backends.local.pipes import PipeReaders
from supervisor.backends.local.reaper_client import ExitReport, Reaper
from supervisor.events import ReplicaKey
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
        readers: PipeReaders,
        sink: LogSink,
        log: ReplicaLog,
        key: ReplicaKey,
        attempt: int,
    ) -> None:
        self.pid = pid
        self.key = key  # which replica, and which attempt of it, this process is
        self.attempt = attempt
        self.pgid = pid  # a session leader leads its group
        self._report = report
        self._pipes = pipes
        self._reaper = reaper
        self._readers = readers
        self._sink = sink
        self._log = log
        self.returncode: int | None = None
        self.unknown_reason = ""
        self.exited = report.done
        # What the pipes' reader callbacks tell ``follow`` (``_wake``): on an EOF, a pause,
        # a failure, and (through the report) the exit. A flag and the future ``follow``
        # awaits, not an ``asyncio.Event``: every object a running replica holds is walked
        # by each full collection of the host's garbage collector, and the event's waiters'
        # deque and its ``wait`` coroutine were three more per replica.
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._failure: Exception | None = None
        # Set by ``watch`` until the first wake: what starts the task that runs ``follow``.
        self._hand_over: Callable[[ReplicaProcess], None] | None = None
        self._hand_over_soon: Callable[[ReplicaProcess], None] | None = None

    @classmethod
    async def start(
        cls,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        group: str,
        reaper: Reaper,
        readers: PipeReaders,
        sink: LogSink,
        log: ReplicaLog,
        key: ReplicaKey,
        attempt: int,
        alone: bool = False,
        prepare: Mapping[str, Any] | None = None,
        on_claim: Callable[[], None] | None = None,
    ) -> ReplicaProcess:
        """Spawn through the reaper; OSError if it cannot start, BackendError if no reaper.

        ``alone``: no other replica of the app is being started with this one.
        ``prepare``: the app's claim, made by the reaper first, and ``on_claim``
        told once it is (``Reaper.spawn``).
        """
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        note_made(max(w_out, w_err))
        try:
            pid, report = await reaper.spawn(
                argv, cwd=cwd, env=env, group=group, stdout=w_out, stderr=w_err, alone=alone,
                prepare=prepare, on_claim=on_claim,
            )  # fmt: skip
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
        return cls(
            pid,
            report,
            pipes,
            reaper=reaper,
            readers=readers,
            sink=sink,
            log=log,
            key=key,
            attempt=attempt,
        )

    async def follow(self) -> int | None:
        """Copy output until both pipes close and wait for the exit; return the code.

        None when the exit status is unknown (``unknown_reason`` says why).
        Run by one task per attempt at most, once ``watch`` hands over, and the
        only one: each pipe is read by a callback that stays registered
        (``PipeReaders``) and reads a chunk when the pipe is readable (no task
        switch, no registration per chunk). A task per pipe cost more than its
        switches: a thousand running replicas held two thousand of them, with
        their cancel scopes, events and closures, and every full collection of
        the host's garbage collector walked them all, a stall of the host's
        loop that grew with the replicas. A replica outrunning the disk is paused (its readers
        removed) until the sink has room, so memory does not grow. Pipes left
        open by a process that escaped the group are abandoned
        ``DRAIN_TIMEOUT`` seconds after the exit.
        """
        loop = asyncio.get_running_loop()
        self._hand_over = self._hand_over_soon = None
        self._report.on_settle = self._wake
        drained_by = math.inf
        ended = False
        try:
            while self._pipes or not self.exited.is_set():
                self._woken = False
                if self._failure is not None:
                    raise self._failure
                if self.exited.is_set() and drained_by == math.inf:
                    # The reaper kills what the leader left in its group right after the report.
                    drained_by = anyio.current_time() + DRAIN_TIMEOUT
                if drained_by == math.inf:
                    # No cancel scope while the replica runs: one per replica, for its
                    # whole life, would be walked by every full collection.
                    await self._next_change(loop)
                    continue
                with anyio.move_on_at(drained_by) as waited:
                    await self._next_change(loop)
                if waited.cancelled_caught:
                    break
            ended = True
        finally:
            self._let_go(ended)
        return self._conclude()

    @property
    def at_end(self) -> bool:
        """Exited, both pipes read to their end, nothing failed or paused: ``follow``
        would return at once, and ``take_exit`` may stand in for it."""
        return (
            self.exited.is_set() and not self._pipes and self._failure is None and not self._paused
        )

    @property
    def started_at(self) -> float:
        """Wall-clock time the reaper saw it start: when it began, not when this process heard."""
        return self._report.started_at

    @property
    def ended_at(self) -> float:
        """Wall-clock time the reaper saw it end, as ``started_at``; asked once it ``exited``."""
        assert self._report.ended_at is not None, "a running process has no end yet"
        return self._report.ended_at

    @property
    def exit_status(self) -> int | None:
        """What ``follow`` will return: the reaper's report (None while running, or when
        the status is unknown)."""
        return self._report.returncode

    def take_exit(self) -> int | None:
        """``follow``'s result, with no task, for a process ``at_end`` that was not handed over.

        Its exit is told where the reaper's report arrives, a task start and a
        turn of the loop sooner on the way to ``wait``.
        """
        self._hand_over = self._hand_over_soon = None
        self._let_go(ended=True)
        return self._conclude()

    def _let_go(self, ended: bool) -> None:
        """Nothing waits for this process any more: its pipes close (their streams end
        only if ``ended``: not when cut short by a cancel or a failure)."""
        self._report.on_settle = None
        self._waiter = None
        self._unlisten()
        for stream in list(self._pipes):
            if ended:
                self._close_pipe(stream)
            else:
                os.close(self._pipes.pop(stream))

    def _conclude(self) -> int | None:
        code = self.returncode = self._report.returncode
        self.unknown_reason = self._report.reason
        return code

    def _next_change(self, loop: asyncio.AbstractEventLoop) -> Awaitable[None]:
        """What ``follow`` waits for: room when paused (then it reads on), else ``_wake``.

        Not a coroutine itself: the future is awaited by ``follow`` directly, so a
        running replica's task holds no frame of this one.
        """
        if self._paused:
            return self._resume()
        waiter = self._waiter = loop.create_future()
        if self._woken:  # told since ``follow`` last looked
            waiter.set_result(None)
        return waiter

    async def _resume(self) -> None:
        await self._sink.room()
        self._paused = False
        self._listen()

    def watch(
        self,
        hand_over: Callable[[ReplicaProcess], None],
        hand_over_soon: Callable[[ReplicaProcess], None],
    ) -> None:
        """Read the pipes from now on with no task of its own, until ``follow`` is needed.

        A running replica's follower task (its coroutines and their frames, its
        future, its task handle and cancel scope) was about 25 of the 53
        objects a running replica held, and every full collection of the host's
        garbage collector walks each of them: a thousand running replicas made
        that collection a stall of the host's loop several times as long. So
        the pipes are read by the loop's callbacks alone until something needs
        a task: the exit (then ``hand_over(self)`` starts the task that runs
        ``follow``, which goes on from there, unless the caller can tell the
        end at once: see ``at_end``), a pause for room or a failed
        write. Those two are seen in a reader callback, where no task can be
        started (anyio tells its event loop from the current task), so they
        ask ``hand_over_soon(self)`` to hand this process over from a task.
        Both are the caller's, one of each for all its processes: a replica
        holds no callable of its own for them.
        """
        self._hand_over = hand_over
        self._hand_over_soon = hand_over_soon
        self._report.on_settle = self._settled
        self._listen()
        if self.exited.is_set():  # it ended before it was watched: no settle will come
            self._settled()

    @property
    def watched(self) -> bool:
        """Watched by callbacks and not handed over yet: no task runs ``follow``."""
        return self._hand_over is not None

    def hand_over(self) -> None:
        """Hand over to the caller's ``hand_over`` (which starts ``follow``'s task, or tells
        the end at once), unless that was done already. From a task only."""
        hand_over, self._hand_over = self._hand_over, None
        self._hand_over_soon = None
        if hand_over is not None:
            hand_over(self)

    def release_pipes(self) -> None:
        """No follower will run (its app's tasks are cancelled or over): the readers go
        and the pipes close; no stream ends, no exit is told."""
        self._hand_over = self._hand_over_soon = None
        self._report.on_settle = None
        self._unlisten()
        for fd in self._pipes.values():
            os.close(fd)
        self._pipes.clear()

    def _settled(self) -> None:
        """The exit is known (told from the reaper's reader task, or by ``watch``).

        A chunk of each pipe is read first. The replica's own ends closed as it
        exited, before the reaper could reap it, yet the host may hear the reaper
        before its pipes' readers run (several exits come in one wake-up): one that
        said nothing is at its EOF, so a quiet replica is ``at_end`` here already
        and its exit told without a task.
        """
        for fd in list(self._pipes.values()):
            if self._paused or self._failure is not None:
                break  # ``follow`` goes on from there
            self.readable(fd)
        self._wake()
        self.hand_over()

    def _wake(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _listen(self) -> None:
        for fd in self._pipes.values():
            self._readers.add(fd, self)

    def _unlisten(self) -> None:
        """Every pipe off the readers; one not registered (paused, or a failed ``add``) is
        skipped by ``PipeReaders.remove``."""
        for fd in self._pipes.values():
            self._readers.remove(fd)

    def readable(self, fd: int) -> None:
        """The pipe reader's callback (``PipeReaders``): one chunk of one pipe to the sink."""
        stream: StreamName = "stdout" if self._pipes.get("stdout") == fd else "stderr"
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._readers.remove(fd)
            self._close_pipe(stream)
            self._wake()
            return
        try:
            self._sink.write(self._log, stream, data, time.time())
            if self._sink.has_room():
                return
            self._paused = True
        except Exception as e:
            # Raised by ``follow``, in its task, not lost in the loop's exception handler.
            self._failure = e
        self._unlisten()
        self._wake()
        if self._hand_over_soon is not None:  # ``follow`` must resume it, or raise
            self._hand_over_soon(self)

    def _close_pipe(self, stream: StreamName) -> None:
        os.close(self._pipes.pop(stream))
        self._sink.end_stream(self._log, stream)

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
