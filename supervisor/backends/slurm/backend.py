"""The ``slurm`` backend: an app is one heterogeneous batch job, one het group per replica.

Slurm owns the jobs: they outlive the Supervisor that submitted them (closing
a Supervisor stops following them, it does not cancel them), and any process
can describe, list, cancel and read the logs of the apps recorded in the
state directory. What each replica is doing comes from the Supervisor's one
shared poller (``poller.py``) and is translated here, through the state map
in ``states.py``, into replica events for the app's state machines.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from supervisor.backends.adoption import take_over
from supervisor.backends.base import (
    CANCELLED_ELSEWHERE,
    Adoption,
    AppCancelRequested,
    AppNotice,
    AppRuntime,
    AppTasks,
    Backend,
    BackendContext,
    DryrunContext,
    EventSink,
    LogTarget,
    Request,
)
from supervisor.backends.listing import list_indexed
from supervisor.backends.slurm.allocation import (
    AllocationRuntime,
    allocation_app_problems,
    allocation_of,
    allocation_status,
    cancel_elsewhere,
    check_allocation,
    check_allocation_cfg,
    driver_path,
    render_driver,
    start_driver,
)
from supervisor.backends.slurm.capabilities import SLURM_CAPABILITIES
from supervisor.backends.slurm.cluster import cluster_info, job_metadata, jobs_from_json
from supervisor.backends.slurm.identity import JobIdentity
from supervisor.backends.slurm.options import check_slurm_cfg, slurm_run_opts
from supervisor.backends.slurm.poller import JobView, PollerSettings, SlurmPoller
from supervisor.backends.slurm.pyxis import probe_pyxis
from supervisor.backends.slurm.records import JobRecord, hosts_of_tasks, latest_per_component
from supervisor.backends.slurm.script import (
    ClusterFacts,
    SlurmRequest,
    app_problems,
    dependencies,
    group_keys,
    owner_comment,
    pump_path,
    render,
    with_dependencies,
)
from supervisor.backends.slurm.ship import ship_pump
from supervisor.backends.slurm.states import Meaning, meaning_of
from supervisor.backends.slurm.times import PumpExit, ReplicaTimes, read_pump_exit, read_pump_starts
from supervisor.backends.slurm.translate import Mail, ViewTranslator, signal_name
from supervisor.backends.slurm.transport import AccountingDisabled, CliTransport, SlurmTransport
from supervisor.backends.store import (
    AppRecord,
    AppStore,
    Index,
    IndexEntry,
    Owner,
    damaged_status,
)
from supervisor.cluster import ClusterInfo, ClusterJob
from supervisor.errors import (
    BackendError,
    DamagedRecordError,
    Problem,
    SpecError,
    SubmitError,
    problems_of,
)
from supervisor.events import (
    Exited,
    Lost,
    ReplicaEvent,
    ReplicaKey,
    Started,
    Submitted,
)
from supervisor.fsm.app import describe_exit
from supervisor.fsm.rules import derive_app_state
from supervisor.logs.pump import EXIT_FILE
from supervisor.runopts import ResolvedCfg, RunOpts
from supervisor.specs import AppDef, AppHandle, parse_handle
from supervisor.states import AppState, ReplicaState, is_terminal
from supervisor.status import (
    AppStatus,
    DescribeAppResponse,
    ListAppResponse,
    ReplicaStatus,
    RoleStatus,
    Transition,
)
from supervisor.validate import Capabilities

__all__ = ["SlurmBackend"]

IGNORE_FILE = ".asupervisorignore"

FACTS_TTL_S = 600.0
"""How long the cluster's facts (version, partitions' memory) are used before asked again."""
_COMPLETE_TRIES = 10
_COMPLETE_RECHECK_S = 15.0
"""How often a requeue Slurm left half done is completed (the job's view is checked in between)."""
_CANCEL_CONFIRM_S = 10.0
"""How long a sent cancel may take to show in Slurm before it is sent again."""
_ADOPT_FIRST_VIEW_S = 5.0
"""How long ``attach`` waits for its first look at an adopted job (a few poller ticks);
past it (Slurm away) it answers from the records, and the look comes later."""

_REPLICA_STATE = {
    Meaning.QUEUED: ReplicaState.PENDING,
    Meaning.REQUEUED: ReplicaState.PENDING,
    Meaning.RUNNING: ReplicaState.RUNNING,
    Meaning.SUCCEEDED: ReplicaState.SUCCEEDED,
    Meaning.FAILED: ReplicaState.FAILED,
    Meaning.CANCELLED: ReplicaState.CANCELLED,
}


class SlurmRuntime(AppRuntime):
    def __init__(
        self,
        backend: SlurmBackend,
        request: SlurmRequest,
        job_id: int,
        sink: EventSink,
        identity: JobIdentity,
        tasks: AppTasks,
    ) -> None:
        self._backend = backend
        self._tasks = tasks
        self.request = request
        self.job_id = job_id
        self.identity = identity
        self.foreign = False  # the job id now names another job: never cancel it for us
        self.emit = sink
        self.store = AppStore(Path(request.app_dir))
        self.translator = ViewTranslator(
            job_id,
            [(r.role, r.replica_id) for r in request.replicas],
            [[(r.role, r.replica_id) for r in g.replicas] for g in request.groups],
        )
        self._log_dirs = {(r.role, r.replica_id): r.log_dir for r in request.replicas}
        self._error_files = {
            (r.role, r.replica_id): Path(r.error_file(request.workdir)) for r in request.replicas
        }
        # Views are translated in order, but their events wait for the replicas' records
        # (read off the loop): a queue keeps them in the order Slurm gave them. Unbounded:
        # only a view that changed something sends mail (a few per replica and attempt),
        # and the poller's listener must never fail because a record read is slow.
        self._mail, self._mailbox = anyio.create_memory_object_stream[list[Mail]](math.inf)
        tasks.start_soon(self._deliver)
        self._times = ReplicaTimes()
        self._completing = 0  # the requeue (restart count) whose completion was asked for
        self._over = anyio.Event()  # a view showed the job over (or gone): a cancel is confirmed
        self.first_view_told = anyio.Event()  # the first view's events, if any, are sent
        self._final = False  # the final record is written

    def on_view(self, view: JobView) -> None:
        """The poller's listener: runs on the loop, never blocks."""
        if self.foreign or not self.identity.owns_all(view.components):
            # A controller that lost its state reuses job ids: this is someone else's job.
            self.foreign = True
            view = JobView(view.job_id, (), "gone", f"job id {self.job_id} now names another job")
        mail = self.translator.events(view)
        if view.where == "gone":
            self.translator.ended = True  # nothing will run it again: a retry must requeue
            self._over.set()
            # What the replicas' own exit records say is the truth; the rest is unknown.
            self._mail.send_nowait(mail)
            return
        if self.translator.ended:
            self._over.set()
        elif self._over.is_set():
            # Over no longer (requeued): what a view polled before the requeue set must
            # not confirm a cancel of the run now queued (``_run_again``).
            self._over = anyio.Event()
        requeued_to = self.translator.incomplete_requeue
        if requeued_to > self._completing and not self.translator.stopping:
            self._completing = requeued_to
            self._tasks.start_soon(self._complete_requeue, requeued_to)
        if mail:
            self._mail.send_nowait(mail)
        else:
            self.first_view_told.set()  # it told nothing new

    async def _complete_requeue(self, requeued_to: int) -> None:
        """Finish the requeue Slurm left half done, so the job can run again (never cancel it).

        Retried (transient errors) while the job still needs it; a transport that
        cannot do it ends the app's supervision with the reason: the job would
        otherwise wait in the queue for ever.
        """
        delay = 1.0
        for _ in range(_COMPLETE_TRIES):
            done = self.translator.incomplete_requeue != requeued_to or self.translator.stopping
            if done or self._backend.closing:
                return
            try:
                await self._backend.transport.complete_requeue(self.job_id)
            except BackendError as e:
                if not e.transient:
                    self.emit(AppNotice(message=str(e), fatal=True))
                    return
                self.emit(AppNotice(message=f"completing Slurm's requeue failed, retrying: {e}"))
            else:
                self._run_again()
                self._backend.poller.poke()
                # Asked again only if the job still shows ended components well after:
                # a second requeue of a job that started meanwhile would cut its run short.
                delay = _COMPLETE_RECHECK_S
            await anyio.sleep(delay)
            delay = min(delay * 2, _COMPLETE_RECHECK_S)

    async def _deliver(self) -> None:
        """Each view's events, in the order of the views, as the replicas' own records
        tell them (their exit status and error file, when they started and ended).

        Runs until the runtime closes its sending end or the backend's task group
        ends (a durable app left running at close): both ends are closed then.
        """
        async with self._mail, self._mailbox:
            async for mail in self._mailbox:
                await self._tell(mail)
                self.first_view_told.set()

    async def _tell(self, mail: list[Mail]) -> None:
        """One view's events, once the records they need are read (off the loop)."""
        mail = await self._settle_lost(mail)
        if any(isinstance(m, AppCancelRequested) for m in mail):
            # A cancel Slurm shows that this process did not send: another Supervisor's
            # (it records its request first) is said as on every backend; only a cancel
            # with no request on record came from Slurm's side (scancel, an admin).
            asked = await anyio.to_thread.run_sync(
                AppStore(Path(self.request.app_dir)).cancel_path.exists
            )
            if asked:
                elsewhere = AppCancelRequested(reason=CANCELLED_ELSEWHERE)
                mail = [elsewhere if isinstance(m, AppCancelRequested) else m for m in mail]
        exits = [m for m in mail if isinstance(m, Exited)]
        records = await anyio.to_thread.run_sync(self._read_exits, exits) if exits else []
        in_order = sorted(zip(records, exits, strict=True), key=_ended_first)
        exits = [m if r is None else _with_code(m, r.returncode) for r, m in in_order]
        ended = {(m.key, m.attempt): r for r, m in in_order if r is not None}
        # A start seen in the same view as its end has its time in the exit record.
        starts = [m for m in mail if isinstance(m, Started) and (m.key, m.attempt) not in ended]
        started = (
            await anyio.to_thread.run_sync(read_pump_starts, starts, self._log_dirs)
            if starts
            else {}
        )
        failed = [m for m in exits if _failed(m)]
        if any(_LAUNCH_FAILURE in m.msg for m in failed):
            hint = await self._backend.transport.launch_failure_hint(
                self.request.workdir, self.request.app_dir
            )
            if hint:
                exits = [_hinted(m, hint) for m in exits]
                failed = [m for m in exits if _failed(m)]
        errors = await anyio.to_thread.run_sync(self._read_errors, failed) if failed else []
        found = dict(zip([id(m) for m in failed], errors, strict=True))
        # Exits last, the first to end first: the FSM takes the first failure
        # it hears of for the root cause and stops the rest of the gang.
        for m in [*(m for m in mail if not isinstance(m, Exited)), *exits]:
            error = found.get(id(m), "")
            if isinstance(m, Exited) and error:
                m = dataclasses.replace(m, structured_error_msg=error)
            if isinstance(m, ReplicaEvent):
                key = (m.key, m.attempt)
                record = ended.get(key)
                if record is not None:
                    m = self._times.stamped(m, record.started, record.ended)
                else:
                    m = self._times.stamped(m, started.get(key))
            self.emit(m)

    async def _settle_lost(self, mail: list[Mail]) -> list[Mail]:
        """A replica Slurm lost that recorded its own exit for this attempt ended so."""
        lost = [m for m in mail if isinstance(m, Lost)]
        if not lost:
            return mail
        probes = [Exited(role=m.role, replica_id=m.replica_id, attempt=m.attempt, exit_code=None)
                  for m in lost]  # fmt: skip
        records = await anyio.to_thread.run_sync(self._read_exits, probes)
        known: dict[int, Mail] = {
            id(m): _with_code(dataclasses.replace(p, msg=m.reason), record.returncode)
            for m, p, record in zip(lost, probes, records, strict=True)
            if record is not None
        }
        return [known.get(id(m), m) for m in mail]

    def _read_exits(self, exits: list[Exited]) -> list[PumpExit | None]:
        """Each replica's pump's record of this attempt's end; None where there is none.

        A replica killed with its pump (the gang stopped after another's failure)
        has no record: it keeps what Slurm said.
        """
        out: list[PumpExit | None] = []
        for m in exits:
            log_dir = self._log_dirs.get(m.key)
            record = read_pump_exit(Path(log_dir) / EXIT_FILE) if log_dir else None
            out.append(record if record is not None and record.attempt == m.attempt else None)
        return out

    def _read_errors(self, exits: list[Exited]) -> list[str]:
        files = [self._error_files.get(m.key) for m in exits]
        return [self.store.read_error_file(f) if f else "" for f in files]

    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        """Cancel the whole job (Slurm cannot stop one component), durably.

        The cancel is recorded in the app's directory before it is sent, and sent
        again (a controller or slurmrestd away, a cancel Slurm did not act on)
        until a view shows the job over; it ends with this runtime at the latest.
        """
        if self.translator.stopping:
            return
        self.translator.stopping = True
        await anyio.to_thread.run_sync(self.store.request_cancel)
        delay = 1.0
        while not (self._over.is_set() or self.foreign or self._backend.closing):
            try:
                await self._backend.transport.cancel(self.job_id)
            except BackendError as e:
                if not e.transient:
                    raise
                self.emit(AppNotice(message=f"the cancel is not delivered yet, retrying: {e}"))
            else:
                self._backend.poller.poke()
                delay = _CANCEL_CONFIRM_S  # sent: give Slurm time to act before asking again
            with anyio.move_on_after(delay):
                await self._over.wait()
            delay = min(delay * 2, _CANCEL_CONFIRM_S)

    async def restart(self, attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
        """Run the job again, unless its batch script already did.

        The batch script requeues a failed run itself while SLURM_RESTART_COUNT is
        below the job's max_retries (so retries go on with nobody following): asking
        again then would requeue, and so cut short, the next run. But a job Slurm
        ended itself (a time limit, a node failure without requeue) ran no more of its
        script: it is over, and only a requeue from here retries it. When that cannot
        be done, the retry fails with the reason instead of waiting for ever.
        """
        beyond_script = any(attempt > self.request.max_retries for _, attempt in attempts)
        if beyond_script or self.translator.ended:
            try:
                await self._backend.transport.requeue(self.job_id)
            except BackendError as e:
                if e.transient:
                    raise
                for (role, k), attempt in attempts:
                    self.emit(
                        Exited(
                            role=role,
                            replica_id=k,
                            attempt=attempt,
                            exit_code=None,
                            msg=f"{role}/{k}: the retry ({reason}) could not be made: {e}",
                        )
                    )
                return
            self._run_again()
        self._backend.poller.poke()

    def _run_again(self) -> None:
        """The job was requeued from here: it is no longer over, for a retry or a cancel.

        ``_over`` is the cancel's confirmation: left set from the run before, a
        cancel of the retry stopped at once and never reached Slurm.
        """
        self.translator.ended = False
        self._over = anyio.Event()

    async def record(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool
    ) -> None:
        await anyio.to_thread.run_sync(
            self.store.write_state, status, list(transitions), final, self._backend.owner
        )
        if final:
            self._final = True

    def log_target(self, role: str, replica_id: int) -> LogTarget:
        return self._backend.make_log_target(self.store, role, replica_id)

    def metadata(self) -> Mapping[str, str]:
        return job_metadata(self.job_id)

    @property
    def final(self) -> bool:
        """The final record is written."""
        return self._final

    async def aclose(self) -> None:
        self._backend.runtimes.discard(self)
        self._backend.poller.untrack(self.job_id)
        await self._mail.aclose()


class SlurmBackend(Backend):
    name = "slurm"
    durable = True

    def __init__(
        self,
        context: BackendContext,
        *,
        poller: PollerSettings | None = None,
        transport: SlurmTransport | None = None,
    ) -> None:
        super().__init__(context)
        self.transport: SlurmTransport = transport or transport_from_env()
        self.poller = SlurmPoller(self.transport, context.task_group, poller or PollerSettings())
        self.index = Index(context.state_dir, "slurm")
        self.owner = Owner.current()
        self.facts: ClusterFacts | None = None
        self._facts_lock = anyio.Lock()
        self.closing = False
        self.runtimes: set[SlurmRuntime] = set()  # followed here, until their actor ends
        self._facts_at = 0.0
        self._pyxis: bool | None = None
        self._pyxis_probed = False

    @classmethod
    def run_opts(cls) -> RunOpts:
        return slurm_run_opts()

    @property
    def capabilities(self) -> Capabilities:
        return SLURM_CAPABILITIES

    async def prepare(self) -> None:
        """Learn the cluster's facts once, however many submits ask at the same time;
        asked again after FACTS_TTL_S (partitions may change while a service runs)."""
        async with self._facts_lock:
            fresh = anyio.current_time() - self._facts_at < FACTS_TTL_S
            if self.facts is None or not fresh:
                self.facts = await self.transport.facts()
                self._facts_at = anyio.current_time()
                if not self._pyxis_probed and self.transport.kind == "cli":
                    # Once per backend: whether srun runs containers (pyxis).
                    self._pyxis = await probe_pyxis()
                    self._pyxis_probed = True
                self.facts = dataclasses.replace(self.facts, pyxis=self._pyxis)

    def statistics(self) -> dict[str, Any]:
        return self.poller.statistics()

    def check_cfg(self, cfg: ResolvedCfg) -> list[Problem]:
        kind = self.transport.kind
        return problems_of(partial(check_slurm_cfg, cfg)) + problems_of(
            partial(check_allocation_cfg, cfg, kind)
        )

    def check_app(self, app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
        return app_problems(app, cfg, self.facts or ClusterFacts()) + allocation_app_problems(
            app, cfg
        )

    def dryrun(self, app: AppDef, cfg: ResolvedCfg, ctx: DryrunContext) -> SlurmRequest:
        # The options' own rules were checked already (``check_cfg``, before any dryrun);
        # those over the app (``check_app``) are made again, by ``render`` and here.
        problems = allocation_app_problems(app, cfg)
        if problems:
            raise SpecError(problems, context="invalid run options")
        request = render(
            app,
            cfg,
            ctx,
            facts=self.facts or ClusterFacts(),
            default_log_dir=self.context.state_dir / "logs",
            job_dir=cfg.get_str("job_dir"),
        )
        allocation = allocation_of(cfg)
        if allocation is not None:  # steps of a running job: a driver script, not sbatch's
            request = dataclasses.replace(request, script=render_driver(request, allocation))
        return request

    async def launch(
        self, request: Request, sink: EventSink, tasks: AppTasks
    ) -> SlurmRuntime | AllocationRuntime:
        if not isinstance(request, SlurmRequest):
            raise TypeError(f"the slurm backend cannot run a {type(request).__name__}")
        waits = dependencies(request.script)
        if waits:
            script = with_dependencies(request.script, await self._job_ids(waits))
            request = dataclasses.replace(request, script=script)
        store = AppStore(Path(request.app_dir))
        record = AppRecord(
            handle=self.handle(request.session, request.app_id),
            app=request.app,
            owner=self.owner,
            request=request.to_json(),
            extra={"job_id": None},  # a job id once sbatch took the job
        )
        dirs = [Path(r.log_dir) for r in request.replicas]
        await anyio.to_thread.run_sync(store.create, dirs, record)
        # Until sbatch takes the job, nothing runs: a launch that fails leaves nothing
        # behind (the app id stays free for a retry), the job directory it made included.
        snapshot_made = False
        try:
            try:
                await anyio.to_thread.run_sync(ship_pump, Path(pump_path(request.app_dir)))
                if request.job_dir is not None:
                    await anyio.to_thread.run_sync(
                        _snapshot, Path(request.source_dir), Path(request.job_dir)
                    )
                    snapshot_made = True
            except OSError as e:
                raise SubmitError(f"cannot prepare {request.app_dir}: {e}", transient=False) from e
            identity = JobIdentity(
                owner_comment(request.session, request.app_id, None),
                request.job_names,
                time.time(),
            )
            allocation = allocation_of(request.cfg)
            if allocation is None:
                job_id = await self.transport.submit(request.script, request.workdir)
            else:
                await check_allocation(self.transport, allocation)
                driver = driver_path(request.app_dir)
                try:
                    await anyio.to_thread.run_sync(driver.write_text, request.script)
                except OSError as e:
                    raise SubmitError(f"cannot write {driver}: {e}", transient=False) from e
                job_id = allocation
        except SubmitError:
            # A SubmitError says Slurm certainly took no job (an unanswered sbatch is
            # another BackendError: the job may exist, so its directory stays).
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(store.release)
                if snapshot_made and request.job_dir is not None:
                    await anyio.to_thread.run_sync(
                        partial(shutil.rmtree, request.job_dir, ignore_errors=True)
                    )
            raise
        extra: dict[str, Any] = {"job_id": job_id, "identity": identity.to_json()}
        if allocation is not None:
            extra["allocation"] = allocation
        record = dataclasses.replace(record, extra=extra)
        await anyio.to_thread.run_sync(store.write_app, record)
        await anyio.to_thread.run_sync(
            self.index.add, request.session, request.app_id, store.app_dir, request.app.name
        )
        if allocation is not None:
            # Recorded first: the driver's steps are the app's from their first moment.
            await start_driver(request.app_dir, request.workdir)
            in_allocation = AllocationRuntime(self, request, allocation, sink, tasks)
            for role, k in in_allocation.keys:
                sink(Submitted(role=role, replica_id=k))
            return in_allocation
        runtime = SlurmRuntime(self, request, job_id, sink, identity, tasks)
        self.runtimes.add(runtime)
        for role, k in runtime.translator.keys:
            sink(Submitted(role=role, replica_id=k))
        self.poller.track(job_id, runtime.on_view)
        return runtime

    async def _job_ids(self, waits: Sequence[tuple[str, str]]) -> dict[str, int]:
        """The Slurm job id of each app waited for; a SpecError names each unknown one."""
        out: dict[str, int] = {}
        problems = []
        for kind, handle in waits:
            found = await self._found(parse_handle(handle))
            if found is None:
                problems.append(
                    Problem(f"cfg.{kind}", f"{handle} is not a slurm app submitted to this cluster")
                )
            elif found[1].extra.get("allocation") is not None:
                problems.append(
                    Problem(
                        f"cfg.{kind}",
                        f"{handle} runs inside allocation {found[1].extra['allocation']}: it is no "
                        "job of its own that Slurm could wait for",
                    )
                )
            else:
                out[handle] = int(found[1].extra["job_id"])
        if problems:
            raise SpecError(problems, context="invalid run options")
        return out

    async def hold(self, handle: AppHandle, release: bool = False) -> bool:
        """``scontrol uhold`` / ``release``: a held job stays PENDING (reason JobHeldUser)."""
        found = await self._found(handle)
        if found is None:
            return False
        if found[1].extra.get("allocation") is not None:
            raise BackendError(
                f"{handle} runs inside allocation {found[1].extra['allocation']}: there is no "
                "job of its own to hold or release",
                transient=False,
            )
        job_id = int(found[1].extra["job_id"])
        await (self.transport.release(job_id) if release else self.transport.hold(job_id))
        self.poller.poke()
        return True

    # ------------------------------------------------------ apps of other processes
    async def _found(self, handle: AppHandle) -> tuple[AppStore, AppRecord] | None:
        app_dir = await anyio.to_thread.run_sync(self.index.lookup, handle.session, handle.app_id)
        if app_dir is None:
            return None
        store = AppStore(app_dir)
        app = await anyio.to_thread.run_sync(store.read_app)
        if app is None or app.extra.get("job_id") is None:
            return None
        job_id = app.extra["job_id"]
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise DamagedRecordError(str(app_dir / "app.json"), f"job_id is {job_id!r}")
        return store, app

    async def _status_of(self, app: AppRecord) -> AppStatus:
        """The app's state as Slurm and its replicas' exit records say now, without an FSM."""
        return (await self._observe(app)).status

    async def _observe(self, app: AppRecord) -> _Observed:
        """What Slurm reports of the app's job now, corrected by each replica's own exit
        record (``exit.json``, written by its pump on the node).

        Slurm gives every component of a het job the job's exit code, and forgets a
        job that left the controller when the cluster keeps no accounting; the pump's
        record of this attempt says how each replica really ended, long after.
        """
        if app.extra.get("allocation") is not None:
            return _Observed(await allocation_status(self.transport, app), None, None)
        job_id = int(app.extra["job_id"])
        records = [r for r in await self.transport.queue() if r.het_job_id == job_id]
        gone = f"Slurm no longer knows job {job_id}"
        if not records:
            try:
                accounted = latest_per_component(await self.transport.accounting([job_id]))
            except AccountingDisabled:
                accounted = []
                gone += ": it left the controller and this cluster keeps no accounting"
            records = [r for r in accounted if r.het_job_id == job_id]
        if not _identity_of(app).owns_all(records):
            records = []
            gone = f"job id {job_id} now names another job"
        definition = app.app
        by_offset = {r.het_offset: r for r in records}
        found: dict[ReplicaKey, ReplicaStatus] = {}
        stored = app.request.get("groups")
        grouping = (
            [[(str(role), int(k)) for role, k in g] for g in stored]
            if isinstance(stored, list)
            else group_keys(definition)
        )
        app_dir = Path(str(app.request.get("app_dir", "")))
        keys = [key for keys in grouping for key in keys]
        group_states = [_replica_state(by_offset.get(i)) for i in range(len(grouping))]
        own: dict[ReplicaKey, PumpExit] = {}
        cancelled = False
        # The records only speak for a group Slurm shows ended or no longer shows: a live
        # app (every status read of a follower, every look of a log tail) reads no files.
        if any(s is ReplicaState.UNKNOWN or is_terminal(s) for s in group_states):
            own, cancelled = await anyio.to_thread.run_sync(_exit_records, app_dir, keys)
        applied: dict[ReplicaKey, PumpExit] = {}
        ends: list[float] = []
        starts: list[float] = []  # the pumps' own, to the microsecond; else Slurm's seconds
        for offset, keys in enumerate(grouping):
            rec = by_offset.get(offset)
            state = group_states[offset]
            waiting = state is ReplicaState.PENDING and rec and rec.reason not in ("", "None")
            hosts = hosts_of_tasks(rec.nodes, len(keys)) if rec else [""] * len(keys)
            code, signal_ = _slurm_exit(rec, state)
            for (role, k), host in zip(keys, hosts, strict=True):
                replica = ReplicaStatus(
                    id=k,
                    state=state,
                    role=role,
                    hostname=host,
                    exit_code=code,
                    signal=signal_,
                    restarts=rec.restart_cnt if rec else 0,
                    msg=rec.reason if rec and waiting else "",
                )
                ended = own.get((role, k))
                if ended is not None and (
                    rec is None or (is_terminal(state) and ended.attempt == rec.restart_cnt)
                ):
                    replica = _ended_as_recorded(
                        replica, ended, cancelled or state is ReplicaState.CANCELLED
                    )
                    if replica.state is ReplicaState.FAILED and rec and rec.state != "FAILED":
                        # Slurm ended it (a time limit, a node failure): that says more
                        # than the signal the run died of, as the owner says it.
                        replica = dataclasses.replace(replica, msg=_slurm_end(role, k, rec))
                    applied[(role, k)] = ended
                    ends.append(ended.ended)
                    if ended.started is not None:
                        starts.append(ended.started)
                found[(role, k)] = replica
        # The gang stop after a replica's own failure (the batch script ends the rest with a
        # signal) is a stop, as the owner's FSM would have decided: CANCELLED, not FAILED.
        # The first failure is the root cause: an exit code of its own before a death by
        # signal (which a gang stop or Slurm's time limit also deals).
        failed = [key for key, e in applied.items() if found[key].state is ReplicaState.FAILED]
        failures = sorted((applied[key].returncode < 0, applied[key].ended, key) for key in failed)
        root_cause = ""
        if failures:
            _, first_failure, first = failures[0]
            role, k = first
            code = applied[first].returncode
            how = describe_exit(None, signal_name(-code)) if code < 0 else describe_exit(code, None)
            root_cause = f"{role}/{k} {how}"
            for key in failed:
                e = applied[key]
                if key != first and -e.returncode in _GANG_STOP and e.ended >= first_failure:
                    found[key] = dataclasses.replace(found[key], state=ReplicaState.CANCELLED)
        replicas = {
            role.name: [found[(role.name, k)] for k in range(role.num_replicas)]
            for role in definition.roles
        }
        states = [r.state for r in found.values()]
        reasons = sorted({r.msg for r in found.values() if r.msg})
        msg = gone if not records and ReplicaState.UNKNOWN in states else ""
        app_state = derive_app_state(states, cancel_requested=False)
        if app_state is AppState.FAILED and root_cause:
            msg = root_cause  # as the owner's FSM says it
        if reasons and app_state is AppState.PENDING:
            msg = f"pending: {', '.join(reasons)}"
        status = AppStatus(
            state=app_state,
            num_restarts=max((r.restart_cnt for r in records), default=0),
            msg=msg,
            roles=tuple(RoleStatus(role, tuple(reps)) for role, reps in replicas.items()),
        )
        if not starts:
            # Slurm's start of a group that ran: a pending one shows when it may start,
            # and one cancelled while it waited shows the cancel's time.
            starts = [float(r.started) for r in records if r.started > 0 and _ran(r)]
        return _Observed(status, min(starts, default=None), max(ends, default=None))

    async def _final_or_live(self, store: AppStore, app: AppRecord) -> AppStatus:
        """The final record when there is one (its supervising actor saw the error files and
        the root cause), else what Slurm says now.

        An end nobody follows (the owner is gone) is recorded by whoever sees it, once:
        Slurm forgets jobs, the record stays.
        """
        try:
            final = await anyio.to_thread.run_sync(store.read_final_status)
        except DamagedRecordError as e:
            return damaged_status(e, app.app.roles)
        if final is not None:
            return final
        observed = await self._observe(app)
        live = observed.status
        if not live.is_settled and await anyio.Path(store.cancel_path).exists():
            # A recorded cancel the job does not show yet (sent while Slurm or slurmrestd
            # was away): whoever looks next sends it again.
            try:
                if app.extra.get("allocation") is not None:
                    await cancel_elsewhere(self.transport, app)  # its steps, never the allocation
                else:
                    await self.transport.cancel(int(app.extra["job_id"]))
            except BackendError as e:
                note = f"a recorded cancel is not delivered yet: {e}"
                live = dataclasses.replace(live, msg="; ".join(m for m in (live.msg, note) if m))
        ended = live.is_settled and live.state is not AppState.UNKNOWN
        by_job = app.extra.get("allocation") is None  # a job of its own, not steps in an allocation
        if ended and by_job and not await anyio.to_thread.run_sync(store.followed, app):
            left = _retries_left(app, live)
            if left:
                # Slurm ended the job itself (a time limit, a node failure), so its
                # script could not retry it; only a Supervisor's requeue can. The end
                # is not recorded: one that attaches makes the retry, whoever looked
                # first (a recorded end would refuse it for good).
                why = f"{live.msg}; " if live.msg else ""
                return dataclasses.replace(
                    live,
                    state=AppState.UNKNOWN,
                    msg=f"{why}the job ended with {left} retr{'y' if left == 1 else 'ies'} "
                    "left and no Supervisor follows it: attach to make the retry",
                )
            final = await anyio.to_thread.run_sync(
                store.record_observed_end,
                live,
                observed.started,
                observed.ended or time.time(),
                self.owner,
            )
            request = app.request
            await anyio.to_thread.run_sync(
                self.index.settle,
                str(request.get("session")),
                str(request.get("app_id")),
                store.app_dir,
                final,
            )
            return final
        return live

    async def adopt(self, handle: AppHandle) -> Adoption | None:
        """Take over an app whose owner is gone (see ``Backend.adopt``): its job runs on.

        Not an app inside an allocation: its driver process on the allocation's
        first node belongs to the owner that started it.
        """
        found = await self._found(handle)
        if found is None or found[1].extra.get("allocation") is not None:
            return None
        taken = await take_over(
            found[0], self.owner, lambda app: SlurmRequest.from_json(app.request, app.app)
        )
        if taken is None:
            return None
        request, status = taken.request, taken.recorded
        job_id, identity = int(taken.record.extra["job_id"]), _identity_of(taken.record)

        async def start(sink: EventSink, tasks: AppTasks) -> SlurmRuntime:
            runtime = SlurmRuntime(self, request, job_id, sink, identity, tasks)
            runtime.translator.resume(
                {(r.role, r.id): r.restarts for role in status.roles for r in role.replicas}
            )
            self.runtimes.add(runtime)
            self.poller.track(job_id, runtime.on_view)
            # What Slurm says now, before ``attach`` answers: the records lag the job
            # by whatever happened since the owner died (a requeue, an end).
            with anyio.move_on_after(_ADOPT_FIRST_VIEW_S):
                await runtime.first_view_told.wait()
            return runtime

        return Adoption(request, status, taken.history, start, taken.give_up)

    async def describe(self, handle: AppHandle) -> DescribeAppResponse | None:
        found = await self._found(handle)
        if found is None:
            return None
        store, app = found
        status = await self._final_or_live(store, app)
        transitions = await anyio.to_thread.run_sync(store.read_transitions_or_none)
        status = dataclasses.replace(status, metadata=job_metadata(int(app.extra["job_id"])))
        return DescribeAppResponse.from_status(handle.app_id, status, app.app.roles, transitions)

    async def wait_foreign(self, handle: AppHandle) -> AppStatus | None:
        """Wait for an app another process follows, hearing of its job from the shared poller.

        One ``squeue`` per tick serves every waiter, however many; each looks again only
        when the poller sees the job change. A tick that cannot reach Slurm (the
        controller restarting) is no change, and a look that fails for a moment is
        tried again at the next change: the wait goes on.
        """
        found = await self._found(handle)
        if found is None:
            return None
        if found[1].extra.get("allocation") is not None:
            return await super().wait_foreign(handle)  # steps of an allocation: no job to track
        job_id = int(found[1].extra["job_id"])
        changed = anyio.Event()

        def heard(view: JobView) -> None:
            if view.where != "error":  # Slurm unreachable this tick: nothing to look at
                changed.set()

        key = object()  # this waiter's own listener
        self.poller.track(job_id, heard, key)
        try:
            while True:
                try:
                    described = await self.describe(handle)
                except BackendError as e:
                    if not e.transient:
                        raise
                else:
                    if described is None:
                        return None
                    if (status := described.to_status()).is_settled:
                        return status
                await changed.wait()  # the next change of the job (a failed look: too)
                changed = anyio.Event()
        finally:
            self.poller.untrack(job_id, key)

    async def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        """Partitions and nodes (``asupervisor cluster``); see ``cluster.py``."""
        # Version, partitions and nodes: three calls, on either transport.
        version = await self.transport.version_text()
        partitions = await self.transport.partition_list()
        nodes = await self.transport.node_list()
        return cluster_info(version, partitions, nodes, partition)

    async def cluster_jobs(self) -> list[ClusterJob]:
        """Every job the controller holds, anyone's; ours carry their handle."""
        return jobs_from_json(await self.transport.job_list(), self.context.name)

    async def list(self) -> list[ListAppResponse]:
        """The apps recorded as launched by this library; foreign jobs are never listed."""

        async def one(entry: IndexEntry) -> ListAppResponse | None:
            handle = AppHandle(self.context.name, entry.session, entry.app_id)
            found = await self._found(handle)
            if found is None:
                return None
            status = await self._final_or_live(*found)
            name = str(found[1].app.name)
            times = await anyio.to_thread.run_sync(found[0].read_times)
            return ListAppResponse(entry.app_id, status.state, str(handle), name, status.msg, times)

        return await list_indexed(self.index, self.context.name, one)

    async def cancel(self, handle: AppHandle) -> bool:
        """Recorded first (a supervising process, or a later status, sends it again), then sent."""
        found = await self._found(handle)
        if found is None:
            return False
        await anyio.to_thread.run_sync(found[0].request_cancel)
        job_id = int(found[1].extra["job_id"])
        try:
            if found[1].extra.get("allocation") is not None:
                await cancel_elsewhere(self.transport, found[1])  # its steps, never the allocation
                self.poller.poke()
                return True
            live = [r for r in await self.transport.queue() if r.het_job_id == job_id]
            if live and _identity_of(found[1]).owns_all(live):
                await self.transport.cancel(job_id)  # never a job that only has the app's id
                self.poller.poke()
        except BackendError as e:
            raise BackendError(
                f"{e}; the cancel is recorded, and the next status of the app sends it again",
                transient=e.transient,
            ) from e
        return True

    def make_log_target(self, store: AppStore, role: str, replica_id: int) -> LogTarget:
        async def finished() -> bool:
            stored = await anyio.to_thread.run_sync(store.read_app)
            if stored is None:
                return True
            status = await self._status_of(stored)
            return status.is_settled

        return LogTarget(
            directory=store.app_dir / role / str(replica_id),
            is_finished=finished,
            watch_dirs=(store.app_dir,),
        )

    async def log_target(self, handle: AppHandle, role: str, replica_id: int) -> LogTarget | None:
        found = await self._found(handle)
        if found is None:
            return None
        return self.make_log_target(found[0], role, replica_id)

    async def aclose(self) -> None:
        self.closing = True  # a cancel or requeue still being retried stops asking
        unmarked = []
        for runtime in list(self.runtimes):
            if not runtime.final:
                # Its job runs on, and this process (which may live on) follows it no
                # more: whoever reads the app next records its end.
                try:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(runtime.store.mark_released)
                except OSError as e:
                    unmarked.append(f"{runtime.request.app_id}: {e}")
        await self.poller.aclose()
        await self.transport.aclose()
        if unmarked:
            raise BackendError(
                "closing the slurm backend: cannot record that this process follows these "
                "apps no more (others record their end only once it exits): " + "; ".join(unmarked),
                transient=False,
            )


def _with_code(event: Exited, returncode: int) -> Exited:
    """The replica's own exit status (negative: the signal that killed it)."""
    name = signal_name(-returncode) if returncode < 0 else None
    return dataclasses.replace(event, exit_code=returncode, signal=name)


_LAUNCH_FAILURE = "JobLaunchFailure"


def _hinted(event: Exited, hint: str) -> Exited:
    """A launch failure with what may explain it (Slurm says no more)."""
    if _LAUNCH_FAILURE not in event.msg:
        return event
    return dataclasses.replace(event, msg=f"{event.msg}: {hint}")


def _ended_first(pair: tuple[PumpExit | None, Exited]) -> float:
    """The order exits are told in: as their pumps saw them end; those with no record last."""
    return pair[0].ended if pair[0] is not None else float("inf")


def _failed(mail: Mail) -> bool:
    return isinstance(mail, Exited) and (bool(mail.exit_code) or mail.signal is not None)


def _identity_of(app: AppRecord) -> JobIdentity:
    tag = owner_comment(str(app.request["session"]), str(app.request["app_id"]), None)
    return JobIdentity.from_json(app.extra.get("identity"), tag)


def transport_from_env() -> SlurmTransport:
    """The transport a Supervisor's Slurm backend uses, chosen by the environment.

    ``ASUPERVISOR_SLURM_TRANSPORT=cli`` (default: the Slurm commands) or ``rest``:
    slurmrestd at ``ASUPERVISOR_SLURMRESTD`` (``unix:/path`` or ``http://host:port``),
    as ``ASUPERVISOR_SLURMRESTD_USER`` with the JWT in ``SLURM_JWT`` when given.
    One transport per backend, because one poller serves every app; pass
    ``transport=`` to ``SlurmBackend`` (via ``Supervisor(backends=...)``) instead.
    """
    kind = os.environ.get("ASUPERVISOR_SLURM_TRANSPORT", "cli")
    if kind == "cli":
        return CliTransport()
    if kind != "rest":
        raise SpecError(
            [Problem("ASUPERVISOR_SLURM_TRANSPORT", f"{kind!r} is neither 'cli' nor 'rest'")],
            context="invalid slurm backend settings",
        )
    from supervisor.backends.slurm.rest import RestTransport  # httpx only when asked for

    where = os.environ.get("ASUPERVISOR_SLURMRESTD", "")
    token = os.environ.get("SLURM_JWT") or None
    user = os.environ.get("ASUPERVISOR_SLURMRESTD_USER") or None
    if where.startswith("unix:"):
        return RestTransport(socket=where[len("unix:") :], token=token, user=user)
    if where.startswith(("http://", "https://")):
        return RestTransport(url=where, token=token, user=user)
    raise SpecError(
        [Problem("ASUPERVISOR_SLURMRESTD", f"{where!r} is not unix:/path or http://host:port")],
        context="invalid slurm backend settings",
    )


def _snapshot(source: Path, destination: Path) -> None:
    """Copy the workspace into a fresh job directory, leaving out what the ignore file names."""
    patterns: list[str] = []
    ignore_file = source / IGNORE_FILE
    if ignore_file.is_file():
        patterns = [
            line.strip()
            for line in ignore_file.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns(*patterns))


_GANG_STOP = frozenset({signal.SIGTERM, signal.SIGKILL})
"""The signals a gang stop ends a replica with (TERM, then KILL after the grace)."""


@dataclasses.dataclass(frozen=True)
class _Observed:
    """An app's status as observed from outside, with when it started and ended (if known)."""

    status: AppStatus
    started: float | None
    ended: float | None


def _ended_as_recorded(replica: ReplicaStatus, record: PumpExit, cancelled: bool) -> ReplicaStatus:
    """The replica as its own record says it ended (a cancel made a failure CANCELLED)."""
    code = record.returncode
    if code == 0:
        state = ReplicaState.SUCCEEDED
    else:
        state = ReplicaState.CANCELLED if cancelled else ReplicaState.FAILED
    return dataclasses.replace(
        replica,
        state=state,
        exit_code=code,
        signal=signal_name(-code) if code < 0 else None,
        hostname=replica.hostname or record.host,
        restarts=max(replica.restarts, record.attempt),
        msg="",
    )


def _retries_left(app: AppRecord, status: AppStatus) -> int:
    """How many retries a FAILED job (not in an allocation) still has coming: its
    ``max_retries`` less the attempts made, as Slurm counts them or, where it counts
    none (a het job that requeued itself), as each replica's exit record says."""
    if status.state is not AppState.FAILED:
        return 0
    attempts = max(
        [status.num_restarts, *(r.restarts for role in status.roles for r in role.replicas)]
    )
    request = SlurmRequest.from_json(app.request, app.app)
    return max(request.max_retries - attempts, 0)


def _slurm_exit(rec: JobRecord | None, state: ReplicaState) -> tuple[int | None, str | None]:
    """A group's exit code and signal as Slurm shows them, once it ended; else none.

    Slurm shows ``0:0`` for a job that waits or runs, and the last run's code for a
    requeued one: only an end has an exit. A cancel with no code of its own had none
    (it may never have run), as the owner reports it.
    """
    if rec is None or not is_terminal(state):
        return None, None
    signal_ = signal_name(rec.signal)
    if signal_ is not None:
        return None, signal_
    if state is ReplicaState.CANCELLED and not rec.exit_code:
        return None, None
    if state is ReplicaState.FAILED and not rec.exit_code:
        return 1, None  # FAILED with nothing to show for it (NODE_FAIL, TIMEOUT, ...)
    return rec.exit_code, None


def _slurm_end(role: str, k: int, rec: JobRecord) -> str:
    """How Slurm says a run ended, in the owner's words."""
    why = f" ({rec.reason})" if rec.reason and rec.reason != "None" else ""
    return f"{role}/{k}: Slurm state {rec.state}{why}"


def _ran(rec: JobRecord) -> bool:
    """Whether the group's record is of a run (not of a wait, nor a cancel while waiting)."""
    return _replica_state(rec) in (
        ReplicaState.RUNNING,
        ReplicaState.SUCCEEDED,
        ReplicaState.FAILED,
    )


def _replica_state(rec: JobRecord | None) -> ReplicaState:
    """A group's replica state as Slurm's record of it says (UNKNOWN: no record)."""
    meaning = meaning_of(rec.state) if rec else None
    return _REPLICA_STATE[meaning] if meaning else ReplicaState.UNKNOWN


def _exit_records(
    app_dir: Path, keys: Sequence[ReplicaKey]
) -> tuple[dict[ReplicaKey, PumpExit], bool]:
    """Blocking: each replica's exit record that can be read, and whether a cancel is recorded."""
    found: dict[ReplicaKey, PumpExit] = {}
    for role, k in keys:
        record = read_pump_exit(app_dir / role / str(k) / EXIT_FILE)
        if record is not None:
            found[(role, k)] = record
    return found, AppStore(app_dir).cancel_path.exists()
