"""The allocation driver (``cfg allocation=JOBID``): its rendering, golden, and its logic run
for real by bash against stand-ins for srun/squeue/scontrol (the real cluster is in
tests/integration/test_slurm_allocation.py).

Regenerate the golden file with ``UPDATE_GOLDEN=1 pytest tests/unit/test_slurm_allocation.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import AppDef, Role, SpecError
from supervisor.backends.base import DryrunContext
from supervisor.backends.slurm.allocation import (
    Progress,
    allocation_app_problems,
    check_allocation_cfg,
    driver_dir,
    observe,
    read_progress,
    render_driver,
)
from supervisor.backends.slurm.options import slurm_run_opts
from supervisor.backends.slurm.records import JobRecord, StepRecord, parse_steps
from supervisor.backends.slurm.script import (
    ClusterFacts,
    SlurmRequest,
    pump_path,
    render,
)
from supervisor.backends.slurm.ship import ship_pump
from supervisor.backends.slurm.times import PumpExit
from supervisor.specs import MPI, MPI_NODES, PROCS_PER_NODE

GOLDEN = Path(__file__).parent / "golden"
FACTS = ClusterFacts(version=(22, 5), default_partition="debug", real_memory_mb={"debug": 4000})


def _exited(attempt: int, code: int) -> Progress:
    """Attempt 0 runs; replica r/0's pump recorded ``attempt`` ending with ``code``."""
    record = PumpExit(attempt=attempt, returncode=code, ended=1.0, started=None, host="")
    return Progress(attempt=0, exit_records={("r", 0): record})


def _exits(progress: Progress) -> dict[tuple[str, int], tuple[int, int]]:
    """Each replica's recorded (attempt, code)."""
    return {key: (r.attempt, r.returncode) for key, r in progress.exit_records.items()}


def _request(
    app: AppDef, cfg: dict[str, object], log_dir: Path, cwd: str = "/home/me/p"
) -> SlurmRequest:
    ctx = DryrunContext(session="svc", app_id="it-0001", cwd=cwd)
    resolved = slurm_run_opts().resolve({"allocation": "1234", **cfg})
    return render(app, resolved, ctx, facts=FACTS, default_log_dir=log_dir, job_dir=None)


def _grouped() -> AppDef:
    return AppDef(
        name="it",
        roles=[
            Role(name="ps", entrypoint="python", args=["-m", "ps", "$(id) 'q'"]),
            Role(name="w", entrypoint="python", num_replicas=4, metadata={PROCS_PER_NODE: 2}),
        ],
    )


def test_the_driver_matches_its_golden_file_and_is_valid_bash() -> None:
    driver = render_driver(_request(_grouped(), {}, Path("/state/logs")), 1234)
    path = GOLDEN / "allocation.driver.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(driver)
    assert driver == path.read_text()
    assert subprocess.run(["bash", "-n", "-c", driver], check=False).returncode == 0
    # Steps of the allocation, never a job of their own; a grouped role is one step of N x M.
    assert "sbatch" not in driver
    assert driver.count("srun --jobid=1234 --overlap") == 2
    assert "--nodes=2 --ntasks-per-node=2" in driver
    assert "--job-name=asupervisor:svc/it-0001:g1:a" in driver


def test_a_nodelist_places_the_steps_instead_of_round_robin() -> None:
    app = AppDef(name="it", roles=[Role(name="r", entrypoint="true", num_replicas=2)])
    driver = render_driver(_request(app, {"nodelist": ["n2"]}, Path("/l")), 1234)
    assert "place0=--nodelist=n2" in driver
    assert 'pick 1; place1="$picked"' in driver


def test_allocation_problems_name_their_fields() -> None:
    opts = slurm_run_opts()
    with pytest.raises(SpecError) as bad:
        check_allocation_cfg(opts.resolve({"allocation": "12a"}), "cli")
    assert [p.field for p in bad.value.problems] == ["cfg.allocation"]
    with pytest.raises(SpecError, match="needs the cli transport") as rest:
        check_allocation_cfg(opts.resolve({"allocation": "12"}), "rest")
    assert [p.field for p in rest.value.problems] == ["cfg.allocation"]
    with pytest.raises(SpecError) as batch:
        check_allocation_cfg(
            opts.resolve({"allocation": "12", "partition": "debug", "time": "10", "hold": True}),
            "cli",
        )
    assert {p.field for p in batch.value.problems} == {"cfg.partition", "cfg.time", "cfg.hold"}
    check_allocation_cfg(opts.resolve({"allocation": "12", "nodelist": ["n1"]}), "cli")
    check_allocation_cfg(opts.resolve({"partition": "debug"}), "rest")  # no allocation: no check


def test_the_rest_transport_refuses_an_allocation_at_dryrun(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    from supervisor import Supervisor

    monkeypatch.setenv("ASUPERVISOR_SLURM_TRANSPORT", "rest")
    monkeypatch.setenv("ASUPERVISOR_SLURMRESTD", "unix:/nonexistent.sock")

    async def main() -> None:
        async with Supervisor(session="svc") as sv:
            app = AppDef(name="x", roles=[Role(name="r", entrypoint="true")])
            with pytest.raises(SpecError, match=r"cfg\.allocation.*needs the cli transport"):
                sv.dryrun(app, "slurm", {"allocation": "12"})

    anyio.run(main)


def test_squeue_steps_lines_parse_with_any_name() -> None:
    text = "12.0|n1|asupervisor:svc/a-1:g0:a0\n12.batch|n2|x|y\nbad line\n13.1|n[1-2]|\n"
    assert parse_steps(text) == [
        StepRecord(12, "0", "asupervisor:svc/a-1:g0:a0", "n1"),
        StepRecord(12, "batch", "x|y", "n2"),
        StepRecord(13, "1", "", "n[1-2]"),
    ]
    assert parse_steps(text)[0].step_id == "12.0"


RUNNING = JobRecord(job_id=7, het_job_id=7, het_offset=0, state="RUNNING", nodes="n1")


@pytest.mark.parametrize(
    ("progress", "steps", "allocation", "state", "code", "signal"),
    [
        (_exited(0, 3), {}, RUNNING, "exited", 3, None),
        (_exited(0, -15), {}, RUNNING, "exited", None, "SIGTERM"),
        (_exited(1, 0), {}, RUNNING, "waiting", None, None),
        (Progress(attempt=0, rcs={(0, 0): 2}), {}, RUNNING, "exited", 2, None),
        (Progress(attempt=0), {(0, 0): StepRecord(7, "0", "", "n3")}, RUNNING, "running",
         None, None),
        (Progress(attempt=0, done=(0, 143), why="cancelled"), {}, RUNNING, "exited", None, None),
        (Progress(attempt=0, done=(0, 1), why="allocation 7 ended (CANCELLED)"), {}, None,
         "lost", None, None),
        (Progress(attempt=0, driver_alive=False), {}, RUNNING, "lost", None, None),
        (Progress(attempt=0, driver_alive=True), {}, None, "waiting", None, None),
        (Progress(attempt=0), {}, None, "lost", None, None),  # another process, no allocation
    ],
)  # fmt: skip
def test_what_a_replica_does_is_read_from_files_and_steps(
    progress: Progress,
    steps: dict[tuple[int, int], StepRecord],
    allocation: JobRecord | None,
    state: str,
    code: int | None,
    signal: str | None,
) -> None:
    seen = observe(("r", 0), 0, 0, 1, 0, progress, steps, allocation, 7)
    assert (seen.state, seen.exit_code, seen.signal) == (state, code, signal)
    if state == "running":
        assert seen.host == "n3"


# ------------------------------------------------------------- the driver, run by bash


def _stand_ins(bin_dir: Path, allocation_state: str = "RUNNING") -> None:
    """srun runs its command (one task) in a process group of its own and, like Slurm's
    step daemon, signals that whole group when it is signalled; squeue says how the
    allocation is; two nodes."""
    bin_dir.mkdir(parents=True)
    srun = (
        "#!/bin/bash\n"
        'while [[ "$1" == --* ]]; do shift; done\n'
        "export SLURM_PROCID=0\n"
        "set -m\n"
        '"$@" &\n'
        "task=$!\n"
        "trap 'kill -TERM -- \"-$task\" 2>/dev/null' TERM INT HUP\n"
        'while :; do wait "$task"; rc=$?; kill -0 "$task" 2>/dev/null || break; done\n'
        'exit "$rc"\n'
    )
    scripts = {
        "srun": srun,
        "squeue": f'#!/bin/bash\ncase "$*" in *%T*) echo {allocation_state};; *) echo n1;; esac\n',
        "scontrol": "#!/bin/bash\nprintf 'n1\\nn2\\n'\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


def _run_driver(
    tmp_path: Path, app: AppDef, allocation_state: str = "RUNNING", cancelled: bool = False
) -> Path:
    request = _request(app, {}, tmp_path / "logs", cwd=str(tmp_path))
    app_dir = Path(request.app_dir)
    for replica in request.replicas:
        Path(replica.log_dir).mkdir(parents=True)
    ship_pump(Path(pump_path(app_dir)))
    if cancelled:
        (app_dir / "cancel.request").write_text("{}")
    driver = app_dir / "driver.sh"
    driver.write_text(render_driver(request, 1234))
    _stand_ins(tmp_path / "bin", allocation_state)
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "ASUPERVISOR_PYTHON": sys.executable,
    }
    done = subprocess.run(["bash", str(driver)], env=env, timeout=60, check=False)
    assert done.returncode == json.loads((driver_dir(app_dir) / "done").read_text())["code"]
    return app_dir


def _keys(app: AppDef) -> list[list[tuple[str, int]]]:
    return [[(r.name, k)] for r in app.roles for k in range(r.num_replicas)]


def test_the_driver_runs_each_replica_under_the_pump(tmp_path: Path) -> None:
    app = AppDef(name="it", roles=[Role(name="r", entrypoint="echo", args=["hi", "$(id)"],
                                        num_replicas=2)])  # fmt: skip
    app_dir = _run_driver(tmp_path, app)
    progress = read_progress(str(app_dir), _keys(app))
    assert progress.done == (0, 0)
    assert progress.rcs == {(0, 0): 0, (1, 0): 0}
    assert _exits(progress) == {("r", 0): (0, 0), ("r", 1): (0, 0)}
    assert progress.driver_alive is False  # it ended
    assert progress.nodes == {0: "n1", 1: "n2"}  # round robin over the allocation's nodes
    out = (app_dir / "r" / "1" / "stdout.log").read_text()
    assert "hi $(id)" in out


def test_the_driver_stops_the_gang_and_retries_while_retries_last(tmp_path: Path) -> None:
    code = (
        "import os, sys, time; print('attempt', os.environ['ASUPERVISOR_ATTEMPT'], flush=True);"
        "sys.exit(3)"
    )
    app = AppDef(
        name="it",
        roles=[
            Role(name="bad", entrypoint=sys.executable, args=["-c", code], max_retries=2),
            Role(name="slow", entrypoint="sleep", args=["60"], max_retries=2),
        ],
    )
    app_dir = _run_driver(tmp_path, app)
    progress = read_progress(str(app_dir), _keys(app))
    assert progress.done == (2, 3)
    assert _exits(progress)[("bad", 0)] == (2, 3)
    assert _exits(progress)[("slow", 0)] == (2, -15)  # stopped with the gang, each attempt
    assert {a for (_, a) in progress.rcs} == {0, 1, 2}
    assert "attempt 0\nattempt 1\nattempt 2\n" in (app_dir / "bad" / "0" / "stdout.log").read_text()


def test_the_driver_starts_nothing_once_cancelled_or_when_the_allocation_ended(
    tmp_path: Path,
) -> None:
    app = AppDef(name="it", roles=[Role(name="r", entrypoint="true")])
    ended = _run_driver(tmp_path / "ended", app, allocation_state="CANCELLED")
    progress = read_progress(str(ended), _keys(app))
    assert progress.done == (0, 1) and progress.why == "allocation 1234 ended (CANCELLED)"
    assert progress.rcs == {} and _exits(progress) == {}
    cancelled = _run_driver(tmp_path / "cancelled", app, cancelled=True)
    progress = read_progress(str(cancelled), _keys(app))
    assert progress.done == (0, 143) and progress.why == "cancelled"
    assert progress.cancel_requested and progress.rcs == {}


def test_mpi_plugins_go_on_the_steps_and_mpirun_is_refused_naming_allocation() -> None:
    pmix = Role(name="ranks", entrypoint="a.out", num_replicas=2, metadata={MPI: "pmix"})
    driver = render_driver(_request(AppDef(name="m", roles=[pmix]), {}, Path("/l")), 1234)
    assert driver.count("--mpi=pmix") == 2  # each rank's step is wired up by Slurm
    mpirun = Role(name="m", entrypoint="a.out", metadata={MPI: "mpirun", MPI_NODES: 2})
    request = _request(AppDef(name="m", roles=[mpirun]), {}, Path("/l"))
    refused = allocation_app_problems(request.app, request.cfg)
    assert [p.field for p in refused] == ["cfg.allocation"]
