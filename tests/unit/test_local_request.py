"""The local dryrun is a pure function of the app, the options and the context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import AppDef, Resource, Role
from supervisor.backends.base import DryrunContext
from supervisor.backends.local.request import (
    is_path_like,
    local_run_opts,
    render,
    replica_base_env,
)
from supervisor.components import ddp
from supervisor.errors import SpecError

CTX = DryrunContext(session="svc", app_id="app-1", cwd="/work/dir", gpu_count=4)


def _render(app: AppDef, **cfg: object) -> dict[tuple[str, int], dict[str, str]]:
    request = render(app, local_run_opts().resolve(cfg), CTX, Path("/state/logs"))
    return {(r.role, r.replica_id): dict(r.env) for r in request.replicas}


def _gpu_app(trainer_gpus: int, eval_gpus: int) -> AppDef:
    return AppDef(
        name="g",
        roles=[
            Role(
                name="trainer", entrypoint="t", num_replicas=2, resource=Resource(gpu=trainer_gpus)
            ),
            Role(name="eval", entrypoint="e", resource=Resource(gpu=eval_gpus)),
        ],
    )


def test_gpus_are_assigned_in_contiguous_blocks_across_roles() -> None:
    env = _render(_gpu_app(1, 2), auto_set_cuda_visible_devices=True)
    assert env[("trainer", 0)]["CUDA_VISIBLE_DEVICES"] == "0"
    assert env[("trainer", 1)]["CUDA_VISIBLE_DEVICES"] == "1"
    assert env[("eval", 0)]["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_ranks_of_one_node_share_its_gpus_so_local_rank_indexes_them(tmp_path: Path) -> None:
    """ddp's rank mode, 2 nodes x 2 ranks, 2 GPUs per node on a 4-GPU host: each rank's
    CUDA_VISIBLE_DEVICES is its node's block and LOCAL_RANK indexes it, as under torchrun,
    so ``torch.cuda.set_device(LOCAL_RANK)`` picks a device that is there, another for
    each rank. Each replica's own line runs (a real process) and reports what it got."""
    script = tmp_path / "report.py"
    script.write_text(
        "import json, os\n"
        "print(json.dumps([os.environ['LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES']]))\n"
    )
    app = ddp(str(script), j="2x2", gpu=2, interpreter=sys.executable, rdzv_port=29511)
    cfg = local_run_opts().resolve({"auto_set_cuda_visible_devices": True})
    request = render(app, cfg, CTX, Path("/state/logs"))
    picked = []
    for replica in request.replicas:
        done = subprocess.run(
            replica.argv,
            env={**os.environ, **replica.env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        local_rank, visible = json.loads(done.stdout)
        devices = visible.split(",")
        assert int(local_rank) < len(devices), (replica.replica_id, local_rank, visible)
        picked.append(devices[int(local_rank)])
    assert picked == ["0", "1", "2", "3"]


def test_gpus_are_left_alone_when_too_few_or_when_off() -> None:
    too_many = _render(_gpu_app(2, 2), auto_set_cuda_visible_devices=True)
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in too_many.values())
    off = _render(_gpu_app(1, 1))
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in off.values())


def test_request_layout_env_and_prepend_cwd() -> None:
    app = AppDef(
        name="x",
        roles=[
            Role(name="r", entrypoint="prog", args=["${app_id}", "${rank0_env}"], env={"A": "1"})
        ],
    )
    request = render(app, local_run_opts().resolve({"prepend_cwd": True}), CTX, Path("/s"))
    (replica,) = request.replicas
    assert request.app_dir == "/s/svc/app-1"
    assert replica.log_dir == "/s/svc/app-1/r/0"
    assert replica.argv == ("prog", "app-1", "TORCHX_RANK0_HOST")
    assert replica.cwd == "/work/dir"
    assert replica.path_prepend == "/work/dir"
    assert replica.env["A"] == "1"
    assert replica.env["TORCHELASTIC_ERROR_FILE"] == "/s/svc/app-1/r/0/error.json"
    assert "prog app-1 TORCHX_RANK0_HOST" in str(request)
    custom = render(app, local_run_opts().resolve({"log_dir": "/elsewhere"}), CTX, Path("/s"))
    assert custom.app_dir == "/elsewhere/svc/app-1"


def test_env_policy_is_frozen_in_the_request_and_shown_in_the_dryrun() -> None:
    one = AppDef(name="e", roles=[Role(name="r", entrypoint="t")])
    opts = local_run_opts()
    default = render(one, opts.resolve({}), CTX, Path("/s"))
    assert (default.env_policy, default.env_allow) == ("inherit", ())
    allow = render(
        one, opts.resolve({"env_policy": "allow", "env_allow": ["HOME", "LC_*"]}), CTX, Path("/s")
    )
    assert allow.env_allow == ("HOME", "LC_*")
    assert allow.to_json()["env_policy"] == "allow"
    assert "only HOME;LC_* of this process's" in str(allow)
    clean = render(one, opts.resolve({"env_policy": "clean"}), CTX, Path("/s"))
    assert "PATH=/bin:/usr/bin" in str(clean)


def test_replica_base_env_under_each_policy() -> None:
    environ = {"PATH": "/p", "HOME": "/h", "LC_ALL": "C", "SECRET": "s"}
    assert replica_base_env("inherit", (), environ) == environ
    assert replica_base_env("clean", (), environ) == {"PATH": "/bin:/usr/bin"}
    assert replica_base_env("allow", ("HOME", "LC_*"), environ) == {
        "HOME": "/h",
        "LC_ALL": "C",
        "PATH": "/bin:/usr/bin",
    }
    assert replica_base_env("allow", ("PATH",), environ) == {"PATH": "/p"}
    assert replica_base_env("allow", ("secret",), environ) == {"PATH": "/bin:/usr/bin"}


@pytest.mark.parametrize(
    ("cfg", "fields"),
    [
        ({"env_policy": "allow"}, ["cfg.env_allow"]),
        ({"env_policy": "allow", "env_allow": []}, ["cfg.env_allow"]),
        ({"env_allow": ["HOME"]}, ["cfg.env_allow"]),
        ({"env_policy": "clean", "env_allow": ["HOME"]}, ["cfg.env_allow"]),
        ({"env_policy": "allow", "env_allow": ["OK", "A=B", "sp ace"]}, [
            "cfg.env_allow[1]", "cfg.env_allow[2]"
        ]),
    ],
)  # fmt: skip
def test_env_options_that_do_not_fit_name_the_field(
    cfg: dict[str, object], fields: list[str]
) -> None:
    one = AppDef(name="e", roles=[Role(name="r", entrypoint="t")])
    with pytest.raises(SpecError) as bad:
        render(one, local_run_opts().resolve(cfg), CTX, Path("/s"))
    assert [p.field for p in bad.value.problems] == fields


@pytest.mark.parametrize("backend", ["docker", "slurm"])
def test_env_policy_is_refused_elsewhere_with_the_reason(backend: str) -> None:
    from supervisor.backends.docker.options import docker_run_opts
    from supervisor.backends.slurm.options import slurm_run_opts

    opts = docker_run_opts() if backend == "docker" else slurm_run_opts()
    with pytest.raises(SpecError) as bad:
        opts.resolve({"env_policy": "clean", "env_allow": ["HOME"]})
    assert [p.field for p in bad.value.problems] == ["cfg.env_policy", "cfg.env_allow"]
    assert "not supported by this backend" in str(bad.value)
    assert ("image's ENV" if backend == "docker" else "--export=ALL") in str(bad.value)


# -- TorchX's local schedulers: local_cwd and local_dir ------------------------


def test_img_root_is_the_working_directory_and_the_image_is_ignored() -> None:
    """local_cwd: ``${img_root}`` is the cwd, whatever the image says (not the image string)."""
    role = Role(name="r", image="python:3.12", entrypoint="p", args=["${img_root}/x"])
    (replica,) = render(
        AppDef(name="x", roles=[role]), local_run_opts().resolve({}), CTX, Path("/s")
    ).replicas
    assert replica.argv == ("p", "/work/dir/x")
    assert replica.cwd == "/work/dir"


def test_a_directory_image_is_the_working_directory_and_img_root() -> None:
    """local_dir: the replica runs in the image directory; a relative entrypoint is found there."""
    roles = [
        Role(
            name="d",
            image="./pkg",
            entrypoint="bin/run",
            args=["${img_root}"],
            env={"ROOT": "${img_root}"},
        ),
        Role(name="c", image="./not-a-dir", entrypoint="p", args=["${img_root}"]),
    ]
    request = render(
        AppDef(name="x", roles=roles),
        local_run_opts().resolve({}),
        CTX,
        Path("/s"),
        image_dirs={"./pkg": "/work/dir/pkg"},
    )
    d, c = request.replicas
    assert (d.cwd, d.argv, d.env["ROOT"]) == (
        "/work/dir/pkg",
        ("bin/run", "/work/dir/pkg"),
        "/work/dir/pkg",
    )
    assert d.path_append == "/work/dir/pkg"
    assert (c.cwd, c.argv) == ("/work/dir", ("p", "/work/dir"))
    assert c.path_append == "/work/dir"


def test_cwd_goes_last_on_path_unless_prepend_cwd() -> None:
    app = AppDef(name="x", roles=[Role(name="r", entrypoint="p")])
    (last,) = render(app, local_run_opts().resolve({}), CTX, Path("/s")).replicas
    assert last.spawn_path("/usr/bin:/bin") == "/usr/bin:/bin:/work/dir"
    assert last.spawn_path(None) == "/work/dir"  # an environment without PATH: PATH=cwd
    (first,) = render(
        app, local_run_opts().resolve({"prepend_cwd": True}), CTX, Path("/s")
    ).replicas
    assert first.spawn_path("/usr/bin:/bin") == "/work/dir:/usr/bin:/bin"
    assert first.spawn_path(None) == "/work/dir"


def test_torchx_job_id_is_the_handle() -> None:
    app = AppDef(name="x", roles=[Role(name="r", entrypoint="p", num_replicas=2)])
    request = render(app, local_run_opts().resolve({}), CTX, Path("/s"))
    assert {r.env["TORCHX_JOB_ID"] for r in request.replicas} == {"local://svc/app-1"}


def test_is_path_like() -> None:
    assert [is_path_like(i) for i in ("/abs", "./rel", "../up", "a/b", ".", "busybox", "py:3")] == [
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
