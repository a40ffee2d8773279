"""One launched docker app as the Supervisor that launched it follows it.

Each replica attempt is one container, created under the replica's fixed name
(so peers resolve it by that name through every restart). What happens to
the containers comes from the backend's one event stream (``start``,
``die``/``died``); the exit code comes from the event, or from inspecting
the container where the event lacks it. A container's output is copied into
the replica's log files while it runs. Its exit is reported at once:
completing the files takes another ~50 ms on dockerd (it answers the last
fetch only after tearing the container down), so that copy ends on its own
and readers wait for it (``output_copied``, and the ``output-copied`` file
for other processes). ``wait`` then ``log_iter`` never misses a last line,
and ``wait`` is not held up by the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from asyncinotify import Mask

from supervisor.backends.base import (
    CANCELLED_ELSEWHERE,
    AppCancelRequested,
    AppNotice,
    AppTasks,
    EventSink,
    LogTarget,
)
from supervisor.backends.docker.engine import Engine, engine_time
from supervisor.backends.docker.request import LABEL, ContainerSpec, DockerRequest
from supervisor.backends.docker.services import BackendServices
from supervisor.backends.replicas import ReplicaRuntime
from supervisor.backends.store import (
    CANCEL_REQUEST,
    AppStore,
    lock_file,
    read_json_or_none,
    write_json_atomic,
)
from supervisor.errors import BackendError, SubmitError
from supervisor.events import Exited, Lost, ReplicaKey, Started, Submitted, recorded_time
from supervisor.logs import ReplicaLog
from supervisor.logs.inotify_close import open_inotify
from supervisor.logs.sink import attempt_marks
from supervisor.states import TERMINAL, ReplicaState
from supervisor.status import AppStatus, ReplicaStatus, Transition

__all__ = [
    "CopyCheck",
    "DockerRuntime",
    "attempt_starts",
    "container_key",
    "digests_since",
    "exit_signal",
    "latest_containers",
    "mark_removed",
    "remove_each",
    "sha256s",
]

CREATE_FAILED_CODE = 127
CREATE_CONCURRENCY = 8
"""Engine requests of launches in flight at once, across every app on one backend: an
engine under load answers a burst of creates slower than its clients wait."""
FINALIZE_WAITERS = 8
"""Threads at most blocked at once waiting for apps' finalize locks (``lock_waiters``)."""
LAUNCH_TRIES = 4
"""Tries of one launch request that failed transiently (back-off 1, 2, 4 s)."""
ATTEMPT_FILE = ".docker-attempt.json"
COPY_LOCK = ".copy.lock"
"""Held by the one process that copies a replica's output when its owner does not."""
OUTPUT_COPIED = "output-copied"
"""In the app dir once the ended app's output is all in its files: other processes wait for it."""
REMOVED = "containers-removed"
"""In the app dir once the ended app's containers and network are gone. A reader of an
ended app without it removes what is left: its owner was killed after the final record,
before the removal."""
OOM_CODE = KILLED_CODE = 137
CONFIRM_S = 30.0
"""How long a stop waits for the engine to confirm an exit after SIGKILL, and how long an
engine call of a stop is retried (the engine may be away): every wait has a bound."""
UNHEARD_EXIT_S = 3.0
"""How long after a container's log stream ended its exit may still be announced."""
COPY_BOUND_S = 30.0
"""How long the end of an app waits for the last fetch of a container's output."""


def log_sizes(directory: Path) -> dict[str, int]:
    """Bytes already copied per stream: where a later copy of the same container starts."""
    sizes = {}
    for stream in ("stdout", "stderr"):
        try:
            sizes[stream] = (directory / f"{stream}.log").stat().st_size
        except OSError:
            sizes[stream] = 0
    return sizes


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def exit_signal(code: int | None) -> str | None:
    """Engines report a signal death as 128 + the signal number."""
    if code is None or code <= 128:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return None


def sha256s() -> dict[str, Any]:
    """A fresh SHA-256 per stream."""
    return {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}


_MARKS = ("stdout", "stderr", "combined", "index")


def attempt_starts(mark: Mapping[str, Any]) -> dict[str, int] | None:
    """Where the attempt's output starts in every file; None from an older attempt file."""
    try:
        return {name: int(mark[name]) for name in _MARKS}
    except (KeyError, TypeError, ValueError):
        return None


def digests_since(
    directory: Path, marks: Mapping[str, int], sizes: Mapping[str, int]
) -> dict[str, Any]:
    """Blocking: SHA-256 of each stream's bytes from the attempt's mark to ``sizes``."""
    digests = sha256s()
    for stream, digest in digests.items():
        try:
            with open(directory / f"{stream}.log", "rb") as f:
                f.seek(marks[stream])
                left = max(0, sizes[stream] - marks[stream])
                while left:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    digest.update(chunk)
                    left -= len(chunk)
        except FileNotFoundError:
            pass
    return digests


def container_key(c: Mapping[str, Any]) -> tuple[ReplicaKey, int] | None:
    """The replica a listed container runs and its attempt, from its labels."""
    labels = c.get("Labels") or {}
    try:
        return (str(labels[LABEL.ROLE]), int(labels[LABEL.REPLICA_ID])), int(
            labels.get(LABEL.ATTEMPT, 0)
        )
    except (KeyError, TypeError, ValueError):
        return None


def latest_containers(
    containers: Sequence[Mapping[str, Any]],
) -> dict[ReplicaKey, Mapping[str, Any]]:
    """Each replica's container of its highest attempt."""
    latest: dict[ReplicaKey, tuple[int, Mapping[str, Any]]] = {}
    for c in containers:
        found = container_key(c)
        if found is None:
            continue
        key, attempt = found
        held = latest.get(key)
        if held is None or attempt >= held[0]:
            latest[key] = (attempt, c)
    return {key: c for key, (_, c) in latest.items()}


class CopyCheck:
    """Whether a container's whole log, fed frame by frame, starts with what was copied.

    ``received`` and ``digests`` are the byte count and SHA-256 per stream of
    what the follow stream copied; they are read once, here.
    """

    def __init__(self, received: Mapping[str, int], digests: Mapping[str, Any]) -> None:
        self._seen = dict(received)
        self._expected = {stream: digest.digest() for stream, digest in digests.items()}
        self._check = sha256s()
        self._checked = {stream: size == 0 for stream, size in self._seen.items()}
        self._got = {"stdout": 0, "stderr": 0}

    def rest(self, stream: str, data: bytes) -> bytes | None:
        """The bytes of ``data`` past the copied ones (``b""``: none yet); None once the
        copied bytes are known not to be the start of the stream."""
        got = self._got[stream]
        skip = max(0, min(len(data), self._seen[stream] - got))
        self._got[stream] = got + len(data)
        if skip:
            self._check[stream].update(data[:skip])
        if skip == len(data):
            return b""
        if not self._checked[stream]:
            # The first byte past the copied ones: were the copied ones right?
            if self._check[stream].digest() != self._expected[stream]:
                return None
            self._checked[stream] = True
        return data[skip:]

    def whole(self) -> bool:
        """At the end of the log: whether every stream started with its copied bytes."""
        return all(
            self._checked[stream]
            or (
                self._got[stream] == self._seen[stream] and self._check[stream].digest() == expected
            )
            for stream, expected in self._expected.items()
        )


@dataclass
class _Copy:
    """Bytes of each stream copied from one container (count and digest), and when its
    copy ended: the digests tell whether the follow stream gave what the engine holds."""

    received: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    digests: dict[str, Any] = field(default_factory=sha256s)
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


@dataclass(frozen=True)
class _Death:
    """What the engine told of a container's end: its ``die`` event, or a look at it."""

    cid: str
    attempt: int
    """The attempt its replica ran when the end was heard (its label says which it ran)."""
    attributes: Mapping[str, str]
    at: float | None
    """When the engine says it died (None: it does not say)."""


@dataclass
class _Slot:
    spec: ContainerSpec
    attempt: int = 0
    cid: str | None = None
    running: bool = False
    started_sent: bool = False
    started_at: float = 0.0
    """When this process recorded the current container's start (0: it did not)."""
    start_asked: float = 0.0
    """When this process last asked the engine to start a container of this slot (0: never)."""
    exited: anyio.Event = field(default_factory=anyio.Event)
    handled: set[str] = field(default_factory=set)
    copy: _Copy | None = None
    stopped: bool = False
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def busy(self) -> bool:
        return self.lock.locked()


class DockerRuntime(ReplicaRuntime):
    def __init__(
        self, backend: BackendServices, request: DockerRequest, sink: EventSink, tasks: AppTasks
    ) -> None:
        self._backend = backend
        self._tasks = tasks
        self.engine: Engine = backend.engine
        self.request = request
        self.emit = sink
        self.store = AppStore(Path(request.app_dir))
        self._slots: dict[ReplicaKey, _Slot] = {
            (c.role, c.replica_id): _Slot(c) for c in request.containers
        }
        self._by_cid: dict[str, ReplicaKey] = {}
        self._copies_ending: dict[str, anyio.Event] = {}
        """Per container that died: set once its output is all in the files."""
        self._logs: dict[ReplicaKey, ReplicaLog] = {}
        self._cancel_watch = anyio.CancelScope()
        self._closed = False
        self.final = False
        self._cleanup_lock = anyio.Lock()
        self._cleaned = False
        self.ended = anyio.Event()
        """Set once the app's end is fully handled (final state recorded, containers removed)."""
        self.stopping = 0
        """Stops in progress: a closing backend lets them finish before it stops following."""
        self.cancel_recorded = False
        self._copy_locks: list[int] = []
        """Copy locks of replicas whose output this process copies for an owner that is gone."""

    # ---------------------------------------------------------------- launch
    async def start(self) -> None:
        """Create the network and every container, then start them; on failure remove all."""
        req = self.request
        created: list[str] = []
        network_made = False
        errors: list[BackendError] = []
        limit = self._backend.launch_limiter

        async def guarded(call: Callable[[], Awaitable[None]]) -> None:
            try:
                for n in range(LAUNCH_TRIES):
                    try:
                        async with limit:
                            await call()
                        return
                    except BackendError as e:
                        if not e.transient or n == LAUNCH_TRIES - 1:
                            raise
                    await anyio.sleep(2.0**n)  # the engine is away or overloaded: back off
            except BackendError as e:
                errors.append(e)

        async def network() -> None:
            nonlocal network_made
            if network_made:
                return
            if not req.owns_network:
                # Joined, never ours: it must be there before any container is made.
                if not await self.engine.network_exists(req.network):
                    raise SubmitError(
                        f"run option 'network': no network {req.network!r} on the engine at "
                        f"{self.engine.host} (it is joined, never created: create it first)",
                        transient=False,
                    )
                return
            try:
                await self.engine.create_network(req.network_body)
            except BackendError:
                # A create that timed out may have been done: it counts if it is there.
                if not await self._exists("networks", req.network):
                    raise
            network_made = True

        async def create(key: ReplicaKey, slot: _Slot) -> None:
            if slot.cid is not None:
                return
            try:
                cid = await self.engine.create(slot.spec.name, slot.spec.config(0))
            except BackendError:
                found = await self._exists("containers", slot.spec.name)
                if found is None:
                    raise
                cid = found
            created.append(cid)
            slot.cid = cid
            self._by_cid[cid] = key

        try:
            # The engine answers several requests at once: one round trip, not N, of waiting.
            async with anyio.create_task_group() as tg:
                tg.start_soon(guarded, network)
                for image in sorted({c.image for c in req.containers}):
                    tg.start_soon(guarded, partial(self.engine.ensure_image, image))
            if not errors:
                async with anyio.create_task_group() as tg:
                    for key, slot in self._slots.items():
                        tg.start_soon(guarded, partial(create, key, slot))
            if errors:
                raise errors[0]
        except BaseException:
            with anyio.CancelScope(shield=True):
                for cid in created:
                    await self.engine.remove(cid)
                if network_made:
                    await self.engine.remove_network(req.network, [c.name for c in req.containers])
            raise
        self._logs = {
            key: self._backend.log_sink.open(Path(slot.spec.log_dir))
            for key, slot in self._slots.items()
        }
        for key in self._slots:
            self.emit(Submitted(role=key[0], replica_id=key[1]))
        self._tasks.start_soon(self._watch_cancel)
        async with anyio.create_task_group() as tg:
            for key, slot in self._slots.items():
                tg.start_soon(self._start_container, key, slot)

    # ----------------------------------------------------------------- adopt
    async def adopt(self, containers: Sequence[Mapping[str, Any]], recorded: AppStatus) -> None:
        """Follow the containers of an app taken over from an owner that is gone.

        Each replica's latest container is followed from where it is: one still
        running has its output copied on from the bytes its files already hold;
        one that ended meanwhile is reported as if its exit had just been heard
        (the app's machines decide its retry or the gang's end); a replica with
        no container (its owner died amid a restart) is started as its recorded
        attempt. Every container of the app is removed at its end, as at launch.
        """
        for c in containers:
            found = container_key(c)
            if found is not None and found[0] in self._slots:
                self._by_cid[str(c["Id"])] = found[0]
        self._logs = {
            key: self._backend.log_sink.open(Path(slot.spec.log_dir))
            for key, slot in self._slots.items()
        }
        self._tasks.start_soon(self._watch_cancel)
        latest = latest_containers(containers)
        for key, slot in self._slots.items():
            replica = recorded.replica(*key)
            ended = replica is not None and replica.state.name in TERMINAL
            attempt = replica.restarts if replica is not None else 0
            current = latest.get(key)
            found = container_key(current) if current is not None else None
            if current is None or found is None or found[1] < attempt:
                if not ended:
                    self._catch_up(key, slot, current, attempt, replica)
                continue
            slot.cid, slot.attempt = str(current["Id"]), found[1]
            state = str(current.get("State") or "")
            if state == "created":
                if not ended:
                    self._tasks.start_soon(self._start_container, key, slot)
                continue
            start_recorded = replica is not None and replica.state is ReplicaState.RUNNING
            started_at = None
            if state == "running" and not start_recorded:
                # Its owner died before recording the start: the engine's time of it,
                # not now, however long nobody followed the app.
                started_at = await self._start_time(slot.cid)
            copy = await self._resumed_copy(key, slot)
            if state == "running":
                slot.running = True
                slot.started_sent = start_recorded
                self._send_started(key, slot, started_at)
                if copy is None:
                    continue  # another process copies this container's output to its end
                slot.copy = copy
                skip = dict(copy.received)
                self._tasks.start_soon(
                    partial(self._copy_logs, key, slot.cid, copy, True, skip=skip)
                )
                continue
            # Ended while nobody followed it: its output is completed from the engine.
            slot.copy = copy
            if copy is not None:
                copy.done.set()
            if ended:
                slot.handled.add(slot.cid)
                finished = self._copies_ending[slot.cid] = anyio.Event()
                self._tasks.start_soon(self._end_copy, key, slot.cid, copy, finished)
            else:
                slot.running = True
                self.on_event(slot.cid, "die", {})
        # An exit announced between the listing and now was not heard: ask once more.
        self.reconcile()

    def _catch_up(
        self,
        key: ReplicaKey,
        slot: _Slot,
        container: Mapping[str, Any] | None,
        attempt: int,
        replica: ReplicaStatus | None,
    ) -> None:
        """A replica whose latest container is not the attempt its records reached."""
        if container is None and replica is not None and replica.state is ReplicaState.RUNNING:
            # Its container went (removed by force) while nobody followed it: as reconcile
            # reports a container gone while it ran, SIGKILLed; the app's machines decide.
            self.emit(
                Exited(
                    role=key[0],
                    replica_id=key[1],
                    attempt=attempt,
                    exit_code=KILLED_CODE,
                    signal=exit_signal(KILLED_CODE),
                    msg=f"{key[0]}/{key[1]}: its container is gone",
                )
            )
            return
        if container is not None:
            # An older attempt's: stopped (if it runs) and removed by the restart below.
            slot.cid = str(container["Id"])
            slot.running = container.get("State") == "running"
        # Its owner decided this attempt (a launch, a restart) and died before carrying it out.
        self._tasks.start_soon(self._restart_one, key, attempt)

    async def _resumed_copy(self, key: ReplicaKey, slot: _Slot) -> _Copy | None:
        """The copy of ``slot``'s container as its files hold it; None when another process
        holds the replica's copy lock (it copies that container's output to its end)."""
        directory = Path(slot.spec.log_dir)
        held = await anyio.to_thread.run_sync(lock_file, directory / COPY_LOCK, False)
        if held is None:
            return None
        self._copy_locks.append(held)

        def read() -> tuple[dict[str, int], dict[str, int], dict[str, Any]] | None:
            mark = read_json_or_none(directory / ATTEMPT_FILE)
            if not isinstance(mark, dict) or mark.get("container") != slot.cid:
                return None
            starts = attempt_starts(mark)
            if starts is None:
                return None
            sizes = log_sizes(directory)
            return starts, sizes, digests_since(directory, starts, sizes)

        found = await anyio.to_thread.run_sync(read)
        log = self._logs[key]
        copy = _Copy()
        if found is None:
            # Never marked: its owner died before this container started, so none of
            # its output is in the files yet.
            await anyio.to_thread.run_sync(self._mark_attempt, slot)
            self._backend.log_sink.mark_attempt(log)
            return copy
        starts, sizes, digests = found
        self._backend.log_sink.mark_attempt(log, at=starts)
        copy.received = {s: max(0, sizes[s] - starts[s]) for s in ("stdout", "stderr")}
        copy.digests = digests
        return copy

    async def _exists(self, kind: str, name: str) -> str | None:
        """The id of this app's container or network named ``name``, if a create made it."""
        labels = {LABEL.SESSION: self.request.session, LABEL.APP_ID: self.request.app_id}
        try:
            if kind == "networks":
                found = await self.engine.list_networks(labels)
            else:
                found = await self.engine.list_containers(labels)
        except BackendError:
            return None
        for item in found:
            names = [str(n).lstrip("/") for n in item.get("Names") or [item.get("Name")]]
            if name in names:
                return str(item.get("Id") or item.get("ID") or "") or None
        return None

    async def _start_container(self, key: ReplicaKey, slot: _Slot) -> bool:
        """Start the slot's container; False when a stop was decided before the start
        (nothing starts, and whoever decided it answers it).

        Checked here, after the last wait before the engine's ``start``: a stop, or a
        cancel's ``refuse_starts``, that came during the create or the mark found nothing
        running, and a start after it would run the container's code after ``cancel``
        returned (killed at once by the restart, or, if short, ended first).
        """
        cid = slot.cid
        assert cid is not None
        await anyio.to_thread.run_sync(self._mark_attempt, slot)
        if slot.stopped:
            return False
        slot.running = True
        slot.exited = anyio.Event()
        # Made before the start: a container may die before ``start`` returns, and
        # the end of its copy must then find this attempt's copy, not the last one's.
        copy = slot.copy = _Copy()
        # Where this attempt's output starts in the files: a copy found wrong at its end
        # is written again from there.
        self._backend.log_sink.mark_attempt(self._logs[key])
        slot.start_asked = time.time()
        try:
            await self.engine.start(cid)
        except BackendError as e:
            slot.running = False
            copy.done.set()
            self._report_failed_start(key, slot, str(e))
            return True
        self._tasks.start_soon(self._copy_logs, key, cid, copy, True)
        if not slot.started_sent:
            # The engine's time of the start, not when this loop got to the answer (late
            # by as long as the loop was busy): its ``start`` event, if it came meanwhile,
            # or the container's own record.
            at = await self._start_time(cid)
            if slot.cid == cid:  # not a later attempt's (this one ended meanwhile)
                self._send_started(key, slot, at)
        return True

    async def _start_time(self, cid: str) -> float | None:
        """When the engine says ``cid`` started; None when it cannot say (gone, unreachable)."""
        try:
            info = await self.engine.inspect(cid)
        except BackendError:
            return None
        return engine_time(((info or {}).get("State") or {}).get("StartedAt"))

    def _mark_attempt(self, slot: _Slot) -> None:
        """Where this attempt's output starts in the files: lets another process resume copying."""
        directory = Path(slot.spec.log_dir)
        Path(slot.spec.error_file).unlink(missing_ok=True)
        write_json_atomic(
            directory / ATTEMPT_FILE,
            {"container": slot.cid, "attempt": slot.attempt, **attempt_marks(directory)},
        )

    def _send_started(self, key: ReplicaKey, slot: _Slot, at: float | None = None) -> None:
        """RUNNING, once per attempt; ``at``: when the engine says it started (None: now),
        never before this process asked for the start (an engine's clock may be behind)."""
        if not slot.started_sent:
            slot.started_sent = True
            slot.started_at = recorded_time(at, slot.start_asked)
            self.emit(
                Started(
                    role=key[0],
                    replica_id=key[1],
                    attempt=slot.attempt,
                    hostname=slot.spec.name,
                    at=slot.started_at,
                )
            )

    def _report_failed_start(self, key: ReplicaKey, slot: _Slot, msg: str) -> None:
        log = self._logs[key]
        self._backend.log_sink.write(log, "stderr", f"asupervisor: {msg}\n".encode(), time.time())
        slot.exited.set()
        self.emit(
            Exited(
                role=key[0],
                replica_id=key[1],
                attempt=slot.attempt,
                exit_code=CREATE_FAILED_CODE,
                msg=f"{key[0]}/{key[1]}: {msg}",
            )
        )

    # ------------------------------------------------------------------ logs
    async def _copy_logs(
        self,
        key: ReplicaKey,
        cid: str,
        copy: _Copy,
        follow: bool,
        skip: Mapping[str, int] | None = None,
    ) -> None:
        """Copy ``cid``'s output into the replica's files; ``skip``: the bytes of each stream
        already there (copied by the owner this process took the app over from)."""
        sink = self._backend.log_sink
        log = self._logs[key]
        left = dict(skip or {})
        try:
            async with self._backend.tracked():
                with copy.scope:
                    async for stream, data in self.engine.log_frames(cid, follow=follow):
                        if left and left.get(stream):  # only an adopted copy skips
                            skipped = min(len(data), left[stream])
                            left[stream] -= skipped
                            data = data[skipped:]
                            if not data:
                                continue
                        copy.received[stream] += len(data)
                        copy.digests[stream].update(data)
                        sink.write(log, stream, data, time.time())
        except BackendError as e:
            self.emit(AppNotice(message=str(e)))
        finally:
            copy.done.set()
        if follow and not copy.scope.cancel_called:
            # The engine ended the stream on its own: the container ended or is gone. Podman
            # sometimes announces no exit of a container removed by force from outside.
            self._tasks.start_soon(self._reconcile_unless_heard, cid)

    async def _reconcile_unless_heard(self, cid: str) -> None:
        """The exit of ``cid`` (still the current container of its replica) is looked up
        on the engine unless it is heard within UNHEARD_EXIT_S."""
        key = self._by_cid.get(cid)
        if key is None:
            return
        slot = self._slots[key]
        if slot.cid != cid:
            return
        with anyio.move_on_after(UNHEARD_EXIT_S):
            await slot.exited.wait()
        if not self._closed and slot.cid == cid:
            async with self._backend.tracked():
                await self._reconcile_one(slot)

    async def _end_copy(
        self, key: ReplicaKey, cid: str, copy: _Copy | None, ending: anyio.Event
    ) -> None:
        """Complete the files of a container that died, close its streams, then say so.

        A failure here cannot change how the replica ended (already reported):
        it is told in the replica's stderr log, where the missing output
        would have been, and as the app's notice while the app is followed.
        """
        sink, log = self._backend.log_sink, self._logs[key]
        try:
            async with self._backend.tracked():
                try:
                    if copy is not None:
                        await self._drain_retrying(cid, copy, log)
                except BackendError as e:
                    message = f"asupervisor: the rest of this container's output is lost: {e}"
                    sink.write(log, "stderr", f"{message}\n".encode(), time.time())
                    self.emit_notice(f"{key[0]}/{key[1]}: {message}")
                sink.end_stream(log, "stdout")
                sink.end_stream(log, "stderr")
                try:
                    await sink.flush()
                except BackendError as e:
                    self.emit_notice(str(e))
        finally:
            ending.set()

    async def output_copied(self, role: str, replica_id: int) -> None:
        """Return once the files hold the output of every container of this replica that died."""
        for cid in [c for c in self._copies_ending if self._by_cid.get(c) == (role, replica_id)]:
            await self._ended_copy(cid)

    async def _drain_retrying(self, cid: str, copy: _Copy, log: ReplicaLog) -> None:
        """The engine may be away (a restart): its logs are still there once it is back."""
        for n in range(LAUNCH_TRIES):
            try:
                await self._drain_logs(cid, copy, log)
                return
            except BackendError as e:
                if not e.transient or n == LAUNCH_TRIES - 1:
                    raise
            await anyio.sleep(2.0**n)

    async def _drain_logs(self, cid: str, copy: _Copy, log: ReplicaLog) -> None:
        """Stop following at once, then fetch the whole output to complete the files.

        By the ``die`` event the engine holds all of the container's output
        (both engines log it before they announce the exit), but its follow
        stream ends only once the container is torn down (~50 ms later on
        dockerd, never on Podman) and may leave out the last, unterminated
        line (dockerd 20.10). Under CPU load Podman's follow stream also
        loses and reorders pieces. So the follow stops here and one fetch
        without follow completes the files: where each stream's first bytes
        are what the follow copied (same length, same SHA-256) only the rest
        is appended; otherwise the attempt's part of the files is rewound and
        written again from the fetch.
        """
        copy.scope.cancel()
        await copy.done.wait()
        if not await self._append_rest(cid, copy, log):
            self._backend.log_sink.rewind(log)
            copy.received = {"stdout": 0, "stderr": 0}  # a retry checks what it writes
            copy.digests = sha256s()
            await self._append_rest(cid, copy, log)

    async def _append_rest(self, cid: str, copy: _Copy, log: ReplicaLog) -> bool:
        """Append what the engine holds past the copied bytes; False (nothing written
        past them) when the copied bytes are not the start of what the engine holds."""
        check = CopyCheck(copy.received, copy.digests)
        sink = self._backend.log_sink
        async for stream, data in self.engine.log_frames(cid, follow=False):
            rest = check.rest(stream, data)
            if rest is None:
                return False
            if rest:
                copy.received[stream] += len(rest)
                copy.digests[stream].update(rest)
                sink.write(log, stream, rest, time.time())
        return check.whole()

    # ----------------------------------------------------------------- events
    def on_event(
        self, cid: str, action: str, attributes: Mapping[str, str], at: float | None = None
    ) -> None:
        """The backend's event stream: runs on the loop, never blocks.

        ``at``: when the engine says it happened (None: it does not say).
        """
        key = self._by_cid.get(cid)
        if key is None or self._closed:
            return
        slot = self._slots[key]
        if action == "start" and slot.cid == cid:
            self._send_started(key, slot, at)
        elif action in ("die", "died") and cid not in slot.handled:
            slot.handled.add(cid)
            ending = self._copies_ending[cid] = anyio.Event()
            copy = slot.copy if slot.cid == cid else None
            self._tasks.start_soon(self._end_copy, key, cid, copy, ending)
            death = _Death(cid, slot.attempt, dict(attributes), at)
            self._tasks.start_soon(self._on_exit, key, slot, death)

    async def _on_exit(self, key: ReplicaKey, slot: _Slot, death: _Death) -> None:
        async with self._backend.tracked():
            try:
                await self._report_exit(key, slot, death)
            except BackendError as e:
                if slot.cid == death.cid:
                    slot.running = False
                slot.exited.set()
                reason = f"cannot learn how its container ended: {e}"
                self.emit(
                    Lost(role=key[0], replica_id=key[1], attempt=death.attempt, reason=reason)
                )

    async def _report_exit(self, key: ReplicaKey, slot: _Slot, death: _Death) -> None:
        cid, attributes, died_at = death.cid, death.attributes, death.at
        # The event carries the container's labels and (dockerd: exitCode, Podman:
        # containerExitCode) its exit code; the engine is asked only when it does not,
        # or when the code may mean an OOM kill, whose flag only inspect shows.
        code: int | None = _int(attributes.get("exitCode", attributes.get("containerExitCode")))
        state: dict[str, Any] = {"ExitCode": code}
        labels: Mapping[str, Any] = attributes
        if code is None or code == OOM_CODE or LABEL.ATTEMPT not in attributes:
            info = await self.engine.inspect(cid)
            if info is not None:
                state = info.get("State") or {}
                labels = (info.get("Config") or {}).get("Labels") or labels
                code = _int(state.get("ExitCode"))
                died_at = died_at or engine_time(state.get("FinishedAt"))
            # else removed already (``docker rm -f``): the event's code is all there is
        # The container knows which attempt it ran, whatever the slot moved on to since.
        attempt = int(labels.get(LABEL.ATTEMPT, death.attempt))
        msg = ""
        if state.get("OOMKilled"):
            msg = f"{key[0]}/{key[1]}: killed for exceeding its memory limit"
        elif state.get("Error"):
            msg = f"{key[0]}/{key[1]}: {state['Error']}"
        error = ""
        if code != 0:
            error = await anyio.to_thread.run_sync(
                self.store.read_error_file, Path(slot.spec.error_file)
            )
        current = slot.cid == cid
        if current:
            slot.running = False
        self._send_started(key, slot, engine_time(state.get("StartedAt")))
        self.emit(
            Exited(
                role=key[0],
                replica_id=key[1],
                attempt=attempt,
                exit_code=code,
                signal=exit_signal(code),
                msg=msg,
                structured_error_msg=error,
                at=recorded_time(died_at, slot.started_at if current else 0.0),
            )
        )
        slot.exited.set()

    # ---------------------------------------------------------------- actions
    async def _signal(self, cid: str, sig: str) -> None:
        """Send ``sig``, retried while the engine is away (transient errors) for CONFIRM_S."""
        what = f"cannot send {sig} to container {cid[:12]}"
        await _retrying(what, partial(self.engine.kill, cid, sig), anyio.current_time() + CONFIRM_S)

    async def _terminate(self, slot: _Slot) -> None:
        """SIGTERM, then SIGKILL once the grace is over; returns once the exit was reported.

        Bounded: an exit the engine does not confirm within CONFIRM_S of the
        SIGKILL is looked up on the engine (the event may have been lost while
        it was away), and a stop that still cannot be confirmed raises.
        """
        cid, exited = slot.cid, slot.exited
        if cid is None or not slot.running:
            return
        self.stopping += 1
        try:
            await self._signal(cid, "SIGTERM")
            grace = self.request.stop_grace
            with anyio.move_on_after(grace if math.isfinite(grace) else None):
                await exited.wait()
            if exited.is_set():
                return
            await self._signal(cid, "SIGKILL")
            with anyio.move_on_after(CONFIRM_S / 3):
                await exited.wait()
            if not exited.is_set():
                self.reconcile()  # the engine may have come back without replaying the exit
                with anyio.move_on_after(CONFIRM_S):
                    await exited.wait()
            if not exited.is_set():
                raise BackendError(
                    f"the engine did not confirm that container {cid[:12]} stopped",
                    transient=True,
                )
        finally:
            self.stopping -= 1

    def reconcile(self) -> None:
        """Ask the engine how every running container is, now: exits it did not announce
        (it was away, and engines do not replay them) are reported like heard ones."""
        if not self._closed:
            self._tasks.start_soon(self._reconcile)

    async def _reconcile(self) -> None:
        async with self._backend.tracked():
            for slot in list(self._slots.values()):
                await self._reconcile_one(slot)

    async def _reconcile_one(self, slot: _Slot) -> None:
        cid = slot.cid
        if cid is None or not slot.running or cid in slot.handled:
            return
        try:
            info = await self.engine.inspect(cid)
        except BackendError:
            return  # still away: the next reconnect asks again
        state = (info or {}).get("State") or {}
        if (
            cid in slot.handled
            or state.get("Running", False)
            or state.get("Status") in ("created", "configured")
        ):
            return  # heard meanwhile, running, or being started right now
        # Gone while it ran: removed by force (``docker rm -f``), so SIGKILLed.
        attributes: dict[str, str] = {"exitCode": str(KILLED_CODE)}
        if info is not None:
            attributes = {}
            if state.get("Status") in ("exited", "stopped"):
                attributes = {"exitCode": str(state.get("ExitCode"))}
        self.on_event(cid, "die", attributes, engine_time(state.get("FinishedAt")))

    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        self.stopping += 1
        try:
            await super().stop(keys, reason)
        finally:
            self.stopping -= 1

    # The shared stop and restart protocol (``ReplicaRuntime``), for containers.
    def replica_slot(self, key: ReplicaKey) -> _Slot:
        return self._slots[key]

    def replica_slots(self) -> Iterable[_Slot]:
        return self._slots.values()

    def attempt_running(self, key: ReplicaKey) -> bool:
        return self._slots[key].running

    async def end_attempt(self, key: ReplicaKey) -> None:
        await self._terminate(self._slots[key])

    async def start_attempt(self, key: ReplicaKey) -> None:
        """A new container for the attempt, under the replica's name: the last one goes."""
        slot = self._slots[key]
        old = slot.cid
        if old is not None:
            await self._ended_copy(old)
            await self.engine.remove(old)
        slot.started_sent = False
        try:
            slot.cid = await self.engine.create(slot.spec.name, slot.spec.config(slot.attempt))
        except BackendError as e:
            slot.cid = None
            self._report_failed_start(key, slot, str(e))
            return
        self._by_cid[slot.cid] = key
        if not await self._start_container(key, slot):
            # A stop came while the old container went or this one was made: it found
            # nothing running and left its answer to this restart. The container made
            # goes with the app's others.
            self.emit(Exited(role=key[0], replica_id=key[1], attempt=slot.attempt, exit_code=None))

    # ----------------------------------------------------------------- cancel
    async def _watch_cancel(self) -> None:
        """Another process asks for a cancel by creating cancel.request in the app dir.

        This process's own cancel writes the same file (``record_cancel``): seen here
        before its own request reached the app, it would read as another's.
        """
        with self._cancel_watch:
            async with open_inotify() as inotify:
                inotify.add_watch(self.store.app_dir, Mask.CREATE | Mask.MOVED_TO)
                if await anyio.Path(self.store.cancel_path).exists():
                    self.emit(AppCancelRequested(reason=CANCELLED_ELSEWHERE))
                async for event in inotify:
                    named = event.name is not None and str(event.name) == CANCEL_REQUEST
                    if named and not self.cancel_recorded:
                        self.emit(AppCancelRequested(reason=CANCELLED_ELSEWHERE))

    async def record_cancel(self) -> None:
        """cancel.request in the app dir, before the stop: it outlives this process."""
        self.cancel_recorded = True
        try:
            await anyio.to_thread.run_sync(self.store.request_cancel)
        except OSError as e:
            self.emit_notice(f"cannot record the cancel for other processes: {e}")

    def cancel_pending(self) -> bool:
        """Blocking: a cancel (this process's or another's) or a stop is not carried out yet."""
        return bool(self.stopping) or self.cancel_recorded or self.store.cancel_path.exists()

    async def kill_all(self) -> None:
        """The last resort of a closing backend: SIGKILL whatever of this app still runs."""
        for slot in self._slots.values():
            if slot.cid is not None and slot.running:
                try:
                    await self._signal(slot.cid, "SIGKILL")
                except BackendError as e:
                    self.emit_notice(str(e))

    # ----------------------------------------------------------------- record
    async def record(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool
    ) -> None:
        # One worker-thread hop: the final record is on the path of every ``wait``.
        await anyio.to_thread.run_sync(self._record, status, list(transitions), final)
        if final:
            self.final = True

    def _record(self, status: AppStatus, transitions: list[Transition], final: bool) -> None:
        """Blocking: the state (and journal), then for the final one the index entry."""
        self.store.write_state(status, transitions, final, self._backend.owner)
        if final:
            # ``list`` answers the app from its index entry from now on.
            self._backend.index.settle(
                self.request.session, self.request.app_id, self.store.app_dir, status
            )

    def log_target(self, role: str, replica_id: int) -> LogTarget:
        copied = partial(self.output_copied, role, replica_id)
        return self._backend.make_log_target(self.store, role, replica_id, copied=copied)

    def emit_notice(self, message: str) -> None:
        if not self._closed:
            self.emit(AppNotice(message=message))

    def release(self) -> None:
        """This process stops following the app (the Supervisor closed; the containers live on)."""
        self._closed = True
        self._cancel_watch.cancel()
        for slot in self._slots.values():
            if slot.copy is not None:
                slot.copy.scope.cancel()
        self._release_copy_locks()

    def _release_copy_locks(self) -> None:
        """Whoever follows the app next (or reads its logs) may copy its output again."""
        while self._copy_locks:
            os.close(self._copy_locks.pop())

    async def aclose(self) -> None:
        """The app ended: its containers and network go; its logs and records stay."""
        await self.cleanup()
        self._backend.forget(self)

    async def cleanup(self) -> None:
        """Idempotent: the actor calls it, and so does a backend closing right after the end."""
        self._cancel_watch.cancel()
        with anyio.CancelScope(shield=True):
            async with self._cleanup_lock:
                if self._cleaned:
                    return
                self._cleaned = True
                try:
                    await self._cleanup()
                finally:
                    self._release_copy_locks()
                    self.ended.set()

    async def _cleanup(self) -> None:
        # Bounded: exits the engine never announces (it went away) must not hold the end.
        with anyio.move_on_after(CONFIRM_S):
            for slot in self._slots.values():
                if slot.running:
                    await slot.exited.wait()
        for cid in list(self._by_cid):
            await self._ended_copy(cid)
        marked: OSError | None = None
        try:
            await anyio.to_thread.run_sync(
                write_json_atomic, self.store.app_dir / OUTPUT_COPIED, {}
            )
        except OSError as e:
            marked = e
        await self._remove_all()
        await mark_removed(self.store.app_dir)
        if marked is not None:
            # Other processes then wait for this one to exit before reading to the end.
            raise BackendError(f"cannot mark the app's output complete: {marked}", transient=False)

    async def _remove_all(self) -> None:
        """Remove every container, then the network (see ``remove_each``)."""
        removals = [
            (f"cannot remove container {cid[:12]}", partial(self.engine.remove, cid))
            for cid in self._by_cid
        ]
        if self.request.owns_network:
            names = [c.name for c in self.request.containers]
            removals.append(
                (
                    f"cannot remove network {self.request.network}",
                    partial(self.engine.remove_network, self.request.network, names),
                )
            )
        await remove_each(removals, CONFIRM_S)

    async def _ended_copy(self, cid: str) -> None:
        """Before a container goes: its output must be copied (the engine drops it with it).

        Bounded: an engine that stopped answering cannot hold the app's end.
        """
        ending = self._copies_ending.get(cid)
        if ending is not None:
            with anyio.move_on_after(COPY_BOUND_S):
                await ending.wait()

    @property
    def container_ids(self) -> list[str]:
        return list(self._by_cid)


async def mark_removed(app_dir: Path) -> None:
    """REMOVED in ``app_dir``; a mark that cannot be written only costs the next reader of
    the app one look at the engine (see ``ForeignApps._remove_left``)."""
    with contextlib.suppress(OSError):
        await anyio.to_thread.run_sync(write_json_atomic, app_dir / REMOVED, {})


async def remove_each(
    removals: Sequence[tuple[str, Callable[[], Awaitable[None]]]], bound: float
) -> None:
    """Make each ``(what, call)`` removal, in order, each tried even when one fails; then
    one BackendError naming every failure.

    Retried while the engine is away (a dockerd restart stops the containers, so the
    app may end while it goes down). ``bound`` is the time allowed without progress,
    not for all of them: an engine under load takes seconds per removal.
    """
    failures: list[BackendError] = []
    deadline = anyio.current_time() + bound
    for what, remove in removals:
        try:
            await _retrying(what, remove, deadline)
        except BackendError as e:
            failures.append(e)
        else:
            deadline = anyio.current_time() + bound  # progress: a new bound
    if failures:
        raise BackendError(
            "; ".join(str(e) for e in failures),
            transient=all(e.transient for e in failures),
        ) from failures[0]


async def _retrying(what: str, call: Callable[[], Awaitable[None]], deadline: float) -> None:
    """``call``, retried while the engine is away (transient errors) until ``deadline``
    (anyio's clock; one second at least, so each call is tried once even past it); then
    one transient BackendError saying ``what`` failed and why."""
    last: BackendError | None = None
    with anyio.move_on_after(max(deadline - anyio.current_time(), 1.0)):
        while True:
            try:
                await call()
                return
            except BackendError as e:
                if not e.transient:
                    raise
                last = e
            await anyio.sleep(1.0)  # a back-off while the engine is away
    raise BackendError(f"{what}: {last or 'the engine did not answer'}", transient=True) from last
