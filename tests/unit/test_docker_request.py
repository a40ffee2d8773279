"""The docker dryrun: pure, deterministic, and exactly the Engine API bodies that will be sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    SpecError,
    VolumeMount,
)
from supervisor.backends.base import DryrunContext
from supervisor.backends.docker.options import DOCKER_CAPABILITIES, docker_run_opts
from supervisor.backends.docker.request import LABEL, DockerRequest, render
from supervisor.backends.docker.runtime import exit_signal
from supervisor.validate import validate

CTX = DryrunContext(session="s1", app_id="app-1234", cwd="/work", gpu_count=0)


def _render(app: AppDef, **cfg: object) -> DockerRequest:
    resolved = docker_run_opts().resolve(cfg)
    return render(app, resolved, CTX, host="unix:///x.sock", default_log_dir=Path("/logs"))


def _app(**role: object) -> AppDef:
    fields: dict[str, object] = {"image": "img:1", "entrypoint": "python3", **role}
    return AppDef("a", [Role("trainer", **fields), Role("ps", image="img:2", entrypoint="sh")])  # type: ignore[arg-type]


def test_one_container_per_replica_named_for_dns_with_labels() -> None:
    req = _render(_app(num_replicas=2, args=["${replica_id}", "${app_id}", "$HOME"]))
    assert [c.name for c in req.containers] == [
        "app-1234-trainer-0",
        "app-1234-trainer-1",
        "app-1234-ps-0",
    ]
    assert req.network == "asupervisor-app-1234"
    assert req.network_body["Internal"] is True
    assert req.network_body["Labels"][LABEL.SESSION] == "s1"
    second = req.containers[1].config(attempt=3)
    assert second["Entrypoint"] == ["python3"]
    assert second["Cmd"] == ["1", "app-1234", "$HOME"]
    assert second["Labels"] == {
        LABEL.SESSION: "s1",
        LABEL.APP_ID: "app-1234",
        LABEL.APP_DIR: "/logs/s1/app-1234",
        LABEL.ROLE: "trainer",
        LABEL.REPLICA_ID: "1",
        LABEL.ATTEMPT: "3",
    }
    env = dict(e.split("=", 1) for e in second["Env"])
    assert env["TORCHX_RANK0_HOST"] == env["ASUPERVISOR_RANK0_HOST"] == "app-1234-trainer-0"
    assert env["ASUPERVISOR_ATTEMPT"] == "3"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/asupervisor/replica/error.json"
    assert second["HostConfig"]["NetworkMode"] == "asupervisor-app-1234"
    assert second["HostConfig"]["Mounts"][0] == {
        "Type": "bind",
        "Source": "/logs/s1/app-1234/trainer/1",
        "Target": "/asupervisor/replica",
    }
    # config() copies: the frozen request is never changed by an attempt.
    assert LABEL.ATTEMPT not in req.containers[1].body["Labels"]


def test_resources_and_mounts_become_host_config() -> None:
    app = _app(
        resource=Resource(cpu=2, memMB=64),
        mounts=[
            BindMount("/data", "/in", read_only=True),
            VolumeMount("vol", "/vol"),
            DeviceMount("/dev/fuse", "/dev/fuse", permissions="rw"),
        ],
    )
    host = _render(app).containers[0].body["HostConfig"]
    assert host["Memory"] == 64 * 1024 * 1024
    assert host["NanoCpus"] == 2_000_000_000
    assert host["Init"] is True
    assert host["Mounts"][1:] == [
        {"Type": "bind", "Source": "/data", "Target": "/in", "ReadOnly": True},
        {"Type": "volume", "Source": "vol", "Target": "/vol", "ReadOnly": False},
    ]
    assert host["Devices"] == [
        {"PathOnHost": "/dev/fuse", "PathInContainer": "/dev/fuse", "CgroupPermissions": "rw"}
    ]
    assert "DeviceRequests" not in host


def test_gpus_beyond_the_machine_are_refused_before_any_engine_sees_them() -> None:
    with pytest.raises(SpecError) as caught:
        _render(_app(resource=Resource(gpu=2)))
    assert caught.value.fields == ("roles[0].resource.gpu",)
    ctx = DryrunContext(session="s1", app_id="app-1234", cwd="/w", gpu_count=4)
    req = render(
        _app(resource=Resource(gpu=2)),
        docker_run_opts().resolve({}),
        ctx,
        host="unix:///x.sock",
        default_log_dir=Path("/logs"),
    )
    requests = req.containers[0].body["HostConfig"]["DeviceRequests"]
    assert requests[0]["Count"] == 2 and requests[0]["Capabilities"] == [["gpu"]]


def test_the_request_is_deterministic_and_printable() -> None:
    app = _app(num_replicas=2)
    first, second = _render(app, stop_grace=1.5), _render(app, stop_grace=1.5)
    assert first.to_json() == second.to_json()
    assert first.stop_grace == 1.5
    text = str(first)
    assert "app-1234-trainer-1" in text and "internal: True" in text
    assert not _render(app, internal_network=False).network_body["Internal"]


def test_capabilities_require_an_image_and_accept_mounts() -> None:
    with pytest.raises(SpecError) as caught:
        validate(AppDef("a", [Role("r", entrypoint="x")]), DOCKER_CAPABILITIES)
    assert any("image" in f for f in caught.value.fields)
    validate(_app(mounts=[BindMount("/a", "/b")]), DOCKER_CAPABILITIES)


@pytest.mark.parametrize(
    ("code", "name"), [(0, None), (3, None), (137, "SIGKILL"), (143, "SIGTERM")]
)
def test_exit_codes_past_128_name_their_signal(code: int, name: str | None) -> None:
    assert exit_signal(code) == name


def test_a_roles_error_file_is_kept_and_read_back_where_the_host_can_see_it() -> None:
    inside = _render(_app(env={"TORCHELASTIC_ERROR_FILE": "/asupervisor/replica/err/x.json"}))
    env = dict(e.split("=", 1) for e in inside.containers[0].config(0)["Env"])
    assert env["TORCHELASTIC_ERROR_FILE"] == "/asupervisor/replica/err/x.json"
    assert inside.containers[0].error_file == "/logs/s1/app-1234/trainer/0/err/x.json"
    assert inside.containers[1].error_file == "/logs/s1/app-1234/ps/0/error.json"
    outside = _render(_app(env={"TORCHELASTIC_ERROR_FILE": "/tmp/x.json"}))
    # Not under the mounted replica dir: never confused with the default file.
    assert not outside.containers[0].error_file.endswith("/error.json")


def test_a_relative_log_dir_is_made_absolute_from_the_dry_runs_directory() -> None:
    req = _render(_app(), log_dir="rel/logs")
    assert req.app_dir == "/work/rel/logs/s1/app-1234"
