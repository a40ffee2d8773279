"""Docker apps this process does not follow: found by records and labels, judged by containers.

An app is *followed* while the process that launched it lives and has not
released it (``owner.released``, written when its Supervisor closes). A
followed app's recorded state is the truth; an unfollowed one's state is
what its containers say, and the first process to see them all ended records
the final state and removes them (logs and records stay).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from asyncinotify import Mask

from supervisor.backends.base import CANCELLED_ELSEWHERE, LogTarget
from supervisor.backends.docker.engine import (
    EVENTS_REOPEN_S,
    EXIT_ACTIONS,
    Engine,
    engine_time,
    event_action,
    event_container,
    event_time,
)
from supervisor.backends.docker.request import LABEL
from supervisor.backends.docker.resume import LogResumer
from supervisor.backends.docker.runtime import (
    OUTPUT_COPIED,
    REMOVED,
    exit_signal,
    latest_containers,
    mark_removed,
)
from supervisor.backends.docker.services import BackendServices
from supervisor.backends.listing import list_indexed
from supervisor.backends.pids import owner_exit
from supervisor.backends.store import (
    FINALIZE_LOCK,
    AppRecord,
    AppStore,
    IndexEntry,
    Owner,
    damaged_status,
    lock_file,
)
from supervisor.errors import BackendError, DamagedRecordError, only_cause
from supervisor.fsm.rules import ExitOutcome, derive_app_state, exit_outcome
from supervisor.logs.inotify_close import open_inotify
from supervisor.specs import AppHandle
from supervisor.states import AppState, ReplicaState, is_terminal
from supervisor.status import (
    AppStatus,
    DescribeAppResponse,
    ListAppResponse,
    ReplicaStatus,
    RoleStatus,
)

__all__ = ["ForeignApps"]

_EXITED = re.compile(r"Exited \((-?\d+)\)")
_UNFOLLOWED = "no process follows this app; state read from its containers"
LEFTOVERS_S = 10.0
"""How long a reader of an ended app spends removing what its killed owner left."""

_Found = tuple[AppStore, AppRecord]


def _being_removed(c: Mapping[str, Any]) -> bool:
    """Whether the engine is removing the container (or failed to: dockerd's ``dead``)."""
    return str(c.get("State") or "").lower() in ("removing", "dead")


def _container_state(c: Mapping[str, Any]) -> tuple[ReplicaState, int | None]:
    state = str(c.get("State") or "").lower()
    if state in ("created", "configured", "initialized"):
        return ReplicaState.PENDING, None
    if state in ("running", "paused", "restarting", "stopping"):
        return ReplicaState.RUNNING, None
    match = _EXITED.search(str(c.get("Status") or ""))
    code = int(match.group(1)) if match else c.get("ExitCode")
    if isinstance(code, int):
        return (ReplicaState.SUCCEEDED if code == 0 else ReplicaState.FAILED), code
    return ReplicaState.UNKNOWN, None


def _read_state(store: AppStore) -> tuple[tuple[AppStatus, Owner] | None, bool]:
    """Blocking: the recorded state, and whether it is an end whose removal nobody finished
    (no REMOVED mark), in one hop: every read of an ended app asks both."""
    recorded = store.read_state()
    ended = recorded is not None and recorded[0].is_terminal
    return recorded, ended and not (store.app_dir / REMOVED).exists()


def _end_recorded(store: AppStore) -> AppStatus | None:
    """Blocking: the final status recorded by whoever finished the app; None if nobody did.

    Under the finalize lock: a reader finishing the app holds it while it removes the
    containers and network, so what it recorded is read once they are gone (a reader
    that returned earlier could end its process, and cut that removal short).
    """
    fd = lock_file(store.app_dir / FINALIZE_LOCK, True)
    assert fd is not None  # a waiting lock is always taken
    try:
        return store.read_final_status()
    finally:
        os.close(fd)


async def _run_times(
    engine: Engine, containers: Sequence[dict[str, Any]]
) -> tuple[float | None, float]:
    """When the app's first container started and its last one finished, as the engine
    recorded (now, for an end it does not say): the times of an end nobody followed."""
    starts, ends = [], []
    for c in containers:
        info = await engine.inspect(str(c["Id"]))
        state = (info or {}).get("State") or {}
        starts.append(engine_time(state.get("StartedAt")))
        ends.append(engine_time(state.get("FinishedAt")))
    started = min((t for t in starts if t is not None), default=None)
    return started, max((t for t in ends if t is not None), default=time.time())


class ForeignApps:
    def __init__(self, backend: BackendServices) -> None:
        self._backend = backend
        self.logs = LogResumer(backend)
        # One ``wait`` per app followed here, however many of its replicas' logs are
        # followed: each opens an event stream and an inotify instance.
        self._endings: dict[tuple[str, str], tuple[anyio.CancelScope, anyio.Event]] = {}

    # ---------------------------------------------------------------- finding
    async def find(self, handle: AppHandle) -> _Found | None:
        index = self._backend.index
        app_dir = await anyio.to_thread.run_sync(index.lookup, handle.session, handle.app_id)
        if app_dir is None:
            # Launched with another state dir: the containers' labels say where its records are.
            labels = {LABEL.SESSION: handle.session, LABEL.APP_ID: handle.app_id}
            try:
                found = await self._backend.engine.list_containers(labels)
            except BackendError:
                found = []
            dirs = {(c.get("Labels") or {}).get(LABEL.APP_DIR) for c in found} - {None}
            if not dirs:
                return None
            app_dir = Path(str(dirs.pop()))
        store = AppStore(app_dir)
        app = await anyio.to_thread.run_sync(store.read_app)
        return None if app is None else (store, app)

    def engine_of(self, app: AppRecord) -> Engine:
        host = str(app.request.get("host") or self._backend.host)
        return self._backend.engine_for(host)

    # ------------------------------------------------------------------ state
    async def containers(self, app: AppRecord) -> list[dict[str, Any]]:
        labels = {
            LABEL.SESSION: str(app.request["session"]),
            LABEL.APP_ID: str(app.request["app_id"]),
        }
        return await self.engine_of(app).list_containers(labels)

    async def status(self, store: AppStore, app: AppRecord) -> AppStatus:
        try:
            recorded, left = await anyio.to_thread.run_sync(_read_state, store)
        except DamagedRecordError as e:
            # Said as it is; a cancel still stops the containers and records anew.
            return damaged_status(e, app.app.roles)
        if recorded is not None and recorded[0].is_terminal:
            if left:
                await self._remove_left(store, app)
            return recorded[0]
        if await anyio.to_thread.run_sync(store.followed, app):
            if recorded is None:
                return AppStatus(AppState.SUBMITTED, msg="no state recorded yet")
            return recorded[0]
        if await anyio.Path(store.cancel_path).exists():
            # A cancel its owner did not carry out (it closed or died first).
            return await self._stop_unfollowed(store, app)
        containers = await self.containers(app)
        if not containers or any(_being_removed(c) for c in containers):
            # Gone or going, as when another reader finished the app meanwhile (``finalize``
            # records the end before it removes them): the record read above may predate
            # that end. A container being removed says nothing of how it ended.
            with contextlib.suppress(DamagedRecordError):
                ended = await anyio.to_thread.run_sync(
                    _end_recorded, store, limiter=self._backend.lock_waiters
                )
                if ended is not None:
                    return ended
        derived = self._from_containers(app, containers, recorded)
        owed = _retry_owed(app, derived, recorded)
        if owed:
            # Recorded as the end, it would be the end for good: a process that attaches
            # makes the retry (``adopt``), whoever looked first. Nothing is recorded.
            return replace(
                derived,
                state=AppState.UNKNOWN,
                msg=f"{owed} failed with a retry left and no process follows the app: "
                "attach to make the retry",
            )
        if derived.is_terminal and containers:
            # Everything ended and nobody follows the app: whoever sees it finishes it.
            return await self.finalize(store, app, derived)
        return derived

    @staticmethod
    def _from_containers(
        app: AppRecord,
        containers: Sequence[dict[str, Any]],
        recorded: tuple[AppStatus, Owner] | None,
    ) -> AppStatus:
        latest = latest_containers(containers)
        definition = app.app
        states: list[ReplicaState] = []
        roles = []
        for role in definition.roles:
            replicas = []
            for k in range(role.num_replicas):
                found = latest.get((role.name, k))
                old = recorded[0].replica(role.name, k) if recorded else None
                if found is not None:
                    state, code = _container_state(found)
                elif old is not None and is_terminal(old.state):
                    state, code = old.state, old.exit_code
                else:
                    state, code = ReplicaState.UNKNOWN, None
                states.append(state)
                replicas.append(
                    ReplicaStatus(
                        id=k,
                        state=state,
                        role=role.name,
                        hostname=str((found or {}).get("Names", [""])[0]).lstrip("/"),
                        exit_code=code,
                        signal=exit_signal(code),
                    )
                )
            roles.append(RoleStatus(role.name, tuple(replicas)))
        return AppStatus(
            state=derive_app_state(states, cancel_requested=False),
            num_restarts=recorded[0].num_restarts if recorded else 0,
            msg=_UNFOLLOWED if containers else "the app's containers are gone",
            roles=tuple(roles),
        )

    async def finalize(
        self,
        store: AppStore,
        app: AppRecord,
        status: AppStatus,
        *,
        cancelled: set[tuple[str, int]] | None = None,
    ) -> AppStatus:
        """Record the final state and remove the containers and network of an unfollowed app.

        One process at a time (an exclusive lock on the app directory); one that
        finds the final state already recorded returns that.
        """
        async with self._finalize_lock(store):
            try:
                recorded = await anyio.to_thread.run_sync(store.read_state)
            except DamagedRecordError:
                recorded = None  # what the containers said replaces it
            if recorded is not None and recorded[0].is_terminal:
                return recorded[0]
            now = await anyio.to_thread.run_sync(store.read_app)
            if now is not None and await anyio.to_thread.run_sync(store.followed, now):
                # Attached to meanwhile (``take_over``): its new owner records the end.
                return recorded[0] if recorded is not None else status
            return await self._finalize(store, app, status, cancelled)

    @contextlib.asynccontextmanager
    async def _finalize_lock(self, store: AppStore) -> AsyncIterator[None]:
        """The app's FINALIZE_LOCK: one process at a time ends an unfollowed app.

        Waited for in a thread of its own kind: the holder needs default ones (see
        ``BackendServices.lock_waiters``).
        """
        fd = await anyio.to_thread.run_sync(
            lock_file, store.app_dir / FINALIZE_LOCK, True, limiter=self._backend.lock_waiters
        )
        assert fd is not None  # a waiting lock is always taken
        try:
            yield
        finally:
            os.close(fd)

    async def _finalize(
        self,
        store: AppStore,
        app: AppRecord,
        status: AppStatus,
        cancelled: set[tuple[str, int]] | None,
    ) -> AppStatus:
        if cancelled is not None:
            stopped = cancelled
            roles = tuple(
                RoleStatus(
                    r.role,
                    tuple(
                        ReplicaStatus(
                            id=x.id,
                            state=ReplicaState.CANCELLED
                            if (x.role, x.id) in stopped or not is_terminal(x.state)
                            else x.state,
                            role=x.role,
                            hostname=x.hostname,
                            exit_code=x.exit_code,
                            signal=x.signal,
                        )
                        for x in r.replicas
                    ),
                )
                for r in status.roles
            )
            status = AppStatus(
                AppState.CANCELLED,
                num_restarts=status.num_restarts,
                msg=CANCELLED_ELSEWHERE,
                roles=roles,
            )
        await self._copy_rest(store, app)
        owner = self._backend.owner
        engine = self.engine_of(app)
        containers = await self.containers(app)
        started, ended = await _run_times(engine, containers)
        steps = await anyio.to_thread.run_sync(store.observed_steps, status, started, ended)
        await anyio.to_thread.run_sync(store.write_state, status, steps, True, owner)
        await self._remove(store, app, containers)
        return status

    async def _copy_rest(self, store: AppStore, app: AppRecord) -> None:
        """The containers hold the only copy of what they wrote since nobody followed them."""
        for role in app.app.roles:
            for k in range(role.num_replicas):
                await self.logs.resume(store, app, role.name, k, final=True)

    async def _remove(
        self, store: AppStore, app: AppRecord, containers: Sequence[dict[str, Any]]
    ) -> None:
        """The ended app's containers and network go (gone already is fine); then REMOVED."""
        engine = self.engine_of(app)
        for c in containers:
            await engine.remove(str(c["Id"]))
        if app.request.get("network_body", True):  # not a joined network: the app's own
            names = [str(c.get("name", "")) for c in app.request.get("containers") or ()]
            await engine.remove_network(str(app.request["network"]), [n for n in names if n])
        await mark_removed(store.app_dir)

    async def _remove_left(self, store: AppStore, app: AppRecord) -> None:
        """An ended app whose removal nobody finished: its owner was killed between the
        final record and the removal, or an older version ended it (which wrote no
        REMOVED). Left alone while its owner lives (it is removing them). Bounded, and
        an engine that cannot answer leaves it to the next reader: the end is recorded,
        and reading it needs no engine."""
        if await anyio.to_thread.run_sync(store.followed, app):
            return
        async with self._finalize_lock(store):  # one reader at a time: the next finds the mark
            if await anyio.Path(store.app_dir / REMOVED).exists():
                return
            with anyio.move_on_after(LEFTOVERS_S), contextlib.suppress(BackendError):
                containers = await self.containers(app)
                if containers and not await anyio.Path(store.app_dir / OUTPUT_COPIED).exists():
                    await self._copy_rest(store, app)  # killed before it had copied it all
                await self._remove(store, app, containers)

    # ------------------------------------------------------------------ verbs
    async def describe(self, handle: AppHandle) -> DescribeAppResponse | None:
        found = await self.find(handle)
        if found is None:
            return None
        store, app = found
        status = await self.status(store, app)
        transitions = await anyio.to_thread.run_sync(store.read_transitions_or_none)
        return DescribeAppResponse.from_status(handle.app_id, status, app.app.roles, transitions)

    async def list(self) -> list[ListAppResponse]:
        """The apps recorded in this state directory, as for every backend.

        Apps of other state directories are not listed, but their handles still
        work here: ``find`` falls back to the containers' labels.
        """

        async def one(entry: IndexEntry) -> ListAppResponse | None:
            handle = AppHandle(self._backend.context.name, entry.session, entry.app_id)
            found = await self.find(handle)
            if found is None:
                return None
            try:
                status = await self.status(*found)
            except DamagedRecordError:
                raise  # listed as damaged, by list_indexed
            except BackendError as e:
                # Its engine is away (stopped, unreachable): this app is unknown for now,
                # and the apps of the other engines are listed all the same.
                status = AppStatus(AppState.UNKNOWN, msg=f"cannot read its containers: {e}")
            name = str(found[1].app.name)
            times = await anyio.to_thread.run_sync(found[0].read_times)
            return ListAppResponse(entry.app_id, status.state, str(handle), name, status.msg, times)

        return await list_indexed(self._backend.index, self._backend.context.name, one)

    async def cancel(self, handle: AppHandle) -> bool:
        found = await self.find(handle)
        if found is None:
            return False
        store, app = found
        status = await self.status(store, app)
        if status.is_terminal:
            return True
        # Recorded first, whoever carries it out: an owner that closes or dies before
        # its stop is done leaves the request to the next process that looks.
        await anyio.to_thread.run_sync(store.request_cancel)
        if await anyio.to_thread.run_sync(store.followed, app):
            return True
        await self._stop_unfollowed(store, app)
        return True

    async def _stop_unfollowed(self, store: AppStore, app: AppRecord) -> AppStatus:
        """Carry out a cancel nobody follows: SIGTERM, grace, SIGKILL; record CANCELLED."""
        engine = self.engine_of(app)
        grace = float(app.request.get("stop_grace", 5.0))
        live = [c for c in await self.containers(app) if c.get("State") == "running"]
        running = [str(c["Id"]) for c in live]
        stopped = set()
        for c in live:
            labels = c.get("Labels") or {}
            stopped.add((str(labels.get(LABEL.ROLE)), int(labels.get(LABEL.REPLICA_ID, -1))))
        for cid in running:
            await engine.kill(cid, "SIGTERM")
        async with anyio.create_task_group() as tg:

            async def settle(cid: str) -> None:
                if not await engine.wait_exit(cid, grace):
                    await engine.kill(cid, "SIGKILL")
                    await engine.wait_exit(cid, 30.0)

            for cid in running:
                tg.start_soon(settle, cid)
        status = self._from_containers(app, await self.containers(app), None)
        return await self.finalize(store, app, status, cancelled=stopped)

    async def wait(self, handle: AppHandle) -> AppStatus | None:
        """Woken by the owner's records (inotify), the owner's death, or a container's exit."""
        found = await self.find(handle)
        if found is None:
            return None
        store, app = found
        try:
            return await self._wait_found(store, app)
        except BaseExceptionGroup as group:
            # The one error of a task of this wait, as itself: ``except BackendError`` of
            # the caller must match it (``_wait_end`` did not, and at close the engine's
            # "connection closed" reached the Supervisor's task group).
            cause = only_cause(group)
            if cause is group:
                raise
            raise cause from None

    async def _wait_found(self, store: AppStore, app: AppRecord) -> AppStatus | None:
        wake: list[anyio.Event] = [anyio.Event()]
        labels = {
            LABEL.SESSION: str(app.request["session"]),
            LABEL.APP_ID: str(app.request["app_id"]),
        }
        owner = app.owner
        engine = self.engine_of(app)
        since = time.time() - 1.0
        async with contextlib.AsyncExitStack() as stack:
            first: AsyncIterator[dict[str, Any]] | None = None
            try:
                first = await stack.enter_async_context(engine.events(labels, since))
            except BackendError as e:
                if not e.transient:
                    raise
                # The engine is away as the wait begins: opened again once it is back.
            tg = await stack.enter_async_context(anyio.create_task_group())

            async def consume(stream: AsyncIterator[dict[str, Any]]) -> None:
                nonlocal since
                async for event in stream:
                    since = event_time(event) or since
                    action = event_action(event)
                    if action in EXIT_ACTIONS:
                        # The engine announces the death before its listing says so.
                        await engine.wait_exit(event_container(event), 10.0)
                    if action in EXIT_ACTIONS or action == "destroy":
                        wake[0].set()

            async def on_events() -> None:
                stream: AsyncIterator[dict[str, Any]] | None = first
                while True:
                    try:
                        if stream is not None:
                            await consume(stream)
                        else:
                            async with engine.events(labels, since) as reopened:
                                await consume(reopened)
                    except BackendError as e:
                        if not e.transient:
                            raise
                    # The engine dropped the stream (or could not open it): the status
                    # is read again now, and what it missed is replayed from ``since``.
                    stream = None
                    wake[0].set()
                    await anyio.sleep(EVENTS_REOPEN_S)  # a back-off, not a poll

            async def on_files() -> None:
                async with open_inotify() as inotify:
                    inotify.add_watch(store.app_dir, Mask.MOVED_TO | Mask.CLOSE_WRITE | Mask.CREATE)
                    async for _ in inotify:
                        wake[0].set()

            async def on_owner() -> None:
                await owner_exit(owner)
                wake[0].set()

            tg.start_soon(on_events)
            tg.start_soon(on_files)
            tg.start_soon(on_owner)
            try:
                while True:
                    wake[0] = anyio.Event()
                    try:
                        status = await self.status(store, app)
                    except BackendError as e:
                        if not e.transient:
                            raise
                        # The engine is away: read again when its stream opens again.
                    else:
                        if status.is_settled and await anyio.to_thread.run_sync(
                            self.output_settled, store, app
                        ):
                            return status
                    await wake[0].wait()
            finally:
                tg.cancel_scope.cancel()
        return None  # not reached: the loop only ends by returning

    async def finished(self, store: AppStore) -> bool:
        app = await anyio.to_thread.run_sync(store.read_app)
        if app is None:
            return True
        status = await self.status(store, app)
        return status.is_settled and await anyio.to_thread.run_sync(self.output_settled, store, app)

    @staticmethod
    def output_settled(store: AppStore, app: AppRecord) -> bool:
        """Blocking: no more output will reach the app's files unless someone copies it.

        The owner reports an exit before the container's last output is in the
        files, and marks the end of that copy once the app ended; an owner that
        no longer follows leaves the copy to ``resume``.
        """
        return (store.app_dir / OUTPUT_COPIED).exists() or not store.followed(app)

    # ------------------------------------------------------------------- logs
    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        found = await self.find(handle)
        if found is None:
            return None
        store, app = found
        if not await anyio.to_thread.run_sync(store.followed, app):
            await self.logs.resume(store, app, role, replica_id)

        async def copied() -> None:
            status = await self.status(store, app)
            if status.is_settled:
                await self.wait(handle)

        target = self._backend.make_log_target(store, role, replica_id, copied=copied)
        # The engine's die and destroy events of the app's containers (and the owner's
        # records, and its death) end a follower at once: nothing in the replica's
        # directory changes when an unfollowed container exits, so without this it
        # would notice only at its 30 s re-check.
        return replace(target, ended=self._ended(handle))

    def _ended(self, handle: AppHandle) -> Callable[[], Awaitable[None]]:
        """Returns once ``wait`` would: the app settled and its output is in the files."""
        key = (handle.session, handle.app_id)

        async def ended() -> None:
            known = self._endings.get(key)
            if known is None:
                known = self._endings[key] = (anyio.CancelScope(), anyio.Event())
                self._backend.task_group.start_soon(self._wait_end, handle, *known)
            await known[1].wait()

        return ended

    async def _wait_end(
        self, handle: AppHandle, scope: anyio.CancelScope, ended: anyio.Event
    ) -> None:
        try:
            with scope:
                await self.wait(handle)
                ended.set()
        except (BackendError, OSError):
            pass  # not set: the followers end at their re-check, as without events
        finally:
            self._endings.pop((handle.session, handle.app_id), None)

    async def aclose(self) -> None:
        for scope, _ in list(self._endings.values()):
            scope.cancel()
        await self.logs.aclose()


def _retry_owed(
    app: AppRecord, derived: AppStatus, recorded: tuple[AppStatus, Owner] | None
) -> str:
    """The failed replica that its app's state machine would restart (``exit_outcome``,
    with its role's retries used as last recorded), as ``role/k``; "" for none."""
    used = {role.role: role.restarts for role in recorded[0].roles} if recorded else {}
    limits = {role.name: role.max_retries for role in app.app.roles}
    for role in derived.roles:
        left = used.get(role.role, 0) < limits.get(role.role, 0)
        for replica in role.replicas:
            if replica.state is not ReplicaState.FAILED:
                continue
            outcome = exit_outcome(replica.exit_code, stopping=False, retries_left=left)
            if outcome is ExitOutcome.RESTART:
                return f"{role.role}/{replica.id}"
    return ""
