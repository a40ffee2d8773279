"""The app actor: one task per app, the only writer of that app's machines.

Backend events and user commands both arrive in its mailbox and are applied
in arrival order, all that the mailbox holds in one batch (the exits of a
gang arrive together). The actions the FSM decides go to the backend as tasks
of their own, so that the mailbox keeps draining while a replica takes its
grace period to stop; after each batch it publishes once to readers
(``status``, ``wait``, ``watch``), and the record for other processes follows
on the trailing edge of a burst, the final record last.

Everything of one app runs in the app's own task group, which the actor
hosts (``open``): the actor, its actions, and the tasks the backend's runtime
starts to follow the app (``AppTasks``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.backends.base import (
    AppCancelRequested,
    AppNotice,
    AppRuntime,
    AppTasks,
    Request,
)
from supervisor.errors import BackendError, only_cause
from supervisor.events import Lost, ReplicaEvent
from supervisor.fsm.app import Action, AppFSM, RestartReplicas, RoleSpec, StopReplicas
from supervisor.logs import EndSignal
from supervisor.observe import Observer
from supervisor.specs import parse_handle
from supervisor.states import TERMINAL
from supervisor.status import AppStatus, Transition

__all__ = ["AppActor"]

PERSIST_INTERVAL = 0.05
"""Seconds a change waits before it is written for other processes: the changes of a
burst that come meanwhile go in the same write (coalesced on the trailing edge), and
an app that ends within it gets its final record as its next write. Not delayed: the
state ``submit`` returns with, and a retry, written before it is carried out."""

BATCH_MAX = 64
"""Mail items applied in one turn of the event loop: events that arrive together are
applied together, yet a burst of thousands (a big app's starts) leaves the host's loop a
turn every few milliseconds. An item costs about 50 us on a quiet machine and several
times that while spawns load it: 256 made single turns of up to 50 ms while 1,000
replicas started."""

ABANDON_STOP_S = 30.0
"""How long an app whose supervision broke gets to stop its replicas before it is left."""


@dataclass(frozen=True)
class _Cancel:
    reason: str


@dataclass(frozen=True)
class _Barrier:
    reached: anyio.Event


@dataclass(frozen=True)
class _Broken:
    """An action or a task of the app failed in a way that leaves its replicas unaccounted for."""

    doing: str
    error: Exception


_Mail = ReplicaEvent | AppCancelRequested | AppNotice | _Cancel | _Barrier | _Broken


class AppActor:
    def __init__(
        self,
        handle: str,
        request: Request,
        observer: Observer | None = None,
        on_done: Callable[[AppActor], None] | None = None,
    ) -> None:
        self.handle = handle
        self.request = request
        self.backend_name = parse_handle(handle).backend  # the registered name, aliases too
        self._observer = observer
        self._observed = 0  # transitions of the history already handed to the observer
        # Called once, synchronously, when ``done`` is set: before any waiter resumes.
        self._on_done = on_done
        self.fsm = AppFSM(
            [
                RoleSpec(r.name, r.num_replicas, r.max_retries, r.retry_policy)
                for r in request.app.roles
            ]
        )
        send: MemoryObjectSendStream[_Mail]
        recv: MemoryObjectReceiveStream[_Mail]
        send, recv = anyio.create_memory_object_stream(math.inf)
        self._send, self._recv = send, recv
        self.runtime: AppRuntime | None = None
        self._metadata: Mapping[str, str] = {}  # the runtime's, once it has gone
        # Set by ``begin`` (with the runtime) or ``discard``: the app's task group goes on.
        self._begun = anyio.Event()
        self._owed: Sequence[Action] = ()
        # Followers of the app's logs listen to its end (no task each, see EndSignal).
        self.done = EndSignal()
        self._changed = anyio.Event()
        self._dirty = anyio.Event()
        self._version = 0  # bumped by every published change
        self._written = -1  # the version the last record written holds
        self._final_written = False
        self._finished = False
        self._persisted = 0
        # Fast: an uncontended acquire takes no turn of the loop (the final record's is
        # on the path of ``wait``).
        self._persist_lock = anyio.Lock(fast_acquire=True)
        self._persist_failure = ""
        # What the backend reported and what recording failed are two notices: clearing
        # one (a record written again) must not erase the other (output lost on a full disk).
        self._notices: dict[str, str] = {}

    # ------------------------------------------------------------------- inbox
    def post(self, item: ReplicaEvent | AppCancelRequested | AppNotice) -> None:
        """The backend's EventSink; never blocks."""
        if not self.done.is_set():
            if isinstance(item, AppCancelRequested):
                self._refuse_starts()
            self._send.send_nowait(item)

    def request_cancel(self, reason: str = "cancelled by request") -> None:
        if not self.done.is_set():
            self._refuse_starts()
            self._send.send_nowait(_Cancel(reason))

    def _refuse_starts(self) -> None:
        """A cancel is asked: the runtime starts no new attempt from now on.

        Told here, not when the cancel is applied: its stop goes out some turns
        of the loop later, and a restart under way sent its spawn meanwhile,
        user code starting after ``cancel`` returned. A cancel always stops
        every live replica (``AppFSM.cancel``), so no start it refuses was
        still wanted; one already under way is stopped.
        """
        if self.runtime is None:
            return
        try:
            self.runtime.refuse_starts()
        except Exception as exc:
            self.broken("refusing new attempts for a cancel", exc)

    async def settle(self) -> None:
        """Return once everything posted so far has been applied."""
        if self.done.is_set():
            return
        reached = anyio.Event()
        self._send.send_nowait(_Barrier(reached))
        await reached.wait()

    async def record_now(self) -> None:
        """Write the current state for other processes now, not at the next coalesced write.

        Nothing is written when the last record already holds this state, or is final.
        """
        if self.runtime is not None:
            await self._persist(self.runtime, final=False)

    def discard(self) -> None:
        """For an actor whose launch failed: it will never run, so its mailbox is closed here.

        Its task group ends once what the failed launch started there has ended.
        """
        self._finish()
        self._begun.set()

    def broken(self, doing: str, error: Exception) -> None:
        """A task of the app failed unexpectedly: its supervision ends (``AppTasks``)."""
        if not self.done.is_set():
            self._send.send_nowait(_Broken(doing, error))
        elif self._observer is not None:
            # The app had already ended: nothing is left to stop, but it is not hidden.
            self._observer.internal_error(self.handle, doing, error)

    # ------------------------------------------------------------------ readers
    @property
    def final_recorded(self) -> bool:
        """The final record was written: other processes (and ``describe``) read the end."""
        return self._final_written

    def status(self) -> AppStatus:
        return self.fsm.snapshot()

    def metadata(self) -> Mapping[str, str]:
        """What the backend knows the app by (a Slurm job id), also once its runtime went."""
        return self.runtime.metadata() if self.runtime is not None else self._metadata

    def has_replica(self, role: str, replica_id: int) -> bool:
        """Without a snapshot: N followers starting while N replicas start stay O(N), not O(N²)."""
        return (role, replica_id) in self.fsm.replicas

    async def transitions(
        self, stop: Callable[[], bool] | None = None
    ) -> AsyncIterator[Transition]:
        """Every transition so far, then each new one; ends with the app, or once ``stop()``.

        ``stop`` is asked after each catch-up; ``wake_readers`` makes it be asked now.
        """
        seen = 0
        while True:
            changed = self._changed
            history = self.fsm.history
            while seen < len(history):
                yield history[seen]
                seen += 1
            if self.done.is_set() or (stop is not None and stop()):
                return
            await changed.wait()

    def wake_readers(self) -> None:
        """Wake every ``transitions`` reader to ask its ``stop`` again (nothing changed)."""
        self._changed.set()
        self._changed = anyio.Event()

    # -------------------------------------------------------------------- loop
    def resume(self, recorded: AppStatus, history: Sequence[Transition]) -> list[Action]:
        """Take over from the records of another process's app (``Supervisor.attach``).

        Its journal is already written and already seen by the Supervisor's
        event stream's readers elsewhere: only what happens from here on is
        written and announced. Returns the actions still owed, for ``run``.
        """
        actions = self.fsm.resume(recorded, history)
        self._persisted = self._observed = len(history)
        return actions

    async def open(self, task_group: TaskGroup) -> AppTasks:
        """Open the app's own task group inside ``task_group`` (the Supervisor's).

        The backend starts the app's work there from ``launch`` on, so the group
        exists before the app does; ``begin`` then runs the actor in it (or
        ``discard`` lets it end). It ends when the last of the app's tasks does.
        """
        tasks: AppTasks = await task_group.start(self._host, name=self.task_name)
        return tasks

    @property
    def task_name(self) -> str:
        """The name of the task that hosts the app's task group: it shows whose work runs."""
        return f"asupervisor app {self.handle}"

    def begin(self, runtime: AppRuntime, owed: Sequence[Action] = ()) -> None:
        """Follow the launched (or adopted) app, in its own task group, to its end."""
        self.runtime = runtime
        self._owed = owed
        self._begun.set()

    async def _host(self, *, task_status: TaskStatus[AppTasks]) -> None:
        async with anyio.create_task_group() as group:
            task_status.started(AppTasks(group, self.broken))
            await self._begun.wait()
            if self.runtime is not None:
                await self._run(self.runtime, group, self._owed)
        # The app's work is over: the runtime goes (it holds this actor through its event
        # sink, a cycle that kept an ended app in memory until the garbage collector's next
        # full pass), and what it told about the app stays.
        if self.runtime is not None:
            self._metadata = self.runtime.metadata()
        self.runtime = None
        self._owed = ()

    async def _run(
        self, runtime: AppRuntime, task_group: TaskGroup, owed: Sequence[Action]
    ) -> None:
        """Follow the app to its end; whatever goes wrong stays this app's problem.

        An unexpected error here must not escape: it ends this app as UNKNOWN
        with the reason (after stopping its replicas) instead of taking the
        Supervisor's task group, and every other app, down with it.
        """
        try:
            await self._loop(runtime, task_group, owed)
        except Exception as exc:
            await self._abandon(runtime, exc)
        finally:
            self._finish()
        try:
            await runtime.aclose()
        except Exception as exc:
            # The app is over; its status is all that is left to tell.
            self._note("release", f"releasing the app's resources failed: {exc}")
            self._publish()

    async def _loop(
        self, runtime: AppRuntime, task_group: TaskGroup, owed: Sequence[Action]
    ) -> None:
        writer = anyio.CancelScope()
        async with anyio.create_task_group() as own:
            own.start_soon(self._persist_loop, runtime, writer)
            self._start_actions(owed, runtime, task_group)
            if not self.fsm.is_terminal:  # else it ended while nobody followed it
                await self._follow_mail(runtime, task_group)
            # The end goes to the observer and the watchers while its final record is
            # written in the records' thread: queued first, so told before any waiter
            # resumes, yet off the way to ``wait``.
            failed: list[Exception] = []
            asyncio.get_running_loop().call_soon(self._publish_end, failed)
            await self._persist(runtime, final=True)
            if failed:
                raise failed[0]
            # Waiters first, then the periodic writer's end: a cancel formats its
            # caller task's repr (anyio), 60-100 us no ``wait`` needs to wait for.
            self._finish()
            await anyio.lowlevel.cancel_shielded_checkpoint()
            # Ended inside its own scope, not by cancelling its task: anyio keeps the
            # cancel of a task in a reference cycle with the task's frames, and so this
            # app in memory until the garbage collector's next full pass.
            writer.cancel()

    async def _follow_mail(self, runtime: AppRuntime, task_group: TaskGroup) -> None:
        """Apply the mailbox, batch by batch, until the app's state is terminal."""
        async for first in self._recv:
            # Whatever else the mailbox holds came together (the exits of a gang,
            # a burst of starts): applied as one batch, published once.
            changed = False
            item: _Mail | None = first
            taken = 1
            while item is not None:
                if isinstance(item, _Barrier):
                    item.reached.set()
                else:
                    self._apply(item, runtime, task_group)
                    changed = True
                    if self.fsm.is_terminal:
                        break
                if taken == BATCH_MAX:
                    break  # the rest on the next turn: the host's loop gets its turn
                item = self._next_mail()
                taken += 1
            if self.fsm.is_terminal:
                break  # published while the final record is written (``_loop``)
            if changed:
                self._publish()

    def _next_mail(self) -> _Mail | None:
        try:
            return self._recv.receive_nowait()
        except anyio.WouldBlock:
            return None

    def _apply(self, item: _Mail, runtime: AppRuntime, task_group: TaskGroup) -> None:
        """One mail item through the FSM; the actions it decides start as tasks of their own."""
        if isinstance(item, _Broken):
            raise RuntimeError(f"{item.doing}: {item.error}") from item.error
        if isinstance(item, ReplicaEvent):
            actions = self.fsm.apply(item)
        elif isinstance(item, AppNotice):
            if item.fatal:
                raise RuntimeError(item.message)
            self._note("backend", item.message)
            actions = []
        elif isinstance(item, (_Cancel, AppCancelRequested)):
            actions = self.fsm.cancel(item.reason)
        else:
            raise TypeError(f"unexpected mail {item!r}")
        self._start_actions(actions, runtime, task_group)

    def _start_actions(
        self, actions: Sequence[Action], runtime: AppRuntime, task_group: TaskGroup
    ) -> None:
        for action in actions:
            if self._observer is not None:
                if isinstance(action, StopReplicas):
                    self._observer.stop(self.handle, action.keys, action.reason)
                else:
                    keys = [key for key, _ in action.attempts]
                    self._observer.restart(self.handle, self.backend_name, keys, action.reason)
            task_group.start_soon(self._carry_out, runtime, action)

    async def _abandon(self, runtime: AppRuntime, exc: Exception) -> None:
        """Supervision of this app broke: mark what still lives UNKNOWN, stop it, record it."""
        cause = only_cause(exc)
        reason = f"supervising this app failed ({type(cause).__name__}: {cause})"
        if self._observer is not None:
            self._observer.internal_error(self.handle, "supervising this app", cause)
        with anyio.CancelScope(shield=True):
            live = [
                (key, model.attempt)
                for key, model in self.fsm.replicas.items()
                if model.state.name not in TERMINAL
            ]
            self._note("supervision", reason)
            for (role, k), attempt in live:
                self.fsm.apply(Lost(role=role, replica_id=k, attempt=attempt, reason=reason))
            self._publish()
            with anyio.move_on_after(ABANDON_STOP_S):
                try:
                    await runtime.stop([key for key, _ in live], reason)
                except Exception as stop_exc:
                    self._note("supervision", f"{reason}; stopping its replicas failed: {stop_exc}")
            await self._persist(runtime, final=True)

    async def _carry_out(self, runtime: AppRuntime, action: StopReplicas | RestartReplicas) -> None:
        """Run one action; a backend failure becomes the app's notice, not a crash of every app.

        An unexpected error (not a BackendError) means the replicas are in a
        state nobody knows: the app's supervision ends there (``_Broken``).
        """
        verb = "stopping" if isinstance(action, StopReplicas) else "restarting"
        try:
            if isinstance(action, StopReplicas):
                await runtime.stop(action.keys, action.reason)
            else:
                # Recorded before it is carried out: a process that takes the app over
                # from an owner that died in between finds the retry (and starts it, or
                # follows its container) instead of a newer attempt its records never
                # heard of, which it took for the failed one.
                await self._persist(runtime, final=False)
                await runtime.restart(action.attempts, action.reason)
        except BackendError as e:
            retry = "a retry may help" if e.transient else "retrying will not help"
            if not self.done.is_set():
                self._send.send_nowait(AppNotice(message=f"{verb} replicas failed ({retry}): {e}"))
        except Exception as e:
            self.broken(f"{verb} replicas", e)

    def _finish(self) -> None:
        if self._finished:  # called at the final record, then again as ``_run`` ends
            return
        self.done.set()
        self._publish()
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(self)
        # Release barrier waiters that raced with the end.
        while True:
            try:
                item = self._recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if isinstance(item, _Barrier):
                item.reached.set()
        self._send.close()
        self._recv.close()
        self._finished = True  # only now: a call cut short by an error is made again

    def _publish(self) -> None:
        history = self.fsm.history
        if self._observer is not None and self._observed < len(history):
            new, self._observed = history[self._observed :], len(history)
            self._observer.transitions(self.handle, self.backend_name, new)
        self._version += 1
        self._changed.set()
        self._changed = anyio.Event()
        if not self.fsm.is_terminal:
            # An ended app's record is its final one, which ``_loop`` writes itself: woken,
            # the periodic writer only took a turn of the loop while ``wait`` waited for it.
            self._dirty.set()

    def _publish_end(self, failed: list[Exception]) -> None:
        """``_publish``, as a callback of the loop: what it raises goes to ``failed``,
        for the actor to raise. Nothing to do once ``_finish`` published already."""
        if self._finished:
            return
        try:
            self._publish()
        except Exception as exc:
            failed.append(exc)

    async def _persist_loop(self, runtime: AppRuntime, scope: anyio.CancelScope) -> None:
        """The coalesced writes, until ``scope`` is cancelled (the final record is written)."""
        with scope:
            while True:
                await self._dirty.wait()
                # Trailing edge: the rest of the burst comes in meanwhile and goes in this write.
                await anyio.sleep(PERSIST_INTERVAL)
                self._dirty = anyio.Event()
                await self._persist(runtime, final=False)

    async def _persist(self, runtime: AppRuntime, final: bool) -> None:
        """Write the state for other processes; a failure is this app's notice, never a crash.

        The final record is the last one: once written, nothing overwrites it. A
        non-final write of a state already written is skipped. The app itself goes
        on after a failed write (its replicas do not need the record); the notice
        stays until a write succeeds again.
        """
        # Shielded: a write cut short would leave transitions recorded twice.
        with anyio.CancelScope(shield=True):
            async with self._persist_lock:
                # Once the app ended only the final record is written (the periodic
                # writer still runs while it is, see ``_loop``).
                if self._final_written or (
                    not final and (self.fsm.is_terminal or self._written == self._version)
                ):
                    return
                version = self._version
                history = self.fsm.history
                new = history[self._persisted :]
                try:
                    await runtime.record(self.fsm.snapshot(), new, final)
                except Exception as exc:
                    failure = f"recording the app's state for other processes failed: {exc}"
                    if failure != self._persist_failure:
                        self._persist_failure = failure
                        self._note("record", failure)
                        self._changed_without_record()
                    return
                self._persisted += len(new)
                self._written = version
                self._final_written = final
                if self._persist_failure:
                    self._note("record", "")
                    self._changed_without_record()
                    self._persist_failure = ""

    def _note(self, source: str, message: str) -> None:
        """Set (or clear, with "") the notice of ``source``; the app's shows every one."""
        self._notices[source] = message
        self.fsm.set_notice("; ".join(m for m in self._notices.values() if m))

    def _changed_without_record(self) -> None:
        """Wake readers for a change that must not trigger another write by itself."""
        self._changed.set()
        self._changed = anyio.Event()
