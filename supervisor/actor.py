"""The app actor: one task per app, the only writer of that app's machines.

Backend events and user commands both arrive in its mailbox and are applied
one at a time, in arrival order. After each change it publishes a new
snapshot to readers (``status``, ``wait``, ``watch``) and hands the actions
the FSM decided to the backend, as tasks of their own so that the mailbox
keeps draining while a replica takes its grace period to stop.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.backends.base import AppCancelRequested, AppNotice, AppRuntime, Request
from supervisor.errors import BackendError
from supervisor.events import ReplicaEvent
from supervisor.fsm.app import AppFSM, RestartReplicas, RoleSpec, StopReplicas
from supervisor.status import AppStatus, Transition

__all__ = ["AppActor"]

PERSIST_INTERVAL = 0.05
"""Seconds between two non-final writes of an app's state: coalesces bursts."""


@dataclass(frozen=True)
class _Cancel:
    reason: str


@dataclass(frozen=True)
class _Barrier:
    reached: anyio.Event


_Mail = ReplicaEvent | AppCancelRequested | AppNotice | _Cancel | _Barrier


class AppActor:
    def __init__(self, handle: str, request: Request) -> None:
        self.handle = handle
        self.request = request
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
        self.done = anyio.Event()
        self._changed = anyio.Event()
        self._dirty = anyio.Event()
        self._persisted = 0
        self._persist_lock = anyio.Lock()

    # ------------------------------------------------------------------- inbox
    def post(self, item: ReplicaEvent | AppCancelRequested | AppNotice) -> None:
        """The backend's EventSink; never blocks."""
        if not self.done.is_set():
            self._send.send_nowait(item)

    def request_cancel(self, reason: str = "cancelled by request") -> None:
        if not self.done.is_set():
            self._send.send_nowait(_Cancel(reason))

    async def settle(self) -> None:
        """Return once everything posted so far has been applied."""
        if self.done.is_set():
            return
        reached = anyio.Event()
        self._send.send_nowait(_Barrier(reached))
        await reached.wait()

    async def record_now(self) -> None:
        """Write the current state for other processes now, not at the next coalesced write."""
        if self.runtime is not None and not self.done.is_set():
            await self._persist(self.runtime, final=False)

    def discard(self) -> None:
        """For an actor whose launch failed: it will never run, so its mailbox is closed here."""
        self._finish()

    # ------------------------------------------------------------------ readers
    def status(self) -> AppStatus:
        return self.fsm.snapshot()

    async def transitions(self) -> AsyncIterator[Transition]:
        seen = 0
        while True:
            changed = self._changed
            history = self.fsm.history
            while seen < len(history):
                yield history[seen]
                seen += 1
            if self.done.is_set():
                return
            await changed.wait()

    # -------------------------------------------------------------------- loop
    async def run(self, runtime: AppRuntime, task_group: TaskGroup) -> None:
        self.runtime = runtime
        async with anyio.create_task_group() as own:
            own.start_soon(self._persist_loop, runtime)
            try:
                async for item in self._recv:
                    if isinstance(item, _Barrier):
                        item.reached.set()
                        continue
                    if isinstance(item, ReplicaEvent):
                        actions = await self.fsm.apply(item)
                    elif isinstance(item, AppNotice):
                        self.fsm.set_notice(item.message)
                        actions = []
                    else:
                        actions = await self.fsm.cancel()
                    for action in actions:
                        task_group.start_soon(self._carry_out, runtime, action)
                    self._publish()
                    if self.fsm.is_terminal:
                        break
                own.cancel_scope.cancel()
                await self._persist(runtime, final=True)
            finally:
                self._finish()
        await runtime.aclose()

    async def _carry_out(self, runtime: AppRuntime, action: StopReplicas | RestartReplicas) -> None:
        """Run one action; a backend failure becomes the app's notice, not a crash of every app."""
        try:
            if isinstance(action, StopReplicas):
                await runtime.stop(action.keys, action.reason)
            else:
                await runtime.restart(action.attempts, action.reason)
        except BackendError as e:
            verb = "stopping" if isinstance(action, StopReplicas) else "restarting"
            retry = "a retry may help" if e.transient else "retrying will not help"
            if not self.done.is_set():
                self._send.send_nowait(AppNotice(message=f"{verb} replicas failed ({retry}): {e}"))

    def _finish(self) -> None:
        self.done.set()
        self._publish()
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

    def _publish(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
        self._dirty.set()

    async def _persist_loop(self, runtime: AppRuntime) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await self._persist(runtime, final=False)
            await anyio.sleep(PERSIST_INTERVAL)

    async def _persist(self, runtime: AppRuntime, final: bool) -> None:
        # Shielded: a write cut short would leave transitions recorded twice.
        with anyio.CancelScope(shield=True):
            async with self._persist_lock:
                history = self.fsm.history
                new = history[self._persisted :]
                await runtime.record(self.fsm.snapshot(), new, final)
                self._persisted += len(new)
