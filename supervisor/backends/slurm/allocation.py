"""Apps run inside an existing allocation (``cfg allocation=JOBID``): replicas as job steps.

An interactive user holding an allocation (``salloc --no-shell``, or a batch
job that runs) iterates without queueing again: instead of ``sbatch``, launch
starts a small driver script, detached (``setsid -f``), on the submitting host.
The driver runs each het group of the app (a replica, or a grouped role) as one
``srun --jobid=JOBID --overlap`` step, through the same log pump as the batch
script (so logs and each replica's ``exit.json`` land in the same places), stops
the other steps when one fails (the gang), and retries the whole app itself
while retries are left, as the batch script requeues itself: retries go on with
nobody following.

What each replica does is observed, never decided, here: the shared poller's
one ``squeue --steps`` per tick (for every allocation in use) says which steps
run where; the files the pump and the driver write say how each attempt ended.
The driver's files, in ``<app dir>/.asupervisor/driver/``:

* ``pid``: ``PID HOST`` of the driver;
* ``attempt``: the attempt it runs now;
* ``a<N>.g<G>.rc``: srun's exit code for het group G in attempt N;
* ``done``: ``{"attempt": N, "code": C}`` once it ended (no more steps come).

A cancel cancels the app's steps (and tells the driver), never the allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from supervisor.backends.base import (
    AppCancelRequested,
    AppNotice,
    AppRuntime,
    AppTasks,
    BackendContext,
    EventSink,
    LogTarget,
)
from supervisor.backends.slurm.cluster import job_metadata
from supervisor.backends.slurm.poller import SlurmPoller, StepView
from supervisor.backends.slurm.records import JobRecord, StepRecord, hosts_of_tasks
from supervisor.backends.slurm.script import (
    RANK0_ENV,
    TASK_INDEX,
    SlurmGroup,
    SlurmRequest,
    owner_comment,
    pump_path,
)
from supervisor.backends.slurm.times import (
    PumpExit,
    ReplicaTimes,
    read_pump_exit,
    read_pump_starts,
)
from supervisor.backends.slurm.translate import signal_name
from supervisor.backends.slurm.transport import SlurmTransport
from supervisor.backends.store import CANCEL_REQUEST, AppRecord, AppStore, Owner, read_json_or_none
from supervisor.errors import BackendError, Problem, SpecError, SubmitError
from supervisor.events import Exited, Lost, ReplicaKey, Requeued, Started
from supervisor.fsm.rules import derive_app_state
from supervisor.logs.pump import EXIT_FILE
from supervisor.runopts import ResolvedCfg
from supervisor.specs import MPI, AppDef
from supervisor.states import ReplicaState
from supervisor.status import AppStatus, ReplicaStatus, RoleStatus, Transition


class Host(Protocol):
    """What a runtime needs of the backend that launched it (``SlurmBackend``; imports go
    one way: the backend imports this module)."""

    context: BackendContext
    transport: SlurmTransport
    poller: SlurmPoller
    owner: Owner
    closing: bool

    def make_log_target(self, store: AppStore, role: str, replica_id: int) -> LogTarget: ...


__all__ = [
    "ALLOCATION",
    "AllocationRuntime",
    "Progress",
    "allocation_app_problems",
    "allocation_of",
    "allocation_status",
    "cancel_elsewhere",
    "check_allocation",
    "check_allocation_cfg",
    "driver_dir",
    "driver_path",
    "observe",
    "read_progress",
    "render_driver",
    "start_driver",
    "step_prefix",
]

ALLOCATION = "allocation"
"""The run option: the job id of the allocation the app runs in."""

BATCH_ONLY = (
    "partition", "time", "qos", "account", "reservation", "constraint", "comment",
    "mail-user", "mail-type", "exclusive", "hold", "gres", "gpus_per_node",
    "after", "afterok", "afterany",
)  # fmt: skip
"""Options that shape a new batch job: meaningless for steps of a job that already runs."""

_JOB_ID = re.compile(r"[1-9][0-9]*")
_KEPT_DIRECTIVES = ("--nodes=", "--ntasks=", "--ntasks-per-node=", "--nodelist=", "--exclude=")
_DRIVER_END_S = 60.0
"""How long a retry beyond the driver's own waits for the driver to end."""
_CANCEL_SENT_S = 10.0
"""How long a sent cancel may take to show before it is sent again."""


# ---------------------------------------------------------------- options


def allocation_of(cfg: ResolvedCfg) -> int | None:
    """The allocation the app runs in, or None (a batch job of its own)."""
    value = cfg.get_str(ALLOCATION)
    return int(value) if value is not None and _JOB_ID.fullmatch(value) else None


def check_allocation_cfg(cfg: ResolvedCfg, transport_kind: str) -> None:
    """SpecError naming ``cfg.allocation`` (and each option it cannot go with)."""
    value = cfg.get_str(ALLOCATION)
    if value is None:
        return
    problems: list[Problem] = []
    if not _JOB_ID.fullmatch(value):
        problems.append(Problem(f"cfg.{ALLOCATION}", f"{value!r} is not a Slurm job id (digits)"))
    if transport_kind != "cli":
        problems.append(
            Problem(
                f"cfg.{ALLOCATION}",
                f"running inside an allocation needs the cli transport (srun), not "
                f"{transport_kind!r}; set ASUPERVISOR_SLURM_TRANSPORT=cli",
            )
        )
    for key in BATCH_ONLY:
        given = cfg.get(key)
        if given is not None and given is not False and given != []:
            problems.append(
                Problem(
                    f"cfg.{key}",
                    f"cannot go with cfg.{ALLOCATION}: the app runs as steps of job {value}, "
                    "which already has its resources and limits",
                )
            )
    if problems:
        raise SpecError(problems, context="invalid run options")


def allocation_app_problems(app: AppDef, cfg: ResolvedCfg) -> list[Problem]:
    """What the app needs that steps of an allocation cannot give (``SlurmBackend.check_app``
    lists it in a dry run, ``SlurmBackend.dryrun`` refuses it): an mpirun role runs in a
    batch script, which such an app has not."""
    if allocation_of(cfg) is None:
        return []  # none, or one ``check_allocation_cfg`` names
    return [
        Problem(
            f"cfg.{ALLOCATION}",
            f"role {role.name!r} runs mpirun in a batch script, which an app "
            "inside an allocation has not: use the pmix or pmi2 plugin (one step of ranks)",
        )
        for role in app.roles
        if role.metadata.get(MPI) == "mpirun"
    ]


# ---------------------------------------------------------------- the driver


def driver_dir(app_dir: str | Path) -> Path:
    return Path(app_dir) / ".asupervisor" / "driver"


def driver_path(app_dir: str | Path) -> Path:
    return Path(app_dir) / ".asupervisor" / "driver.sh"


def step_prefix(session: str, app_id: str) -> str:
    """Every step of the app is named ``<prefix>g<GROUP>:a<ATTEMPT>``."""
    return f"{owner_comment(session, app_id, None)}:"


def _step_options(group: SlurmGroup) -> list[str]:
    kept = [d for d in group.directives if d.startswith(_KEPT_DIRECTIVES)]
    if not any(d.startswith("--nodes=") for d in kept):
        kept.insert(0, "--nodes=1")
    return kept


def _nodes_of(group: SlurmGroup) -> int:
    for d in group.directives:
        if d.startswith("--nodes="):
            return int(d.partition("=")[2])
    return 1


def _group_command(group: SlurmGroup, pump: str) -> str:
    """The group's replicas under the pump; a group of several picks its replica by task rank
    (0-based within its own step, unlike the batch script's one het step)."""
    if len(group.replicas) == 1:
        return group.replicas[0].command(pump)
    cases = "".join(f"{i}) exec {r.command(pump)} ;;\n" for i, r in enumerate(group.replicas))
    body = (
        f'case "${TASK_INDEX}" in\n{cases}'
        f'*) echo "asupervisor: no replica for task ${TASK_INDEX}" >&2; exit 1 ;;\nesac'
    )
    return f"sh -c {shlex.quote(body)}"


def render_driver(request: SlurmRequest, allocation: int) -> str:
    """The driver script (pure): ``bash driver.sh [FIRST_ATTEMPT]``."""
    q = shlex.quote
    state = driver_dir(request.app_dir)
    pump = pump_path(request.app_dir)
    prefix = step_prefix(request.session, request.app_id)
    lines = [
        "#!/bin/bash",
        f"# asupervisor app {request.app_id} ({request.app.name}), session {request.session}:",
        f"# its replicas run as steps of allocation {allocation}, started from here (detached).",
        f"state={q(str(state))}",
        'mkdir -p "$state"',
        'exec >>"$state/driver.log" 2>&1 </dev/null',
        'put() { printf \'%s\\n\' "$2" >"$state/.$1.tmp" && mv -f "$state/.$1.tmp" "$state/$1"; }',
        'put pid "$$ $(hostname)"',
        f"allocation={allocation}",
        'attempt="${1:-0}"',
        f"max_retries={request.max_retries}",
        f"cancel={q(str(Path(request.app_dir) / CANCEL_REQUEST))}",
        "export SLURM_UNBUFFEREDIO=1",
        'export ASUP_PYTHON="${ASUPERVISOR_PYTHON:-python3}"',
        "# The allocation's nodes, given to the groups round robin (one node per replica,",
        "# as the batch job's het groups get), unless cfg.nodelist placed them.",
        'nodes=($(scontrol show hostnames "$(squeue -h -j "$allocation" -o %N)" 2>/dev/null))',
        "cursor=0",
        "pick() {  # sets picked (no subshell: the cursor moves on)",
        '    local n="$1" out=() i',
        '    picked=""',
        '    [ "${#nodes[@]}" -gt 0 ] || return 0',
        '    for ((i = 0; i < n; i++)); do out+=("${nodes[(cursor + i) % ${#nodes[@]}]}"); done',
        "    cursor=$(((cursor + n) % ${#nodes[@]}))",
        '    local IFS=,; picked="--nodelist=${out[*]}"',
        "}",
    ]
    for group in request.groups:
        fixed = next((d for d in group.directives if d.startswith("--nodelist=")), None)
        lines.append(
            f"place{group.group}={q(fixed)}"
            if fixed
            else f'pick {_nodes_of(group)}; place{group.group}="$picked"'
        )
    lines += [f'put g{g.group}.nodes "${{place{g.group}#--nodelist=}}"' for g in request.groups]
    lines += [
        "# Rank 0's host: the first node of group 0.",
        'rank0="${place0#--nodelist=}"',
        'rank0="${rank0%%,*}"',
        f'export {RANK0_ENV}="${{rank0:-${{nodes[0]:-}}}}"',
        f'export ASUPERVISOR_RANK0_HOST="${RANK0_ENV}"',
        "",
        "pids=()",
        "stopping=0",
        'stop_steps() { local p; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; }',
        "trap 'stopping=1; stop_steps' TERM INT HUP",
        "code=0",
        'why=""',
        "while :; do",
        '    if [ -e "$cancel" ] || [ "$stopping" = 1 ]; then code=143; why=cancelled; break; fi',
        "    # The allocation must still run (a retry after it ended would only fail).",
        '    now=$(squeue -h -j "$allocation" -o %T 2>&1 | head -n 1)',
        '    if [ "$now" != RUNNING ] &&',
        '        [[ -z "$now" || "$now" == *"Invalid job id"* || "$now" =~ ^[A-Z_]+$ ]]; then',
        '        code=1; why="allocation $allocation ended (${now:-gone})"; break',
        "    fi",
        '    export ASUPERVISOR_ATTEMPT="$attempt"',
        '    put attempt "$attempt"',
        "    pids=()",
    ]
    for group in request.groups:
        options = [
            f"--jobid={allocation}",
            "--overlap",
            *_step_options(group),
            *group.step_options,  # --mpi=PLUGIN, pyxis' container options: the same for a step
            f"--chdir={request.workdir}",
            "--kill-on-bad-exit=1",
            f"--output={group.launcher_log}",
            "--open-mode=append",
        ]
        name = q(f"--job-name={prefix}g{group.group}:a")
        place = f"place{group.group}"
        lines += [
            f'    srun {shlex.join(options)} {name}"$attempt" ${{{place}:+"${place}"}} \\',
            f"        {_group_command(group, pump)} &",
            "    pids+=($!)",
        ]
    lines += [
        "    ended=()",
        "    left=${#pids[@]}",
        "    failed=0",
        '    while [ "$left" -gt 0 ]; do',
        '        for i in "${!pids[@]}"; do',
        '            [ -z "${ended[$i]:-}" ] || continue',
        '            ! kill -0 "${pids[$i]}" 2>/dev/null || continue',
        '            wait "${pids[$i]}"',
        "            rc=$?",
        '            ended[$i]="$rc"',
        "            left=$((left - 1))",
        '            put "a$attempt.g$i.rc" "$rc"',
        '            echo "asupervisor: attempt $attempt: group $i: srun exited with code $rc"',
        '            if [ "$rc" -ne 0 ] && [ "$failed" = 0 ]; then',
        '                failed=1; code="$rc"; stop_steps  # the gang stops with its first failure',
        "            fi",
        "        done",
        '        if [ "$left" -gt 0 ]; then sleep 1 & wait $! 2>/dev/null; fi',
        "    done",
        '    if [ "$failed" = 0 ]; then code=0; break; fi',
        '    if [ -e "$cancel" ] || [ "$stopping" = 1 ]; then why=cancelled; break; fi',
        '    if [ "$attempt" -ge "$max_retries" ]; then break; fi',
        "    attempt=$((attempt + 1))",
        "done",
        'why="${why//[^A-Za-z0-9 ._:()-]/ }"',
        'put done "{\\"attempt\\": $attempt, \\"code\\": $code, \\"why\\": \\"$why\\"}"',
        'exit "$code"',
        "",
    ]
    return "\n".join(lines)


def _driver_environment() -> dict[str, str]:
    """The submitting process's environment, less what would steer srun elsewhere
    (a Supervisor itself run inside a Slurm job has that job's SLURM_* variables)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")) or k == "SLURM_CONF"
    }


async def start_driver(app_dir: str, workdir: str, first_attempt: int = 0) -> None:
    """Start the driver detached from this process (it outlives it); returns at once."""
    state = driver_dir(app_dir)
    await anyio.to_thread.run_sync(_clear_done, state)
    try:
        done = await anyio.run_process(
            ["setsid", "-f", "bash", str(driver_path(app_dir)), str(first_attempt)],
            stdin=None,
            stdout=-3,  # subprocess.DEVNULL: the driver must hold no pipe of ours
            stderr=-3,
            check=False,
            cwd=workdir,
            env=_driver_environment(),
        )
    except OSError as e:
        raise SubmitError(f"cannot start the app's driver: {e}", transient=False) from e
    if done.returncode != 0:
        raise SubmitError(
            f"cannot start the app's driver (setsid exited with {done.returncode})",
            transient=False,
        )


def _clear_done(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "done").unlink(missing_ok=True)


async def check_allocation(transport: SlurmTransport, allocation: int) -> JobRecord:
    """The allocation's job, running; SubmitError naming ``cfg.allocation`` otherwise."""
    try:
        records = [r for r in await transport.queue() if r.job_id == allocation]
    except BackendError as e:
        # Nothing was started yet: the launch leaves nothing behind.
        raise SubmitError(
            f"cfg.{ALLOCATION}: cannot tell whether job {allocation} runs: {e}",
            transient=e.transient,
        ) from e
    if not records:
        raise SubmitError(
            f"cfg.{ALLOCATION}: Slurm has no job {allocation} (salloc --no-shell ... gives one)",
            transient=False,
        )
    record = records[0]
    if record.state != "RUNNING":  # not PENDING, SUSPENDED, COMPLETING, ...
        raise SubmitError(
            f"cfg.{ALLOCATION}: job {allocation} is {record.state}, not RUNNING: "
            "an app can only run inside an allocation that has its nodes",
            transient=False,
        )
    return record


# ---------------------------------------------------------------- observation


@dataclass(frozen=True)
class Progress:
    """What the driver and the pumps wrote (read off the loop)."""

    attempt: int | None = None  # the attempt the driver runs now (None: not started yet)
    done: tuple[int, int] | None = None  # (last attempt, code) once the driver ended
    why: str = ""  # why it ended early: "cancelled", "allocation ... ended"
    rcs: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (group, attempt) -> rc
    driver_alive: bool | None = None  # None: cannot tell (another host, no pid yet)
    cancel_requested: bool = False  # someone recorded a cancel (this process or another)
    nodes: Mapping[int, str] = field(default_factory=dict)  # the nodes each group was given
    # Each replica's exit record: its attempt, code, where it ran, when it started and ended.
    exit_records: Mapping[ReplicaKey, PumpExit] = field(default_factory=dict)


def _int_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_progress(app_dir: str, groups: Sequence[Sequence[ReplicaKey]]) -> Progress:
    """Blocks: read the driver's and the pumps' files."""
    state = driver_dir(app_dir)
    done_record = read_json_or_none(state / "done")
    done = None
    why = ""
    if isinstance(done_record, dict):
        try:
            done = (int(done_record["attempt"]), int(done_record["code"]))
            why = str(done_record.get("why") or "")
        except (KeyError, TypeError, ValueError):
            done = None
    rcs: dict[tuple[int, int], int] = {}
    try:
        names = os.listdir(state)
    except OSError:
        names = []
    nodes: dict[int, str] = {}
    for name in names:
        found = re.fullmatch(r"a(\d+)\.g(\d+)\.rc", name)
        if found:
            rc = _int_file(state / name)
            if rc is not None:
                rcs[(int(found.group(2)), int(found.group(1)))] = rc
        given = re.fullmatch(r"g(\d+)\.nodes", name)
        if given:
            with contextlib.suppress(OSError):
                nodes[int(given.group(1))] = (state / name).read_text().strip()
    exit_records: dict[ReplicaKey, PumpExit] = {}
    for group in groups:
        for role, k in group:
            record = read_pump_exit(Path(app_dir) / role / str(k) / EXIT_FILE)
            if record is not None:
                exit_records[(role, k)] = record
    alive: bool | None = None
    try:
        pid_text, host = (state / "pid").read_text().split()
        if host == socket.gethostname():
            os.kill(int(pid_text), 0)
            alive = True
    except ProcessLookupError:
        alive = False
    except (OSError, ValueError):
        alive = None
    cancelled = (Path(app_dir) / CANCEL_REQUEST).exists()
    return Progress(
        _int_file(state / "attempt"),
        done,
        why,
        rcs,
        alive,
        cancelled,
        nodes,
        exit_records,
    )


@dataclass(frozen=True)
class Seen:
    """One replica's attempt as observed: ``state`` is waiting, running, exited or lost."""

    state: str
    host: str = ""
    exit_code: int | None = None
    signal: str | None = None
    msg: str = ""


def observe(
    key: ReplicaKey,
    group: int,
    index: int,
    size: int,
    attempt: int,
    progress: Progress,
    steps: Mapping[tuple[int, int], StepRecord],
    allocation: JobRecord | None,
    allocation_id: int,
    launcher_log: str = "",
) -> Seen:
    """What one replica's ``attempt`` is doing (pure). ``steps``: the app's live steps by
    (group, attempt); ``allocation``: the allocation's job (None: not listed by squeue)."""
    role, k = key
    step = steps.get((group, attempt))
    # Where it runs: its step's nodes, else (a step that ended between two looks) the
    # nodes the driver gave its group.
    placed = step.nodes if step else progress.nodes.get(group, "")
    host = hosts_of_tasks(placed, size)[index] if placed else ""
    recorded = progress.exit_records.get(key)
    if recorded is not None and recorded.attempt == attempt:
        # A step that ended before any look saw it, and before the driver wrote its
        # group's nodes (seen under load): the replica's own record says where it ran.
        host = host or recorded.host
        code = recorded.returncode
        if code < 0:
            return Seen("exited", host, None, signal_name(-code))
        return Seen("exited", host, code)
    rc = progress.rcs.get((group, attempt))
    if rc is not None:
        where = f" (see {launcher_log})" if launcher_log else ""
        if recorded is not None and recorded.attempt > attempt:
            msg = f"{role}/{k}: srun exited with code {rc}"  # its record is the next attempt's
        else:
            # srun ended, and the pump (which records before it exits) recorded nothing.
            msg = f"{role}/{k}: srun ended with code {rc} before the replica recorded an exit"
        return Seen("exited", host, rc or None, None, msg + where)
    if step is not None:
        return Seen("running", host)
    if progress.done is not None:
        ran_to, _ = progress.done
        if progress.why.startswith("allocation") and ran_to >= attempt:
            return Seen("lost", msg=f"{role}/{k}: {progress.why}")
        if ran_to >= attempt:
            return Seen("exited", "", None, None, f"{role}/{k}: stopped before it ran")
        return Seen("lost", msg=progress.why or f"the app's driver ended after attempt {ran_to}")
    if progress.driver_alive is False:
        return Seen("lost", msg="the app's driver died (see .asupervisor/driver/driver.log)")
    if progress.done is None and progress.driver_alive is None and allocation is None:
        return Seen("lost", msg=f"allocation {allocation_id} is no longer in the queue")
    return Seen("waiting")


def _steps_by_group(prefix: str, steps: Sequence[StepRecord]) -> dict[tuple[int, int], StepRecord]:
    out = {}
    for step in steps:
        if not step.name.startswith(prefix):
            continue
        found = re.fullmatch(r"g(\d+):a(\d+)", step.name[len(prefix) :])
        if found:
            out[(int(found.group(1)), int(found.group(2)))] = step
    return out


# ---------------------------------------------------------------- the runtime


class AllocationRuntime(AppRuntime):
    """An app whose replicas run as steps of an allocation, followed through the poller."""

    def __init__(
        self,
        backend: Host,
        request: SlurmRequest,
        allocation: int,
        sink: EventSink,
        tasks: AppTasks,
    ) -> None:
        self._backend = backend
        self.request = request
        self.allocation = allocation
        self.emit = sink
        self.store = AppStore(Path(request.app_dir))
        self.prefix = step_prefix(request.session, request.app_id)
        self.groups = [[(r.role, r.replica_id) for r in g.replicas] for g in request.groups]
        self.keys = [key for group in self.groups for key in group]
        self._attempt = dict.fromkeys(self.keys, 0)
        self._started: set[tuple[ReplicaKey, int]] = set()
        self._exited: set[tuple[ReplicaKey, int]] = set()
        self._lost: set[tuple[ReplicaKey, int]] = set()
        self._times = ReplicaTimes()
        self._log_dirs = {(r.role, r.replica_id): r.log_dir for r in request.replicas}
        self._steps: dict[tuple[int, int], StepRecord] = {}
        self._progress = Progress()
        self._notice = ""
        self.stopping = False
        self._external_cancel = False
        self._gave_up = False
        self._over = anyio.Event()  # the driver ended: no more steps come
        self._views, self._inbox = anyio.create_memory_object_stream[StepView](1)
        tasks.start_soon(self._follow)
        backend.poller.track_steps(self, allocation, self.on_view)

    def on_view(self, view: StepView) -> None:
        """The poller's listener (on the loop, never blocks): only the latest view matters."""
        try:
            self._views.send_nowait(view)
        except anyio.WouldBlock:
            pass  # one is waiting already; the next tick brings a newer one
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def _follow(self) -> None:
        async with self._views, self._inbox:
            async for view in self._inbox:
                await self._look(view)

    async def _look(self, view: StepView) -> None:
        if view.problem:
            if view.problem != self._notice:
                self._notice = view.problem
                self.emit(AppNotice(message=view.problem))
            return
        if self._notice:
            self._notice = ""
            self.emit(AppNotice(message=""))
        progress = await anyio.to_thread.run_sync(read_progress, self.request.app_dir, self.groups)
        self._progress = progress
        self._steps = _steps_by_group(self.prefix, view.steps)
        if progress.cancel_requested and not self.stopping and not self._external_cancel:
            # Another process cancelled the app (``asupervisor cancel``): it stops its steps.
            self._external_cancel = True
            self.emit(AppCancelRequested(reason="cancelled by request (from another process)"))
        driver_attempt = progress.attempt or 0
        # Exits first (the root cause), then the driver's own retries, then starts.
        exits: list[Exited] = []
        later: list[Requeued | Started | Lost] = []
        for g, group in enumerate(self.request.groups):
            for i, replica in enumerate(group.replicas):
                key = (replica.role, replica.replica_id)
                for attempt in sorted({self._attempt[key], driver_attempt}):
                    if attempt < self._attempt[key]:
                        continue
                    if attempt > self._attempt[key]:
                        # The driver retried on its own (a failure this process missed).
                        later.append(
                            Requeued(
                                role=key[0],
                                replica_id=key[1],
                                attempt=attempt,
                                reason="the driver retried the app",
                            )
                        )
                        self._attempt[key] = attempt
                    self._observe_one(key, g, i, len(group.replicas), attempt, view, exits, later)
        failed = [m for m in exits if m.exit_code or m.signal]
        if failed:
            errors = await anyio.to_thread.run_sync(self._read_errors, failed)
            found = dict(zip([id(m) for m in failed], errors, strict=True))
            exits = [
                dataclasses.replace(m, structured_error_msg=found[id(m)]) if found.get(id(m)) else m
                for m in exits
            ]
        # A replica seen for the first time already exited (its step started and ended
        # between two looks) gets its Started, which carries its host, right before its
        # Exited: after it, the FSM would take the Started for news of an ended attempt.
        # Each at the time the replica's pump recorded, where it recorded it: a start seen
        # with its end, as the exit record says; one seen alone, as its start record says.
        starts = {(m.key, m.attempt): m for m in later if isinstance(m, Started)}
        paired = {
            (m.key, m.attempt): starts.pop((m.key, m.attempt))
            for m in exits
            if (m.key, m.attempt) in starts
        }
        alone = list(starts.values())
        started = (
            await anyio.to_thread.run_sync(read_pump_starts, alone, self._log_dirs) if alone else {}
        )
        for exited in exits:
            times = self._exit_times(exited, progress)  # (started, ended), Nones: no record
            start = paired.get((exited.key, exited.attempt))
            if start is not None:
                self.emit(self._times.stamped(start, *times))
            self.emit(self._times.stamped(exited, *times))
        for event in later:
            if isinstance(event, Started):
                if starts.get((event.key, event.attempt)) is not event:
                    continue  # told with its exit, above
                event = self._times.stamped(event, started.get((event.key, event.attempt)))
            self.emit(event)
        lost = [m.reason for m in later if isinstance(m, Lost)]
        if lost and not self._gave_up:
            # Nothing will run these replicas any more (the allocation ended, the driver
            # died): the app's supervision ends, UNKNOWN with the reason.
            self._gave_up = True
            self.emit(AppNotice(message=lost[0], fatal=True))
        if progress.done is not None or progress.driver_alive is False:
            self._over.set()

    @staticmethod
    def _exit_times(exited: Exited, progress: Progress) -> tuple[float | None, float | None]:
        """(started, ended) as the pump recorded the attempt ``exited`` tells of (Nones
        where it did not: its srun ended with no record, or the record is another attempt's)."""
        record = progress.exit_records.get(exited.key)
        if record is None or record.attempt != exited.attempt:
            return (None, None)
        return (record.started, record.ended)

    def _observe_one(
        self,
        key: ReplicaKey,
        g: int,
        i: int,
        size: int,
        attempt: int,
        view: StepView,
        exits: list[Exited],
        later: list[Requeued | Started | Lost],
    ) -> None:
        if (key, attempt) in self._exited:
            return
        seen = observe(
            key,
            g,
            i,
            size,
            attempt,
            self._progress,
            self._steps,
            view.allocation,
            self.allocation,
            self.request.groups[g].launcher_log,
        )
        base: dict[str, Any] = {"role": key[0], "replica_id": key[1], "attempt": attempt}
        if (
            seen.state in ("running", "exited")
            and seen.host
            and (key, attempt) not in self._started
        ):
            self._started.add((key, attempt))
            later.append(Started(**base, hostname=seen.host))
        if seen.state == "exited":
            self._exited.add((key, attempt))
            exits.append(Exited(**base, exit_code=seen.exit_code, signal=seen.signal, msg=seen.msg))
        elif seen.state == "lost" and (key, attempt) not in self._lost:
            self._lost.add((key, attempt))
            later.append(Lost(**base, reason=seen.msg))

    def _read_errors(self, exits: list[Exited]) -> list[str]:
        by_key = {(r.role, r.replica_id): r for r in self.request.replicas}
        return [
            self.store.read_error_file(Path(by_key[m.key].error_file(self.request.workdir)))
            for m in exits
        ]

    def _app_steps(self) -> list[str]:
        return [s.step_id for s in self._steps.values()]

    async def stop(self, keys: Sequence[ReplicaKey], reason: str) -> None:
        """Cancel the app's steps (never the allocation), durably: the recorded cancel keeps
        the driver from starting another attempt; sent again until the driver ended."""
        if self.stopping:
            return
        self.stopping = True
        await anyio.to_thread.run_sync(self.store.request_cancel)
        while not (self._over.is_set() or self._backend.closing):
            await anyio.to_thread.run_sync(_signal_driver, self.request.app_dir)
            try:
                await self._backend.transport.cancel_steps(self._app_steps())
            except BackendError as e:
                if not e.transient:
                    raise
                self.emit(AppNotice(message=f"the cancel is not delivered yet, retrying: {e}"))
            self._backend.poller.poke()
            with anyio.move_on_after(_CANCEL_SENT_S):
                await self._over.wait()

    async def restart(self, attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
        """The driver retries by itself while its retries last; past them (or after it
        ended), a new driver starts at the attempt asked for."""
        wanted = max((attempt for _, attempt in attempts), default=0)
        for key, attempt in attempts:
            self._attempt[key] = max(self._attempt.get(key, 0), attempt)
        progress = await anyio.to_thread.run_sync(read_progress, self.request.app_dir, self.groups)
        if wanted > self.request.max_retries:
            # Beyond the driver's own retries: once it ended, a new one runs the attempt.
            with anyio.move_on_after(_DRIVER_END_S):
                while progress.done is None and progress.driver_alive is not False:
                    await anyio.sleep(0.5)
                    progress = await anyio.to_thread.run_sync(
                        read_progress, self.request.app_dir, self.groups
                    )
        ended = progress.done is not None and progress.done[0] < wanted
        if ended and not progress.why and not self.stopping and not self._backend.closing:
            self._over = anyio.Event()
            await start_driver(self.request.app_dir, self.request.workdir, wanted)
        self._backend.poller.poke()

    async def record(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool
    ) -> None:
        await anyio.to_thread.run_sync(
            self.store.write_state, status, list(transitions), final, self._backend.owner
        )

    def log_target(self, role: str, replica_id: int) -> LogTarget:
        return self._backend.make_log_target(self.store, role, replica_id)

    def metadata(self) -> Mapping[str, str]:
        """The job its steps belong to (the allocation: no job of its own)."""
        return {**job_metadata(self.allocation), "slurm_allocation": str(self.allocation)}

    async def aclose(self) -> None:
        self._backend.poller.untrack_steps(self)
        await self._views.aclose()


def _signal_driver(app_dir: str) -> None:
    """SIGTERM to the driver, when it runs on this host: it stops its steps and retries no more."""
    try:
        pid_text, host = (driver_dir(app_dir) / "pid").read_text().split()
        if host == socket.gethostname() and not (driver_dir(app_dir) / "done").exists():
            os.kill(int(pid_text), 15)
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- other processes


async def allocation_status(transport: SlurmTransport, app: AppRecord) -> AppStatus:
    """An allocation app's state as its files and Slurm show it now, without an FSM."""
    request = app.request
    app_dir = str(request["app_dir"])
    allocation = int(app.extra["job_id"])
    groups = [[(str(role), int(k)) for role, k in g] for g in request["groups"]]
    steps: dict[tuple[int, int], StepRecord] = {}
    record: JobRecord | None = None
    problem = ""
    progress = await anyio.to_thread.run_sync(read_progress, app_dir, groups)
    if progress.done is None:
        # Slurm first, the files after: a step that ends in between has recorded its exit.
        try:
            record = next((r for r in await transport.queue() if r.job_id == allocation), None)
            prefix = step_prefix(str(request["session"]), str(request["app_id"]))
            steps = _steps_by_group(prefix, await transport.steps([allocation]))
        except BackendError as e:
            problem = f"cannot ask Slurm: {e}"
        progress = await anyio.to_thread.run_sync(read_progress, app_dir, groups)
    attempt = progress.attempt or 0
    found: dict[ReplicaKey, ReplicaStatus] = {}
    for g, keys in enumerate(groups):
        for i, (role, k) in enumerate(keys):
            seen = observe((role, k), g, i, len(keys), attempt, progress, steps, record, allocation)
            if seen.state == "exited":
                if seen.exit_code == 0:
                    state = ReplicaState.SUCCEEDED
                elif progress.cancel_requested:
                    state = ReplicaState.CANCELLED
                else:
                    state = ReplicaState.FAILED
            elif seen.state == "running":
                state = ReplicaState.RUNNING
            elif seen.state == "lost" or problem:
                state = ReplicaState.UNKNOWN
            else:
                state = ReplicaState.PENDING
            found[(role, k)] = ReplicaStatus(
                id=k,
                state=state,
                role=role,
                hostname=seen.host,
                exit_code=seen.exit_code,
                signal=seen.signal,
                restarts=attempt,
                msg=seen.msg,
            )
    definition = app.app
    roles = tuple(
        RoleStatus(role.name, tuple(found[(role.name, k)] for k in range(role.num_replicas)))
        for role in definition.roles
    )
    states = [r.state for r in found.values()]
    return AppStatus(
        state=derive_app_state(states, cancel_requested=False),
        num_restarts=attempt,
        msg=problem,
        roles=roles,
    )


async def cancel_elsewhere(transport: SlurmTransport, app: AppRecord) -> None:
    """A cancel from a process that did not launch the app: its steps, never the allocation
    (the recorded cancel, written before, keeps the driver from retrying)."""
    request = app.request
    await anyio.to_thread.run_sync(_signal_driver, str(request["app_dir"]))
    prefix = step_prefix(str(request["session"]), str(request["app_id"]))
    mine = _steps_by_group(prefix, await transport.steps([int(app.extra["job_id"])]))
    await transport.cancel_steps([s.step_id for s in mine.values()])
