"""What the docker backend's parts use of the backend that owns them.

``DockerRuntime`` (one app launched here), ``LogResumer`` (copying output after
a restart) and ``ForeignApps`` (apps of other processes) are each given their
backend. They see it through this protocol, not the ``DockerBackend`` class, so
the backend imports them and none of them imports the backend: the package's
imports run one way, with no circle even for the type checker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from supervisor.backends.base import BackendContext, LogTarget
from supervisor.backends.docker.engine import Engine
from supervisor.backends.store import AppStore, Index, Owner
from supervisor.logs import LogSink

__all__ = ["BackendServices"]


class BackendServices(Protocol):
    context: BackendContext
    host: str
    """The engine used when a request names none."""
    engine: Engine
    index: Index
    owner: Owner
    log_sink: LogSink
    task_group: TaskGroup
    launch_limiter: anyio.CapacityLimiter
    """Shared by every launch of the backend: a cap on creates in flight across apps."""
    lock_waiters: anyio.CapacityLimiter
    """The threads that wait for an app's ``FINALIZE_LOCK``, apart from anyio's default ones.

    The reader recording an unfollowed app's end holds that lock across awaits that
    need worker threads (records, output copies). Readers waiting for it in default
    threads could take them all (40 readers of one app, or fewer under a lower
    limit), and the holder would then wait for one for ever.
    """

    def engine_for(self, host: str) -> Engine: ...

    def tracked(self) -> AbstractAsyncContextManager[None]:
        """Background work that talks to an engine: closing the backend waits for it."""
        ...

    def forget(self, runtime: Any) -> None:
        """A runtime that ended; ``Any`` because the runtime's module is below this one."""
        ...

    def make_log_target(
        self,
        store: AppStore,
        role: str,
        replica_id: int,
        *,
        copied: Callable[[], Awaitable[None]] | None = None,
    ) -> LogTarget: ...
