"""Golden scripts and checks of MPI (the ``mpi`` component) and containers (pyxis) on Slurm.

Regenerate the golden files with ``UPDATE_GOLDEN=1 pytest tests/unit/test_slurm_mpi_containers.py``
and review the diff like code.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import anyio
import pytest

from supervisor import AppDef, BindMount, DeviceMount, Role, SpecError, VolumeMount
from supervisor.backends.base import DryrunContext
from supervisor.backends.slurm.capabilities import SLURM_CAPABILITIES
from supervisor.backends.slurm.options import slurm_run_opts
from supervisor.backends.slurm.pyxis import has_pyxis, probe_pyxis
from supervisor.backends.slurm.script import ClusterFacts, SlurmRequest, render
from supervisor.components import mpi
from supervisor.logs.pump import inherited_fds
from supervisor.specs import MPI, Mount
from supervisor.validate import validate

GOLDEN = Path(__file__).parent / "golden"
CTX = DryrunContext(session="svc", app_id="hello-0001", cwd="/home/me/project")
PYXIS = ClusterFacts((22, 5), "debug", {"debug": 4000}, pyxis=True)
NO_PYXIS = ClusterFacts((22, 5), "debug", {"debug": 4000}, pyxis=False)


def _render(
    app: AppDef, cfg: dict[str, object] | None = None, facts: ClusterFacts = PYXIS
) -> SlurmRequest:
    return render(
        app,
        slurm_run_opts().resolve(cfg or {}),
        CTX,
        facts=facts,
        default_log_dir=Path("/state/logs"),
        job_dir=None,
    )


def _golden(name: str, script: str) -> str:
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(script)
    return path.read_text()


def _container_app(**role: object) -> AppDef:
    return AppDef(
        name="train",
        roles=[
            Role(
                name="trainer",
                image="nvcr.io#nvidia/pytorch:24.01-py3",
                entrypoint="python",
                args=["-m", "train"],
                num_replicas=2,
                **role,  # type: ignore[arg-type]
            )
        ],
    )


MOUNTS: list[Mount] = [
    BindMount(src_path="/datasets", dst_path="/data", read_only=True),
    BindMount(src_path="/scratch/me", dst_path="/scratch"),
    DeviceMount(src_path="/dev/infiniband", dst_path="/dev/infiniband"),
]


@pytest.mark.parametrize(
    ("name", "app"),
    [
        ("mpi_pmix", mpi("./hello", "--greeting", "hi there", j="2x2", plugin="pmix")),
        ("mpi_pmi2", mpi("./hello", j="2x2", plugin="pmi2")),
        ("mpi_mpirun", mpi("./hello", j="2x2", plugin="mpirun", mpirun_args="--bind-to none")),
        ("container", _container_app(mounts=MOUNTS)),
    ],
)
def test_scripts_match_golden_files(name: str, app: AppDef) -> None:
    script = _render(app).script
    assert script == _golden(name, script)


def _srun_words(script: str) -> list[str]:
    srun = script[script.index("srun ") :].split("exitcode=")[0]
    return shlex.split(srun.replace("\\\n", " "))


def test_pmix_and_pmi2_are_one_srun_step_of_nnodes_x_nproc_ranks() -> None:
    for plugin in ("pmix", "pmi2"):
        validate(mpi("./hello", j="2x2", plugin=plugin), SLURM_CAPABILITIES)
        request = _render(mpi("./hello", j="2x2", plugin=plugin))
        assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2" in request.script
        assert f"--mpi={plugin}" in _srun_words(request.script)
        assert [(r.role, r.replica_id) for r in request.replicas] == [
            ("hello", k) for k in range(4)
        ]
        assert len(request.groups) == 1 and "hetjob" not in request.script


def test_mpirun_runs_in_the_batch_script_over_the_whole_allocation() -> None:
    validate(mpi("./hello", j="2x2", plugin="mpirun"), SLURM_CAPABILITIES)
    request = _render(mpi("./hello", j="2x2", plugin="mpirun", mpirun="mpirun.openmpi"))
    script = request.script
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2" in script
    assert "srun " not in script  # mpirun itself starts the ranks through Slurm
    assert "-- mpirun.openmpi -np 4 ./hello >>" in script
    assert [(r.role, r.replica_id) for r in request.replicas] == [("hello", 0)]
    assert 'echo "asupervisor: mpirun exited with code $exitcode"' in script


def test_mpi_metadata_is_checked_naming_the_field() -> None:
    bad = AppDef(name="x", roles=[Role(name="r", entrypoint="a", metadata={MPI: "openmpi"})])
    with pytest.raises(SpecError) as e:
        _render(bad)
    assert [p.field for p in e.value.problems] == ["roles[0].metadata['asupervisor/mpi']"]
    two = mpi("./hello", plugin="mpirun")
    two = AppDef(name="x", roles=[*two.roles, Role(name="other", entrypoint="true")])
    with pytest.raises(SpecError) as e:
        _render(two)
    assert "roles[0].metadata['asupervisor/mpi']" in [p.field for p in e.value.problems]
    with pytest.raises(ValueError, match="--plugin"):
        mpi("./hello", plugin="openmpi")
    with pytest.raises(ValueError, match="program"):
        mpi()


def test_container_options_are_on_the_srun_line() -> None:
    words = _srun_words(_render(_container_app(mounts=MOUNTS)).script)
    assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in words
    mounts = next(w for w in words if w.startswith("--container-mounts="))
    items = mounts.partition("=")[2].split(",")
    app_dir = "/state/logs/svc/hello-0001"
    assert items == [
        f"{app_dir}:{app_dir}",  # logs and the log pump, where the nodes see them
        "/home/me/project:/home/me/project",
        "/datasets:/data:ro",
        "/scratch/me:/scratch",
        "/dev/infiniband:/dev/infiniband",
    ]
    assert "--container-workdir=/home/me/project" in words


def test_an_image_without_pyxis_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as e:
        _render(_container_app(), facts=NO_PYXIS)
    assert [p.field for p in e.value.problems] == ["roles[0].image"]
    assert "image_is_tag" in str(e.value) and "pyxis" in str(e.value)


def test_an_image_that_is_only_a_tag_renders_nothing() -> None:
    for facts in (PYXIS, NO_PYXIS):
        script = _render(_container_app(), {"image_is_tag": True}, facts).script
        assert "--container" not in script
    plain = AppDef(name="p", roles=[Role(name="r", entrypoint="true")])
    assert "--container" not in _render(plain).script


def test_mounts_need_a_rendered_image() -> None:
    no_image = AppDef(name="p", roles=[Role(name="r", entrypoint="true", mounts=MOUNTS[:1])])
    with pytest.raises(SpecError) as e:
        _render(no_image)
    assert [p.field for p in e.value.problems] == ["roles[0].mounts"]
    with pytest.raises(SpecError) as e:
        _render(_container_app(mounts=MOUNTS[:1]), {"image_is_tag": True})
    assert [p.field for p in e.value.problems] == ["roles[0].mounts"]
    # Every problem at once: no pyxis for the image, and so none for the mounts.
    with pytest.raises(SpecError) as e:
        _render(_container_app(mounts=MOUNTS[:1]), facts=NO_PYXIS)
    assert [p.field for p in e.value.problems] == ["roles[0].image", "roles[0].mounts"]


def test_volume_mounts_and_odd_paths_are_refused() -> None:
    mounts = [VolumeMount(src="vol", dst_path="/v"), BindMount(src_path="/a,b", dst_path="/c")]
    with pytest.raises(SpecError) as e:
        _render(_container_app(mounts=mounts))
    assert [p.field for p in e.value.problems] == ["roles[0].mounts[0]", "roles[0].mounts[1]"]


@pytest.mark.parametrize(
    ("cfg", "ctx", "named"),
    [
        ({"log_dir": "/runs/a:b"}, CTX, "app's directory"),
        ({}, DryrunContext(session="team:a", app_id="hello-0001", cwd="/p"), "app's directory"),
        ({}, DryrunContext(session="svc", app_id="h,1", cwd="/p"), "app's directory"),
        ({}, DryrunContext(session="svc", app_id="h", cwd="/home/me/a:b"), "working directory"),
    ],
)
def test_paths_mounted_for_the_app_are_refused_with_a_colon_or_comma(
    cfg: dict[str, object], ctx: DryrunContext, named: str
) -> None:
    """Its directory and the working directory are mounted too: a ':' in one (from the
    session, the app id, log_dir or the cwd) was rendered into --container-mounts."""
    opts = slurm_run_opts().resolve(cfg)
    with pytest.raises(SpecError) as e:
        render(
            _container_app(),
            opts,
            ctx,
            facts=PYXIS,
            default_log_dir=Path("/state/logs"),
            job_dir=None,
        )
    assert [p.field for p in e.value.problems] == ["roles[0].image"]
    assert named in str(e.value) and "--container-mounts" in str(e.value)


def test_mpirun_cannot_run_in_a_container() -> None:
    app = mpi("./hello", plugin="mpirun")
    role = app.roles[0]
    app = AppDef(name=app.name, roles=[Role(**{**role.__dict__, "image": "img"})])
    with pytest.raises(SpecError) as e:
        _render(app)
    assert "roles[0].image" in [p.field for p in e.value.problems]


def test_pyxis_is_read_from_srun_help(tmp_path: Path) -> None:
    assert has_pyxis("      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n")
    assert not has_pyxis("Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]\n")
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\necho '  --container-image=IMAGE  [pyxis] the image'\n")
    fake.chmod(0o755)
    assert anyio.run(probe_pyxis, str(fake)) is True
    assert anyio.run(probe_pyxis, str(tmp_path / "missing")) is None


def test_the_pump_keeps_pmi_fd_open(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    try:
        monkeypatch.setenv("PMI_FD", str(write))
        assert inherited_fds() == (write,)
        monkeypatch.setenv("PMI_FD", "not a number")
        assert inherited_fds() == ()
    finally:
        os.close(read)
        os.close(write)
    monkeypatch.setenv("PMI_FD", str(write))  # closed now
    assert inherited_fds() == ()


def test_the_cli_knows_the_mpi_component() -> None:
    from click.testing import CliRunner

    from supervisor.cli.main import cli

    result = CliRunner().invoke(cli, ["run", "mpi", "--help"])
    assert result.exit_code == 0, result.output
    assert "-j" in result.output and "--plugin" in result.output and "--mpirun" in result.output
    result = CliRunner().invoke(
        cli, ["run", "--dryrun", "mpi", "-j", "2x2", "--plugin", "pmi2", "--", "./hello", "-v"]
    )
    assert result.exit_code == 0, result.output
    # The local backend's dry run: four replicas (ranks) of the program.
    assert [line.split(":")[0].strip() for line in result.output.splitlines()[2:]] == [
        f"hello/{k}" for k in range(4)
    ]
    assert result.output.count(" ./hello -v\n") == 4
