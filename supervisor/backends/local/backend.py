"""The ``local`` backend: each replica a process group on this machine.

A replica's exit is final for that attempt; restarts are new attempts the app's
FSM asks for. Every app keeps its records under its app directory
(``store.py``) so the CLI in another process can read its status and logs and
ask for a cancel, which this backend notices through inotify.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from asyncinotify import Inotify, Mask

from supervisor.backends.base import (
    CANCELLED_ELSEWHERE,
    AppCancelRequested,
    AppNotice,
    AppTasks,
    Backend,
    BackendContext,
    DryrunContext,
    EventSink,
    LogTarget,
    Request,
)
from supervisor.backends.listing import list_indexed
from supervisor.backends.local.fdtable import FDS_PER_REPLICA, make_room
from supervisor.backends.local.flag import Flag
from supervisor.backends.local.pipes import PipeReaders
from supervisor.backends.local.process import ReplicaProcess, signal_name
from supervisor.backends.local.reaper_client import NotPrepared, Reaper
from supervisor.backends.local.request import (
    DEFAULT_MAX_REPLICAS,
    LocalRequest,
    ReplicaLaunch,
    env_cfg_problems,
    is_path_like,
    local_run_opts,
    render,
)
from supervisor.backends.pids import owner_exit
from supervisor.backends.replicas import ReplicaRuntime
from supervisor.backends.serial import SerialWorker
from supervisor.backends.store import (
    DISK_FULL,
    AppRecord,
    AppStore,
    CancelRequests,
    Index,
    IndexEntry,
    Owner,
    damaged_status,
    record_identities,
    unknown_status,
)
from supervisor.errors import BackendError, DamagedRecordError, Problem, SubmitError
from supervisor.events import Exited, ReplicaKey, Started, Submitted
from supervisor.logs import LogSink, ReplicaLog
from supervisor.logs.inotify_close import close_inotify, open_inotify
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle, RetryPolicy
from supervisor.states import TERMINAL, AppState, ReplicaState
from supervisor.status import (
    AppStatus,
    AppTimes,
    DescribeAppResponse,
    ListAppResponse,
    RoleStatus,
    Transition,
)
from supervisor.validate import Capabilities

__all__ = ["LOCAL_CAPABILITIES", "LocalBackend"]

SPAWN_FAILED_CODE = 127
SPAWNS_IN_FLIGHT = 16
"""Spawns of one app asked of the reaper and not answered yet, at most. The reaper forks
one at a time, so a few queued keep it busy while this process prepares the next (an
environment, two pipes: a few tenths of a millisecond each on the loop). More only held
objects: with all of a 1,000-replica app's spawns under way at once, their tasks,
requests and environments were some 35,000 objects for the garbage collector's full
pass to walk while the submit ran (a stall of the host's loop of 20-45 ms), and a turn
of the loop could prepare dozens of them."""

DIRS_BEFORE_SPAWNS = SPAWNS_IN_FLIGHT
"""Replica directories made with the app's records, before its first spawn. The rest are
made in hops of ``DIRS_PER_HOP`` to the records' thread while the first replicas start:
the ``mkdir`` of every directory first held back every spawn (2-5 ms of a 100-replica
submit here, 0.02-0.05 ms each, on a file system shared with other work)."""
DIRS_PER_HOP = 64

LOCAL_CAPABILITIES = Capabilities(
    backend="local",
    # Each replica is its own process group: one replica, one role or the whole app can be redone.
    retry_policies=frozenset(RetryPolicy),
    mounts=False,
    max_replicas_per_role=DEFAULT_MAX_REPLICAS,
    requires_image=False,
    replicas_hint="raise it with cfg max_replicas_per_role=N",
)


def _reserve_size(replicas: int) -> int:
    """Bytes set aside for an app's final record: its state, and the transitions since the
    last record that could be written (a few per replica)."""
    return 64 * 1024 + 1024 * replicas


def image_dirs(app: AppDef, cwd: str) -> dict[str, str]:
    """The roles' images that are directories (``local_dir``), each to its absolute path.

    Only path-like images are looked at (one ``stat`` each, as ``os.getcwd`` in
    the dry run); a relative one is taken relative to ``cwd``.
    """
    found: dict[str, str] = {}
    for role in app.roles:
        image = role.image
        if image in found or not is_path_like(image):
            continue
        path = os.path.normpath(os.path.join(cwd, image))
        if os.path.isdir(path):
            found[image] = path
    return found


@dataclass(eq=False)
class _DirBatch:
    """Replica directories made in one hop while the app's first replicas start."""

    dirs: list[Path]
    made: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    error: OSError | None = None  # why they could not be made (a full disk)


@dataclass
class _Slot:
    launch: ReplicaLaunch
    attempt: int = 0
    proc: ReplicaProcess | None = None
    done: Flag | None = None  # the attempt's end was told (a Flag: see flag.py)
    stopped: bool = False
    _lock: anyio.Lock | None = None
    # The batch that makes this replica's directory, until it is made (or failed: then a
    # restart makes it, see ``LocalRuntime.start_attempt``).
    dirs: _DirBatch | None = None

    @property
    def lock(self) -> anyio.Lock:
        """Made at first use, by the replica's first spawn: the slots of a big app are
        made in one step of the submit, and a thousand locks there held the loop 10 ms."""
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    def busy(self) -> bool:
        """Asked without making the lock: a stop of a replica that ended must not leave it
        one, which would keep its slot from ``settled``."""
        return self._lock is not None and self._lock.locked()

    def settled(self) -> bool:
        """Nothing of it to wait for: no spawn or restart holds or awaits its lock (an idle
        one is dropped), and the end of its attempt, if one started, was told."""
        return self._lock is None and (self.done is None or self.done.is_set())

    def drop_idle_lock(self) -> None:
        """Forget the lock if nobody holds or waits for it; the next use makes a new one.

        A free lock with no waiter is no different from a new one, and a running
        replica's lock (with its waiters' deque) would otherwise be walked by every
        full collection of the host's garbage collector for the replica's whole life.
        """
        lock = self._lock
        if lock is not None and not lock.locked() and not lock.statistics().tasks_waiting:
            self._lock = None


async def _raise_untold(error: Exception) -> None:
    """Raise ``error`` in a task of the app: telling a replica's exit failed (``AppTasks``
    ends the app with the reason)."""
    raise error


class LocalRuntime(ReplicaRuntime):
    def __init__(
        self, backend: LocalBackend, request: LocalRequest, sink: EventSink, tasks: AppTasks
    ) -> None:
        self._backend = backend
        self.request = request
        self.emit = sink
        self._tasks = tasks
        self.store = AppStore(Path(request.app_dir))
        self._owner = backend.owner
        self._slots: dict[ReplicaKey, _Slot] = {
            (r.role, r.replica_id): _Slot(r) for r in request.replicas
        }
        self._logs: dict[ReplicaKey, ReplicaLog] = {}
        # What every replica's environment starts from, taken once (``os.environ`` decodes
        # every variable on each read): as at the launch, for restarts too, as TorchX does.
        self._base_env = request.base_env(os.environ)
        # Kept as the records are written: the final one's index entry needs them.
        self._times = AppTimes()
        self._claimed = False  # the app directory is this launch's (``release_store``)
        # A lone replica's claim went with its spawn: ``app.json`` and the index entry go
        # with the first record (``_record``).
        self._unfilled = False
        # Attempts being started now: a spawn is "alone" (the reaper may fork it straight
        # into the app's cgroup) only when no other replica starts with it.
        self._starting = 0
        self.cancel_asked = False  # by another process: its request goes with the app
        self._final_status: AppStatus | None = None  # once the final record is written
        self._final_identities: list[list[int] | None] | None = None
        # For ``_guard_watched``: what wakes it, the processes to hand over, and whether
        # it may end (once no replica can be left watched without a task).
        self._guard_wake = anyio.Event()
        self._asked: list[ReplicaProcess] = []
        self._released = False
        # Bound once: every process of the app is handed over through these two.
        self._start_follower = self._hand_over
        self._ask_for_follower = self._hand_over_soon

    def _create_store(self) -> None:
        """Blocking: the app's directories, first record, index entry and final reserve.

        O(replicas), so in a worker thread, and in one hop: each hop costs about
        as much as these writes, and every submit waits for them. The host's table
        of descriptors is grown here too, for the replicas' pipes (see ``fdtable``).
        """
        make_room(FDS_PER_REPLICA * len(self._slots))
        first = [Path(s.launch.log_dir) for s in self._slots.values() if s.dirs is None]
        self.store.create(first, self._app_record())
        self._claimed = True
        try:
            self._index()
            self.store.reserve(_reserve_size(len(self._slots)))
        except OSError:
            self.release_store()
            raise

    def _app_record(self) -> AppRecord:
        request = self.request
        return AppRecord(
            handle=self._backend.handle(request.session, request.app_id),
            app=request.app,
            owner=self._owner,
            request=request.to_json(),
        )

    def _index(self) -> None:
        request = self.request
        self._backend.index.add(
            request.session, request.app_id, self.store.app_dir, request.app.name
        )

    def _fill_pays(self) -> bool:
        """Whether a lone replica's first records are worth writing while it starts.

        Only where the host would otherwise wait for the reaper: no other spawn in
        flight and at most one call ahead in the records' thread (the last app's
        ``ready_spare``). In a burst of small apps the host has other work for that
        while, and the reaper's word and a call of its own for the fill cost it CPU
        (0.4-0.5 ms per app, 150-app rounds alternated in one process); there the
        first record fills, as it would without the word (it is told about 1 % of
        the time, and to each lone submit of a service between bursts).
        """
        backend = self._backend
        return backend.records.pending <= 1 and not backend.reaper.spawning

    def _claim_made(self) -> None:
        """On the loop: the reaper made a lone replica's claim and goes on to spawn it
        (it says so where ``_fill_pays``).

        ``app.json`` and the index entry are written now, in the records' thread,
        while the replica starts (the host waits for the reaper then): the
        first record, on the way to ``submit``'s return, finds them written.
        """
        self._claimed = self._unfilled = True
        self._backend.records.post(self._fill_ahead)

    def _fill_ahead(self) -> None:
        """Blocking: ``_fill_store`` ahead of the first record, and the files that record
        goes into (``make_first_files``). Should it fail, the first record fills again
        (``_record``) and reports what still fails as its own failure. Queued before any
        record (``_claim_made``), so nothing has filled yet."""
        with contextlib.suppress(OSError):
            self._fill_store()
            self.store.make_first_files()

    def _fill_store(self) -> None:
        """Blocking: what a lone replica's claim left (``_spawn_lone``), for ``_claim_made``
        or else the first record: ``app.json`` and the index entry. Room is made in the
        descriptors' table for the next apps' pipes (a lone replica's are made on the
        loop, with no hop before)."""
        make_room(FDS_PER_REPLICA * SPAWNS_IN_FLIGHT)
        self.store.write_app(self._app_record(), new=True)
        self._index()
        self._unfilled = False  # (else the next record tries again, as for any record)

    def release_store(self) -> None:
        """Blocking: a launch that failed gives its app id back (a retry may take it
        again) and leaves nothing for ``list`` or ``gc``: no handle reached anyone.

        Only the directory this launch claimed: never that of another app of the same id.
        """
        if not self._claimed:
            return
        self._claimed = False
        self._backend.index.remove(self.request.session, self.request.app_id)
        self.store.release()

    async def start(self) -> None:
        # Several replicas: the reaper starts now if it has not yet, and where it moves into
        # cgroups to spawn (no ``_cspawn.c``), its first move after a quiet while waits for
        # the kernel (5-15 ms); asked now, that wait overlaps the records being written.
        # Asked again once they are, in case writing them took longer than the move stays
        # cheap (a big app); the reaper ignores an ask while moves are cheap.
        burst = len(self._slots) > 1
        if burst:
            self._backend.reaper.warm_up()
        batches = self._batch_dirs()
        # A lone replica whose reaper runs: its app's claim goes with its spawn, in one round
        # trip (see ``_spawn_lone``). Else the records first, as for several replicas.
        lone = not burst and self._backend.reaper.running
        try:
            # Before the app can be found (its index entry): a cancel asked from then on is seen.
            await self._backend.watch_cancel(self)
        except OSError as e:
            raise self._cannot_create(e) from e
        if not lone:
            await self._records_first()
        if burst:
            self._backend.reaper.warm_up()
        # Only now that the directories exist (a lone replica's: made before it starts, so
        # before it can write): the writer thread must not find them missing.
        self._logs = {
            key: self._backend.log_sink.open(Path(slot.launch.log_dir), made=True)
            for key, slot in self._slots.items()
        }
        for key in self._slots:
            self.emit(Submitted(role=key[0], replica_id=key[1]))
        # Counted at once: a spawn is "alone" only when no other replica is to start.
        self._starting += len(self._slots)
        self._tasks.start_soon(self._guard_watched)
        try:
            # A few spawners take the replicas in turn (see SPAWNS_IN_FLIGHT), while the
            # rest of the directories are made (their hops queued first, in order).
            if lone:
                await self._spawn_lone()
            else:
                queue = iter(self._slots.items())
                async with anyio.create_task_group() as tg:
                    for batch in batches:
                        tg.start_soon(self._make_dirs, batch)
                    for _ in range(min(SPAWNS_IN_FLIGHT, len(self._slots))):
                        tg.start_soon(self._spawn_each, queue)
        except BaseException:
            self._release_guard()  # what started is followed by tasks, as the app ends
            raise

    def _batch_dirs(self) -> list[_DirBatch]:
        """Give the replicas past ``DIRS_BEFORE_SPAWNS`` the batches that make their dirs."""
        later = list(self._slots.values())[DIRS_BEFORE_SPAWNS:]
        batches = []
        for at in range(0, len(later), DIRS_PER_HOP):
            slots = later[at : at + DIRS_PER_HOP]
            batch = _DirBatch([Path(slot.launch.log_dir) for slot in slots])
            for slot in slots:
                slot.dirs = batch
            batches.append(batch)
        return batches

    async def _make_dirs(self, batch: _DirBatch) -> None:
        try:
            await self._backend.records.run(self.store.make_replica_dirs, batch.dirs)
        except OSError as e:
            batch.error = e  # each of its replicas fails to start, saying why
        batch.made.set()

    def _dir_failed(self, key: ReplicaKey, slot: _Slot, error: OSError) -> None:
        """The replica cannot start: its directory (its logs, its error file) is not there."""
        self._not_started(
            key, slot, f"cannot create {slot.launch.log_dir}: {error.strerror or error}"
        )

    def _not_started(self, key: ReplicaKey, slot: _Slot, reason: str) -> None:
        """The attempt could not be started: its exit says why, as a shell's 127 would."""
        self.emit(
            Exited(
                role=key[0],
                replica_id=key[1],
                attempt=slot.attempt,
                exit_code=SPAWN_FAILED_CODE,
                msg=f"{key[0]}/{key[1]}: {reason}",
            )
        )

    async def _guard_watched(self) -> None:
        """One task per app for the replicas that have no follower task yet.

        It hands over those a reader callback asks for (``_hand_over_soon``).
        Cancelled with the app's tasks, it stops watching the rest: their
        pipes close, as a follower's would on its cancel. Released (``aclose``,
        or a start that failed), it hands every one still watched to a
        follower of its own.
        """
        try:
            while True:
                await self._guard_wake.wait()
                self._guard_wake = anyio.Event()
                asked, self._asked = self._asked, []
                for proc in asked:
                    proc.hand_over()
                if self._released:
                    break
        except anyio.get_cancelled_exc_class():
            for slot in self._slots.values():
                if slot.proc is not None and slot.proc.watched:
                    self._unfollowed(slot, slot.proc)
            raise
        for slot in self._slots.values():
            if slot.proc is not None:
                slot.proc.hand_over()

    def _hand_over(self, proc: ReplicaProcess) -> None:
        """Start the task that follows ``proc`` to its end (``ReplicaProcess.watch``), or,
        where none of that would wait, tell its end here (``_told_at_once``)."""
        slot = self._slots[proc.key]
        assert slot.done is not None  # made with the attempt, before it was watched
        try:
            if not (proc.at_end and self._told_at_once(slot, proc, slot.done)):
                self._tasks.start_soon(self._follow, slot, proc, slot.done)
        except RuntimeError:
            # The app's task group has ended (the Supervisor's was cancelled under a
            # launch): rather than the error reaching the reaper's reader, which
            # serves every app.
            self._unfollowed(slot, proc)

    @staticmethod
    def _unfollowed(slot: _Slot, proc: ReplicaProcess) -> None:
        """Nobody will follow ``proc``: its pipes close and whoever waits for it is let go."""
        proc.release_pipes()
        if slot.done is not None:
            slot.done.set()

    def _hand_over_soon(self, proc: ReplicaProcess) -> None:
        """From a reader callback: ``_guard_watched`` hands ``proc`` over, from its task.

        Only while the guard runs: it is released once the app is over, and no
        replica starts after that (every slot is ``stopped``), so none can ask.
        """
        self._asked.append(proc)
        self._guard_wake.set()

    def _release_guard(self) -> None:
        self._released = True
        self._guard_wake.set()

    async def _spawn_lone(self) -> None:
        """Start the app's one replica with the app's claim in the same round trip.

        The reaper makes the app directory, the replica's and the final record's
        reserve (``AppStore.claim_plan``) before the spawn: a claim refused (the id
        taken) or a disk with no room starts nothing, as ``_create_store`` first
        did, and one hop to the records' thread less is on the way to ``submit``'s
        return (``app.json`` and the index entry are written while the replica
        starts: ``_claim_made``). When
        the reaper cannot be asked, the records are made here and the replica
        fails to start, as one of several would.
        """
        ((key, slot),) = self._slots.items()
        async with slot.lock:
            plan = None
            if slot.stopped:
                # Stopped during the launch (the backend closing): nothing will start, and
                # the stop is answered from records made the other way.
                await self._records_first()
            else:
                plan = self.store.claim_plan([Path(slot.launch.log_dir)], _reserve_size(1))
            try:
                await self._spawn(key, slot, plan)
            except NotPrepared as e:
                self._claimed = e.claimed
                if not e.claimed and e.error.errno == errno.EEXIST:
                    raise self.store.taken() from None
                raise self._cannot_create(e.error) from e.error
        slot.drop_idle_lock()

    def _cannot_create(self, error: OSError) -> SubmitError:
        return SubmitError(f"cannot create {self.store.app_dir}: {error}", transient=False)

    async def _records_first(self) -> None:
        """The app's records made in the records' thread before any spawn (``_create_store``).

        Also for a lone replica the reaper could not be asked to claim for (gone, or
        the request not sent). Should it have made the app's directory and ended before
        it said so, the id reads as taken: that directory may be another app's, so it
        stays. (Said, the claim is this launch's: ``_claim_made``.)
        """
        try:
            await self._backend.records.run(self._create_store)
        except OSError as e:
            raise self._cannot_create(e) from e

    async def _spawn_each(self, queue: Iterator[tuple[ReplicaKey, _Slot]]) -> None:
        """Start the replicas ``queue`` holds, one after the other (shared by the spawners)."""
        for key, slot in queue:
            await self._spawn_locked(key, slot)

    async def _spawn_locked(self, key: ReplicaKey, slot: _Slot) -> None:
        async with slot.lock:
            await self._spawn(key, slot)
        slot.drop_idle_lock()

    async def _spawn(
        self, key: ReplicaKey, slot: _Slot, plan: dict[str, Any] | None = None
    ) -> None:
        """Start one attempt; called with ``slot.lock`` held, so a stop meanwhile waits for it.

        The caller counted it in ``_starting``; it is uncounted here once started (or not).
        ``plan``: the app's claim, carried out by the reaper first (``_spawn_lone``).
        """
        try:
            await self._spawn_counted(key, slot, plan)
        finally:
            self._starting -= 1

    async def _spawn_counted(
        self, key: ReplicaKey, slot: _Slot, plan: dict[str, Any] | None
    ) -> None:
        launch = slot.launch
        batch = slot.dirs
        if batch is not None:
            await batch.made.wait()
            if batch.error is None:
                slot.dirs = None
            elif not slot.stopped:  # (a stop that came meanwhile is answered below)
                self._dir_failed(key, slot, batch.error)
                return
        if slot.stopped:
            # A stop decided before the spawn: nothing starts, the stop is answered here.
            self.emit(Exited(role=key[0], replica_id=key[1], attempt=slot.attempt, exit_code=None))
            return
        env = {
            **self._base_env,
            **launch.env,
            "ASUPERVISOR_ATTEMPT": str(slot.attempt),
        }
        path = launch.spawn_path(env.get("PATH"))
        if path is not None:
            env["PATH"] = path
        log = self._logs[key]
        proc: ReplicaProcess | None = None
        # Why it did not start, as text: the error itself, kept in this frame, would hold
        # the frame through its traceback (a cycle that kept the ended app in memory).
        failed: str | None = None
        unanswered = False
        try:
            proc = await ReplicaProcess.start(
                launch.argv,
                cwd=launch.cwd,
                env=env,
                group=self.request.app_id,
                reaper=self._backend.reaper,
                readers=self._backend.pipe_readers,
                sink=self._backend.log_sink,
                log=log,
                key=key,
                attempt=slot.attempt,
                alone=self._starting == 1,
                prepare=plan,
                on_claim=self._claim_made if plan is not None and self._fill_pays() else None,
            )
        except (OSError, BackendError) as e:
            unanswered = isinstance(e, BackendError)
            reason = e.strerror if isinstance(e, OSError) else None
            failed = f"cannot start {launch.argv[0]!r}: {reason or e}"
        if plan is not None and not self._claimed:
            if unanswered:  # no answer, and no word of the claim: see ``_records_first``
                await self._records_first()
            else:  # the reaper answered: it made the claim (the spawn may have failed)
                self._claimed = self._unfilled = True
        if failed is not None:
            await self._say_not_started(key, slot, log, failed)
            return
        assert proc is not None  # (it started)
        slot.proc = proc
        slot.done = Flag()
        self.emit(
            Started(
                role=key[0],
                replica_id=key[1],
                attempt=slot.attempt,
                hostname=socket.gethostname(),
                pid=proc.pid,
                at=proc.started_at,
            )
        )
        # No task until the replica needs one (see ``ReplicaProcess.watch``).
        proc.watch(self._start_follower, self._ask_for_follower)
        if slot.stopped:
            # A stop decided while the spawn was under way wins: the new attempt is
            # killed at once and its exit answers the stop.
            proc.kill_now()

    async def _follow(self, slot: _Slot, proc: ReplicaProcess, done: Flag) -> None:
        key = proc.key
        try:
            code = await proc.follow()
            lost = ""
            try:
                await self._backend.log_sink.flush(self._logs[key])
            except BackendError as e:
                lost = self._output_lost(key, e)
            error = ""
            if code != 0:
                # In the records' thread: a gang stopped at once reads a thousand of these,
                # which through ``anyio.to_thread`` grew its pool to dozens of threads.
                error = await self._backend.records.run(
                    self.store.read_error_file, Path(slot.launch.error_file)
                )
            self._tell_exit(slot, proc, code, lost, error)
        except Exception:
            # The app's end (``AppTasks`` tells its actor, which stops the rest); this
            # replica's process must not outlive the one who followed it.
            proc.kill_now()
            raise
        finally:
            done.set()

    def _told_at_once(self, slot: _Slot, proc: ReplicaProcess, done: Flag) -> bool:
        """``_follow``'s work, with no task, where none of it waits; False where some would.

        For a replica that succeeded (no error file to read) with its output all
        written: the usual end, and every ``wait`` waits for it. An unexpected error
        is what ``_follow`` makes of one, the app's end: never an error in the
        reaper's reader (it serves every app), nor a waiter left waiting.
        """
        key = proc.key
        lost = ""
        try:
            if proc.exit_status != 0 or not self._backend.log_sink.flush_now(self._logs[key]):
                return False
        except BackendError as e:
            lost = self._output_lost(key, e)
        try:
            self._tell_exit(slot, proc, proc.take_exit(), lost, "")
        except Exception as exc:
            proc.kill_now()
            self._tasks.start_soon(_raise_untold, exc)
        finally:
            done.set()
        return True

    async def _say_not_started(
        self, key: ReplicaKey, slot: _Slot, log: ReplicaLog, reason: str
    ) -> None:
        """The replica's log says why it did not start, before its exit is told.

        As for a replica that ran (``_follow``): its streams end (which closes its
        files: else each replica that never started kept three open for the
        Supervisor's life) and the line is written before ``wait`` can return.
        """
        sink = self._backend.log_sink
        lost = ""
        try:
            sink.write(log, "stderr", f"asupervisor: {reason}\n".encode(), time.time())
            sink.end_stream(log, "stdout")
            sink.end_stream(log, "stderr")
            await sink.flush(log)
        except BackendError as e:
            lost = self._output_lost(key, e)
        self._not_started(key, slot, "; ".join(m for m in (reason, lost) if m))

    def _output_lost(self, key: ReplicaKey, error: BackendError) -> str:
        """A log write failed (a full disk, a removed log dir): the replica says what was
        lost, and the app too; the exit is still told, and no other app is taken down."""
        lost = str(error)
        self.emit(AppNotice(message=f"{key[0]}/{key[1]}: {lost}"))
        return lost

    def _tell_exit(
        self, slot: _Slot, proc: ReplicaProcess, code: int | None, lost: str, error: str
    ) -> None:
        key = proc.key
        # Never a success: the app hears why the status is missing.
        unknown = "" if code is not None else f"{key[0]}/{key[1]}: {proc.unknown_reason}"
        if slot.proc is proc:
            slot.proc = None
        self.emit(
            Exited(
                role=key[0],
                replica_id=key[1],
                attempt=proc.attempt,
                exit_code=code,
                signal=signal_name(code),
                msg="; ".join(m for m in (unknown, lost) if m),
                structured_error_msg=error,
                at=proc.ended_at,  # told only once it exited (``follow``, ``at_end``)
            )
        )

    # The shared stop and restart protocol (``ReplicaRuntime``), for processes.
    def replica_slot(self, key: ReplicaKey) -> _Slot:
        return self._slots[key]

    def replica_slots(self) -> Iterable[_Slot]:
        return self._slots.values()

    def attempt_running(self, key: ReplicaKey) -> bool:
        # Until its exit is told, not merely until it exited: between the two its output
        # is flushed and its error file read, and a stop then made up an exit of its own
        # ("stopped before it ran") that came first and took the real one's place.
        slot = self._slots[key]
        return slot.proc is not None and slot.done is not None and not slot.done.is_set()

    async def end_attempt(self, key: ReplicaKey) -> None:
        slot = self._slots[key]
        proc, done = slot.proc, slot.done
        if proc is not None and done is not None:
            await proc.terminate(self.request.stop_grace)
            await done.wait()

    async def start_attempt(self, key: ReplicaKey) -> None:
        slot = self._slots[key]
        unmade = await self._backend.records.run(
            self._prepare_attempt, slot.launch, slot.dirs is not None
        )
        if unmade is not None:
            self._dir_failed(key, slot, unmade)
            return
        slot.dirs = None
        # _spawn checks ``stopped`` again: a stop that came during the await wins.
        self._starting += 1
        await self._spawn(key, slot)

    @staticmethod
    def _prepare_attempt(launch: ReplicaLaunch, make_dir: bool) -> OSError | None:
        """Blocking: the replica's directory made if its first making failed (a full disk
        then; why it still cannot be is returned), and the error file of the attempt
        before removed."""
        if make_dir:
            try:
                os.makedirs(launch.log_dir, exist_ok=True)
            except OSError as e:
                return e
        Path(launch.error_file).unlink(missing_ok=True)
        return None

    async def record(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool
    ) -> None:
        # One hop to the records' thread for the whole record: the final one is on the
        # path of every ``wait``, and each hop costs about as much as the writes themselves.
        self._times = self._times.after(transitions)
        await self._backend.records.run(self._record, status, list(transitions), final)
        if not final:
            # After, not in the same call: off the way of whoever waits for this record
            # (``submit`` for the first one). The next one may be the final one.
            self._backend.records.post(self.store.ready_spare)

    def _record(self, status: AppStatus, transitions: list[Transition], final: bool) -> None:
        """Blocking: the state (and journal), after what a lone replica's claim left
        (``_fill_store``); the final one's index entry comes after."""
        if self._unfilled:
            self._fill_store()
        try:
            self.store.write_state(status, transitions, final, self._owner, ready_next=True)
        except OSError as e:
            # The replicas' output filled the disk: the space set aside at the start is
            # the final record's. Earlier records wait for space like everything else.
            if not final or e.errno not in DISK_FULL or not self.store.release_reserve():
                raise
            self.store.write_state(status, transitions, final, self._owner, ready_next=True)
        if final:
            # The settle comes later (``_release_files``): what it vouches for is the
            # records as this wrote them, not as they may be by then.
            self._final_identities = record_identities(self.store.app_dir)
            self._final_status = status

    def log_target(self, role: str, replica_id: int) -> LogTarget:
        return self._backend.make_log_target(self.store, role, replica_id)

    def _release_files(self) -> None:
        """Blocking: what follows the final record, off the path of ``wait``.

        The index entry is settled (``list`` answers the app from it from now on;
        until then it reads the records, as for a running app) and the reserve
        given back (unlinking a file of allocated blocks costs 0.4 ms on ext4,
        more than the record), and the old state.json removed. A ``gc`` that
        removed the ended app meanwhile keeps it removed: the settle only
        replaces an entry that is there.

        Nothing for a launch that claimed no directory (its id was taken): the one
        there is another app's.
        """
        if not self._claimed:
            return
        if self._final_status is not None:
            self._backend.index.settle(
                self.request.session,
                self.request.app_id,
                self.store.app_dir,
                self._final_status,
                self._times,
                self._final_identities,
            )
        self.store.release_reserve()
        # The old state.json the final write left (or the spare, when that write failed).
        self.store.discard_spare()
        if self.cancel_asked:
            self._backend.cancel_requests.withdraw(self.request.session, self.request.app_id)

    def kill_all(self) -> None:
        for slot in self._slots.values():
            slot.stopped = True
            if slot.proc is not None:
                slot.proc.kill_now()

    async def aclose(self) -> None:
        self._backend.unwatch_cancel(self)
        try:
            for slot in self._slots.values():
                # Most slots of an ended app have nothing to wait for: skipped without a
                # turn of the loop each (two per replica made 3-4 ms of a 100-replica app).
                if slot.settled():
                    continue
                async with slot.lock:  # a restart under way finishes (or is stopped) first
                    if slot.done is not None:
                        await slot.done.wait()
        finally:
            self._release_guard()  # every follower ran (or the app's tasks are cancelled)
        # Whatever the replicas left behind (outside their process groups) goes too.
        self._backend.reaper.release(self.request.app_id)
        # A hop of its own, after ``wait`` returned: in the final record's, once that told
        # the loop, it held the GIL while the loop was still on the way to ``wait``.
        await self._backend.records.run(self._release_files)
        self._backend.forget(self)
        # Nothing is handed over from now on: the two bound methods held here hold this
        # runtime too, and such a cycle keeps an ended app in memory until the garbage
        # collector's next full pass.
        self._start_follower = self._ask_for_follower = _nobody
        # Log failures no exit reported (a replica that never started): this app's
        # to show, not left for the Supervisor's close to raise at everyone.
        failures: list[BackendError] = []
        for log in self._logs.values():
            try:
                await self._backend.log_sink.flush(log)
            except BackendError as e:
                failures.append(e)
        if failures:
            raise failures[0]


def _nobody(proc: ReplicaProcess) -> None:
    """What an ended runtime hands its processes over to: none is left to hand over."""


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return when the first of ``waits`` does; the others are cancelled."""
    async with anyio.create_task_group() as tg:

        async def one(w: Callable[[], Awaitable[object]]) -> None:
            await w()
            tg.cancel_scope.cancel()

        for w in waits:
            tg.start_soon(one, w)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.task_group = context.task_group
        self.log_sink = LogSink()
        # The apps' records, in one thread: the final one is on the path of ``wait``.
        self.records = SerialWorker("asupervisor-local-records")
        self.reaper = Reaper(context.task_group)
        self.pipe_readers = PipeReaders()  # every replica's output pipes, on the loop as one
        self.index = Index(context.state_dir, "local")
        self.owner = Owner.current()
        self._runtimes: set[LocalRuntime] = set()
        self.cancel_requests = CancelRequests(context.state_dir, "local")
        self._inotify: Inotify | None = None
        self._inotify_lock = anyio.Lock()
        self._inotify_scope = anyio.CancelScope()
        self._inotify_stopped = anyio.Event()
        self._cancellable: dict[str, LocalRuntime] = {}  # by the name of their cancel request

    @classmethod
    def run_opts(cls) -> RunOpts:
        return local_run_opts()

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    def check_cfg(self, cfg: ResolvedCfg) -> list[Problem]:
        return env_cfg_problems(cfg)

    def capabilities_for(self, cfg: ResolvedCfg) -> Capabilities:
        limit = cfg.get_int("max_replicas_per_role", DEFAULT_MAX_REPLICAS)
        return dataclasses.replace(self.capabilities, max_replicas_per_role=limit)

    def statistics(self) -> dict[str, Any]:
        """``containment``: how replicas are kept from outliving their app (see the README)."""
        return {"containment": self.reaper.containment}

    def default_log_dir(self) -> Path:
        return self.context.state_dir / "logs"

    def dryrun(self, app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext) -> LocalRequest:
        return render(app, cfg, ctx, self.default_log_dir(), image_dirs(app, ctx.cwd))

    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> LocalRuntime:
        if not isinstance(request, LocalRequest):
            raise TypeError(f"the local backend cannot run a {type(request).__name__}")
        runtime = LocalRuntime(self, request, sink, tasks)
        self._runtimes.add(runtime)
        try:
            await runtime.start()
        except BaseException:
            # Cancelled (or failed) part-way: no handle will reach anyone, so the
            # replicas already spawned are stopped here, not left running unowned, and
            # the app leaves no record (one of SUBMITTED nobody follows, before). The
            # shield holds off anyio's cancels only: an asyncio-native one (a caller's
            # ``asyncio.timeout``) lands inside the launch too, and ends here.
            with anyio.CancelScope(shield=True):
                runtime.kill_all()
                with contextlib.suppress(BackendError):
                    await runtime.aclose()
                await self.records.run(runtime.release_store)
            raise
        return runtime

    # ---------------------------------------------------------- cancel requests
    async def watch_cancel(self, runtime: LocalRuntime) -> None:
        """Hear the cancel requests of other processes for ``runtime``'s app.

        One watch of ``cancel_requests.directory`` serves every app, made with
        the first one: before that app's index entry, so no request can precede it.
        """
        if self._inotify is None:
            async with self._inotify_lock:
                if self._inotify is None:
                    await anyio.to_thread.run_sync(self.cancel_requests.prepare)
                    inotify = Inotify()
                    mask = Mask.CREATE | Mask.MOVED_TO
                    try:
                        inotify.add_watch(self.cancel_requests.directory, mask)
                    except BaseException:
                        await close_inotify(inotify)
                        raise
                    self._inotify = inotify
                    self.task_group.start_soon(self._read_inotify, inotify)
        request = runtime.request
        self._cancellable[CancelRequests.name(request.session, request.app_id)] = runtime

    def forget(self, runtime: LocalRuntime) -> None:
        """The runtime is closed: nothing of it runs or can still start."""
        self._runtimes.discard(runtime)

    def unwatch_cancel(self, runtime: LocalRuntime) -> None:
        name = CancelRequests.name(runtime.request.session, runtime.request.app_id)
        if self._cancellable.get(name) is runtime:
            del self._cancellable[name]

    async def _read_inotify(self, inotify: Inotify) -> None:
        try:
            with self._inotify_scope:
                async for event in inotify:
                    if event.name is None:
                        continue
                    runtime = self._cancellable.get(str(event.name))
                    if runtime is not None:
                        runtime.cancel_asked = True
                        runtime.emit(AppCancelRequested(reason=CANCELLED_ELSEWHERE))
        finally:
            self._inotify_stopped.set()

    # ------------------------------------------------------ apps of other processes
    async def _store_for(self, handle: AppHandle) -> AppStore | None:
        app_dir = await anyio.to_thread.run_sync(self.index.lookup, handle.session, handle.app_id)
        return AppStore(app_dir) if app_dir is not None else None

    @staticmethod
    def _read_status(
        store: AppStore, *, include_launching: bool = True
    ) -> tuple[AppStatus, AppRecord | None] | None:
        """The app's status and ``app.json``; None for no app. Blocking.

        A damaged record is the app's status (UNKNOWN, saying so), not an
        error: with a damaged ``app.json`` there is no ``app.json`` to give.
        ``include_launching=False``: None too for an app whose launch is under way (its
        owner lives and recorded no state yet): its submit has not returned, so
        no handle reached anyone, it has no submit time to be listed by, and a
        launch that fails leaves no trace of it (``release_store``).
        """
        try:
            app = store.read_app()
        except DamagedRecordError as e:
            return damaged_status(e), None
        if app is None:
            return None
        roles = app.app.roles
        try:
            state = store.read_state()
        except DamagedRecordError as e:
            return damaged_status(e, roles), app
        if state is None:
            owner = app.owner
            if owner.alive():
                if not include_launching:
                    return None
                return AppStatus(AppState.SUBMITTED, msg="no state recorded yet"), app
            msg = f"the supervising process (pid {owner.pid}) ended without recording any state"
            return unknown_status(msg, roles), app
        status, owner = state
        if not status.is_terminal and not owner.alive():
            status = AppStatus(
                state=AppState.UNKNOWN,
                num_restarts=status.num_restarts,
                msg=f"the supervising process (pid {owner.pid}) ended without "
                "recording a final state",
                # Nobody follows its replicas any more: what they do is unknown too.
                roles=tuple(
                    RoleStatus(
                        role.role,
                        tuple(
                            r
                            if r.state.name in TERMINAL
                            else replace(r, state=ReplicaState.UNKNOWN)
                            for r in role.replicas
                        ),
                    )
                    for role in status.roles
                ),
            )
        return status, app

    async def describe(self, handle: AppHandle) -> DescribeAppResponse | None:
        store = await self._store_for(handle)
        if store is None:
            return None
        found = await anyio.to_thread.run_sync(self._read_status, store)
        if found is None:
            return None
        status, app = found
        roles = app.app.roles if app is not None else ()
        transitions = await anyio.to_thread.run_sync(store.read_transitions_or_none)
        return DescribeAppResponse.from_status(handle.app_id, status, roles, transitions)

    async def list(self) -> list[ListAppResponse]:
        async def one(entry: IndexEntry) -> ListAppResponse | None:
            assert entry.app_dir is not None  # list_indexed gives intact entries only
            store = AppStore(entry.app_dir)
            # An app still being launched is left out: it has no submit time yet,
            # so ``since`` dropped it and newest-first put it last, the newest app.
            found = await anyio.to_thread.run_sync(
                functools.partial(self._read_status, store, include_launching=False)
            )
            if found is None:
                return None
            status, app = found
            return ListAppResponse(
                app_id=entry.app_id,
                state=status.state,
                app_handle=self.handle(entry.session, entry.app_id),
                name=app.app.name if app is not None else "",
                msg=status.msg,
                times=await anyio.to_thread.run_sync(store.read_times),
            )

        return await list_indexed(self.index, self.context.name, one)

    async def cancel(self, handle: AppHandle) -> bool:
        store = await self._store_for(handle)
        if store is None:
            return False
        found = await anyio.to_thread.run_sync(self._read_status, store)
        if found is None:
            return False
        status, app = found
        if status.is_terminal:
            return True  # nothing left to stop
        if app is not None and status.is_settled and not app.owner.alive():
            # Its owner died, and its replicas with it (the reaper stops them all): a
            # request would have nobody to stop and nobody to read it.
            return True
        # Also when UNKNOWN: with a damaged record the owner may still be there to read it.
        await anyio.to_thread.run_sync(self._request_cancel, store, handle)
        return True

    def _request_cancel(self, store: AppStore, handle: AppHandle) -> None:
        """Blocking: the request in the app's records, then to its owner, who watches for it."""
        try:
            store.request_cancel()
            self.cancel_requests.request(handle.session, handle.app_id)
        except OSError as e:  # a state directory this process may read but not write
            why = f"cannot ask for {handle} to be cancelled: {e}"
            raise BackendError(why, transient=False) from e

    async def wait_foreign(self, handle: AppHandle) -> AppStatus | None:
        """Woken by the owner replacing state.json (inotify) or by the owner's death (pidfd)."""
        store = await self._store_for(handle)
        if store is None:
            return None
        async with open_inotify() as inotify:
            inotify.add_watch(store.app_dir, Mask.MOVED_TO | Mask.CLOSE_WRITE)
            while True:
                found = await anyio.to_thread.run_sync(self._read_status, store)
                if found is None:
                    return None
                status, app = found
                if status.is_settled or app is None:
                    return status
                await _first_of(inotify.get, partial(owner_exit, app.owner))

    def make_log_target(self, store: AppStore, role: str, replica_id: int) -> LogTarget:
        async def finished() -> bool:
            found = await anyio.to_thread.run_sync(self._read_status, store)
            return found is None or found[0].is_settled

        return LogTarget(
            directory=store.app_dir / role / str(replica_id),
            is_finished=finished,
            watch_dirs=(store.app_dir,),
        )

    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        store = await self._store_for(handle)
        if store is None:
            return None
        target = self.make_log_target(store, role, replica_id)
        app = await anyio.to_thread.run_sync(store.read_app)
        if app is None:
            return target
        owner = app.owner
        if owner.host != socket.gethostname():
            return target  # no pidfd for a process on another machine
        # The owner's death ends the output (its replicas die with it): an event.
        return replace(target, ended=partial(owner_exit, owner))

    async def aclose(self) -> None:
        for runtime in list(self._runtimes):
            runtime.kill_all()
        # Also those whose app already ended: a restart of theirs may still be under way,
        # and must be over before the reaper and the log sink close.
        # A runtime's close may raise (its log failures): the rest still closes, the
        # reaper included (a reaper left open outlived the Supervisor), then it is raised.
        failures: list[Exception] = []
        try:
            for runtime in list(self._runtimes):
                try:
                    await runtime.aclose()
                except Exception as e:
                    failures.append(e)
        finally:
            self.pipe_readers.close()  # every replica was followed to its end, its pipes closed
        if self._inotify is not None:
            # Let the reader unregister its fd before the fd is closed: a closed
            # number is soon reused (by a pidfd), and a late unregister would
            # silently drop the new owner's watch.
            self._inotify_scope.cancel()
            await self._inotify_stopped.wait()
            inotify, self._inotify = self._inotify, None
            await close_inotify(inotify)
        await self.reaper.aclose()
        await self.records.aclose()
        await self.log_sink.aclose()
        if failures:
            raise failures[0]
