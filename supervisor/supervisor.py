"""The public face: ``Supervisor`` owns the task group, the backends and the app actors.

It is the only module that imports both ``fsm`` and ``backends``. Apps it
launched are answered from their actor's memory (``status`` never does I/O);
any other handle is answered by its backend's own records, so a second
process (the CLI) can follow, cancel and read the logs of apps it did not
start.

Memory stays bounded in a service that runs for weeks: once an app has ended
and its final record is written, its actor leaves memory (its current waiters
keep what they hold and are served to the end). From then on ``describe``,
``wait``, ``watch``, ``log_iter`` and ``cancel`` answer from its records on
disk, exactly as for an app of another process; ``status`` answers from a
small cache of the final statuses of the apps that ended last (``finished``:
bounded by apps and by replicas), and None for an app that left it. An app
whose final record could not be written (a full disk) stays in memory: its
records would not tell its end.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import fnmatch
import functools
import getpass
import importlib
import logging
import os
import secrets
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from re import Pattern
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from supervisor.actor import AppActor
from supervisor.backends.base import (
    Backend,
    BackendContext,
    BackendFactory,
    BackendRegistry,
    DryrunContext,
    LogTarget,
    Request,
)
from supervisor.backends.listing import newest_first
from supervisor.backends.store import (
    CancelRequests,
    Index,
    IndexEntry,
    end_is_known,
    remove_app,
)
from supervisor.cluster import ClusterInfo, ClusterJob
from supervisor.errors import (
    BackendError,
    DamagedRecordError,
    DuplicateAppError,
    NotEnteredError,
    Problem,
    ShuttingDown,
    SpecError,
    UnknownAppError,
    UnsupportedAsyncLibraryError,
    WaitTimeout,
)
from supervisor.finished import FinishedStatuses
from supervisor.fsm.ingest import closing_steps
from supervisor.idempotency import IdempotencyKeys, KeyQueues, fingerprint, submit_once
from supervisor.logs import (
    EndSignal,
    Stream,
    WatchHub,
    check_log_query,
    epoch_or_problem,
    iter_log_lines,
)
from supervisor.observe import EventStream, Observer, metrics
from supervisor.observe.bus import DEFAULT_MAX_BUFFER
from supervisor.retention import Retention, limit_problems
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle, Role, make_app_id, make_handle, parse_handle
from supervisor.states import TERMINAL, AppState
from supervisor.status import AppStatus, DescribeAppResponse, ListAppResponse, Transition
from supervisor.uncut import run_uncut
from supervisor.validate import MAX_APP_ID_LENGTH, check_name, validate

__all__ = ["DryRunInfo", "Supervisor", "default_session", "default_state_dir"]

_log = logging.getLogger(__name__)

RECORDED_FIRST_S = 0.05
RECORDED_RECHECK_S = 1.0
"""``watch`` of an app followed elsewhere re-reads its records after each change of its
directory, and at an interval growing from the first to the second figure besides."""
RECORDED_END_GRACE_S = 5.0
"""How long such a watch waits, once the app is known to have ended, for its owner to
record the end in the journal (an app nobody follows never gets it)."""

DRYRUN_THREAD_REPLICAS = 200
"""From this many replicas, ``submit`` renders the request in a worker thread. Below, the
loop does it: a dry run costs 7-27 us per replica (2026-12-05: 100 replicas in 0.7 ms
with no macro, 1.9 ms with some, 2.6 ms for Docker), and the hop to a worker thread and
back cost a 100-replica submit 1.5-2 ms while the loop had other work."""
KEY_LOCK_WAITERS = 8
"""Threads at most blocked at once waiting for idempotency keys' locks (more wait unblocked)."""


def _replicas_asked(app: object) -> int:
    """The replicas ``app`` asks for; 0 for what is no app at all (validation says why)."""
    roles = app.roles if isinstance(app, AppDef) else None
    if not isinstance(roles, list | tuple):
        return 0
    return sum(
        r.num_replicas for r in roles if isinstance(r, Role) and isinstance(r.num_replicas, int)
    )


def _timeout_problem(timeout: object) -> str:
    """What is wrong with ``timeout`` as seconds to wait (None: no limit); "" for nothing."""
    if timeout is None:
        return ""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return f"must be a number of seconds or None, got {type(timeout).__name__}"
    if not timeout >= 0:  # NaN too
        return f"must be >= 0, got {timeout}"
    return ""


def _journal_ends(transitions: Sequence[Transition], state: AppState) -> bool:
    """The journal's last app-level transition reaches ``state``."""
    for t in reversed(transitions):
        if t.role is None:
            return t.dest == state.name
    return False


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


def _working_directory() -> str:
    """The caller's working directory, where replicas start; a removed one is named."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise SpecError(
            [Problem("cwd", "the current working directory was removed; go to one that exists")],
            context="invalid submit",
        ) from None


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


def _is_set(event: EndSignal) -> Callable[[], Awaitable[bool]]:
    async def is_set() -> bool:
        return event.is_set()

    return is_set


async def _set_when_ended(
    ended: Callable[[], Awaitable[None]], finished: EndSignal, stop: anyio.Event
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


@dataclass(frozen=True)
class _ListQuery:
    """The filters of ``Supervisor.list``, checked together (every problem named by field)."""

    states: frozenset[AppState] | None
    since: float | None
    name: str | None
    limit: int | None

    @classmethod
    def of(
        cls,
        state: AppState | str | Collection[AppState | str] | None,
        since: datetime | float | None,
        name: str | None,
        limit: int | None,
    ) -> _ListQuery:
        problems: list[Problem] = []
        states: set[AppState] | None = None
        if state is not None:
            wanted = [state] if isinstance(state, (AppState, str)) else state
            states = set()
            try:
                items = list(wanted)
            except TypeError:
                items = []
                problems.append(Problem("state", f"must be an AppState or a name, {state!r}"))
            for item in items:
                if isinstance(item, AppState):
                    states.add(item)
                elif isinstance(item, str) and item.upper() in AppState.__members__:
                    states.add(AppState[item.upper()])
                else:
                    names = ", ".join(AppState.__members__)
                    problems.append(Problem("state", f"{item!r} is not one of {names}"))
        at = epoch_or_problem(since, "since", problems)
        if name is not None and (not isinstance(name, str) or not name):
            problems.append(Problem("name", f"must be a non-empty string, {name!r}"))
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            problems.append(Problem("limit", f"must be an int >= 0, {limit!r}"))
        if problems:
            raise SpecError(problems, context="invalid list")
        return cls(frozenset(states) if states is not None else None, at, name, limit)

    def keeps(self, app: ListAppResponse) -> bool:
        if self.states is not None and app.state not in self.states:
            return False
        if self.since is not None and (
            app.times.submitted is None or app.times.submitted < self.since
        ):
            return False
        return self.name is None or fnmatch.fnmatchcase(app.name, self.name)

    def apply(self, apps: Sequence[ListAppResponse]) -> list[ListAppResponse]:
        kept = newest_first([a for a in apps if self.keeps(a)])
        return kept if self.limit is None else kept[: self.limit]


def _with_metadata(actor: AppActor) -> AppStatus:
    """The actor's snapshot with what its backend knows the app by (a Slurm job id)."""
    status = actor.status()
    extra = actor.metadata()
    return dataclasses.replace(status, metadata={**status.metadata, **extra}) if extra else status


class Supervisor:
    """Launches apps on backends and follows them; use as ``async with Supervisor() as sv``.

    Closing stops every replica this Supervisor started that is still running.
    ``retention``: remove the records and logs of this session's settled apps
    periodically, in a worker thread (see ``supervisor.retention`` and ``gc``).

    Shutting down, for a service: ``begin_shutdown()`` (which ``close()`` and
    leaving ``async with`` call first) ends every open ``log_iter`` follow,
    ``watch`` and ``events()`` stream of this Supervisor naturally (the
    iterator stops, as if the app had ended, after what was already there) and
    makes every open ``wait`` raise ``ShuttingDown``, at once; a new ``submit`` raises
    ``ShuttingDown`` too. The apps are not touched by it: ``close()`` then stops
    the local apps it started, and durable ones (Docker, Slurm) run on.
    """

    def __init__(
        self,
        session: str | None = None,
        *,
        state_dir: str | Path | None = None,
        backends: Mapping[str, BackendFactory | str] | None = None,
        retention: Retention | None = None,
    ) -> None:
        if retention is not None and not isinstance(retention, Retention):
            raise SpecError(
                [Problem("retention", f"must be a Retention, {type(retention).__name__}")],
                context="invalid supervisor",
            )
        self.retention = retention
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
        # The final statuses of the apps that ended last, newest at the end.
        self._finished = FinishedStatuses()
        # The latest status of each live app ``attach`` made this Supervisor observe,
        # and the scopes of the tasks that keep them current.
        self._observed: dict[str, AppStatus] = {}
        self._observing: set[anyio.CancelScope] = set()
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._gpus: int | None = None
        self._closing: anyio.Event | None = None  # made by the first close, set once it is done
        # What that close's work raised, with where: every close raises it (``close``).
        self._close_failure: tuple[Exception, TracebackType | None] | None = None
        self._watch_hub: WatchHub | None = None
        self._observer = Observer()
        self._unregister_metrics: Callable[[], None] | None = None
        self._shutting_down = False
        # What begin_shutdown ends: the scopes of open waits, the end events of follows.
        self._open_waits: set[anyio.CancelScope] = set()
        self._follows: set[anyio.Event | EndSignal] = set()
        self._key_waiters: anyio.CapacityLimiter | None = None  # made in the loop, at first use
        # One in-process queue per idempotency key: a task waits for its turn there, and
        # only the one at the head takes a thread to wait for the key's lock file.
        self._key_queues = KeyQueues()
        # Launches under way, each set once its app is registered (or the launch failed):
        # ``close`` waits for them, so an app launched while it closes is stopped with the
        # rest instead of being left to the backend's close (SIGKILL, recorded FAILED).
        self._launches: set[anyio.Event] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one that entered it

    # --------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> Supervisor:
        if self._stack is not None or self._is_closed:
            # Its apps, backends and shutdown belong to one ``async with``: a second
            # would start with every verb refusing (closed) or share the first's apps.
            raise NotEnteredError(
                "a Supervisor is entered once: make a new one for each `async with`"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise UnsupportedAsyncLibraryError(
                "asupervisor runs only on asyncio (its backends watch files and processes "
                "through asyncio); start it with anyio.run(main) or asyncio.run(main), not "
                "under trio or another event loop"
            ) from None
        self._loop = asyncio.get_running_loop()
        self._stack = AsyncExitStack()
        outer = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg = await outer.start(self._hold_tasks)
        self._watch_hub = WatchHub(self._tg)
        self._unregister_metrics = metrics.register_states(_StateCounts(self._actors))
        if self.retention is not None:
            self._tg.start_soon(self._retain, self.retention)
        return self

    @staticmethod
    async def _hold_tasks(*, task_status: TaskStatus[TaskGroup]) -> None:
        """Hold the task group of the apps, backends and follows, until ``close`` ends it.

        It lives in a task of its own, shielded, and not in the caller's task
        around the ``async with`` body. So ``close()`` cancelling it leaves the
        rest of the body running (``describe`` after ``await sv.close()``), and
        a scope cancelled around the block (``move_on_after``, a failing
        sibling task) does not reach the apps directly: they stop as at any
        exit, by ``close`` (SIGTERM, ``stop_grace``, a final record).
        """
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                task_status.started(tg)
                await anyio.sleep_forever()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            await self.close()
        except BaseException:
            await self._leave_tasks(exc_type, exc, tb)
            raise
        return await self._leave_tasks(exc_type, exc, tb)

    async def _leave_tasks(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Leave the task group ``__aenter__`` entered; what it says of the block's exception."""
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        try:
            return await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The task group wraps whatever the block raised, even alone. The
            # caller's own exception must come out as itself (``except SpecError``
            # around the block must match); returning lets Python re-raise it
            # untouched. Genuine concurrent failures stay grouped.
            if exc is None or group.exceptions != (exc,):
                raise
        return None

    @property
    def shutting_down(self) -> bool:
        """True once ``begin_shutdown`` (or ``close``) was called."""
        return self._shutting_down

    def begin_shutdown(self) -> None:
        """End every open follow, ``watch``, ``events`` and ``wait`` of this Supervisor now.

        For a service whose server waits for open requests before it runs its
        shutdown code (uvicorn does): call this where the shutdown starts (its
        signal handling), so that streaming responses end and the server can
        stop; ``close()`` comes later, from the lifespan. Synchronous and
        cheap, but call it on the event loop's thread (from a signal handler,
        through ``loop.call_soon_threadsafe``).

        From another thread it raises ``NotEnteredError`` and does nothing: the
        streams, waits and events it ends belong to the loop, and are not
        thread-safe. Idempotent. From then on ``log_iter(..., should_tail=True)``, ``watch``
        and ``events()`` streams end naturally (``StopAsyncIteration``) once they
        gave what was already there; ``wait`` returns the status of an app that already ended and
        raises ``ShuttingDown`` otherwise; ``submit`` and ``schedule`` raise
        ``ShuttingDown``. Apps keep running (and ``status``, ``describe``,
        ``cancel`` and reads to the end keep working) until ``close()``; but
        a local app whose submit was under way is stopped once launched (its
        submit raises ``ShuttingDown``: no handle reached anyone to stop it).
        """
        self._check_loop(hint="from another thread, through loop.call_soon_threadsafe")
        if self._shutting_down:
            return
        self._shutting_down = True
        for scope in list(self._open_waits):
            scope.cancel()
        for ended in list(self._follows):
            ended.set()
        for actor in self._actors.values():
            actor.wake_readers()
        self._observer.bus.close()  # every ``events()`` stream ends after what it holds

    def _refuse_if_shutting_down(self, what: str) -> None:
        if self._shutting_down:
            raise ShuttingDown(f"the Supervisor is shutting down: no new {what}")

    @property
    def _is_closed(self) -> bool:
        """``close`` was called (its work may still be under way)."""
        return self._closing is not None

    async def close(self) -> None:
        """End follows, watches and waits; stop the local apps; release the backends.

        Calls ``begin_shutdown`` first (see there); waits for the launches under
        way (their submits raise ``ShuttingDown``); then cancels the apps of
        backends that are not durable (local) this Supervisor started and waits
        for them to stop. Durable apps (Docker, Slurm) keep running, and any
        process can follow them on.

        The work is done once: a second ``close`` (at the same time, or later: a
        signal's and the lifespan's, or leaving ``async with`` after an explicit
        one) waits for the first's work to end, and raises what that work raised
        (a backend's close that failed), as every close does, the first too; so a
        failure is not lost to whichever close happened to be second.
        """
        self._check_loop()
        self.begin_shutdown()
        if self._closing is not None:
            # Another close is under way (a signal's and the lifespan's, or one whose
            # caller was cancelled, its work going on): done when it is done, not before.
            await self._closing.wait()
            if self._close_failure is not None:
                failure, where = self._close_failure
                raise failure.with_traceback(where)
            return
        self._closing = anyio.Event()
        if self._unregister_metrics is not None:
            self._unregister_metrics()
        if self._tg is None:  # never entered: nothing runs
            await self._shut_down()
            return
        # In a task of its own: an asyncio-native cancel (a timeout around the block,
        # Ctrl-C under ``asyncio.run``) cut the shutdown before it ended the task
        # group, and leaving ``async with`` then waited for ever.
        _, cut = await run_uncut(self._tg, "close", self._shut_down)
        if cut is not None:
            raise cut

    async def _shut_down(self) -> None:
        """``close``'s work, from the launches under way to the task group's end."""
        assert self._closing is not None  # (made by ``close``, which alone calls this)
        try:
            await self._shut_down_once()
        except Exception as e:
            self._close_failure = (e, e.__traceback__)
            raise
        finally:
            self._closing.set()

    async def _shut_down_once(self) -> None:
        with anyio.CancelScope(shield=True):
            while self._launches:  # each ends soon: a launch is bounded, and shielded
                await next(iter(self._launches)).wait()
            owned = [
                actor
                for actor in self._actors.values()
                if not self._backends[parse_handle(actor.handle).backend].durable
            ]
            for actor in owned:
                actor.request_cancel("the supervisor closed")
            for actor in owned:
                await actor.done.wait()
            for scope in list(self._observing):
                scope.cancel()  # their reads must not reach a backend being closed
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

    def _check_loop(self, hint: str = "") -> None:
        """Refuse a verb from another event loop (another thread's) than the one that
        entered this Supervisor: its tasks, events and locks are that loop's, and such a
        call hung for good or left its app recorded wrongly. ``hint``: how else to reach
        that loop, said after "use it from that loop"."""
        if self._loop is None:
            return  # not entered: the verb says so itself
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            how = f" ({hint})" if hint else ""
            raise NotEnteredError(
                "this Supervisor belongs to the event loop that entered it, in another "
                f"thread: use it from that loop{how}, or enter a Supervisor of this loop's own"
            )

    def _task_group(self) -> TaskGroup:
        if self._is_closed:
            # Reads still work after ``close`` through the backends it had in use; one it
            # never used cannot start now.
            raise ShuttingDown("the Supervisor is closed: this needs a backend it had not used")
        if self._tg is None:
            raise NotEnteredError("use the Supervisor inside `async with Supervisor(...) as sv:`")
        return self._tg

    def backend(self, name: str) -> Backend:
        found = self._backends.get(name)
        if found is None:
            factory = self._registry.factory(name)
            context = BackendContext(self.session, self.state_dir, self._task_group(), name)
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

        Run options, the app (with the backend's rules over it under those
        options, ``Backend.check_app``) and ``app_id`` are all checked before one
        ``SpecError`` lists every problem found in them.
        """
        impl = self.backend(backend)
        found: list[SpecError] = []
        # What resolved is checked on: the backend's rules over its options and the app's
        # limits under them (a limit raised by an option given right counts).
        resolved, problems = impl.run_opts().resolve_partly(cfg)
        problems += impl.check_cfg(resolved)
        if problems:
            found.append(SpecError(problems, context="invalid run options"))
        try:
            validate(app, impl.capabilities_for(resolved))
        except SpecError as e:
            found.append(e)
        else:
            # The backend's rules over the app and its options together: listed with the
            # options' problems above, not a round trip after them (from ``dryrun``).
            fitting = impl.check_app(app, resolved)
            if fitting:
                found.append(SpecError(fitting, context="the app does not fit these options"))
        if app_id is not None:
            named = check_name("app_id", app_id, max_length=MAX_APP_ID_LENGTH)
            if named:
                found.append(SpecError(named, context="invalid app id"))
        if found:
            context = found[0].context if len(found) == 1 else "invalid submit"
            raise SpecError([p for e in found for p in e.problems], context=context)
        if self._gpus is None:
            self._gpus = _gpu_count()
        ctx = DryrunContext(
            session=self.session,
            app_id=app_id or make_app_id(app.name, secrets.token_hex(4)),
            cwd=_working_directory(),
            gpu_count=self._gpus,
            backend=backend,
        )
        return DryRunInfo(backend, app, resolved, impl.dryrun(app, resolved, ctx))

    async def schedule(self, info: DryRunInfo) -> str:
        """Launch a dry-run request; returns the handle once the launch was recorded."""
        self._check_loop()
        self._refuse_if_shutting_down("schedule")
        tg = self._task_group()
        impl = self.backend(info.backend)
        handle = make_handle(info.backend, self.session, info.request.app_id)
        if handle in self._actors:
            raise DuplicateAppError(f"{handle} was already scheduled by this Supervisor")
        actor = AppActor(handle, info.request, self._observer, on_done=self._forget)
        launched = anyio.Event()
        self._launches.add(launched)
        try:
            tasks = await actor.open(tg)
            # In a task of its own: an asyncio-native cancel of the caller (through
            # anyio's shield) left what the launch had started with no handle and no
            # record. Such a cancel is raised below, where the app is stopped.
            runtime, cut = await run_uncut(
                tg,
                f"launch of {handle}",
                functools.partial(impl.launch, info.request, actor.post, tasks),
            )
        except BaseException:
            actor.discard()
            raise
        else:
            self._actors[handle] = actor
            actor.begin(runtime)
        finally:
            self._launches.discard(launched)
            launched.set()
        try:
            if cut is not None:
                raise cut
            if not impl.durable:
                # ``close`` began during the launch: it stops this (local) app with the
                # rest. A durable app runs on after ``close`` as the others do: its
                # handle is returned.
                self._refuse_if_shutting_down("submit")
            await actor.settle()
            # Another process asking right after this returns must find the app as it is.
            await actor.record_now()
        except BaseException:
            # The caller was cancelled (or failed) after the launch: no handle reaches it,
            # so nobody could ever stop this app. Stop what was started, then go on raising.
            with anyio.CancelScope(shield=True):
                actor.request_cancel(
                    "the supervisor began shutting down before the submit returned"
                    if self._shutting_down
                    else "the submit was cancelled before it returned"
                )
                await actor.done.wait()
            raise
        return handle

    async def attach(self, handle: str) -> AppStatus:
        """Follow an app launched by another process, or before this one restarted.

        When its owner is gone and its backend lets it outlive its owner (Docker,
        Slurm), this Supervisor becomes its owner: it follows the app as if it had
        launched it, so its retries and gang failure carry on, ``status`` answers
        it from memory and ``watch`` gives its recorded transitions, then the live
        ones. One owner at a time: while the owner lives (or another process took
        it over first) this process observes: ``status`` answers the app from its
        records, kept current in a task until it ends (nothing of it is carried
        out here; ``attach`` it again to take it over once its owner is gone).
        A local app cannot outlive its reaper, so one whose owner died gives its
        recorded state, as does any app that ended. Returns the app's status;
        ``UnknownAppError`` for no app.
        """
        self._check_loop()
        self._refuse_if_shutting_down("attach")
        actor = self._actors.get(handle)
        if actor is not None:
            return _with_metadata(actor)
        parsed = parse_handle(handle)
        tg = self._task_group()
        impl = await self._loaded(parsed.backend)
        adoption = await impl.adopt(parsed)
        if adoption is None:
            described = await self._describe_recorded(parsed)
            if described is None:
                raise UnknownAppError(f"no app {handle}")
            status = described.to_status()
            if status.is_settled:
                self._finished.put(handle, status)
            elif handle not in self._observed:
                self._observed[handle] = status
                tg.start_soon(self._observe, handle, parsed, described)
            return status
        actor = AppActor(handle, adoption.request, self._observer, on_done=self._forget)
        owed = actor.resume(adoption.recorded, adoption.history)
        try:
            # Shielded like a launch: a cancel between taking the lease and following
            # the app would leave it owned by a process that does not follow it.
            with anyio.CancelScope(shield=True):
                tasks = await actor.open(tg)
                runtime = await adoption.start(actor.post, tasks)
        except BaseException:
            actor.discard()
            with anyio.CancelScope(shield=True):
                await adoption.give_up()
            raise
        self._actors[handle] = actor
        actor.begin(runtime, owed)
        await actor.settle()
        await actor.record_now()
        return _with_metadata(actor)

    def _forget(self, actor: AppActor) -> None:
        """The app ended: once its end is on disk, its actor leaves memory.

        Called as ``done`` is set, before any waiter resumes: those who wait on
        it hold the actor itself and are served to the end; any later question
        about the app is answered from its records (``status`` from the cache).
        """
        if actor.final_recorded and self._actors.get(actor.handle) is actor:
            del self._actors[actor.handle]
            self._finished.put(actor.handle, _with_metadata(actor))

    def followed(self) -> list[str]:
        """Handles of the apps this Supervisor holds in memory now.

        An app launched here is held from its submit until it ended and its
        final record is written; then it leaves memory (see the module's
        docstring). The length of this list is what memory grows with.
        """
        return list(self._actors)

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
        self._check_loop()
        self._refuse_if_shutting_down("submit")
        started = time.monotonic()
        handle = await self._submit(app, backend, cfg, idempotency_key)
        metrics.record_submit(backend, time.monotonic() - started)
        return handle

    async def _submit(
        self,
        app: AppDef,
        backend: str,
        cfg: Mapping[str, object] | None,
        idempotency_key: str | None,
    ) -> str:
        await self.prepare(backend)
        if idempotency_key is None:
            return await self.schedule(await self._dryrun_off_loop(app, backend, cfg))
        problems: builtins.list[Problem] = []
        if not isinstance(idempotency_key, str) or not idempotency_key:
            problems.append(Problem("idempotency_key", "must be a non-empty string"))
        try:  # pure: the app's and the options' problems are named with the key's
            info = await self._dryrun_off_loop(app, backend, cfg)
        except SpecError as e:
            if not problems:
                raise
            problems.extend(e.problems)
        if problems:
            raise SpecError(problems, context="invalid submit")
        assert isinstance(idempotency_key, str)  # (checked just above)
        return await submit_once(
            IdempotencyKeys(
                self.state_dir,
                backend,
                self.session,
                self._key_lock_waiters(),
                self._key_queues,
            ),
            idempotency_key,
            # What the options resolve to: 5 and 5.0, or a default left out and given,
            # are the same submit.
            submitted=fingerprint(backend, info.app, info.cfg),
            exists=self.exists,
            prepare=lambda: make_handle(backend, self.session, info.app_id),
            launch=lambda: self.schedule(info),
        )

    def _key_lock_waiters(self) -> anyio.CapacityLimiter:
        """The threads that wait for idempotency keys' locks (see ``IdempotencyKeys``)."""
        if self._key_waiters is None:
            self._key_waiters = anyio.CapacityLimiter(KEY_LOCK_WAITERS)
        return self._key_waiters

    async def _dryrun_off_loop(
        self, app: AppDef, backend: str, cfg: Mapping[str, object] | None
    ) -> DryRunInfo:
        """``dryrun``, in a worker thread for a big app: rendering thousands of replicas
        takes tens of milliseconds the host's event loop would otherwise stall for."""
        if _replicas_asked(app) < DRYRUN_THREAD_REPLICAS:  # (bad input: the dryrun reports it)
            return self.dryrun(app, backend, cfg)
        return await anyio.to_thread.run_sync(self.dryrun, app, backend, cfg)

    async def prepare(self, backend: str) -> None:
        """Let a backend learn what its dryrun depends on (Slurm: version, partitions).

        ``submit`` does this itself; call it before a bare ``dryrun`` of such a
        backend to see the request exactly as ``submit`` would send it.
        """
        self._check_loop()
        impl = await self._loaded(backend)
        await impl.prepare()

    async def _loaded(self, name: str) -> Backend:
        """``backend(name)``, its module imported in a worker thread the first time.

        The verbs that may be the first to touch a backend use this one: an import
        reads and runs the backend's modules, tens of milliseconds the host's loop
        would otherwise stall for (see ``BackendRegistry.unimported``).
        """
        if name not in self._backends:
            module = self._registry.unimported(name)
            if module is not None:
                # One that cannot be imported is said by ``backend`` (UnknownBackendError).
                with contextlib.suppress(ImportError):
                    await anyio.to_thread.run_sync(importlib.import_module, module)
        return self.backend(name)

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Per backend in use: counters of the work done (e.g. squeue calls for Slurm)."""
        return {name: b.statistics() for name, b in self._backends.items()}

    def status(self, handle: str) -> AppStatus | None:
        """A snapshot of an app this Supervisor follows; no I/O. None for any other handle.

        Followed: launched here, or given to ``attach`` (as its owner, or as an
        observer of an app whose owner lives: then the snapshot is its records as
        ``watch`` reads them, each change within about 50 ms where the records are
        on this machine). An app that ended is answered from a cache of the latest
        final statuses (``supervisor.finished``: 256 apps, 4,096 replicas in all);
        one that left it (or that this
        Supervisor's ``gc`` removed) answers None, as an app of another process
        does: ``describe`` or ``wait`` read its records.
        """
        actor = self._actors.get(handle)
        if actor is not None:
            return _with_metadata(actor)
        observed = self._observed.get(handle)
        return observed if observed is not None else self._finished.get(handle)

    async def describe(self, handle: str) -> DescribeAppResponse | None:
        self._check_loop()
        parsed = parse_handle(handle)
        actor = self._actors.get(handle)
        if actor is not None:
            return DescribeAppResponse.from_status(
                parsed.app_id,
                _with_metadata(actor),
                actor.request.app.roles,
                tuple(actor.fsm.history),
            )
        return await self._describe_recorded(parsed)

    async def _describe_recorded(self, parsed: AppHandle) -> DescribeAppResponse | None:
        """An app followed elsewhere, from its backend's records; a damaged one is UNKNOWN."""
        try:
            impl = await self._loaded(parsed.backend)
            return await impl.describe(parsed)
        except DamagedRecordError as e:
            return DescribeAppResponse(parsed.app_id, AppState.UNKNOWN, msg=str(e))

    async def exists(self, handle: str) -> bool:
        return await self.describe(handle) is not None

    async def list(
        self,
        backend: str,
        *,
        state: AppState | str | Collection[AppState | str] | None = None,
        since: datetime | float | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[ListAppResponse]:
        """The apps recorded by ``backend`` in this state directory, newest submitted first.

        Filters: ``state`` (one state or several, by value or name), ``since``
        (submitted at or after: a datetime, naive meaning local time, or epoch
        seconds), ``name`` (the AppDef's name; shell-style wildcards ``*?[]``),
        ``limit`` (at most that many, the newest). Settled apps are listed from
        the index alone (see ``supervisor.backends.store``). A local app whose
        launch is under way is listed once its first state is recorded (before
        its submit returns): until then it has no submit time to be listed by.
        """
        self._check_loop()
        query = _ListQuery.of(state, since, name, limit)
        impl = await self._loaded(backend)
        apps = await impl.list()
        return query.apply(apps)

    async def gc(
        self,
        backend: str,
        *,
        older_than: float | None = None,
        keep: int | None = None,
        dry_run: bool = False,
    ) -> builtins.list[str]:
        """Remove the records, logs and index entries of this session's settled apps.

        Removed: each settled app that ended more than ``older_than`` seconds
        ago, and all but the ``keep`` settled apps that ended last (either may be
        None; not both). Never removed: an app followed here and not yet over,
        an app that is not settled, or one whose end is not recorded while its
        supervising process lives, or whose index entry is damaged, or one a
        submit under its idempotency key may be returning right now (a later gc
        removes it). The idempotency keys of the apps removed go with them. Returns the
        handles removed (with ``dry_run``: those that would be), newest first.
        Once removed, an app is unknown to this Supervisor too: ``status`` answers
        None and ``wait`` raises ``UnknownAppError``, as ``describe`` answers None
        (a gc by another process is not seen by ``status``'s cache of final statuses).
        The file work runs in a worker thread.
        """
        self._check_loop()
        problems = limit_problems(older_than, keep, age="older_than", count="keep")
        if problems:  # Retention's checks, named as this call spells them
            raise SpecError(problems, context="invalid gc")
        impl = await self._loaded(backend)
        index: Index | None = getattr(impl, "index", None)
        if index is None:
            return []
        entries = await anyio.to_thread.run_sync(lambda: list(index.entries()))
        settled: builtins.list[tuple[float, IndexEntry]] = []
        for entry in entries:
            if entry.session != self.session or entry.damage is not None:
                continue
            handle = make_handle(backend, entry.session, entry.app_id)
            if handle in self._actors or entry.app_dir is None:
                continue
            at = await self._settled_at(backend, entry)
            if at is not None:
                settled.append((at, entry))
        settled.sort(key=lambda found: found[0], reverse=True)
        cutoff = None if older_than is None else time.time() - older_than
        doomed = [
            entry
            for rank, (at, entry) in enumerate(settled)
            if (keep is not None and rank >= keep) or (cutoff is not None and at < cutoff)
        ]
        handles = [make_handle(backend, e.session, e.app_id) for e in doomed]
        if dry_run:
            return handles
        keys = IdempotencyKeys(self.state_dir, backend, self.session)
        requests = CancelRequests(self.state_dir, backend)
        entries_of = dict(zip(handles, doomed, strict=True))
        gone: builtins.list[str] = []  # also when a later one fails

        def remove_one(handle: str) -> bool:
            entry = entries_of[handle]
            try:
                if not remove_app(index, entry.session, entry.app_id, entry.app_dir):
                    return False  # another gc (another process) took it first
                # One its owner never read (it died first) would stay for ever.
                requests.withdraw(entry.session, entry.app_id)
            except OSError as e:  # records this process may read but not remove
                raise BackendError(
                    f"cannot remove the records of {handle}: {e}", transient=False
                ) from e
            gone.append(handle)
            return True

        def remove() -> builtins.list[str]:
            try:
                # Each app under the locks of its idempotency keys, which go with it.
                return keys.remove_apps(handles, remove_one)
            except OSError as e:
                raise BackendError(
                    f"cannot remove the idempotency keys under {keys.root}: {e}", transient=False
                ) from e

        try:
            return await anyio.to_thread.run_sync(remove)
        finally:
            for handle in gone:
                # ``status`` and ``wait`` answered it from memory while ``describe`` said None.
                self._finished.drop(handle)

    async def _settled_at(self, backend: str, entry: IndexEntry) -> float | None:
        """When a removable app ended (else submitted); None when it must stay."""
        if entry.summary is not None:  # written with its final record
            times = entry.summary.times
        else:
            parsed = AppHandle(backend, entry.session, entry.app_id)
            described = await self._describe_recorded(parsed)
            if described is None or not described.to_status().is_settled:
                return None
            assert entry.app_dir is not None
            if not await anyio.to_thread.run_sync(end_is_known, entry.app_dir):
                return None
            times = described.times
        at = times.ended if times.ended is not None else times.submitted
        if at is None and entry.path is not None:
            with contextlib.suppress(OSError):
                at = (await anyio.Path(entry.path).stat()).st_mtime
        return at if at is not None else 0.0

    async def _retain(self, retention: Retention) -> None:
        """Apply ``retention`` every ``interval`` seconds to each backend in use here or
        holding apps of this session: a restarted service that has only waited for
        requests so far still has its last run's apps to sweep."""
        while True:
            await anyio.sleep(retention.interval)
            for name in await anyio.to_thread.run_sync(self._backends_with_apps):
                try:
                    await self.gc(name, older_than=retention.max_age, keep=retention.max_count)
                except Exception:
                    # The next sweep tries again; the apps are not harmed by a late one.
                    _log.warning("retention sweep of backend %s failed", name, exc_info=True)

    def _backends_with_apps(self) -> builtins.list[str]:
        """Blocking: the registered backends in use here or indexing apps of this session."""
        return [
            name
            for name in self._registry.names()
            if name in self._backends or (Index(self.state_dir, name).root / self.session).is_dir()
        ]

    # ------------------------------------------------------------ the cluster
    def _cluster_backend(self, backend: str, what: str) -> Any:
        impl = self.backend(backend)
        if not callable(getattr(impl, "cluster_info", None)):
            raise SpecError(
                [Problem("backend", f"{backend!r} has no cluster to {what}; slurm has")],
                context="invalid request",
            )
        return impl

    async def cluster(self, backend: str = "slurm", *, partition: str | None = None) -> ClusterInfo:
        """The cluster's partitions and nodes (state, CPUs, memory, GRES), as ``sinfo`` shows.

        With ``partition``, that partition and its nodes only. A backend with no
        cluster (local, docker) raises ``SpecError``.
        """
        self._check_loop()
        info: ClusterInfo = await self._cluster_backend(backend, "show").cluster_info(partition)
        return info

    async def cluster_jobs(
        self,
        backend: str = "slurm",
        *,
        user: str | None = None,
        states: Collection[str] = (),
        partition: str | None = None,
    ) -> builtins.list[ClusterJob]:
        """Every job the scheduler holds, anyone's, as ``squeue`` shows; ours carry ``handle``.

        Filters: the job's ``user``, its Slurm ``states`` (PENDING, RUNNING, ...;
        any case) and ``partition``.
        """
        self._check_loop()
        impl = self._cluster_backend(backend, "list")
        jobs: builtins.list[ClusterJob] = await impl.cluster_jobs()
        wanted = {s.upper() for s in states}
        return [
            j
            for j in jobs
            if (user is None or j.user == user)
            and (not wanted or j.state in wanted)
            and (partition is None or j.partition == partition)
        ]

    async def matching(
        self,
        backend: str,
        *,
        states: AppState | str | Collection[AppState | str] = (),
        partition: str | None = None,
    ) -> builtins.list[ListAppResponse]:
        """This session's apps on ``backend`` that have not ended, filtered: ``states`` are
        app states (PENDING, RUNNING, ...), ``partition`` the Slurm partition their job is in.

        Never another session's app, nor a job this library did not launch: what
        ``cancel_matching`` (and ``asupervisor cancel --state/--partition/--all``) stops.
        """
        self._check_loop()
        # One state alone is one state (not its letters); AppState members as themselves.
        given = [states] if isinstance(states, str | AppState) else list(states)
        wanted = {s.name if isinstance(s, AppState) else str(s).upper() for s in given}
        unknown = sorted(wanted - AppState.__members__.keys())
        if unknown:
            known = ", ".join(AppState.__members__)
            raise SpecError(
                [Problem("states", f"{', '.join(unknown)}: not app states ({known})")],
                context="invalid filter",
            )
        ours = [
            a
            for a in await self.list(backend)
            if parse_handle(a.app_handle).session == self.session
            and a.state.name not in TERMINAL
            and (not wanted or a.state.name in wanted)
        ]
        if partition is not None:
            jobs = await self.cluster_jobs(backend, partition=partition)
            in_partition = {j.handle for j in jobs if j.handle is not None}
            ours = [a for a in ours if a.app_handle in in_partition]
        return ours

    async def cancel_matching(
        self,
        backend: str,
        *,
        states: AppState | str | Collection[AppState | str] = (),
        partition: str | None = None,
    ) -> builtins.list[str]:
        """Cancel what ``matching`` finds; the handles asked to stop."""
        found = await self.matching(backend, states=states, partition=partition)
        for app in found:
            await self.cancel(app.app_handle)
        return [a.app_handle for a in found]

    async def cancel(self, handle: str) -> None:
        """Ask the app to stop and return at once; repeating it, or a finished app, is fine."""
        self._check_loop()
        actor = self._actors.get(handle)
        if actor is not None:
            if actor.runtime is not None and not actor.done.is_set():
                try:
                    await actor.runtime.record_cancel()  # durable first, then carried out
                except anyio.get_cancelled_exc_class():
                    # Asked all the same: a cancel of the caller cut the record short
                    # (an asyncio-native one goes through anyio's shields), and the app
                    # ran on for good, its record saying a cancel was under way.
                    actor.request_cancel()
                    raise
            actor.request_cancel()
            return
        parsed = parse_handle(handle)
        impl = await self._loaded(parsed.backend)
        if not await impl.cancel(parsed):
            raise UnknownAppError(f"no app {handle}")

    async def hold(self, handle: str) -> None:
        """Keep a pending app from starting until ``release`` (Slurm: ``scontrol hold``).

        Its state stays PENDING with the scheduler's reason (JobHeldUser). An
        app nobody recorded raises ``UnknownAppError``, on any backend; a
        backend that cannot hold (local, docker) raises ``SpecError``.
        """
        self._check_loop()
        await self._hold(handle, release=False)

    async def release(self, handle: str) -> None:
        """Let a held app start (Slurm: ``scontrol release``); see ``hold``."""
        self._check_loop()
        await self._hold(handle, release=True)

    async def _hold(self, handle: str, *, release: bool) -> None:
        parsed = parse_handle(handle)
        impl = await self._loaded(parsed.backend)
        try:
            held = await impl.hold(parsed, release=release)
        except SpecError:
            # A backend that cannot hold refuses without looking: an app nobody recorded
            # is unknown there too, as every other verb says (the CLI's exit 1, not 2).
            # Looked up only here, so a hold that works costs no extra describe.
            if handle not in self._actors and await self._describe_recorded(parsed) is None:
                raise UnknownAppError(f"no app {handle}") from None
            raise
        if not held:
            raise UnknownAppError(f"no app {handle}")

    async def wait(self, handle: str, timeout: float | None = None) -> AppStatus:
        """The final status, once the app is terminal (event-driven for apps launched here).

        Raises ``WaitTimeout`` after ``timeout`` seconds, and ``ShuttingDown`` once
        ``begin_shutdown`` (or ``close``) was called before the app ended.
        ``timeout`` is seconds (>= 0; 0 only looks) or None (no limit); the records
        of an app followed elsewhere are read once before it starts to count.
        """
        self._check_loop()
        problem = _timeout_problem(timeout)
        if problem:
            raise SpecError([Problem("timeout", problem)], context="invalid wait")
        started = time.monotonic()
        parsed = parse_handle(handle)
        status = self._ended_here(handle)
        if status is None:
            self._refuse_if_shutting_down(f"wait for {handle}")
            if timeout is not None and handle not in self._actors:
                # The deadline bounds the waiting, not the first look: ``timeout=0`` looks
                # once, and a short one is not spent before the app's records were read.
                status = await self._settled_on_record(parsed)
            if status is None:
                status = await self._wait_within(handle, parsed, timeout)
        metrics.record_wait(parsed.backend, time.monotonic() - started)
        return status

    def _ended_here(self, handle: str) -> AppStatus | None:
        """The final status of an app that ended here, held or cached; no I/O."""
        actor = self._actors.get(handle)
        if actor is not None:
            return _with_metadata(actor) if actor.done.is_set() else None
        return self._finished.get(handle)

    async def _settled_on_record(self, parsed: AppHandle) -> AppStatus | None:
        """The recorded status of an app followed elsewhere if it is settled; else None."""
        described = await self._describe_recorded(parsed)
        if described is None:
            raise UnknownAppError(f"no app {parsed}")
        status = described.to_status()
        return status if status.is_settled else None

    async def _wait_within(
        self, handle: str, parsed: AppHandle, timeout: float | None
    ) -> AppStatus:
        status: AppStatus | None = None
        with anyio.move_on_after(timeout):
            with anyio.CancelScope() as shutdown:  # only begin_shutdown cancels this one
                self._open_waits.add(shutdown)
                if self._shutting_down:  # it began before this scope was there to cancel
                    shutdown.cancel()
                try:
                    status = await self._wait(handle, parsed)
                finally:
                    self._open_waits.discard(shutdown)
            if shutdown.cancelled_caught:
                raise ShuttingDown(f"the Supervisor began shutting down while waiting for {handle}")
        if status is None:
            raise WaitTimeout(f"{handle} was not terminal after {timeout} s")
        return status

    async def _wait(self, handle: str, parsed: AppHandle) -> AppStatus:
        actor = self._actors.get(handle)
        if actor is not None:
            await actor.done.wait()
            return _with_metadata(actor)
        finished = self._finished.get(handle)
        if finished is not None:
            return finished
        # Another process follows this app: its backend tells when its records say it ended.
        try:
            impl = await self._loaded(parsed.backend)
            status = await impl.wait_foreign(parsed)
        except DamagedRecordError as e:
            # Nothing more can be learned from it: as settled as UNKNOWN ever is.
            return AppStatus(AppState.UNKNOWN, msg=str(e))
        if status is None:
            raise UnknownAppError(f"no app {handle}")
        return status

    def events(self, max_buffer: int = DEFAULT_MAX_BUFFER) -> EventStream:
        """Every transition of every app this Supervisor follows, from now on, as they happen.

        One stream for all apps (``watch`` follows one), app and replica level, each
        app's transitions in order. An app ``attach`` observes (its owner, another
        process, lives) is in it from the attach on: what its records say from then
        on, as ``watch`` reads them, so a service's dashboard shows the apps of its
        other replicas too. It ends when the Supervisor closes. A reader more
        than ``max_buffer`` events behind gets ``EventsOverflowError`` once (the
        stream goes on after the gap); publishing never waits for a reader.
        """
        self._check_loop()
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or max_buffer < 1:
            problem = Problem(
                "max_buffer", f"must be a whole number of at least 1, not {max_buffer!r}"
            )
            raise SpecError([problem], context="invalid events")
        if self._tg is None and not self._is_closed:  # it would wait for a close never coming
            raise NotEnteredError("use the Supervisor inside `async with Supervisor(...) as sv:`")
        return self._observer.bus.open(max_buffer)

    async def watch(self, handle: str) -> AsyncGenerator[Transition, None]:
        """Every transition of an app, app and replica level, in order, to the end.

        Of an app launched here, each as it happens. Of an app another process
        follows (or that ended and left memory here), the transitions recorded so far,
        then each one as it is recorded, never one twice. Ends early, after the
        transitions so far, once ``begin_shutdown`` is called. ``UnknownAppError``
        for a handle of no app.
        """
        self._check_loop()
        actor = self._actors.get(handle)
        if actor is None:
            async for recorded in self._watch_recorded(handle):
                yield recorded
            return
        async for t in actor.transitions(stop=lambda: self._shutting_down):
            yield t

    async def _watch_recorded(self, handle: str) -> AsyncIterator[Transition]:
        """An app this Supervisor does not follow: its recorded transitions, then each one
        recorded after them, until it settles. The journal only grows: a transition is
        never given twice.

        An end no journal holds (the owner died first: ``wait`` says UNKNOWN) is
        given last, as the steps the state table takes to it, numbered after the
        journal: a watch ends where ``wait`` and ``describe`` do.
        """
        parsed = parse_handle(handle)
        described = await self._describe_recorded(parsed)
        if described is None:
            raise UnknownAppError(f"no app {handle}")
        # The longest journal read: one read shorter (damaged since) takes nothing back,
        # and the end's steps are numbered after what was given.
        given: Sequence[Transition] = ()
        last = described
        async with contextlib.aclosing(self._recorded_views(parsed, described)) as views:
            async for found in views:
                for recorded in found.transitions[len(given) :]:
                    yield recorded
                if len(found.transitions) > len(given):
                    given = found.transitions
                last = found
        status = last.to_status()
        if status.is_settled:  # none when the journal reached it (the table drops it)
            for step in closing_steps(given, status, None, time.time()):
                yield step

    async def _recorded_views(
        self, parsed: AppHandle, described: DescribeAppResponse, *, to_shutdown: bool = True
    ) -> AsyncGenerator[DescribeAppResponse, None]:
        """``described``, then the app's records again each time they may have changed,
        until it settles (or is removed; or, with ``to_shutdown``, ``begin_shutdown``).

        Its records are read again whenever its directory changes (inotify, where the
        app's records are on this machine) and at an interval growing to
        ``RECORDED_RECHECK_S`` besides, for what no file shows (the scheduler's view of
        an app nobody follows, an owner's death).
        """
        wake = [anyio.Event()]
        self._follows.add(wake[0])  # begin_shutdown sets it
        hub, token, wd = self._watch_hub, WatchHub.new_token(), None
        index: Index | None = getattr(await self._loaded(parsed.backend), "index", None)
        try:
            if hub is not None and index is not None and not described.to_status().is_settled:
                try:
                    app_dir = await anyio.to_thread.run_sync(
                        index.lookup, parsed.session, parsed.app_id
                    )
                except DamagedRecordError:
                    app_dir = None  # its records say so as they are read below: no wake-ups
                if app_dir is not None:
                    wd = hub.subscribe(app_dir, token, lambda _event: wake[0].set())
            interval = RECORDED_FIRST_S
            settled_at: float | None = None
            while True:
                yield described
                status = described.to_status()
                if status.is_settled:
                    # A scheduler may tell the end before the app's owner recorded it:
                    # its journal gets a little while to catch up, then the follow ends.
                    # Not for UNKNOWN: that is what is said once nobody is left to record
                    # an end (its owner died, its record is damaged).
                    now = time.monotonic()
                    settled_at = now if settled_at is None else settled_at
                    if _journal_ends(described.transitions, status.state):
                        return
                    if status.state is AppState.UNKNOWN:
                        return
                    if now - settled_at >= RECORDED_END_GRACE_S:
                        return
                if to_shutdown and self._shutting_down:
                    return
                with anyio.move_on_after(interval):
                    await wake[0].wait()
                woken = wake[0].is_set() and not self._shutting_down
                self._follows.discard(wake[0])
                wake[0] = anyio.Event()
                self._follows.add(wake[0])
                if to_shutdown and self._shutting_down:
                    return
                interval = RECORDED_FIRST_S if woken else min(interval * 2, RECORDED_RECHECK_S)
                found = await self._describe_recorded(parsed)
                if found is None:
                    return  # removed meanwhile (gc): nothing more will be recorded
                described = found
        finally:
            self._follows.discard(wake[0])
            if wd is not None and hub is not None:
                hub.unsubscribe(wd, token)

    async def _observe(
        self, handle: str, parsed: AppHandle, described: DescribeAppResponse
    ) -> None:
        """Keep the ``status`` of an app attached to as an observer current, to its end.

        From its records, as ``watch`` reads them, until it settles (then the
        cache of ended apps answers it), is removed, this Supervisor takes it over
        (a later ``attach`` after its owner died), or the Supervisor closes. A
        backend that cannot be read (an engine away) leaves the last snapshot in
        place and is asked again, as a later ``describe`` would be.
        """
        scope = anyio.CancelScope()
        self._observing.add(scope)  # ``close`` ends it before the backends close
        try:
            with scope:
                await self._follow_observed(handle, parsed, described)
        finally:
            self._observing.discard(scope)
            status = self._observed.pop(handle, None)  # ``attach`` put the first one
            if status is not None and status.is_settled and handle not in self._actors:
                self._finished.put(handle, status)  # even when the close cut the follow short

    async def _follow_observed(
        self, handle: str, parsed: AppHandle, start: DescribeAppResponse
    ) -> None:
        """``_observe``'s follow: each view's status into ``_observed``, and each transition
        recorded after ``start`` (the view ``attach`` answered from) to the ``events()``
        stream, as ``watch`` gives them: once each, in order, then the steps to an end no
        journal holds. Only to the stream: the owner's process logs and counts them.

        The longest journal read is what was given, across a backend that could not be
        read for a while too: a view read again gives only what came after it.
        """
        given: Sequence[Transition] = start.transitions
        found: DescribeAppResponse | None = start
        while handle not in self._actors:
            try:
                if found is None:
                    found = await self._describe_recorded(parsed)
                    if found is None:
                        return  # removed meanwhile (gc)
                views = self._recorded_views(parsed, found, to_shutdown=False)
                async with contextlib.aclosing(views) as found_views:
                    async for found in found_views:
                        if handle in self._actors:
                            return  # taken over: its actor publishes from its journal on
                        self._observed[handle] = found.to_status()
                        if len(found.transitions) > len(given):
                            self._observer.bus.publish(handle, found.transitions[len(given) :])
                            given = found.transitions
                status = found.to_status()
                if status.is_settled:  # none when the journal reached it
                    self._observer.bus.publish(
                        handle, closing_steps(given, status, None, time.time())
                    )
                return
            except BackendError:
                found = None
                await anyio.sleep(RECORDED_RECHECK_S)

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
    ) -> AsyncGenerator[str, None]:
        """Lines of one replica's output, each with its ``\\n``; see logs.iter_log_lines.

        A follow (``should_tail=True``) ends with the app, or, after the lines
        already in the files, once ``begin_shutdown`` is called.
        """
        self._check_loop()
        query = check_log_query(streams, regex, since, until, k)  # before any lookup
        target, app_end = await self._log_target(handle, role_name, k)
        finished: EndSignal | None = app_end
        stop_watching = anyio.Event()
        is_finished = target.is_finished
        copied = target.copied
        if copied is not None and (not should_tail or finished is None or finished.is_set()):
            # Also a follow of an app that already ended: its last copies may still be
            # rewriting an attempt's files (a docker copy found wrong at the exit). An
            # app known from its records (``finished`` None: another process's, or one
            # that ended and left memory) answers at once while it runs.
            await copied()
        elif copied is not None and finished is not None:
            # The app ended (``finished``) before its last output reached the files:
            # the follow ends once both are true.
            app_done, copies_done = finished, EndSignal()
            finished = copies_done
            is_finished = _is_set(copies_done)

            async def ended() -> None:
                await app_done.wait()
                await copied()

            self._task_group().start_soon(_set_when_ended, ended, copies_done, stop_watching)
        if finished is None and target.ended is not None and should_tail and not self._is_closed:
            # The backend has an event for "no more output" (another process's app
            # whose owner died): it ends the follow at once.
            finished = EndSignal()
            self._task_group().start_soon(_set_when_ended, target.ended, finished, stop_watching)
        follow_end: EndSignal | None = None
        heard: EndSignal | None = None  # what follow_end listens to
        if should_tail:
            # What ends this follow: the app's end as above, or begin_shutdown (which
            # sets every such event; the app's own event is shared, so not that one).
            follow_end = EndSignal()  # its followers wait without a task per wait
            if self._shutting_down:
                follow_end.set()
            elif finished is not None:
                # A listener, not a task (and its task group) per follower: a
                # thousand followers started together felt those.
                heard = finished
                heard.listen(follow_end.set)
            finished = follow_end
            self._follows.add(follow_end)
        try:
            async for line in iter_log_lines(
                target.directory,
                stream=query.stream,
                regex=query.pattern,
                since=query.since,
                until=query.until,
                should_tail=should_tail,
                is_finished=is_finished,
                extra_watch_dirs=target.watch_dirs,
                finished_event=finished,
                watch_hub=self._watch_hub,
            ):
                yield line
        finally:
            stop_watching.set()
            if heard is not None and follow_end is not None:
                heard.unlisten(follow_end.set)
            if follow_end is not None:
                self._follows.discard(follow_end)

    async def _log_target(
        self, handle: str, role: str, k: int
    ) -> tuple[LogTarget, EndSignal | None]:
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
        backend = await self._loaded(parsed.backend)
        described = await self._describe_recorded(parsed)
        # An app of this process that ended and left memory is known by its cached final
        # status too, for a backend that keeps no records of its own to describe it by.
        status = described.to_status() if described is not None else self._finished.get(handle)
        if status is None:
            raise UnknownAppError(f"no app {handle}")
        if status.replica(role, k) is None:
            # Without roles (its record is damaged) the reason is all there is to say.
            damaged = described is not None and not described.roles and described.msg
            why = f": {described.msg}" if damaged and described is not None else ""
            raise UnknownAppError(f"{handle} has no replica {role}/{k}{why}")
        target = await backend.log_target(parsed, role, k)
        if target is None:
            raise UnknownAppError(f"no app {handle}")
        return target, None


class _StateCounts:
    """The Supervisor's apps and replicas by state, for the metrics' observable counters."""

    def __init__(self, actors: Mapping[str, AppActor]) -> None:
        self._actors = actors

    def app_states(self) -> list[tuple[str, str, int]]:
        counts: dict[tuple[str, str], int] = {}
        for actor in list(self._actors.values()):
            key = (actor.backend_name, actor.fsm.state.name)
            counts[key] = counts.get(key, 0) + 1
        return [(backend, state, n) for (backend, state), n in counts.items()]

    def replica_states(self) -> list[tuple[str, str, int]]:
        counts: dict[tuple[str, str], int] = {}
        for actor in list(self._actors.values()):
            for state, n in actor.fsm.replica_counts().items():
                key = (actor.backend_name, state.name)
                counts[key] = counts.get(key, 0) + n
        return [(backend, state, n) for (backend, state), n in counts.items() if n]
