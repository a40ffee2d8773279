"""From what Slurm reports about a job to events about its replicas."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.backends.base import AppCancelRequested, AppNotice
from supervisor.backends.slurm.poller import JobView
from supervisor.backends.slurm.records import JobRecord, hosts_of_tasks
from supervisor.backends.slurm.states import Meaning, meaning_of
from supervisor.events import Exited, Lost, Queued, ReplicaEvent, ReplicaKey, Requeued, Started

__all__ = ["Mail", "ViewTranslator", "signal_name"]

_log = logging.getLogger(__name__)

Mail = ReplicaEvent | AppCancelRequested | AppNotice

HOLD_VIEWS = 3
"""How many views in a row the end of a replica killed by a signal may wait for a
component of its job that is still completing (see ``ViewTranslator._held``)."""


def signal_name(number: int | None) -> str | None:
    if not number:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class ViewTranslator:
    """Turns successive poller views of one job into replica events (pure; keeps a little memory).

    Memory is needed because Slurm reports states, not changes: which attempt
    each replica is on, whether a requeue was already reported, whether we
    asked for the cancel ourselves.
    """

    def __init__(
        self,
        job_id: int,
        keys: Sequence[ReplicaKey],
        groups: Sequence[Sequence[ReplicaKey]] | None = None,
    ) -> None:
        """``groups``: the replicas of each het component (default: one replica each)."""
        self.job_id = job_id
        self.keys = list(keys)
        self.groups = [list(g) for g in groups] if groups is not None else [[k] for k in keys]
        self._attempts = dict.fromkeys(self.keys, 0)
        self._run_start: dict[ReplicaKey, int] = {}  # start time of the run seen this attempt
        self.stopping = False
        self._external_cancel = False
        self._notice = ""  # the controller's error shown now ("" when none)
        # Slurm requeued the job but left some components ended (a het job whose
        # leader's node failed, on 22.05): the job cannot start until someone
        # completes the requeue. The restart count the job was requeued to, or 0.
        self.incomplete_requeue = 0
        # The latest view shows the whole job over: nothing (the batch script included)
        # will put it back in the queue, so a retry must requeue it from outside.
        self.ended = False
        self._held_views = 0  # views in a row that held back ends by a signal

    def resume(self, attempts: Mapping[ReplicaKey, int]) -> None:
        """Carry on from the attempts another process's records reached (``attach``):
        a view of a later run is then a requeue, one of these runs is not."""
        for key, attempt in attempts.items():
            if key in self._attempts:
                self._attempts[key] = attempt

    def events(self, view: JobView) -> list[Mail]:
        if view.where == "error":
            # Once per error, not once per poll: the poller asks every tick while it lasts.
            if view.problem == self._notice:
                return []
            self._notice = view.problem
            return [AppNotice(message=view.problem)]
        out: list[Mail] = []
        if self._notice:
            self._notice = ""
            out.append(AppNotice(message=""))
        if view.where == "gone":
            for role, k in self.keys:
                attempt = self._attempts[(role, k)]
                out.append(Lost(role=role, replica_id=k, attempt=attempt, reason=view.problem))
            return out
        # Real failures first: with kill-on-bad-exit the others were killed *because*
        # of them, and the FSM attributes the app's failure to the first it hears of.
        ordered = sorted(view.components, key=lambda c: (c.signal is not None, c.het_offset))
        requeued_to = max(
            (c.restart_cnt for c in ordered if meaning_of(c.state) in _WAITING), default=0
        )
        casualties = {c.het_offset for c in ordered if _casualty(c, requeued_to)}
        self.incomplete_requeue = requeued_to if casualties else 0
        self.ended = not casualties and all(_over(c) for c in ordered)
        # A casualty ended by its job's requeue, on an older attempt: part of that one
        # requeue, never a failure of its own (see _casualty). A held one still runs.
        instead = dict.fromkeys(self._held(ordered, casualties), Meaning.RUNNING)
        instead.update(dict.fromkeys(casualties, Meaning.REQUEUED))
        for comp in ordered:
            out.extend(self._events(comp, instead.get(comp.het_offset)))
        if _log.isEnabledFor(logging.DEBUG):
            # Slurm reports states, not changes: this trace is what explains a count.
            _log.debug(
                "job %s from %s: %s -> %s",
                self.job_id,
                view.where,
                [(c.het_offset, c.state, c.restart_cnt, c.started, c.reason) for c in ordered],
                [type(m).__name__ + str(getattr(m, "attempt", "")) for m in out],
            )
        return out

    def _held(self, ordered: Sequence[JobRecord], casualties: set[int]) -> set[int]:
        """Components killed by a signal whose end waits for a component still completing.

        With kill-on-bad-exit, Slurm kills the other replicas *because* one
        failed; a view can show them FAILED by SIGTERM while the one that failed
        is still COMPLETING, its exit code not known yet. Reported now, the
        killed ones would be the first failures the FSM hears of, and the one
        that failed would be recorded as stopped with the gang. So their ends
        wait (``HOLD_VIEWS`` views at most) for that component's own end. Not
        while we stop the app ourselves: those signals are ours.
        """
        completing = any(c.state.startswith("COMPLETING") and c.signal is None for c in ordered)
        held: set[int] = set()
        if completing and not self.stopping and self._held_views < HOLD_VIEWS:
            held = {
                c.het_offset
                for c in ordered
                if c.signal is not None
                and meaning_of(c.state) is Meaning.FAILED
                and c.het_offset not in casualties
            }
        self._held_views = self._held_views + 1 if held else 0
        return held

    def _events(self, comp: JobRecord, instead: Meaning | None = None) -> list[Mail]:
        """Every replica of a component lives its state (a group's tasks share one allocation).

        ``instead``: the meaning to report instead of the state Slurm shows.
        """
        if comp.het_offset >= len(self.groups):
            return [AppNotice(message=f"job {comp.job_id} has an unexpected component")]
        out: list[Mail] = []
        group = self.groups[comp.het_offset]
        # Each task's own node, not the group's whole list.
        for key, host in zip(group, hosts_of_tasks(comp.nodes, len(group)), strict=True):
            out.extend(self._replica_events(comp, key, instead, host))
        return out

    def _replica_events(
        self, comp: JobRecord, key: ReplicaKey, instead: Meaning | None, host: str
    ) -> list[Mail]:
        role, k = key
        meaning = meaning_of(comp.state)
        if comp.requeue and comp.state in ("NODE_FAIL", "PREEMPTED"):
            meaning = Meaning.REQUEUED  # Slurm puts such a job back in the queue itself
        if instead is not None:
            meaning = instead
        if meaning is None:
            return [
                AppNotice(message=f"Slurm reports state {comp.state!r}, unknown to asupervisor")
            ]
        out: list[Mail] = []
        seen_start = self._run_start.get(key)
        seen_running = seen_start is not None
        # Slurm may show one requeue over several ticks (REQUEUED, then the count bumped
        # while still REQUEUED, then PENDING): it counts once, until a run is seen again.
        awaiting_run = self._attempts[key] > 0 and seen_start is None
        if comp.state.startswith("COMPLETING") and (
            awaiting_run
            or comp.restart_cnt > self._attempts[key]
            or (seen_start is not None and comp.started and comp.started != seen_start)
        ):
            # The last run's teardown after a requeue: Slurm has already bumped the
            # count or set the next start time, but nothing new runs yet. The teardown
            # may last several ticks, its start time moving between them: a run that
            # only ends is never the next attempt's start.
            meaning = Meaning.REQUEUED
        # Slurm's restart count is the attempt number; a job caught in REQUEUED (or a
        # node failure it will requeue) may not have bumped it yet, so it counts one
        # ahead, once per requeue however many ticks see it.
        attempt = max(comp.restart_cnt, self._attempts[key])
        if meaning is Meaning.REQUEUED and not awaiting_run:
            attempt = max(attempt, self._attempts[key] + 1)
        # restart_cnt does not always move (22.05 leaves it at 0 for a het job that
        # requeued itself), so a run seen to end in the queue again, or a run with
        # another start time, is a requeue too.
        ran = meaning in (Meaning.RUNNING, Meaning.SUCCEEDED, Meaning.FAILED, Meaning.CANCELLED)
        if seen_start is not None and (
            meaning is Meaning.QUEUED or (ran and comp.started and comp.started != seen_start)
        ):
            attempt = max(attempt, self._attempts[key] + 1)
        if attempt > self._attempts[key] or meaning in (Meaning.QUEUED, Meaning.REQUEUED):
            self._run_start.pop(key, None)
        if ran and comp.started and key not in self._run_start:
            self._run_start[key] = comp.started
        if attempt > self._attempts[key]:
            out.append(
                Requeued(role=role, replica_id=k, attempt=attempt, reason=comp.reason or comp.state)
            )
            self._attempts[key] = attempt
        base: dict[str, Any] = {"role": role, "replica_id": k, "attempt": attempt}
        if meaning is Meaning.QUEUED:
            out.append(Queued(**base, reason=comp.reason))
        elif meaning is Meaning.RUNNING:
            out.append(Started(**base, hostname=host))
        elif meaning is Meaning.SUCCEEDED:
            out.append(Started(**base, hostname=host))
            out.append(Exited(**base, exit_code=0))
        elif meaning in (Meaning.FAILED, Meaning.CANCELLED):
            if meaning is Meaning.CANCELLED and not self.stopping and not self._external_cancel:
                self._external_cancel = True
                why = f" ({comp.reason})" if comp.reason and comp.reason != "None" else ""
                out.insert(
                    0, AppCancelRequested(reason=f"job {self.job_id} was cancelled in Slurm{why}")
                )
            code = comp.exit_code
            if meaning is Meaning.FAILED and not code and comp.signal is None:
                code = 1  # FAILED with nothing to show for it (NODE_FAIL, TIMEOUT, ...)
            if meaning is Meaning.CANCELLED and not code:
                code = None  # cancelled before or while running: no success to report
            # A job cancelled while it waited has nodes in some views (those it was about
            # to get): it never ran, so no start is reported for it.
            if comp.nodes and (meaning is Meaning.FAILED or seen_running):
                out.append(Started(**base, hostname=host))
            out.append(
                Exited(
                    **base,
                    exit_code=None if comp.signal else code,
                    signal=signal_name(comp.signal),
                    msg=f"{role}/{k}: Slurm state {comp.state}"
                    + (f" ({comp.reason})" if comp.reason and comp.reason != "None" else ""),
                )
            )
        return out


_WAITING = (Meaning.QUEUED, Meaning.REQUEUED)


def _casualty(comp: JobRecord, requeued_to: int) -> bool:
    """A component that ended on an attempt before the one its job was requeued to.

    Seen on 22.05 when the node of a het job's leader fails: the leader goes
    back to the queue (restart count 1) while the other components show
    FAILED (JobLaunchFailure) with the old count. Their end is the requeue's
    doing; the job's next run includes them once the requeue is completed.
    """
    meaning = meaning_of(comp.state)
    ended = meaning in (Meaning.FAILED, Meaning.CANCELLED, Meaning.SUCCEEDED)
    return ended and comp.requeue and comp.restart_cnt < requeued_to


def _over(comp: JobRecord) -> bool:
    """The component ended and Slurm will not requeue it by itself."""
    if comp.requeue and comp.state in ("NODE_FAIL", "PREEMPTED"):
        return False
    return meaning_of(comp.state) in (Meaning.SUCCEEDED, Meaning.FAILED, Meaning.CANCELLED)
