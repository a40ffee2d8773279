"""One status poller for every Slurm job a Supervisor follows.

Slurm has no event stream a client can subscribe to, so polling is the only
way; this makes it one ``squeue`` per tick however many apps are tracked
(``squeue --json`` returns every job anyway: 22.05 ignores its filters), plus
one batched ``sacct`` for the jobs that left the controller. The tick is
fast while answers change and backs off while nothing does; a ``poke``
(after a submit or a cancel) makes the next tick come at once. A failing
squeue or sacct changes no job: listeners get the error text, and the
poller retries with backoff.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from supervisor.backends.slurm.records import JobRecord, StepRecord, latest_per_component
from supervisor.backends.slurm.states import Meaning, meaning_of
from supervisor.backends.slurm.transport import AccountingDisabled, SlurmTransport
from supervisor.errors import BackendError

__all__ = ["JobView", "PollerSettings", "SlurmPoller", "StepView"]


@dataclass(frozen=True)
class JobView:
    """What one tick learned about one tracked job.

    ``where`` is "queue" (squeue knows it), "accounting" (only sacct does),
    "gone" (neither: ``problem`` says why) or "error" (this tick could not
    tell; ``problem`` says what failed; nothing about the job changed).
    """

    job_id: int
    components: tuple[JobRecord, ...]
    where: str
    problem: str = ""


Listener = Callable[[JobView], None]


@dataclass(frozen=True)
class StepView:
    """What one tick learned about an allocation an app runs in (``cfg.allocation``).

    ``allocation``: the allocation's job as squeue lists it (None: the controller
    no longer does); ``steps``: its live steps; ``problem``: this tick could not
    tell (squeue failed), nothing changed.
    """

    allocation_id: int
    allocation: JobRecord | None
    steps: tuple[StepRecord, ...]
    problem: str = ""


StepListener = Callable[[StepView], None]

_ENDED = (Meaning.SUCCEEDED, Meaning.FAILED, Meaning.CANCELLED)


@dataclass(frozen=True)
class PollerSettings:
    fast: float = 1.0  # seconds between ticks while something changes
    slow: float = 10.0  # the longest pause while nothing does and nothing runs
    # The longest pause while a tracked job runs: its end is seen within this.
    running: float = 1.0
    growth: float = 1.5  # how fast the pause grows towards ``slow``
    stall: float = 5.0  # after this long without an answer, say so (the call goes on)
    # A job accounting calls live but the controller has not listed for this long was
    # forgotten by it (a controller that lost its state): it ends, never RUNNING for ever.
    forgotten: float = 120.0


class SlurmPoller:
    def __init__(
        self, transport: SlurmTransport, task_group: TaskGroup, settings: PollerSettings
    ) -> None:
        self.transport = transport
        self.settings = settings
        self._task_group = task_group
        # Every listener of each job: its owner's runtime, and waiters for apps that
        # other processes follow (each under its own key).
        self._listeners: dict[int, dict[object, Listener]] = {}
        self._last: dict[int, JobView] = {}
        self._wake = anyio.Event()
        self._running = False
        self._closing = False
        self._stopped = anyio.Event()
        self.accounting: bool | None = None  # unknown until sacct first answers
        self.counters: Counter[str] = Counter()
        self.interval = settings.fast
        self._unlisted_since: dict[int, float] = {}  # live in accounting, not in the queue
        # Apps running inside allocations: (allocation id, listener) by the app's key.
        self._step_listeners: dict[object, tuple[int, StepListener]] = {}

    def track(self, job_id: int, listener: Listener, key: object = None) -> None:
        """Hear about ``job_id`` every time its view changes (``key``: one of several listeners).

        The next tick tells the view to every listener, changed or not: a new one has
        seen none yet (the others see the same view again, which tells them nothing).
        """
        self._listeners.setdefault(job_id, {})[key] = listener
        self._last.pop(job_id, None)
        if not self._running:
            self._running = True
            self._task_group.start_soon(self._loop)
        self.poke()

    def untrack(self, job_id: int, key: object = None) -> None:
        listeners = self._listeners.get(job_id, {})
        listeners.pop(key, None)
        if listeners:
            return  # others still listen
        self._listeners.pop(job_id, None)
        self._last.pop(job_id, None)
        self._unlisted_since.pop(job_id, None)

    def track_steps(self, key: object, allocation_id: int, listener: StepListener) -> None:
        """Hear, every tick, about an allocation and its steps (one ``squeue --steps``
        per tick for all the allocations in use)."""
        self._step_listeners[key] = (allocation_id, listener)
        if not self._running:
            self._running = True
            self._task_group.start_soon(self._loop)
        self.poke()

    def untrack_steps(self, key: object) -> None:
        self._step_listeners.pop(key, None)

    def poke(self) -> None:
        """Tick now rather than at the end of the current pause."""
        self.interval = self.settings.fast
        self._wake.set()

    def statistics(self) -> dict[str, Any]:
        return {
            "transport": self.transport.kind,
            "tracked_jobs": len(self._listeners),
            "tracked_allocation_apps": len(self._step_listeners),
            "interval_s": self.interval,
            "accounting": self.accounting,
            "queue_calls": self.transport.calls[self.transport.queue_call],
            "accounting_calls": self.transport.calls[self.transport.accounting_call],
            **{f"calls_{k}": v for k, v in self.transport.calls.items()},
            **dict(self.counters),
        }

    async def aclose(self) -> None:
        """Stop after the tick in progress, if any: a Slurm command is never cut off."""
        self._closing = True
        if self._running:
            self._wake.set()
            await self._stopped.wait()

    async def _loop(self) -> None:
        try:
            await self._ticks()
        finally:
            self._stopped.set()

    async def _ticks(self) -> None:
        while not self._closing:
            if self._listeners or self._step_listeners:
                changed = await self._tick()
                if changed:
                    self.interval = self.settings.fast
                else:
                    ceiling = self.settings.running if self._any_running() else self.settings.slow
                    self.interval = min(self.interval * self.settings.growth, ceiling)
                with anyio.move_on_after(self.interval):
                    await self._wake.wait()
            else:
                await self._wake.wait()
            self._wake = anyio.Event()

    def _any_running(self) -> bool:
        # Only a queue that merely waits may back off all the way: a running job can
        # end at any moment, and wait() should hear of it within ``running`` seconds.
        if self._step_listeners:
            return True  # an app in an allocation runs (or is about to) as long as it is tracked
        return any(
            meaning_of(c.state) is Meaning.RUNNING
            for job in self._listeners
            if (view := self._last.get(job)) is not None
            for c in view.components
        )

    async def _tick(self) -> bool:
        self.counters["ticks"] += 1
        tracked = list(self._listeners)
        error: BackendError | None = None
        async with anyio.create_task_group() as tg:
            # squeue blocks, retrying, while the controller is away: say so while it lasts.
            tg.start_soon(self._report_stall, tracked)
            try:
                queue = await self.transport.queue()
            except BackendError as e:
                error = e
            tg.cancel_scope.cancel()
        if error is not None:
            self.counters["errors"] += 1
            self._deliver_steps_error(f"squeue failed: {error}")
            return self._deliver_error(tracked, f"squeue failed: {error}")
        if self._step_listeners:
            await self._deliver_steps(queue)
        found: dict[int, list[JobRecord]] = {}
        wanted = set(tracked)
        for record in queue:
            if record.het_job_id in wanted:
                found.setdefault(record.het_job_id, []).append(record)
        views = {
            job: JobView(job, tuple(sorted(found[job], key=lambda r: r.het_offset)), "queue")
            for job in found
        }
        missing = [job for job in tracked if job not in found]
        for job in found:
            self._unlisted_since.pop(job, None)
        if missing:
            views.update(await self._from_accounting(missing))
        changed = False
        for job, view in views.items():
            if self._last.get(job) != view:
                changed = True
                self._last[job] = view
                self._deliver(job, view)
        return changed

    def _deliver(self, job: int, view: JobView) -> None:
        for listener in list(self._listeners.get(job, {}).values()):
            listener(view)

    async def _deliver_steps(self, queue: list[JobRecord]) -> None:
        """One ``squeue --steps`` for every allocation in use that the controller lists."""
        listeners = list(self._step_listeners.values())
        wanted = {allocation for allocation, _ in listeners}
        jobs = {r.job_id: r for r in queue if r.job_id in wanted}
        try:
            steps = await self.transport.steps(sorted(jobs))
        except BackendError as e:
            self.counters["errors"] += 1
            self._deliver_steps_error(f"squeue --steps failed: {e}")
            return
        for allocation, listener in listeners:
            mine = tuple(s for s in steps if s.job_id == allocation)
            listener(StepView(allocation, jobs.get(allocation), mine))

    def _deliver_steps_error(self, problem: str) -> None:
        for allocation, listener in list(self._step_listeners.values()):
            listener(StepView(allocation, None, (), problem))

    async def _from_accounting(self, missing: list[int]) -> dict[int, JobView]:
        if self.accounting is False:
            reason = "the job left the controller and this cluster keeps no accounting"
            return {job: JobView(job, (), "gone", reason) for job in missing}
        try:
            records = await self.transport.accounting(missing)
            self.accounting = True
        except AccountingDisabled:
            self.accounting = False
            return await self._from_accounting(missing)
        except BackendError as e:
            self.counters["errors"] += 1
            return {job: JobView(job, (), "error", f"sacct failed: {e}") for job in missing}
        found: dict[int, list[JobRecord]] = {}
        for record in latest_per_component(records):
            found.setdefault(record.het_job_id, []).append(record)
        views = {}
        for job in missing:
            if job in found:
                comps = tuple(sorted(found[job], key=lambda r: r.het_offset))
                if not all(meaning_of(c.state) in _ENDED for c in comps):
                    # A live job the controller does not list: it is restarting, or
                    # slurmdbd lags. Accounting's older picture must not move it back,
                    # unless this lasts: then the controller forgot the job.
                    since = self._unlisted_since.setdefault(job, anyio.current_time())
                    if anyio.current_time() - since >= self.settings.forgotten:
                        views[job] = JobView(
                            job, (), "gone", f"the controller forgot job {job} (accounting "
                            f"still says {comps[0].state}; squeue has not listed it for "
                            f"{self.settings.forgotten:.0f} s)",
                        )  # fmt: skip
                        continue
                    views[job] = JobView(
                        job, (), "error", "squeue does not list the job but sacct says it is live"
                    )
                    continue
                views[job] = JobView(job, comps, "accounting")
            else:
                views[job] = JobView(job, (), "gone", "neither squeue nor sacct knows the job")
        return views

    async def _report_stall(self, jobs: list[int]) -> None:
        await anyio.sleep(self.settings.stall)
        self.counters["stalls"] += 1
        self._deliver_error(jobs, f"squeue failed: no answer for {self.settings.stall:.0f} s yet")

    def _deliver_error(self, jobs: list[int], problem: str) -> bool:
        for job in jobs:
            view = JobView(job, (), "error", problem)
            if self._last.get(job) != view:
                self._last[job] = view
                self._deliver(job, view)
        return False
