"""MPI and containers on the real Slurm cluster (issue 17 items 2 and 3).

A tiny C hello world, compiled with Debian's Open MPI and MPICH into the
test's directory (a file system every node shares), runs on 2 nodes x 2 ranks:
Open MPI with ``srun --mpi=pmix`` and with ``mpirun`` from the allocation's
first node, MPICH with ``srun --mpi=pmi2`` (Debian's Open MPI has no PMI-2).
Each rank prints its rank, the world's size and the Slurm node it runs on.

The emulated nodes are one host: Open MPI's shared-memory transport (vader)
takes ranks of two "nodes" for neighbours and crashes, so the Open MPI runs
use ``OMPI_MCA_btl=self,tcp``. MPICH (ch4:ucx) runs with ``UCX_NET_DEVICES=lo``:
the host's other interfaces include the docker engines' veths, which come and
go as containers do, and UCX failed now and then to start its worker on one
that vanished ("init_worker ... No such device"). The cluster has no pyxis: a role's image is
refused at dry run, unless it is only a tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, AppState, BindMount, Role, SpecError, Supervisor
from supervisor.components import mpi

from .slurm_cluster import ensure_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

CLI = [sys.executable, "-m", "supervisor.cli.main"]
HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    const char *node = getenv("SLURMD_NODENAME");
    printf("hello rank=%d size=%d node=%s\n", rank, size, node ? node : "?");
    MPI_Finalize();
    return 0;
}
"""
LINE = re.compile(r"hello rank=(\d+) size=(\d+) node=(\S+)")
# Ranks of two emulated nodes share one host: no shared-memory transport between them.
OPEN_MPI_ENV = {"OMPI_MCA_btl": "self,tcp"}
# UCX (MPICH's device) on the loopback only: other interfaces come and go with containers.
MPICH_ENV = {"UCX_NET_DEVICES": "lo"}
# mpirun refuses root unless told; the cluster's jobs run as the submitting user (root here).
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hello world built with each MPI (``mpicc.openmpi``, ``mpicc.mpich``)."""
    where = tmp_path_factory.mktemp("mpi")
    source = where / "hello.c"
    source.write_text(HELLO)
    out = {}
    for kind in ("openmpi", "mpich"):
        mpicc = shutil.which(f"mpicc.{kind}")
        if mpicc is None:
            pytest.fail(f"mpicc.{kind} is missing: scripts/slurm-cluster up installs it")
        out[kind] = where / f"hello-{kind}"
        subprocess.run([mpicc, "-o", str(out[kind]), str(source)], check=True, timeout=120)
    return out


def _parse(lines: list[str]) -> list[tuple[int, int, str]]:
    found = [LINE.search(line) for line in lines]
    return [(int(m[1]), int(m[2]), m[3]) for m in found if m]


def _check_world(ranks: list[tuple[int, int, str]]) -> None:
    """Ranks 0..3 once each, a world of 4, two nodes with two ranks each."""
    assert sorted(r for r, _, _ in ranks) == [0, 1, 2, 3], ranks
    assert {size for _, size, _ in ranks} == {4}, ranks
    assert sorted(Counter(node for _, _, node in ranks).values()) == [2, 2], ranks


async def _run_per_rank(app: AppDef) -> list[tuple[int, int, str]]:
    """Run an app of one replica per rank; each replica's own log says its rank."""
    async with Supervisor(session="mpi") as sv:
        handle = await sv.submit(app, "slurm")
        final = await sv.wait(handle, timeout=180)
        role = app.roles[0].name
        logs = {
            k: [line async for line in sv.log_iter(handle, role, k)]
            for k in range(app.roles[0].num_replicas)
        }
    assert final.state is AppState.SUCCEEDED, (final, logs)
    ranks = []
    for k, lines in logs.items():
        (mine,) = _parse(lines)
        assert mine[0] == k, (k, lines)  # replica k is MPI rank k
        ranks.append(mine)
    return ranks


async def test_open_mpi_over_srun_pmix(
    cluster: dict[str, object], state_dir: Path, hello: dict[str, Path]
) -> None:
    """Needs a TmpFS per node (scripts/slurm-cluster sets it): PMIx makes its step directory
    there, named by job and step only, and emulated nodes sharing one would collide."""
    config = await anyio.run_process(["scontrol", "show", "config"])
    tmpfs = [line for line in config.stdout.decode().splitlines() if line.startswith("TmpFS")]
    if not any("%n" in line for line in tmpfs):
        pytest.fail(
            f"the running cluster has no TmpFS per node ({tmpfs}): it was started by an older "
            "scripts/slurm-cluster; run `scripts/slurm-cluster up` to restart it"
        )
    app = mpi(str(hello["openmpi"]), j="2x2", plugin="pmix", env=OPEN_MPI_ENV)
    _check_world(await _run_per_rank(app))


async def test_mpich_over_srun_pmi2(
    cluster: dict[str, object], state_dir: Path, hello: dict[str, Path]
) -> None:
    """PMI-2 talks over PMI_FD, which the log pump must leave open for the rank."""
    _check_world(
        await _run_per_rank(mpi(str(hello["mpich"]), j="2x2", plugin="pmi2", env=MPICH_ENV))
    )


async def test_open_mpi_mpirun_from_the_first_node(
    cluster: dict[str, object], state_dir: Path, hello: dict[str, Path]
) -> None:
    app = mpi(
        str(hello["openmpi"]),
        j="2x2",
        plugin="mpirun",
        mpirun="mpirun.openmpi",
        env={**OPEN_MPI_ENV, **AS_ROOT},
    )
    async with Supervisor(session="mpi") as sv:
        handle = await sv.submit(app, "slurm")
        final = await sv.wait(handle, timeout=180)
        lines = [line async for line in sv.log_iter(handle, app.roles[0].name, 0)]
    assert final.state is AppState.SUCCEEDED, (final, lines)
    _check_world(_parse(lines))


async def test_the_cli_runs_the_mpi_component(
    cluster: dict[str, object], state_dir: Path, hello: dict[str, Path]
) -> None:
    env = {**os.environ, "ASUPERVISOR_HOME": str(state_dir)}
    args = ["run", "--backend", "slurm", "--wait", "mpi", "-j", "2x2", "--plugin", "pmi2"]
    args += ["--env", "UCX_NET_DEVICES=lo"]
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*CLI, *args, str(hello["mpich"])], capture_output=True, text=True, env=env, timeout=240
        )
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "SUCCEEDED" in done.stdout


async def test_an_image_needs_pyxis_unless_it_is_only_a_tag(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    role = Role(name="c", image="debian:12", entrypoint="echo", args=["in no container"])
    app = AppDef(name="img", roles=[role])
    async with Supervisor(session="img") as sv:
        await sv.prepare("slurm")  # asks srun whether pyxis is there: it is not
        with pytest.raises(SpecError) as e:
            sv.dryrun(app, "slurm")
        assert [p.field for p in e.value.problems] == ["roles[0].image"]
        assert "image_is_tag" in str(e.value)
        mounted = AppDef(
            name="img",
            roles=[Role(**{**role.__dict__, "mounts": [BindMount(str(tmp_path), "/data")]})],
        )
        with pytest.raises(SpecError) as e:
            sv.dryrun(mounted, "slurm", {"image_is_tag": True})
        assert [p.field for p in e.value.problems] == ["roles[0].mounts"]
        handle = await sv.submit(app, "slurm", {"image_is_tag": True})
        final = await sv.wait(handle, timeout=120)
        lines = [line async for line in sv.log_iter(handle, "c", 0)]
    assert final.state is AppState.SUCCEEDED, final
    assert lines == ["in no container\n"]
    script = json.loads((state_dir / "logs" / "img").glob("*/app.json").__next__().read_text())
    assert "--container" not in script["request"]["script"]
