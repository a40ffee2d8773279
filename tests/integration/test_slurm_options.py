"""Choosing nodes, dependencies and holds, on the real 3-node cluster (issue 17 items 1 and 5).

Where a test needs something of the cluster's own (a reservation), it makes it
under a unique name and always deletes it; the cluster is shared, so the
reservation is short and covers one node only.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    AppStatus,
    Role,
    SpecError,
    SubmitError,
    Supervisor,
    UnknownAppError,
)
from supervisor.specs import parse_handle

from .slurm_cluster import ensure_cluster, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

PY = sys.executable
CLI = [PY, "-m", "supervisor.cli.main"]


@pytest.fixture(scope="module")
def cluster() -> dict[str, object]:
    return ensure_cluster(accounting=True)


def _one(name: str, *args: str, replicas: int = 1) -> AppDef:
    return AppDef(
        name=name, roles=[Role(name="r", entrypoint=PY, args=list(args), num_replicas=replicas)]
    )


def _hosts(final: AppStatus) -> list[str]:
    return [r.hostname for role in final.roles for r in role.replicas]


def _job_id(state_dir: Path, handle: str) -> str:
    parsed = parse_handle(handle)
    entry = state_dir / "index" / "slurm" / parsed.session / f"{parsed.app_id}.json"
    app_dir = Path(json.loads(entry.read_text())["app_dir"])
    return str(json.loads((app_dir / "app.json").read_text())["job_id"])


def _scontrol_job(job_id: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=False
    ).stdout


async def test_nodelist_and_exclude_choose_the_replicas_nodes(
    cluster: dict[str, object], state_dir: Path
) -> None:
    async with Supervisor(session="svc") as sv:
        pinned = await sv.submit(
            _one("pinned", "-c", "pass", replicas=2), "slurm", {"nodelist": ["n3", "n2"]}
        )
        avoiding = await sv.submit(_one("avoiding", "-c", "pass"), "slurm", {"exclude": ["n[1-2]"]})
        first = await sv.wait(pinned, timeout=120)
        second = await sv.wait(avoiding, timeout=120)
    assert first.state is AppState.SUCCEEDED, first
    assert _hosts(first) == ["n3", "n2"]  # in the order named, one node per het group
    assert second.state is AppState.SUCCEEDED, second
    assert _hosts(second) == ["n3"]


@pytest.mark.slurm_exclusive  # n1 for itself alone
async def test_an_exclusive_app_shares_its_node_with_nobody(
    cluster: dict[str, object], state_dir: Path
) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            _one("alone", "-c", "pass"), "slurm", {"exclusive": True, "nodelist": ["n1"]}
        )
        shown = _scontrol_job(_job_id(state_dir, handle))
        final = await sv.wait(handle, timeout=120)
    assert final.state is AppState.SUCCEEDED, final
    assert "OverSubscribe=NO" in shown, shown  # what Slurm records for --exclusive


@pytest.fixture
def reservation() -> Iterator[str]:
    """A 3-minute reservation of n3 for root, under a unique name, always deleted."""
    name = f"asup-test-{secrets.token_hex(4)}"
    created = subprocess.run(
        [
            "scontrol", "create", "reservation", f"reservationname={name}", "users=root",
            "nodes=n3", "starttime=now", "duration=3", "flags=ignore_jobs",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    try:
        yield name
    finally:
        subprocess.run(
            ["scontrol", "delete", f"reservationname={name}"], capture_output=True, check=False
        )


@pytest.mark.slurm_exclusive  # reserves n3: nobody else's job starts there
async def test_a_reservation_runs_the_app_on_the_reserved_node(
    cluster: dict[str, object], state_dir: Path, reservation: str
) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            _one("reserved", "-c", "pass"), "slurm", {"reservation": reservation}
        )
        final = await sv.wait(handle, timeout=120)
    assert final.state is AppState.SUCCEEDED, final
    assert _hosts(final) == ["n3"]


@pytest.mark.parametrize("cfg", [{"gres": ["gpu:a100:2"]}, {"gpus_per_node": "a100:2"}])
async def test_gpus_this_cluster_lacks_are_a_submit_error_from_slurm(
    cluster: dict[str, object], state_dir: Path, cfg: dict[str, Any]
) -> None:
    async with Supervisor(session="svc") as sv:
        info = sv.dryrun(_one("gpu", "-c", "pass"), "slurm", cfg)
        assert "a100:2" in str(info.request)  # rendered as asked
        with pytest.raises(SubmitError) as err:
            await sv.submit(_one("gpu", "-c", "pass"), "slurm", cfg)
    assert not err.value.transient
    assert "sbatch" in str(err.value) and "gres" in str(err.value).lower(), err.value


async def test_afterok_starts_an_app_only_once_the_first_succeeded(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "first-done"
    first_code = f"import time, pathlib; time.sleep(6); pathlib.Path({str(marker)!r}).touch()"
    second_code = f"import os, sys; sys.exit(0 if os.path.exists({str(marker)!r}) else 7)"
    async with Supervisor(session="svc") as sv:
        first = await sv.submit(_one("first", "-c", first_code), "slurm")
        second = await sv.submit(_one("second", "-c", second_code), "slurm", {"afterok": [first]})
        assert "--dependency=afterok:" + _job_id(state_dir, first) in _scontrol_job(
            _job_id(state_dir, second)
        ).replace("Dependency=", "--dependency=")
        waiting = await until(
            lambda: sv.describe(second),
            lambda d: d is not None and "Dependency" in d.msg,
            60,
            "the second app says it waits for the first",
        )
        assert waiting is not None and waiting.state is AppState.PENDING
        done_first = await sv.wait(first, timeout=120)
        done_second = await sv.wait(second, timeout=120)
    assert done_first.state is AppState.SUCCEEDED, done_first
    assert done_second.state is AppState.SUCCEEDED, done_second  # exit 7 had it started early


async def test_afterok_on_a_failing_app_never_runs_and_ends(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    ran = tmp_path / "second-ran"
    async with Supervisor(session="svc") as sv:
        first = await sv.submit(_one("fails", "-c", "import time; time.sleep(3); exit(3)"), "slurm")
        second = await sv.submit(
            _one("never", "-c", f"open({str(ran)!r}, 'w')"), "slurm", {"afterok": [first]}
        )
        assert (await sv.wait(first, timeout=120)).state is AppState.FAILED
        # Not pending for ever: Slurm cancels it (--kill-on-invalid-dep), and we say so.
        final = await sv.wait(second, timeout=120)
    assert final.state is AppState.CANCELLED, final
    assert not ran.exists()
    assert all(r.hostname == "" for r in final.roles[0].replicas), final  # it never started
    assert "DependencyNeverSatisfied" in final.msg, final


async def test_waiting_for_an_unknown_app_is_a_spec_error_naming_the_option(
    cluster: dict[str, object], state_dir: Path
) -> None:
    async with Supervisor(session="svc") as sv:
        with pytest.raises(SpecError) as err:
            await sv.submit(_one("x", "-c", "pass"), "slurm", {"afterany": ["slurm://svc/nope-1"]})
        assert err.value.fields == ("cfg.afterany",)
        with pytest.raises(SpecError) as err:
            await sv.submit(_one("x", "-c", "pass"), "slurm", {"after": ["local://svc/a-1"]})
        assert err.value.fields == ("cfg.after",)
        assert await sv.list("slurm") == []  # nothing was submitted


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASUPERVISOR_HOME": str(state_dir)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


async def test_a_held_app_says_so_and_runs_once_released_from_the_cli(
    cluster: dict[str, object], state_dir: Path
) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(_one("held", "-c", "pass"), "slurm", {"hold": True})
        held = await until(
            lambda: sv.describe(handle),
            lambda d: d is not None and "JobHeldUser" in d.msg,
            60,
            "the held app shows JobHeldUser",
        )
        assert held is not None and held.state is AppState.PENDING
        status = sv.status(handle)  # the followed app's own state says so too
        assert status is not None and "JobHeldUser" in status.msg, status
        released = await anyio.to_thread.run_sync(lambda: _cli(state_dir, "release", handle))
        assert released.returncode == 0, released.stderr
        assert f"released: {handle}" in released.stderr
        final = await sv.wait(handle, timeout=120)
    assert final.state is AppState.SUCCEEDED, final


async def test_hold_and_release_through_the_supervisor(
    cluster: dict[str, object], state_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    async with Supervisor(session="svc") as sv:
        # The first keeps the second pending (afterany), so it can be held before it runs.
        first = await sv.submit(
            _one("gate", "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): "
                 "time.sleep(0.2)"),
            "slurm",
        )  # fmt: skip
        second = await sv.submit(_one("late", "-c", "pass"), "slurm", {"afterany": [first]})
        await sv.hold(second)
        gate.touch()
        assert (await sv.wait(first, timeout=120)).state is AppState.SUCCEEDED
        still = await until(
            lambda: sv.describe(second),
            lambda d: d is not None and "JobHeldUser" in d.msg,
            60,
            "the held app stays held after its dependency is met",
        )
        assert still is not None and still.state is AppState.PENDING
        await sv.release(second)
        assert (await sv.wait(second, timeout=120)).state is AppState.SUCCEEDED
        with pytest.raises(UnknownAppError, match="no app local://svc/x-1"):
            await sv.hold("local://svc/x-1")  # no such app, before "cannot hold"


def test_hold_and_release_have_help_and_exit_codes(state_dir: Path) -> None:
    for verb in ("hold", "release"):
        shown = _cli(state_dir, verb, "--help")
        assert shown.returncode == 0 and "scontrol" in shown.stdout, shown.stderr
    unknown = _cli(state_dir, "hold", "slurm://svc/none-1")
    assert unknown.returncode == 1 and "no app slurm://svc/none-1" in unknown.stderr
    local = _cli(state_dir, "release", "local://svc/none-1")
    assert local.returncode == 1 and "no app local://svc/none-1" in local.stderr
    ended = _cli(state_dir, "run", "--", "true").stdout.strip()
    local = _cli(state_dir, "release", ended)
    assert local.returncode == 2 and "cannot release" in local.stderr


async def _queued(job_id: int) -> list[dict[str, Any]]:
    done = await anyio.run_process(["squeue", "--json"], check=True)
    jobs = json.loads(done.stdout)["jobs"]
    return sorted((j for j in jobs if j["het_job_id"] == job_id), key=lambda j: j["het_job_offset"])


async def test_the_new_directives_reach_slurm_over_rest_as_over_sbatch(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """slurmrestd ignores #SBATCH lines: each option must become the same job property.

    Held and waiting for a held job, so nothing runs; REST also holds and releases.
    """
    from supervisor.backends.base import DryrunContext
    from supervisor.backends.slurm.options import slurm_run_opts
    from supervisor.backends.slurm.rest import RestTransport
    from supervisor.backends.slurm.script import ClusterFacts, render, with_dependencies
    from supervisor.backends.slurm.transport import CliTransport

    from .test_slurm_rest import _token

    token = _token(cluster)
    if token is None:
        pytest.fail("no JWT for root: `scontrol token` gave none")
    rest = cluster["rest"]
    transport = RestTransport(url=rest["jwt_url"], token=token, user="root")
    cli = CliTransport()
    target = await anyio.run_process(
        ["sbatch", "--parsable", "--hold", "--comment=asupervisor:test/target", "--wrap", "true"],
        check=True,
    )
    target_id = int(target.stdout.decode().strip())
    cfg = {
        "nodelist": ["n2", "n1"], "exclude": ["n3"], "exclusive": True, "hold": True,
        "afterok": ["slurm://t/target-1"], "time": "0:05:00",
    }  # fmt: skip
    request = render(
        _one("viarest", "-c", "pass", replicas=2),
        slurm_run_opts().resolve(cfg),
        DryrunContext(session="rest", app_id="o-1", cwd=str(tmp_path)),
        facts=ClusterFacts(version=(22, 5), default_partition="debug"),
        default_log_dir=tmp_path / "logs",
        job_dir=None,
    )
    script = with_dependencies(request.script, {"slurm://t/target-1": target_id})
    ids: list[int] = []
    try:
        ids.append(await transport.submit(script, request.workdir))
        done = await anyio.run_process(
            ["sbatch", "--parsable", f"--chdir={request.workdir}"],
            input=script.encode(),
            check=True,
        )
        ids.append(int(done.stdout.decode().strip().split(";")[0]))
        by_rest, by_cli = await _queued(ids[0]), await _queued(ids[1])
        fields = (
            "het_job_offset", "required_nodes", "excluded_nodes", "shared", "dependency",
            "state_reason", "time_limit", "job_state",
        )  # fmt: skip
        assert len(by_rest) == len(by_cli) == 2
        for mine, theirs in zip(by_rest, by_cli, strict=True):
            assert {f: mine.get(f) for f in fields} == {f: theirs.get(f) for f in fields}
        assert [j["required_nodes"] for j in by_rest] == ["n2", "n1"]
        for component in by_rest:  # with the other components' nodes, as Slurm adds them
            names = await anyio.run_process(
                ["scontrol", "show", "hostnames", component["excluded_nodes"]], check=True
            )
            shown = names.stdout.decode().split()
            assert "n3" in shown, component["excluded_nodes"]
        assert by_rest[0]["dependency"] == f"afterok:{target_id}(unfulfilled)"
        assert by_rest[0]["state_reason"] == "JobHeldUser"
        await transport.release(ids[0])
        released = await _queued(ids[0])
        assert released[0]["state_reason"] not in ("JobHeldUser", "JobHeldAdmin"), released[0]
        assert released[0]["priority"] > 0  # what a hold sets to 0
        await transport.hold(ids[0])
        held = await _queued(ids[0])
        assert held[0]["state_reason"] in ("JobHeldUser", "JobHeldAdmin")  # root: admin hold
        assert transport.calls["hold"] == transport.calls["release"] == 1
    finally:
        for job_id in [*ids, target_id]:
            await cli.cancel(job_id)
        await transport.aclose()


async def test_ntasks_per_node_puts_that_many_replicas_on_each_node(
    cluster: dict[str, object], state_dir: Path
) -> None:
    role = Role(name="w", entrypoint="sh", args=["-c", "echo $SLURMD_NODENAME"], num_replicas=4)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(
            AppDef(name="packed", roles=[role]), "slurm", {"ntasks_per_node": 2}
        )
        shown = _scontrol_job(_job_id(state_dir, handle))
        final = await sv.wait(handle, timeout=120)
        nodes = [
            "".join([line async for line in sv.log_iter(handle, "w", k, streams="stdout")]).strip()
            for k in range(4)
        ]
    assert final.state is AppState.SUCCEEDED, final
    assert "NumNodes=2" in shown and "NumTasks=4" in shown, shown
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
