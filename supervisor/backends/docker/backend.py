"""The ``docker`` backend: each replica a container on a Docker-API engine.

Containers outlive the Supervisor that launched them (``durable``, as Slurm
jobs do): closing a Supervisor stops following its apps, it does not stop
them. Any process can then describe, list, wait for, read the logs of and
cancel them, from the app's records (found through the index, or through the
``io.asupervisor.app_dir`` label of its containers) and the containers
themselves:

* while the launching process follows the app, its recorded state is the
  truth (its state machine decides retries and gang failure), and a cancel
  is a ``cancel.request`` file it watches;
* once nobody follows it, the state is derived from the containers, a cancel
  stops them directly (SIGTERM, grace, SIGKILL), and whoever sees the last
  one end records the final state and removes containers and network.

What this process follows is heard from one engine event stream per backend.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from supervisor.backends.adoption import take_over
from supervisor.backends.base import (
    Adoption,
    AppTasks,
    Backend,
    BackendContext,
    DryrunContext,
    EventSink,
    LogTarget,
    Request,
)
from supervisor.backends.docker.engine import (
    EVENTS_REOPEN_S,
    EXIT_ACTIONS,
    Engine,
    event_action,
    event_container,
    event_time,
)
from supervisor.backends.docker.foreign import ForeignApps
from supervisor.backends.docker.options import DOCKER_CAPABILITIES, default_host, docker_run_opts
from supervisor.backends.docker.request import (
    LABEL,
    DockerRequest,
    check_docker_app,
    check_docker_cfg,
    render,
)
from supervisor.backends.docker.runtime import (
    CONFIRM_S,
    CREATE_CONCURRENCY,
    FINALIZE_WAITERS,
    DockerRuntime,
)
from supervisor.backends.store import AppRecord, AppStore, Index, Owner, remove_app
from supervisor.errors import BackendError, Problem, SubmitError
from supervisor.logs import LogSink
from supervisor.observe import metrics
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle
from supervisor.status import AppStatus, DescribeAppResponse, ListAppResponse
from supervisor.validate import Capabilities

__all__ = ["DockerBackend"]

EVENTS_READY_S = 60.0
"""How long a launch waits for the engine's event stream to open before failing (transient)."""


class DockerBackend(Backend):
    name = "docker"
    durable = True

    def __init__(self, context: BackendContext, *, host: str | None = None) -> None:
        super().__init__(context)
        self.task_group = context.task_group
        self.host = host or default_host()
        self.engines: dict[str, Engine] = {}
        self.engine = self.engine_for(self.host)
        self.log_sink = LogSink()
        self.index = Index(context.state_dir, "docker")
        self.owner = Owner.current()
        self._runtimes: set[DockerRuntime] = set()
        self._events_ready: dict[tuple[str, str], anyio.Event] = {}
        self._events_scopes: dict[tuple[str, str], anyio.CancelScope] = {}
        """One per engine and session (apps taken over may be of another session): a
        CancelScope serves one ``with`` block, so streams cannot share one."""
        self._busy = 0
        self.launch_limiter = anyio.CapacityLimiter(CREATE_CONCURRENCY)
        """Shared by every launch of this backend: a cap on creates in flight across apps."""
        self.lock_waiters = anyio.CapacityLimiter(FINALIZE_WAITERS)
        self._idle = anyio.Event()
        self.foreign = ForeignApps(self)

    def engine_for(self, host: str) -> Engine:
        engine = self.engines.get(host)
        if engine is None:
            engine = self.engines[host] = Engine(host)
        return engine

    @classmethod
    def run_opts(cls) -> RunOpts:
        return docker_run_opts()

    @property
    def capabilities(self) -> Capabilities:
        return DOCKER_CAPABILITIES

    def check_cfg(self, cfg: ResolvedCfg) -> list[Problem]:
        return check_docker_cfg(cfg, cfg.get_str("host") or self.host)

    def check_app(self, app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
        return check_docker_app(app, cfg, cfg.get_str("host") or self.host)

    def dryrun(self, app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext) -> DockerRequest:
        return render(
            app,
            cfg,
            ctx,
            host=cfg.get_str("host") or self.host,
            default_log_dir=self.context.state_dir / "logs",
            environ=os.environ,  # copy_env's source, read here as TorchX does
        )

    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> DockerRuntime:
        if not isinstance(request, DockerRequest):
            raise TypeError(f"the docker backend cannot run a {type(request).__name__}")
        engine = self.engine_for(request.host)
        await self._ensure_events(engine)
        store = AppStore(Path(request.app_dir))
        record = AppRecord(
            handle=self.handle(request.session, request.app_id),
            app=request.app,
            owner=self.owner,
            request=request.to_json(),
        )
        try:
            dirs = [Path(c.log_dir) for c in request.containers]
            await anyio.to_thread.run_sync(store.create, dirs, record)
            await anyio.to_thread.run_sync(
                self.index.add, request.session, request.app_id, store.app_dir, request.app.name
            )
        except OSError as e:
            raise SubmitError(f"cannot create {store.app_dir}: {e}", transient=False) from e
        runtime = DockerRuntime(self, request, sink, tasks)
        runtime.engine = engine
        self._runtimes.add(runtime)
        try:
            await runtime.start()
        except BaseException:
            self._runtimes.discard(runtime)
            # Nothing runs (start removed what it made): neither does its record stay,
            # as for a job sbatch refused, or it would list for ever as an app.
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(
                    remove_app, self.index, request.session, request.app_id, store.app_dir
                )
            raise
        return runtime

    @asynccontextmanager
    async def tracked(self) -> AsyncIterator[None]:
        """Background work that talks to an engine: ``aclose`` waits for it before closing."""
        if self._busy == 0:
            self._idle = anyio.Event()
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    def forget(self, runtime: DockerRuntime) -> None:
        self._runtimes.discard(runtime)

    # ------------------------------------------------------------------ events
    async def _ensure_events(self, engine: Engine, session: str | None = None) -> None:
        """Start following the events of ``engine``'s containers of ``session`` (this
        Supervisor's by default) once; bounded: a launch never waits forever here."""
        session = session or self.context.session
        ready = self._events_ready.get((engine.host, session))
        if ready is None:
            ready = self._events_ready[(engine.host, session)] = anyio.Event()
            scope = self._events_scopes[(engine.host, session)] = anyio.CancelScope()
            self.task_group.start_soon(self._follow_events, engine, session, ready, scope)
        with anyio.move_on_after(EVENTS_READY_S):
            await ready.wait()
        if not ready.is_set():
            raise SubmitError(
                f"the engine at {engine.host} did not open its event stream within "
                f"{EVENTS_READY_S:.0f} s",
                transient=True,
            )

    async def _follow_events(
        self, engine: Engine, session: str, ready: anyio.Event, scope: anyio.CancelScope
    ) -> None:
        """One stream for every container of a session; reopened if the engine drops it."""
        since = time.time() - 1.0
        try:
            async with self.tracked():
                with scope:
                    await self._read_events(engine, session, ready, since)
        finally:
            ready.set()  # whatever ended the follower, nobody waits on it any more

    async def _read_events(
        self, engine: Engine, session: str, ready: anyio.Event, since: float
    ) -> None:
        troubled = False
        while True:
            try:
                async with engine.events({LABEL.SESSION: session}, since) as ev:
                    ready.set()
                    if troubled:
                        # Back. An engine that restarted does not replay the exits it
                        # saw meanwhile: each app asks it how its containers are now.
                        troubled = False
                        for runtime in list(self._runtimes):
                            if runtime.engine is engine:
                                runtime.emit_notice("")
                                runtime.reconcile()
                    async for event in ev:
                        since = event_time(event) or since
                        self._dispatch(event)
            except (BackendError, OSError) as e:
                if not ready.is_set():
                    ready.set()  # launch fails on its own with a clearer error
                troubled = True
                for runtime in list(self._runtimes):
                    if runtime.engine is engine:  # another engine's apps are not troubled
                        runtime.emit_notice(f"lost the engine's event stream: {e}")
                await anyio.sleep(EVENTS_REOPEN_S)  # a back-off before reconnecting, not a poll

    def _dispatch(self, event: dict[str, Any]) -> None:
        action = event_action(event)
        metrics.count_engine_event(action)
        if action != "start" and action not in EXIT_ACTIONS:
            return
        cid = event_container(event)
        attributes = (event.get("Actor") or {}).get("Attributes") or {}
        at = event_time(event)
        for runtime in list(self._runtimes):
            runtime.on_event(cid, action, attributes, at)

    # ------------------------------------------------------ apps of other processes
    async def describe(self, handle: AppHandle) -> DescribeAppResponse | None:
        return await self.foreign.describe(handle)

    async def list(self) -> list[ListAppResponse]:
        return await self.foreign.list()

    async def cancel(self, handle: AppHandle) -> bool:
        return await self.foreign.cancel(handle)

    async def wait_foreign(self, handle: AppHandle) -> AppStatus | None:
        return await self.foreign.wait(handle)

    async def adopt(self, handle: AppHandle) -> Adoption | None:
        """Take over an app whose owner is gone (see ``Backend.adopt``): its containers run on."""
        found = await self.foreign.find(handle)
        if found is None:
            return None
        taken = await take_over(
            found[0],
            self.owner,
            lambda app: DockerRequest.from_json(app.request, app.app),
            lock_waiters=self.lock_waiters,
        )
        if taken is None:
            return None
        request, status = taken.request, taken.recorded

        async def start(sink: EventSink, tasks: AppTasks) -> DockerRuntime:
            engine = self.engine_for(request.host)
            await self._ensure_events(engine, request.session)
            runtime = DockerRuntime(self, request, sink, tasks)
            runtime.engine = engine
            self._runtimes.add(runtime)
            try:
                labels = {LABEL.SESSION: request.session, LABEL.APP_ID: request.app_id}
                await runtime.adopt(await engine.list_containers(labels), status)
            except BaseException:
                self._runtimes.discard(runtime)
                raise
            return runtime

        return Adoption(request, status, taken.history, start, taken.give_up)

    def make_log_target(
        self,
        store: AppStore,
        role: str,
        replica_id: int,
        *,
        copied: Callable[[], Awaitable[None]] | None = None,
    ) -> LogTarget:
        """``copied``: how a reader in this process learns the last output is in the files."""

        async def finished() -> bool:
            return await self.foreign.finished(store)

        return LogTarget(
            directory=store.app_dir / role / str(replica_id),
            is_finished=finished,
            watch_dirs=(store.app_dir,),
            copied=copied,
        )

    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        return await self.foreign.log_target(handle, role, replica_id)

    async def aclose(self) -> None:
        """Stop following: the containers run on, and another process can pick them up.

        A stop or cancel in progress is carried out first (SIGTERM, grace,
        SIGKILL), while this process still hears the exits, within the grace
        and a bound; what still runs after that gets SIGKILL. Every step is
        bounded and every app is handled even when one's records cannot be
        written (a removed log directory, a full disk); such failures are
        raised together, as one BackendError, once everything is closed.
        """
        failures: list[str] = []
        pending: list[DockerRuntime] = []
        for runtime in list(self._runtimes):
            try:
                if runtime.final:
                    await runtime.cleanup()  # it ended just now: finish its cleanup first
                elif await anyio.to_thread.run_sync(runtime.cancel_pending):
                    pending.append(runtime)
                else:
                    await self._release(runtime)
            except (OSError, BackendError) as e:
                failures.append(f"{runtime.request.app_id}: {e}")
        if pending:
            grace = max(r.request.stop_grace for r in pending)
            bound = (grace if math.isfinite(grace) else 0.0) + CONFIRM_S
            with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
                for runtime in pending:
                    await runtime.ended.wait()
            for runtime in pending:
                if not runtime.ended.is_set():
                    try:
                        with anyio.CancelScope(shield=True):
                            await runtime.kill_all()
                        await self._release(runtime)
                    except (OSError, BackendError) as e:
                        failures.append(f"{runtime.request.app_id}: {e}")
        for scope in self._events_scopes.values():
            scope.cancel()
        await self.foreign.aclose()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CONFIRM_S):
            if self._busy:
                await self._idle.wait()
        for engine in self.engines.values():
            await engine.aclose()
        try:
            await self.log_sink.aclose()
        except (OSError, BackendError) as e:
            failures.append(f"writing the last output: {e}")
        if failures:
            raise BackendError(
                "closing the docker backend: " + "; ".join(failures), transient=False
            )

    async def _release(self, runtime: DockerRuntime) -> None:
        runtime.release()
        await anyio.to_thread.run_sync(runtime.store.mark_released)
