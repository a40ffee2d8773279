"""Seeing and acting on the real local cluster (issue 17 item 6), on both transports.

``asupervisor cluster`` against what sinfo says, the Slurm job id in
``status``/``describe`` against what squeue says, ``list --cluster`` with its
filters on a job submitted with plain sbatch, and ``cancel`` by filter, which
must stop only this session's matching apps, and asks first.
Every CLI command runs as its own process (``python -m supervisor``), against
the test's private state directory, so no other test's apps are in reach.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppDef, AppState, ClusterInfo, Role, Supervisor

from .slurm_cluster import ensure_cluster, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor"]
TIMEOUT = 60.0
HELD = {"hold": True}


@pytest.fixture(scope="module")
def facts() -> dict[str, object]:
    return ensure_cluster(accounting=True)


@pytest.fixture(params=["cli", "rest"])
def transport(
    request: pytest.FixtureRequest, facts: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> str:
    """The Slurm commands, then slurmrestd (JWT, jobs run as root as under sbatch here)."""
    if request.param == "rest":
        rest = facts["rest"]
        assert isinstance(rest, dict)
        if not rest.get("jwt_token"):
            print("slurmrestd has no JWT endpoint here")
            pytest.skip("slurmrestd has no JWT endpoint here")
        monkeypatch.setenv("ASUPERVISOR_SLURM_TRANSPORT", "rest")
        monkeypatch.setenv("ASUPERVISOR_SLURMRESTD", str(rest["jwt_url"]))
        monkeypatch.setenv("ASUPERVISOR_SLURMRESTD_USER", "root")
        monkeypatch.setenv("SLURM_JWT", str(rest["jwt_token"]))
    return str(request.param)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1"}


async def cli(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    """One ``asupervisor`` process; stdin is /dev/null unless given (a pty's end)."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            env=_env(),
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    return await anyio.to_thread.run_sync(run)


async def cli_json(*args: str) -> Any:
    done = await cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def sh(*args: str) -> str:
    done = await anyio.run_process(list(args))
    return done.stdout.decode()


async def squeue_jobs() -> list[dict[str, Any]]:
    jobs = json.loads(await sh("squeue", "--json"))["jobs"]
    assert isinstance(jobs, list)
    return jobs


def sleeper(name: str) -> AppDef:
    return AppDef(name=name, roles=[Role(name="r", entrypoint="sleep", args=["300"])])


@pytest.fixture
async def foreign(tmp_path: Path) -> AsyncIterator[int]:
    """A held job submitted with plain sbatch, not by the library; scancelled after."""
    out = await sh(
        "sbatch", "--parsable", "--hold", "-J", "svview-foreign",
        f"--output={tmp_path}/foreign.out", "--wrap", "sleep 30",
    )  # fmt: skip
    job_id = int(out.strip().split(";")[0])
    try:
        yield job_id
    finally:
        await anyio.run_process(["scancel", str(job_id)], check=False)


@pytest.fixture
async def cleanup(state_dir: Path) -> AsyncIterator[list[tuple[Supervisor, str]]]:
    """Apps to cancel at the end whatever happened: (a Supervisor of their session, handle).

    Cancelled from a fresh Supervisor of the session (the test's own has closed by then).
    """
    apps: list[tuple[Supervisor, str]] = []
    yield apps
    with anyio.CancelScope(shield=True):
        for used, handle in apps:
            try:
                async with Supervisor(session=used.session, state_dir=state_dir) as sv:
                    await sv.cancel(handle)
            except Exception as e:  # the test's own failure is the one to see
                print(f"cleanup of {handle}: {e}")


# ------------------------------------------------------------------------- cluster
def _sinfo_nodes(text: str) -> dict[str, tuple[int, int, str]]:
    """``sinfo -N -h -o '%N|%c|%m|%P'``: node -> (cpus, memory MB, partition)."""
    found = {}
    for line in text.splitlines():
        name, cpus, memory, partition = line.split("|")
        found[name] = (int(cpus), int(memory.rstrip("+")), partition.rstrip("*"))
    return found


async def test_cluster_shows_what_sinfo_shows(transport: str, state_dir: Path) -> None:
    sinfo = _sinfo_nodes(await sh("sinfo", "-N", "-h", "-o", "%N|%c|%m|%P"))
    default = next(
        line.split("|")[0].rstrip("*")
        for line in (await sh("sinfo", "-h", "-o", "%P|%D")).splitlines()
        if line.split("|")[0].endswith("*")
    )
    async with Supervisor(session="viewer") as sv:
        info = await sv.cluster("slurm")
    assert isinstance(info, ClusterInfo)
    assert info.version == (await sh("sinfo", "--version")).split()[-1]
    assert {n.name: (n.cpus, n.memory_mb, n.partitions[0]) for n in info.nodes} == sinfo
    assert len(info.nodes) == 3
    assert all(0 <= n.alloc_cpus <= n.cpus and n.state for n in info.nodes)
    parts = {p.name: p for p in info.partitions}
    assert parts[default].default and parts[default].state == "UP"
    assert parts[default].total_nodes == 3
    assert parts[default].total_cpus == sum(c for c, _, _ in sinfo.values())

    shown = await cli_json("cluster")
    assert set(shown) == {"backend", "version", "partitions", "nodes"}
    assert shown["backend"] == "slurm"
    assert set(shown["partitions"][0]) == {
        "name", "state", "nodes", "total_nodes", "total_cpus", "default",
    }  # fmt: skip
    assert set(shown["nodes"][0]) == {
        "name", "state", "cpus", "alloc_cpus", "memory_mb", "alloc_memory_mb", "gres",
        "partitions", "reason",
    }  # fmt: skip
    assert sorted(n["name"] for n in shown["nodes"]) == sorted(sinfo)
    only = await cli_json("cluster", "--partition", default)
    assert [p["name"] for p in only["partitions"]] == [default] and len(only["nodes"]) == 3
    none = await cli_json("cluster", "--partition", "no-such-partition")
    assert none["partitions"] == [] and none["nodes"] == []

    table = await cli("cluster")
    assert table.returncode == 0, table.stderr
    assert f"{default}*" in table.stdout
    for name, (cpus, memory, _) in sinfo.items():
        row = next(line for line in table.stdout.splitlines() if line.startswith(name + " "))
        assert f"/{cpus}" in row and f"/{memory}" in row, row

    local = await cli("cluster", "--backend", "local")
    assert local.returncode == 2 and "no cluster" in local.stderr


# -------------------------------------------------------------------------- job id
async def test_status_shows_the_job_id_squeue_shows(
    transport: str, state_dir: Path, cleanup: list[tuple[Supervisor, str]]
) -> None:
    async with Supervisor(session="ids") as sv:
        handle = await sv.submit(sleeper("idapp"), "slurm", cfg=HELD)
        cleanup.append((sv, handle))
        app_id = handle.rsplit("/", 1)[1]
        tagged = [j for j in await squeue_jobs() if f"ids/{app_id}" in (j.get("comment") or "")]
        assert len(tagged) == 1, tagged
        job_id = str(tagged[0]["job_id"])
        here = sv.status(handle)
        assert here is not None and here.metadata == {"slurm_job_id": job_id}
        described = await sv.describe(handle)
        assert described is not None and described.metadata == {"slurm_job_id": job_id}

        status = await cli_json("status", handle)  # another process: from the records
        assert status["metadata"] == {"slurm_job_id": job_id}
        described_json = await cli_json("describe", handle)
        assert described_json["metadata"] == {"slurm_job_id": job_id}
        human = await cli("status", handle)
        assert f"slurm_job_id: {job_id}" in human.stdout, human.stdout
        await sv.cancel(handle)
        assert (await sv.wait(handle, timeout=TIMEOUT)).state is AppState.CANCELLED
    ended = await cli("status", handle, "--json")  # recorded final status: the id stays
    assert json.loads(ended.stdout)["metadata"] == {"slurm_job_id": job_id}


# ---------------------------------------------------------------- list --cluster
async def test_list_cluster_shows_foreign_jobs_with_filters(
    transport: str, state_dir: Path, foreign: int, cleanup: list[tuple[Supervisor, str]]
) -> None:
    user = (await sh("id", "-un")).strip()
    async with Supervisor(session="lister") as sv:
        handle = await sv.submit(sleeper("listed"), "slurm", cfg=HELD)
        cleanup.append((sv, handle))
        status = sv.status(handle)
        assert status is not None
        ours = int(status.metadata["slurm_job_id"])

        jobs = await cli_json("list", "--backend", "slurm", "--cluster")
        by_id = {j["job_id"]: j for j in jobs}
        assert by_id[foreign]["handle"] is None
        assert by_id[foreign]["name"] == "svview-foreign"
        assert by_id[foreign]["state"] == "PENDING" and by_id[foreign]["user"] == user
        assert by_id[ours]["handle"] == handle

        partition = by_id[foreign]["partition"]
        filtered = await cli_json(
            "list", "--backend", "slurm", "--cluster",
            "--user", user, "--state", "pending", "--partition", partition,
        )  # fmt: skip
        assert {foreign, ours} <= {j["job_id"] for j in filtered}
        assert all(j["state"] == "PENDING" and j["user"] == user for j in filtered)
        for args in (
            ("--user", "no-such-user"),
            ("--state", "COMPLETED"),
            ("--partition", "no-such-partition"),
        ):
            others = await cli_json("list", "--backend", "slurm", "--cluster", *args)
            assert foreign not in {j["job_id"] for j in others}, args

        table = await cli("list", "--backend", "slurm", "--cluster", "--state", "PENDING")
        row = next(line for line in table.stdout.splitlines() if line.startswith(f"{ours} "))
        assert handle in row
        row = next(line for line in table.stdout.splitlines() if line.startswith(f"{foreign} "))
        assert "svview-foreign" in row and "slurm://" not in row

        mine = await cli_json("list", "--backend", "slurm")  # our apps only, as before
        assert [a["handle"] for a in mine] == [handle]
        usage = await cli("list", "--backend", "slurm", "--user", user)
        assert usage.returncode == 2 and "--cluster" in usage.stderr


# -------------------------------------------------------------- cancel by filter
async def _state(sv: Supervisor, handle: str) -> AppState:
    found = await sv.describe(handle)
    assert found is not None
    return found.state


async def test_cancel_by_filter_stops_only_this_sessions_matching_apps(
    transport: str, state_dir: Path, foreign: int, cleanup: list[tuple[Supervisor, str]]
) -> None:
    async with Supervisor(session="mine") as mine, Supervisor(session="other") as other:
        pending = await mine.submit(sleeper("pend"), "slurm", cfg=HELD)
        cleanup.append((mine, pending))
        running = await mine.submit(sleeper("run"), "slurm")
        cleanup.append((mine, running))
        theirs = await other.submit(sleeper("theirs"), "slurm", cfg=HELD)
        cleanup.append((other, theirs))
        await until(lambda: _state(mine, running), lambda s: s is AppState.RUNNING, 120, "running")
        assert await _state(mine, pending) is AppState.PENDING

        # No terminal to ask on and no --yes: refused, nothing cancelled.
        refused = await cli(
            "--session", "mine", "cancel", "--backend", "slurm", "--state", "PENDING"
        )
        assert refused.returncode == 2, refused.stderr
        assert "--yes" in refused.stderr and pending in refused.stderr  # listed first
        assert running not in refused.stderr and theirs not in refused.stderr

        done = await cli(
            "--session", "mine", "cancel", "--backend", "slurm", "--state", "PENDING", "--yes"
        )
        assert done.returncode == 0, done.stderr
        assert f"cancel requested: {pending}" in done.stderr
        assert (await mine.wait(pending, timeout=TIMEOUT)).state is AppState.CANCELLED
        assert await _state(mine, running) is AppState.RUNNING
        assert await _state(other, theirs) is AppState.PENDING
        assert any(j["job_id"] == foreign for j in await squeue_jobs())

        nothing = await cli(
            "--session", "mine", "cancel", "--backend", "slurm", "--partition", "nope", "--yes"
        )
        assert nothing.returncode == 0 and "nothing to cancel" in nothing.stderr
        assert await _state(mine, running) is AppState.RUNNING

        partition = next(j for j in await squeue_jobs() if j["job_id"] == foreign)["partition"]
        done = await cli(
            "--session", "mine", "cancel", "--backend", "slurm", "--partition", partition, "-y"
        )
        assert done.returncode == 0, done.stderr
        assert (await mine.wait(running, timeout=TIMEOUT)).state is AppState.CANCELLED
        assert await _state(other, theirs) is AppState.PENDING
        foreign_job = next(j for j in await squeue_jobs() if j["job_id"] == foreign)
        assert foreign_job["job_state"] == "PENDING"  # never a job the library did not launch

        # The Python API: the other session's own filter finds its app only.
        found = await other.matching("slurm", states=["pending"])
        assert [a.app_handle for a in found] == [theirs]
        assert await mine.matching("slurm") == []


def _ask_on_a_pty(*args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a terminal on stdin, the answer already typed."""
    main, child = pty.openpty()
    try:
        os.write(main, answer.encode())
        return subprocess.run(
            [*CLI, *args],
            env=_env(),
            stdin=child,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(child)
        os.close(main)


async def test_cancel_all_asks_on_a_terminal(
    transport: str, state_dir: Path, cleanup: list[tuple[Supervisor, str]]
) -> None:
    async with Supervisor(session="asker") as sv:
        handle = await sv.submit(sleeper("asked"), "slurm", cfg=HELD)
        cleanup.append((sv, handle))
        args = ("--session", "asker", "cancel", "--backend", "slurm", "--all")

        declined = await anyio.to_thread.run_sync(lambda: _ask_on_a_pty(*args, answer="n\n"))
        assert declined.returncode == 1, declined.stderr
        assert handle in declined.stderr and "Cancel these 1 app?" in declined.stderr
        assert "cancel requested" not in declined.stderr
        assert await _state(sv, handle) is AppState.PENDING

        accepted = await anyio.to_thread.run_sync(lambda: _ask_on_a_pty(*args, answer="y\n"))
        assert accepted.returncode == 0, accepted.stderr
        assert f"cancel requested: {handle}" in accepted.stderr
        assert (await sv.wait(handle, timeout=TIMEOUT)).state is AppState.CANCELLED

        both = await cli("--session", "asker", "cancel", handle, "--all")
        assert both.returncode == 2 and "not both" in both.stderr
        neither = await cli("--session", "asker", "cancel")
        assert neither.returncode == 2
