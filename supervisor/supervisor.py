"""The public face: ``Supervisor`` owns the task group, the backends and the app actors.

It is the only module that imports both ``fsm`` and ``backends``. Apps it
launched are answered from their actor's memory (``status`` never does I/O);
any other handle is answered by its backend's own records, so a second
process (the CLI) can follow, cancel and read the logs of apps it did not
start.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from re import Pattern
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from supervisor.actor import AppActor
from supervisor.backends.base import (
    Backend,
    BackendContext,
    BackendRegistry,
    DryrunContext,
    LogTarget,
    Request,
)
from supervisor.errors import (
    DamagedRecordError,
    DuplicateAppError,
    Problem,
    SpecError,
    UnknownAppError,
    UnsupportedAsyncLibraryError,
    WaitTimeout,
)
from supervisor.fsm.states import AppState
from supervisor.idempotency import IdempotencyKeys, fingerprint, submit_once
from supervisor.logs import Stream, WatchHub, iter_log_lines, parse_streams
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle, make_app_id, make_handle, parse_handle
from supervisor.status import AppStatus, DescribeAppResponse, ListAppResponse, Transition
from supervisor.validate import MAX_APP_ID_LENGTH, check_name, validate

__all__ = ["DryRunInfo", "Supervisor", "default_session", "default_state_dir"]


def default_state_dir() -> Path:
    """``$ASUPERVISOR_HOME``, else ``$XDG_STATE_HOME/asupervisor``, else ~/.local/state/..."""
    explicit = os.environ.get("ASUPERVISOR_HOME")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "asupervisor"


def default_session() -> str:
    """``$USER`` when set, else the login name of this uid, else ``default``.

    ``$USER`` first, so that a handle written ``local://$USER/app`` names the
    default session wherever ``$USER`` is set; where it is not (root in a
    container), the CLI reads ``local:///app`` as the default session too.
    """
    user = os.environ.get("USER")
    if user:
        return user
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "default"


def _gpu_count() -> int:
    """NVIDIA devices the driver lists; a directory read, no subprocess."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


@dataclass(frozen=True)
class DryRunInfo:
    """What ``dryrun`` returns and ``schedule`` consumes; ``str()`` shows the request."""

    backend: str
    app: AppDef
    cfg: ResolvedCfg
    request: Request

    @property
    def app_id(self) -> str:
        return self.request.app_id

    def __str__(self) -> str:
        return str(self.request)


def _is_set(event: anyio.Event) -> Callable[[], Awaitable[bool]]:
    async def is_set() -> bool:
        return event.is_set()

    return is_set


async def _set_when_ended(
    ended: Callable[[], Awaitable[None]], finished: anyio.Event, stop: anyio.Event
) -> None:
    """Set ``finished`` once ``ended`` returns; give up when ``stop`` is set (follow over)."""
    async with anyio.create_task_group() as tg:

        async def wait_ended() -> None:
            await ended()
            finished.set()
            tg.cancel_scope.cancel()

        tg.start_soon(wait_ended)
        await stop.wait()
        tg.cancel_scope.cancel()


class Supervisor:
    """Launches apps on backends and follows them; use as ``async with Supervisor() as sv``.

    Closing stops every replica this Supervisor started that is still running.
    """

    def __init__(
        self,
        session: str | None = None,
        *,
        state_dir: str | Path | None = None,
        backends: Mapping[str, Any] | None = None,
    ) -> None:
        self.session = session if session is not None else default_session()
        problems = check_name("session", self.session)
        if problems:
            raise SpecError(problems, context="invalid session")
        # Absolute: records written under it must be found from any directory.
        chosen = state_dir if state_dir is not None else default_state_dir()
        self.state_dir = Path(chosen).absolute()
        self._registry = BackendRegistry(backends)
        self._backends: dict[str, Backend] = {}
        self._actors: dict[str, AppActor] = {}
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._gpus: int | None = None
        self._closed = False
        self._watch_hub: WatchHub | None = None

    # --------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> Supervisor:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise UnsupportedAsyncLibraryError(
                "asupervisor runs only on asyncio (its backends watch files and processes "
                "through asyncio); start it with anyio.run(main) or asyncio.run(main), not "
                "under trio or another event loop"
            ) from None
        self._stack = AsyncExitStack()
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._watch_hub = WatchHub(self._tg)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            await self.close()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                try:
                    await stack.__aexit__(exc_type, exc, tb)
                except BaseExceptionGroup as group:
                    # The task group wraps whatever the block raised, even alone. The
                    # caller's own exception must come out as itself (``except SpecError``
                    # around the block must match); returning lets Python re-raise it
                    # untouched. Genuine concurrent failures stay grouped.
                    if exc is None or group.exceptions != (exc,):
                        raise
        return None

    async def close(self) -> None:
        """Cancel the apps still running here, wait for them to stop, release backends."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            owned = [
                actor
                for actor in self._actors.values()
                if not self._backends[parse_handle(actor.handle).backend].durable
            ]
            for actor in owned:
                actor.request_cancel("the supervisor closed")
            for actor in owned:
                await actor.done.wait()
            try:
                await self._close_backends()
            finally:
                # Whatever a backend's close raised, the task group must stop, or
                # leaving ``async with`` waits on it forever.
                if self._tg is not None:
                    self._tg.cancel_scope.cancel()

    async def _close_backends(self) -> None:
        """Close every backend, even after one failed; then raise the first failure."""
        failures: list[Exception] = []
        for backend in self._backends.values():
            try:
                await backend.aclose()
            except Exception as e:
                failures.append(e)
        if failures:
            raise failures[0]

    def _task_group(self) -> TaskGroup:
        if self._tg is None or self._closed:
            raise RuntimeError("use the Supervisor inside `async with Supervisor(...) as sv:`")
        return self._tg

    def backend(self, name: str) -> Backend:
        found = self._backends.get(name)
        if found is None:
            factory = self._registry.factory(name)
            context = BackendContext(self.session, self.state_dir, self._task_group())
            found = self._backends[name] = factory(context)
        return found

    def run_opts(self, backend: str) -> RunOpts:
        """The backend's run options; no backend is started when its class can tell."""
        target: Any = self._registry.factory(backend)
        while isinstance(target, functools.partial):  # partial(SlurmBackend, poller=...)
            target = target.func
        declared = getattr(target, "run_opts", None)
        if callable(declared):
            opts: RunOpts = declared()
            return opts
        return self.backend(backend).run_opts()  # a plain factory function

    def backends(self) -> list[str]:
        return self._registry.names()

    # ------------------------------------------------------------------- verbs
    def dryrun(
        self,
        app: AppDef,
        backend: str,
        cfg: Mapping[str, object] | None = None,
        *,
        app_id: str | None = None,
    ) -> DryRunInfo:
        """Validate and render the request; no side effects. ``app`` is never mutated.

        Run options, the app and ``app_id`` are all checked before one
        ``SpecError`` lists every problem found in them.
        """
        impl = self.backend(backend)
        found: list[SpecError] = []
        resolved: ResolvedCfg | None = None
        try:
            resolved = impl.run_opts().resolve(cfg)
        except SpecError as e:
            found.append(e)
        try:
            caps = impl.capabilities if resolved is None else impl.capabilities_for(resolved)
            validate(app, caps)
        except SpecError as e:
            found.append(e)
        if app_id is not None:
            named = check_name("app_id", app_id, max_length=MAX_APP_ID_LENGTH)
            if named:
                found.append(SpecError(named, context="invalid app id"))
        if found:
            context = found[0].context if len(found) == 1 else "invalid submit"
            raise SpecError([p for e in found for p in e.problems], context=context)
        assert resolved is not None  # resolve raised otherwise, and that was re-raised above
        if self._gpus is None:
            self._gpus = _gpu_count()
        ctx = DryrunContext(
            session=self.session,
            app_id=app_id or make_app_id(app.name, secrets.token_hex(4)),
            cwd=os.getcwd(),
            gpu_count=self._gpus,
        )
        return DryRunInfo(backend, app, resolved, impl.dryrun(app, resolved, ctx))

    async def schedule(self, info: DryRunInfo) -> str:
        """Launch a dry-run request; returns the handle once the launch was recorded."""
        tg = self._task_group()
        impl = self.backend(info.backend)
        handle = make_handle(info.backend, self.session, info.request.app_id)
        if handle in self._actors:
            raise DuplicateAppError(f"{handle} was already scheduled by this Supervisor")
        actor = AppActor(handle, info.request)
        try:
            # Shielded: a launch cut short by the caller's cancel would leave what it
            # had started (processes, a Slurm job, containers) with no handle and no
            # record. The cancel lands just below instead, where the app is stopped.
            with anyio.CancelScope(shield=True):
                runtime = await impl.launch(info.request, actor.post)
        except BaseException:
            actor.discard()
            raise
        self._actors[handle] = actor
        tg.start_soon(actor.run, runtime, tg)
        try:
            await actor.settle()
            # Another process asking right after this returns must find the app as it is.
            await actor.record_now()
        except BaseException:
            # The caller was cancelled (or failed) after the launch: no handle reaches it,
            # so nobody could ever stop this app. Stop what was started, then go on raising.
            with anyio.CancelScope(shield=True):
                actor.request_cancel("the submit was cancelled before it returned")
                await actor.done.wait()
            raise
        return handle

    async def submit(
        self,
        app: AppDef,
        backend: str,
        cfg: Mapping[str, object] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> str:
        """Dry-run and schedule ``app``; returns its handle.

        With ``idempotency_key``, a submit repeated under the same key (by a
        service retrying after a crash, from any process of this session)
        returns the first submit's handle instead of starting a second run;
        see ``supervisor.idempotency``.
        """
        await self.prepare(backend)
        if idempotency_key is None:
            return await self.schedule(self.dryrun(app, backend, cfg))
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise SpecError(
                [Problem("idempotency_key", "must be a non-empty string")], context="invalid submit"
            )
        pending: list[DryRunInfo] = []

        def prepare() -> str:
            pending.append(self.dryrun(app, backend, cfg))
            return make_handle(backend, self.session, pending[-1].app_id)

        return await submit_once(
            IdempotencyKeys(self.state_dir, backend, self.session),
            idempotency_key,
            submitted=fingerprint(backend, app, cfg),
            exists=self.exists,
            prepare=prepare,
            launch=lambda: self.schedule(pending[-1]),
        )

    async def prepare(self, backend: str) -> None:
        """Let a backend learn what its dryrun depends on (Slurm: version, partitions).

        ``submit`` does this itself; call it before a bare ``dryrun`` of such a
        backend to see the request exactly as ``submit`` would send it.
        """
        await self.backend(backend).prepare()

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Per backend in use: counters of the work done (e.g. squeue calls for Slurm)."""
        return {name: b.statistics() for name, b in self._backends.items()}

    def status(self, handle: str) -> AppStatus | None:
        """A snapshot of an app this Supervisor follows; no I/O. None for any other handle."""
        actor = self._actors.get(handle)
        return actor.status() if actor is not None else None

    async def describe(self, handle: str) -> DescribeAppResponse | None:
        parsed = parse_handle(handle)
        actor = self._actors.get(handle)
        if actor is not None:
            return DescribeAppResponse.from_status(
                parsed.app_id, actor.status(), actor.request.app.roles, tuple(actor.fsm.history)
            )
        return await self._describe_recorded(parsed)

    async def _describe_recorded(self, parsed: AppHandle) -> DescribeAppResponse | None:
        """An app followed elsewhere, from its backend's records; a damaged one is UNKNOWN."""
        try:
            return await self.backend(parsed.backend).describe(parsed)
        except DamagedRecordError as e:
            return DescribeAppResponse(parsed.app_id, AppState.UNKNOWN, msg=str(e))

    async def exists(self, handle: str) -> bool:
        return await self.describe(handle) is not None

    async def list(self, backend: str) -> list[ListAppResponse]:
        return await self.backend(backend).list()

    async def cancel(self, handle: str) -> None:
        """Ask the app to stop and return at once; repeating it, or a finished app, is fine."""
        actor = self._actors.get(handle)
        if actor is not None:
            if actor.runtime is not None and not actor.done.is_set():
                await actor.runtime.record_cancel()  # durable first, then carried out
            actor.request_cancel()
            return
        parsed = parse_handle(handle)
        if not await self.backend(parsed.backend).cancel(parsed):
            raise UnknownAppError(f"no app {handle}")

    async def hold(self, handle: str) -> None:
        """Keep a pending app from starting until ``release`` (Slurm: ``scontrol hold``).

        Its state stays PENDING with the scheduler's reason (JobHeldUser). A
        backend that cannot hold (local, docker) raises ``SpecError``; an app
        nobody recorded raises ``UnknownAppError``.
        """
        await self._hold(handle, release=False)

    async def release(self, handle: str) -> None:
        """Let a held app start (Slurm: ``scontrol release``); see ``hold``."""
        await self._hold(handle, release=True)

    async def _hold(self, handle: str, *, release: bool) -> None:
        parsed = parse_handle(handle)
        if not await self.backend(parsed.backend).hold(parsed, release=release):
            raise UnknownAppError(f"no app {handle}")

    async def wait(self, handle: str, timeout: float | None = None) -> AppStatus:
        """The final status, once the app is terminal (event-driven for apps launched here)."""
        with anyio.move_on_after(timeout) as scope:
            status = await self._wait(handle)
        if scope.cancelled_caught:
            raise WaitTimeout(f"{handle} was not terminal after {timeout} s")
        return status

    async def _wait(self, handle: str) -> AppStatus:
        actor = self._actors.get(handle)
        if actor is not None:
            await actor.done.wait()
            return actor.status()
        # Another process follows this app: its backend tells when its records say it ended.
        parsed = parse_handle(handle)
        try:
            status = await self.backend(parsed.backend).wait_foreign(parsed)
        except DamagedRecordError as e:
            # Nothing more can be learned from it: as settled as UNKNOWN ever is.
            return AppStatus(AppState.UNKNOWN, msg=str(e))
        if status is None:
            raise UnknownAppError(f"no app {handle}")
        return status

    async def watch(self, handle: str) -> AsyncIterator[Transition]:
        """Every transition of an app launched here, app and replica level, in order, to the end."""
        actor = self._actors.get(handle)
        if actor is None:
            raise UnknownAppError(f"{handle} is not followed by this Supervisor")
        async for t in actor.transitions():
            yield t

    async def log_iter(
        self,
        handle: str,
        role_name: str,
        k: int = 0,
        regex: str | Pattern[str] | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        should_tail: bool = False,
        streams: Stream | str | None = None,
    ) -> AsyncIterator[str]:
        """Lines of one replica's output, each with its ``\\n``; see logs.iter_log_lines."""
        stream = parse_streams(streams)
        target, finished = await self._log_target(handle, role_name, k)
        stop_watching = anyio.Event()
        is_finished = target.is_finished
        copied = target.copied
        if copied is not None and (not should_tail or (finished is not None and finished.is_set())):
            # Also a follow of an app that already ended: its last copies may still be
            # rewriting an attempt's files (a docker copy found wrong at the exit).
            await copied()
        elif copied is not None and finished is not None:
            # The app ended (``finished``) before its last output reached the files:
            # the follow ends once both are true.
            app_done, finished = finished, anyio.Event()
            is_finished = _is_set(finished)

            async def ended() -> None:
                await app_done.wait()
                await copied()

            self._task_group().start_soon(_set_when_ended, ended, finished, stop_watching)
        if finished is None and target.ended is not None and should_tail:
            # The backend has an event for "no more output" (another process's app
            # whose owner died): it ends the follow at once.
            finished = anyio.Event()
            self._task_group().start_soon(_set_when_ended, target.ended, finished, stop_watching)
        try:
            async for line in iter_log_lines(
                target.directory,
                stream=stream,
                regex=regex,
                since=since,
                until=until,
                should_tail=should_tail,
                is_finished=is_finished,
                extra_watch_dirs=target.watch_dirs,
                finished_event=finished,
                watch_hub=self._watch_hub,
            ):
                yield line
        finally:
            stop_watching.set()

    async def _log_target(
        self, handle: str, role: str, k: int
    ) -> tuple[LogTarget, anyio.Event | None]:
        parsed: AppHandle = parse_handle(handle)
        actor = self._actors.get(handle)
        if actor is not None and actor.runtime is not None:
            if not actor.has_replica(role, k):
                raise UnknownAppError(f"{handle} has no replica {role}/{k}")
            done = actor.done
            base = actor.runtime.log_target(role, k)
            # No watch on the app's directory (``base.watch_dirs``): it tells another
            # process the app ended, which ``done`` tells here. Each state record
            # written there would wake every follower of the app: N followers times
            # the records of N replicas starting.
            return LogTarget(base.directory, _is_set(done), copied=base.copied), done
        backend = self.backend(parsed.backend)
        described = await self._describe_recorded(parsed)
        if described is None:
            raise UnknownAppError(f"no app {handle}")
        if described.to_status().replica(role, k) is None:
            # Without roles (its record is damaged) the reason is all there is to say.
            why = f": {described.msg}" if not described.roles and described.msg else ""
            raise UnknownAppError(f"{handle} has no replica {role}/{k}{why}")
        target = await backend.log_target(parsed, role, k)
        if target is None:
            raise UnknownAppError(f"no app {handle}")
        return target, None
