"""Real DDP training (torch, gloo on CPU) through the ``ddp`` component, locally and on Slurm.

``examples/ddp_train.py`` trains a tiny model for a few steps and checks that
every rank ends with the same weights (the all-reduce ran across the ranks).
On Slurm each node name resolves to this machine, so MASTER_ADDR=n1 is a
real rendezvous over TCP between the emulated nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor import AppDef, AppState, AppStatus, Supervisor, parse_handle
from supervisor.components import ddp

from .slurm_cluster import ensure_cluster

torch = pytest.importorskip("torch", reason="the ddp extra (torch) is not installed")

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py")
BACKENDS = ["local", pytest.param("slurm", marks=pytest.mark.slurm)]
TORCHRUN_TOPOLOGIES = [
    ("local", "1x2"),
    ("local", "2x1"),
    pytest.param("slurm", "2x1", marks=pytest.mark.slurm),
]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    if name == "slurm":
        ensure_cluster(accounting=True)
    return name


def _why(status: AppStatus) -> str:
    """The whole status, the ranks' error file included (pytest cuts an object's repr short)."""
    return f"{status.msg}\n{status.structured_error_msg}\n{status}"


async def _lines(sv: Supervisor, handle: str, role: str, k: int) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k)]


async def _run_torchrun(app: AppDef, backend: str, j: str) -> tuple[str, AppStatus, str]:
    """Run to the end: the handle, the final status and every node's output, joined."""
    nnodes = int(j.split("x")[0])
    async with Supervisor(session="ddp") as sv:
        handle = await sv.submit(app, backend)
        try:
            status = await sv.wait(handle, timeout=240)
        finally:
            await sv.cancel(handle)  # a Slurm job must not outlive a failed test
        text = "".join(["".join(await _lines(sv, handle, "ddp_train", k)) for k in range(nnodes)])
    return handle, status, text


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize(("j", "world"), [("2x1", 2), ("1x2", 2), ("2x2", 4)])
async def test_ddp_trains_in_sync(backend: str, j: str, world: int, state_dir: Path) -> None:
    app = ddp(TRAIN, "--steps", "3", j=j, cpu=2, memMB=1000, interpreter=sys.executable)
    async with Supervisor(session="ddp") as sv:
        handle = await sv.submit(app, backend)
        status = await sv.wait(handle, timeout=240)
        assert status.state is AppState.SUCCEEDED, _why(status)
        nnodes, nproc = (int(n) for n in j.split("x"))
        nodes: dict[int, str] = {}
        for k in range(world):
            text = "".join(await _lines(sv, handle, "ddp_train", k))
            assert f"rank {k}/{world} local_rank {k % nproc} " in text, text
            assert "in_sync True" in text
            nodes[k] = text.split(" node ")[1].split()[0]
        if backend == "slurm":
            # N nodes x M tasks: ranks k*M .. k*M+M-1 share node k, and the N nodes differ.
            by_group = {
                g: {nodes[k] for k in range(world) if k // nproc == g} for g in range(nnodes)
            }
            assert all(len(v) == 1 for v in by_group.values()), nodes
            assert len(set().union(*by_group.values())) == nnodes, nodes


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_ddp_crash_fails_fast_with_the_ranks_error(backend: str, state_dir: Path) -> None:
    app = ddp(TRAIN, "--crash-rank", "1", j="2x1", interpreter=sys.executable)
    async with Supervisor(session="ddp") as sv:
        handle = await sv.submit(app, backend)
        status = await sv.wait(handle, timeout=180)
        assert status.state is AppState.FAILED
        assert "crashed on purpose" in status.structured_error_msg
        crashed = status.replica("ddp_train", 1)
        assert crashed is not None and "crashed on purpose" in crashed.structured_error_msg
    async with Supervisor(session="ddp") as other:  # another process's view agrees
        described = await other.describe(handle)
        assert described is not None and described.state is AppState.FAILED


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_ddp_retry_succeeds_and_counts_one_restart(backend: str, state_dir: Path) -> None:
    app = ddp(
        TRAIN,
        "--crash-rank",
        "1",
        "--crash-until-attempt",
        "1",
        j="2x1",
        max_retries=1,
        interpreter=sys.executable,
    )
    async with Supervisor(session="ddp") as sv:
        handle = await sv.submit(app, backend)
        status = await sv.wait(handle, timeout=240)
        assert status.state is AppState.SUCCEEDED, _why(status)
        assert status.num_restarts == 1


@pytest.mark.parametrize(("backend", "j"), TORCHRUN_TOPOLOGIES, indirect=["backend"])
async def test_torchrun_mode_trains_in_sync_across_nodes(
    backend: str, j: str, state_dir: Path
) -> None:
    """One torchrun per node (c10d rendezvous, on one node too):
    every rank trains and ends with the same weights."""
    app = ddp(TRAIN, "--steps", "3", j=j, mode="torchrun", interpreter=sys.executable)
    handle, status, text = await _run_torchrun(app, backend, j)
    assert status.state is AppState.SUCCEEDED, _why(status)
    for rank in range(2):
        assert f"rank {rank}/2 " in text
    assert text.count("in_sync True") == 2
    # torchrun's run id names the app, one node or several (not --standalone's random one).
    assert text.count(f" run {parse_handle(handle).app_id}") == 2, text


@pytest.mark.parametrize(("backend", "j"), TORCHRUN_TOPOLOGIES, indirect=["backend"])
async def test_torchrun_mode_restarts_its_workers_in_place(
    backend: str, j: str, state_dir: Path
) -> None:
    """Rank 1 crashes on torchrun's first round; torchrun's own --max_restarts brings
    every worker back and the second round trains in sync, the job succeeds, and the
    supervisor restarted nothing. (Before torchrun ran with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    the second round read the first's gloo addresses from torchrun's shared store and
    failed or hung: see ``supervisor.components.dist.TORCHRUN_ENV``. A worker that
    aborted at its exit after training, a torch race that ddp_train.py now sidesteps,
    spent the restart too.)"""
    app = ddp(
        TRAIN,
        "--steps",
        "3",
        "--crash-rank",
        "1",
        "--crash-until-attempt",
        "1",
        j=j,
        mode="torchrun",
        max_retries=1,
        interpreter=sys.executable,
    )
    _, status, text = await _run_torchrun(app, backend, j)
    assert status.state is AppState.SUCCEEDED, _why(status)
    assert status.num_restarts == 0  # torchrun restarted in place, not the supervisor
    assert "rank 1 crashed on purpose (attempt 0)" in text, text
    # Only the second round trains (rank 1 dies before the first's model exists), and
    # rank 1's torchrun counts the restart its crash cost.
    assert text.count("in_sync True") == 2, text
    assert "rank 0/2 " in text and "rank 1/2 " in text, text
    rank1 = next(line for line in text.splitlines() if "rank 1/2 " in line)
    assert "in_sync True restart 1 " in rank1, rank1
