"""The one exception tree of asupervisor.

Every error the library raises on purpose is a ``SupervisorError``. Callers
catch the branch they can act on::

    SupervisorError
    ├── SpecError (also ValueError)          bad AppDef or run options; lists every problem
    ├── InvalidHandleError (also ValueError) a handle string that does not parse
    ├── UnknownBackendError (also KeyError)  no backend under that name
    ├── UnknownAppError (also LookupError)   the handle names no app this backend knows
    ├── WaitTimeout (also TimeoutError)      ``wait(timeout=...)`` ran out
    ├── UnsupportedAsyncLibraryError (also RuntimeError)  not running under asyncio
    ├── ShuttingDown (also RuntimeError)     the Supervisor is shutting down: no new submit or wait
    ├── MissingExtraError (also ImportError) a backend's extra is not installed
    ├── EventsOverflowError                  an ``events()`` reader fell too far behind
    └── BackendError                         the backend failed; ``transient``: may a retry help
        ├── SubmitError                      launching failed; nothing was left running
        │   └── DuplicateAppError            that app id was already launched (here or elsewhere)
        └── DamagedRecordError               an app's record on disk cannot be read as one

Native exceptions (``OSError``, subprocess failures, ...) are translated at the
backend boundary so callers never see them leak through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "BackendError",
    "DamagedRecordError",
    "DuplicateAppError",
    "EventsOverflowError",
    "InvalidHandleError",
    "MissingExtraError",
    "NotEnteredError",
    "Problem",
    "ShuttingDown",
    "SpecError",
    "SubmitError",
    "SupervisorError",
    "UnknownAppError",
    "UnknownBackendError",
    "UnsupportedAsyncLibraryError",
    "WaitTimeout",
    "only_cause",
    "problems_of",
]


class SupervisorError(Exception):
    """Root of every error asupervisor raises on purpose."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation finding: ``field`` is a path such as ``roles[1].num_replicas``."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(SupervisorError, ValueError):
    """An AppDef or run options failed validation.

    Validation collects every problem before raising, so one round trip tells a
    user everything to fix; ``problems`` keeps them machine-readable.
    """

    def __init__(self, problems: Iterable[Problem], context: str = "invalid app") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.context = context
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{context}: {len(self.problems)} problem(s)\n{lines}")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.field for p in self.problems)


class InvalidHandleError(SupervisorError, ValueError):
    """A string is not of the form ``{backend}://{session}/{app_id}``."""


class UnknownBackendError(SupervisorError, KeyError):
    """No backend is registered under the requested name."""

    def __str__(self) -> str:
        # KeyError quotes its argument; keep the sentence readable.
        return str(self.args[0]) if self.args else "unknown backend"


class UnknownAppError(SupervisorError, LookupError):
    """The handle is well formed but its app does not exist (any more)."""


class WaitTimeout(SupervisorError, TimeoutError):
    """``wait`` gave up before the app reached a terminal state."""


class EventsOverflowError(SupervisorError):
    """A reader of ``Supervisor.events()`` fell more events behind than its stream holds.

    The stream stays usable: the next read returns what came after the gap. Raised
    rather than buffering without bound inside a service that runs for weeks.
    """


class UnsupportedAsyncLibraryError(SupervisorError, RuntimeError):
    """The Supervisor was entered under an event loop other than asyncio (trio, ...).

    Backends watch files and processes with asyncio-only machinery (inotify
    readers, subprocess pipes), so the Supervisor refuses at once on entry
    instead of failing at the first submit with an error from deep inside.
    """


class NotEnteredError(SupervisorError, RuntimeError):
    """The Supervisor is used outside its ``async with``: before it, entered again, or
    from another thread than its event loop's.

    Its verbs need the task group the block holds (the apps' actors, the backends'
    tasks), which is that loop's. After ``close`` they raise ``ShuttingDown`` instead.
    """


class ShuttingDown(SupervisorError, RuntimeError):
    """The Supervisor is shutting down (``begin_shutdown``, ``close``).

    Raised by a ``wait`` that was open (or started) once the shutdown began, whose
    app had not ended, and by a ``submit`` or ``schedule`` from then on: a
    service's handler can answer "unavailable" at once instead of holding its
    request open while the server waits for it. Retrying on this Supervisor cannot
    help; the app itself goes on as the shutdown documents (``Supervisor.close``).
    """


class MissingExtraError(SupervisorError, ImportError):
    """A backend needs packages that come with an extra, and the extra is not installed.

    The core install carries only what the local backend, Slurm over its commands
    and the CLI need; the docker backend and Slurm over slurmrestd each have an extra
    (``asupervisor[docker]``, ``asupervisor[slurm-rest]``). Raised where the backend
    is first used, so ``import supervisor`` never needs them; the message names
    the command that fixes it.
    """

    def __init__(self, extra: str, missing: str, *, what: str) -> None:
        self.extra = extra
        self.missing = missing
        super().__init__(
            f"{what} needs the {missing!r} package, which is not installed: "
            f"pip install 'asupervisor[{extra}]'",
            name=missing,
        )


class BackendError(SupervisorError):
    """A backend operation failed.

    ``transient`` is True when retrying the same call later may succeed (a busy
    controller, a full process table); False when it will fail the same way.
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class SubmitError(BackendError):
    """Launching an app failed; whatever had started was stopped again."""


class DuplicateAppError(SubmitError):
    """An app with this id already exists (its directory was created by an earlier submit).

    Raised when the same dry-run request, or a request with an explicit
    ``app_id``, is scheduled twice, whether by this process or another one:
    the app directory is created atomically, so only the first submit runs.
    Nothing was started; retrying cannot help (``transient`` is False), a new
    ``app_id`` (or ``submit(..., idempotency_key=...)``) can.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class DamagedRecordError(BackendError):
    """An app's record on disk (its index entry, ``app.json``, ``state.json``) is not one.

    Cut short, hand-edited, of the wrong types, or not a regular file at all (a
    directory or a FIFO under the record's name): what it said is lost, and
    reading it again will not bring it back (``transient`` is False).
    ``list``, ``describe`` and ``wait`` report such an app as UNKNOWN with this
    message instead of raising, so one damaged record never hides the others;
    a verb that needs what the record held (another process's Slurm job id or
    containers, to cancel them) raises it. ``path`` is the damaged file.
    """

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"damaged record: {path}: {why}", transient=False)
        self.path = path


def only_cause(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups: a task group wraps even a lone
    error, and that wrapping says nothing (``except BackendError`` would not match it)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def problems_of(check: Callable[[], object]) -> list[Problem]:
    """The problems ``check`` raises as a ``SpecError``, returned: checks written to
    raise, gathered into one list (a dry run names every problem at once)."""
    try:
        check()
    except SpecError as e:
        return list(e.problems)
    return []
