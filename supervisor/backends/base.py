"""The contract between the Supervisor and a backend, and the backend registry.

A backend turns an AppDef into a printable request (``dryrun``, pure), carries
out requests and actions (``launch``, ``AppRuntime.stop``/``restart``), and
reports what it observes as normalized events through an ``EventSink``. It
never decides an app's state. Apps it launched are followed by their actor;
apps launched elsewhere (another process, an earlier run) are answered from
the backend's own records (``describe``, ``list``, ``cancel``, ``log_target``).

A new backend implements five methods: ``Backend.dryrun`` and ``launch``, and its
runtime's ``stop``, ``restart`` and ``log_target``. Everything else has a default:
no run options, every retry policy, and no records, so that only the Supervisor
that launched an app sees it. A backend whose apps others can see overrides the
record keeping (``AppRuntime.record``) and the answers from records.

``launch`` is given the app's own task group (``AppTasks``): the background work
of one app runs there, that of the whole backend (a poller, an engine's event
stream) in ``BackendContext.task_group``.

Backends are looked up by name: built-ins first, then the
``asupervisor.backends`` entry-point group, so a third party adds one with a
line in its own pyproject. Each Supervisor has its own registry instance.
"""

from __future__ import annotations

import abc
import importlib
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVarTuple, Unpack

import anyio
from anyio.abc import TaskGroup

from supervisor.errors import MissingExtraError, Problem, SpecError, UnknownBackendError
from supervisor.events import ReplicaEvent, ReplicaKey
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle, make_handle
from supervisor.status import AppStatus, DescribeAppResponse, ListAppResponse, Transition
from supervisor.validate import Capabilities

__all__ = [
    "CANCELLED_ELSEWHERE",
    "Adoption",
    "AppCancelRequested",
    "AppNotice",
    "AppRuntime",
    "AppTasks",
    "Backend",
    "BackendContext",
    "BackendRegistry",
    "DryrunContext",
    "EventSink",
    "LogTarget",
    "Request",
]

ENTRY_POINT_GROUP = "asupervisor.backends"

BUILTIN_BACKENDS: Mapping[str, str] = {
    "local": "supervisor.backends.local:LocalBackend",
    "slurm": "supervisor.backends.slurm:SlurmBackend",
    "docker": "supervisor.backends.docker:DockerBackend",
}


CANCELLED_ELSEWHERE = "cancelled by another process"
"""The reason of an ``AppCancelRequested`` another process asked for (its ``cancel`` of
an app this one follows): one wording on every backend."""


@dataclass(frozen=True, kw_only=True)
class AppCancelRequested:
    """A cancel arrived through the backend itself (another process, the scheduler)."""

    reason: str = "cancelled by request"


@dataclass(frozen=True, kw_only=True)
class AppNotice:
    """A condition worth showing in the app's status ``msg`` while it lasts ("" clears it).

    For trouble that changes no state: a scheduler that does not answer, a
    state the backend does not know. ``fatal``: the backend lost track of the
    app and cannot go on; the app then ends as UNKNOWN with this message, after
    its replicas were asked to stop.
    """

    message: str
    fatal: bool = False


EventSink = Callable[[ReplicaEvent | AppCancelRequested | AppNotice], None]
"""Where a backend posts events; never blocks (it is the app actor's mailbox)."""


_Args = TypeVarTuple("_Args")


class AppTasks:
    """One app's own task group, where its runtime starts the app's background work.

    Each app's work (its actor, the actions its machines decide, and whatever
    its runtime follows: a process's pipes, a container's output, a Slurm job)
    runs in a task group of that app, inside the Supervisor's. So nothing of an
    app outlives it unseen: the group ends when the app's last task does. And
    one app's broken task stays that app's problem: an unexpected error in a
    task started here ends the app as UNKNOWN (its replicas stopped, the reason
    in its status) instead of cancelling every other app with it.
    """

    def __init__(self, group: TaskGroup, broken: Callable[[str, Exception], None]) -> None:
        self._group = group
        self._broken = broken

    def start_soon(self, func: Callable[[Unpack[_Args]], Awaitable[object]], *args: *_Args) -> None:
        """Run ``func(*args)`` as a task of this app."""
        self._group.start_soon(self._guarded, func, args)

    async def _guarded(
        self, func: Callable[[Unpack[_Args]], Awaitable[object]], args: tuple[*_Args]
    ) -> None:
        try:
            await func(*args)
        except Exception as exc:
            self._broken(f"running {getattr(func, '__qualname__', repr(func))}", exc)


@dataclass(frozen=True)
class BackendContext:
    """What every backend of one Supervisor shares.

    ``task_group`` is the Supervisor's: the background work of the whole backend
    (a poller, an engine's event stream) lives and dies with the Supervisor. The
    work of one app goes into that app's ``AppTasks`` instead.
    """

    session: str
    state_dir: Path
    task_group: TaskGroup
    name: str
    """The name the backend is registered under: the scheme of every handle it makes
    (``Supervisor(backends={"alias": LocalBackend})`` gives ``alias://`` handles)."""


@dataclass(frozen=True)
class DryrunContext:
    """Everything ``dryrun`` may depend on besides the app and options, so it stays pure."""

    session: str
    app_id: str
    cwd: str
    gpu_count: int = 0
    backend: str = ""
    """The name the backend is registered under ("": its usual name)."""


@dataclass(frozen=True)
class Request:
    """What ``dryrun`` produced; backends subclass it. ``str()`` shows it to people."""

    backend: str
    session: str
    app_id: str
    app: AppDef
    cfg: ResolvedCfg

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "session": self.session, "app_id": self.app_id}

    @staticmethod
    def fields_from_json(d: Mapping[str, Any], app: AppDef) -> dict[str, Any]:
        """The fields every request has, from what ``to_json`` recorded: where a backend's
        ``from_json`` starts (the run options are not recorded; following needs none)."""
        return {
            "backend": str(d["backend"]),
            "session": str(d["session"]),
            "app_id": str(d["app_id"]),
            "app": app,
            "cfg": ResolvedCfg(),
        }


@dataclass(frozen=True)
class Adoption:
    """An app this process took over from an owner that is gone (``Backend.adopt``).

    ``recorded`` and ``history`` are the app's last recorded status and its
    journal, from which the app's machines carry on. ``start`` begins to follow
    it: the runtime reports, through the sink, what changed while nobody followed
    the app, then every change as it happens. ``give_up`` hands the app back
    (its lease released) when ``start`` is never called or fails.
    """

    request: Request
    recorded: AppStatus
    history: Sequence[Transition]
    start: Callable[[EventSink, AppTasks], Awaitable[AppRuntime]]
    give_up: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class LogTarget:
    """Where one replica's logs are and how to tell that no more will come.

    ``ended``, where the backend has such an event, returns once no more output
    can come however ``is_finished`` would answer later (the process that
    followed the app died): followers then stop at once instead of at their
    next re-check.

    ``copied``, where the backend reports an exit before the files hold all of
    the output (docker: the engine's last fetch is slow), returns once the
    output of every attempt that ended so far is in the files. A read to the
    end waits for it, so ``wait`` then ``log_iter`` never misses a last line.
    """

    directory: Path
    is_finished: Callable[[], Awaitable[bool]]
    watch_dirs: Sequence[Path] = field(default_factory=tuple)
    ended: Callable[[], Awaitable[None]] | None = None
    copied: Callable[[], Awaitable[None]] | None = None


class AppRuntime(abc.ABC):
    """A launched app as its backend sees it; driven only by the app's actor."""

    @abc.abstractmethod
    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        """Stop replicas; each answers with an ``Exited`` event."""

    @abc.abstractmethod
    async def restart(self, attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
        """Stop what runs of these replicas, then launch each as the given attempt."""

    async def record(  # noqa: B027 - optional hook, empty on purpose
        self, status: AppStatus, transitions: Sequence[Transition], final: bool
    ) -> None:
        """Keep the app's state where other processes can read it.

        This default keeps nothing: only the Supervisor that launched the app sees it.
        """

    @abc.abstractmethod
    def log_target(self, role: str, replica_id: int) -> LogTarget: ...

    async def record_cancel(self) -> None:  # noqa: B027 - most backends have nothing to record
        """Keep a cancel where it outlives this process, before it is carried out.

        Durable backends (apps outlive their Supervisor) make the cancel durable
        here: a Supervisor that closes before the stop is done, or dies, leaves
        the request for whoever looks next. Others need nothing.
        """

    def refuse_starts(self) -> None:  # noqa: B027 - optional hook, empty on purpose
        """A cancel of the app was asked: start no new attempt of any replica from now on.

        Called by the app's actor at once, when the cancel is asked, before the
        actor applies it: the ``stop`` it then decides comes some turns of the
        loop later, while a restart under way could start its new attempt, and
        user code would run after the cancel returned. Must not block or raise.
        A start already under way is the stop's to end. This default does
        nothing (a backend whose restarts are not its own to start).
        """

    def metadata(self) -> Mapping[str, str]:
        """What the backend knows the app by (Slurm: ``slurm_job_id``), for its status."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty on purpose
        """Release what the runtime holds once the app is terminal (this default: nothing)."""


class Backend(abc.ABC):
    name: ClassVar[str]
    durable: ClassVar[bool] = False
    """True when apps outlive their Supervisor (a scheduler owns them): closing then
    stops following them instead of cancelling them."""

    def __init__(self, context: BackendContext) -> None:
        self.context = context

    def handle(self, session: str, app_id: str) -> str:
        """The handle of an app of this backend, under the name it is registered as."""
        return make_handle(self.context.name, session, app_id)

    @classmethod
    def run_opts(cls) -> RunOpts:
        """The options ``cfg`` accepts (this default: none)."""
        return RunOpts()

    @property
    def capabilities(self) -> Capabilities:
        """What the backend can honour (this default: every retry policy, no mounts)."""
        return Capabilities(backend=self.name)

    def capabilities_for(self, cfg: ResolvedCfg) -> Capabilities:
        """What this backend can honor under these run options (a limit ``cfg`` raises)."""
        return self.capabilities

    def check_cfg(self, cfg: ResolvedCfg) -> list[Problem]:
        """Every problem of ``cfg`` beyond each option's type and bounds (the forms an
        option must take, which options go together), returned, not raised: a dry run
        lists them with the app's (this default: none).

        ``cfg`` may hold options that did not resolve (``cfg.unresolved``, at their
        defaults): a rule over one of those is skipped. ``dryrun`` may check the
        same again; it is not called while any problem stands.
        """
        return []

    def check_app(self, app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
        """Every problem of ``app`` under ``cfg`` that this backend's rules find beyond
        ``validate``'s (a count of nodes named against the nodes the app runs on, what
        one replica's grouping needs), returned, not raised: a dry run lists them with
        the options' problems, not one round trip after them (this default: none).

        Called only for an app that validated (an invalid one is named by its own
        problems), and also while ``cfg`` has problems of its own: a rule over an
        option in ``cfg.unresolved`` (at its default) is skipped, and one over an
        option whose form ``check_cfg`` refuses judges what it can and never raises.
        A rule needing what only the dry run knows (``DryrunContext``) or an answer
        from the system stays in ``dryrun``; ``dryrun`` must refuse what this finds
        too (call the same functions), as a backend used directly is not checked here.
        """
        return []

    @abc.abstractmethod
    def dryrun(self, app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext) -> Request:
        """Pure: the exact request, deterministic for the same inputs."""

    @abc.abstractmethod
    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> AppRuntime:
        """Start the request; side effects happen here. Raises SubmitError and leaves nothing.

        ``sink`` takes the app's events; ``tasks`` is the app's own task group,
        for the work that follows the app (see ``AppTasks``).
        """

    # Apps this Supervisor does not hold in memory: launched by another process, or here
    # and ended. These defaults are those of a backend that keeps no records, whose
    # apps only the Supervisor that launched them sees, while they run.

    async def describe(self, handle: AppHandle) -> DescribeAppResponse | None:
        """An app this process does not follow; None if it does not exist (this default)."""
        return None

    async def list(self) -> list[ListAppResponse]:
        """The apps of this backend its records know (this default: none)."""
        return []

    async def cancel(self, handle: AppHandle) -> bool:
        """Ask for an app this process does not follow to be cancelled; False if unknown."""
        return False

    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        """Where the logs of a replica of an app this process does not follow are (None:
        nowhere, this default)."""
        return None

    async def hold(self, handle: AppHandle, release: bool = False) -> bool:
        """Keep a pending app from starting (``release``: let it start); False if unknown.

        Only a scheduler can hold a job: this default refuses, naming the backend.
        """
        verb = "release" if release else "hold"
        raise SpecError(
            [Problem("handle", f"the {self.name} backend cannot {verb} apps (slurm can)")],
            context=f"cannot {verb} {handle}",
        )

    async def wait_foreign(self, handle: AppHandle) -> AppStatus | None:
        """Wait for an app another process follows to end; None if it does not exist.

        This default re-reads ``describe`` with a growing interval, for backends
        that offer no change notification; backends that do override it.
        """
        interval = 0.05
        while True:
            found = await self.describe(handle)
            if found is None:
                return None
            status = found.to_status()
            if status.is_settled:
                return status
            await anyio.sleep(interval)
            interval = min(interval * 2, 1.0)

    async def adopt(self, handle: AppHandle) -> Adoption | None:
        """Become the owner of an app whose owner is gone (``Supervisor.attach``).

        None when this process cannot own it: its owner lives (this process then
        observes it), it ended, or its replicas cannot outlive their owner, as a
        local app's cannot outlive its reaper (this default). A backend that says
        yes holds the app's lease from here: no other process takes it over.
        """
        return None

    async def prepare(self) -> None:  # noqa: B027 - optional hook, empty on purpose
        """Learn what ``dryrun`` needs to know about the backend (a cluster's version, ...)."""

    def statistics(self) -> dict[str, Any]:
        """Counters of the work done for this Supervisor (calls made, ...)."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty on purpose
        """Release backend-wide resources; called once when the Supervisor closes."""


BackendFactory = Callable[[BackendContext], Backend]


def _module_and_attr(spec: str) -> tuple[str, str]:
    """A backend named by ``"package.module:factory"``: its module and attribute."""
    module, _, attr = spec.partition(":")
    return module, attr


class BackendRegistry:
    """Name -> backend factory, resolved lazily so unused backends are never imported."""

    def __init__(self, extra: Mapping[str, BackendFactory | str] | None = None) -> None:
        self._specs: dict[str, BackendFactory | str] = dict(BUILTIN_BACKENDS)
        problems: list[Problem] = []
        for name, spec in (extra or {}).items():
            where = f"backends[{name!r}]"
            if not isinstance(name, str) or not name:
                problems.append(Problem(where, "a backend's name is a non-empty string"))
            elif isinstance(spec, str):
                module, attr = _module_and_attr(spec)
                if not module or not attr:
                    problems.append(Problem(where, f"{spec!r} is not 'package.module:factory'"))
            elif not callable(spec):
                problems.append(
                    Problem(where, f"a backend class or factory, or 'module:factory'; got {spec!r}")
                )
        if problems:
            raise SpecError(problems, context="invalid backends")
        self._specs.update(extra or {})
        self._scanned = False

    def _scan(self) -> None:
        """Add the installed distributions' backends (entry points), once, first needed.

        Not at construction: ``importlib.metadata`` (and ``email``, ``zipfile``, ``csv``
        with it) is some 3,000 objects the host's garbage collector would walk on every
        full collection, and the scan reads every installed distribution's metadata,
        for a Supervisor that uses only built-in backends. Built-in and ``extra``
        backends keep precedence over entry points of the same name, as before.
        """
        if self._scanned:
            return
        self._scanned = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            self._specs.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._scan()
        return sorted(self._specs)

    def unimported(self, name: str) -> str | None:
        """The module ``factory(name)`` has yet to import; None when there is none.

        An import reads and runs the backend's modules (tens of milliseconds, more
        on a cold disk): the Supervisor does it in a worker thread, so the first
        submit to a backend does not hold the host's event loop for it.
        """
        spec = self._specs.get(name)
        if not isinstance(spec, str):
            return None
        module, _ = _module_and_attr(spec)
        return None if module in sys.modules else module

    def factory(self, name: str) -> BackendFactory:
        if name not in self._specs:
            self._scan()
        spec = self._specs.get(name)
        if spec is None:
            raise UnknownBackendError(
                f"no backend named {name!r}; known: {', '.join(self.names())}"
            )
        if isinstance(spec, str):
            module, attr = _module_and_attr(spec)
            try:
                loaded: BackendFactory = getattr(importlib.import_module(module), attr)
            except MissingExtraError:
                raise  # it names the extra to install
            except (ImportError, AttributeError) as e:
                raise UnknownBackendError(f"backend {name!r} ({spec}) cannot be loaded: {e}") from e
            self._specs[name] = loaded
            return loaded
        return spec
