"""The docker dryrun: pure, deterministic, and exactly the Engine API bodies that will be sent."""

from __future__ import annotations

import re
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
from supervisor.backends.docker.request import (
    LABEL,
    DockerRequest,
    container_name,
    network_name,
    render,
)
from supervisor.backends.docker.runtime import exit_signal
from supervisor.validate import validate

CTX = DryrunContext(session="s1", app_id="app-1234", cwd="/work", gpu_count=0)


def _render(
    app: AppDef, ctx: DryrunContext = CTX, environ: dict[str, str] | None = None, **cfg: object
) -> DockerRequest:
    resolved = docker_run_opts().resolve(cfg)
    return render(
        app, resolved, ctx, host="unix:///x.sock", default_log_dir=Path("/logs"), environ=environ
    )


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
            BindMount("/tmp", "/in", read_only=True),
            VolumeMount("vol", "/vol"),
            DeviceMount("/dev/null", "/dev/null", permissions="rw"),
        ],
    )
    host = _render(app).containers[0].body["HostConfig"]
    assert host["Memory"] == 64 * 1024 * 1024
    assert host["ShmSize"] == 64 * 1024 * 1024  # /dev/shm sized like the memory, as TorchX
    assert "Privileged" not in host
    assert host["NanoCpus"] == 2_000_000_000
    assert host["Init"] is True
    assert host["Mounts"][1:] == [
        {"Type": "bind", "Source": "/tmp", "Target": "/in", "ReadOnly": True},
        {"Type": "volume", "Source": "vol", "Target": "/vol", "ReadOnly": False},
    ]
    assert host["Devices"] == [
        {"PathOnHost": "/dev/null", "PathInContainer": "/dev/null", "CgroupPermissions": "rw"}
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
    # The capabilities TorchX asks for (CUDA libraries and nvidia-smi). No GPU here: the
    # request body is what can be checked; the NVIDIA runtime honouring it cannot.
    assert requests[0]["Count"] == 2
    assert requests[0]["Capabilities"] == [["compute", "utility"]]


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


def _env(body: dict[str, object]) -> dict[str, str]:
    items = body["Env"]
    assert isinstance(items, list)
    return dict(str(e).split("=", 1) for e in items)


def test_copy_env_and_env_options_reach_every_container_under_the_roles_env() -> None:
    environ = {"AWS_REGION": "x", "AWS_KEY": "k", "HOME": "/root", "MY_B": "host"}
    app = _app(env={"MY_B": "role"})
    req = _render(app, environ=environ, copy_env=["AWS_*", "MY_B"], env=["MY_A=1", "MY_C=a=b"])
    trainer, ps = (_env(c.config(0)) for c in (req.containers[0], req.containers[1]))
    for env in (trainer, ps):
        assert env["AWS_REGION"] == "x" and env["AWS_KEY"] == "k"
        assert "HOME" not in env  # only what a pattern names
        assert env["MY_A"] == "1" and env["MY_C"] == "a=b"
    assert trainer["MY_B"] == "role" and ps["MY_B"] == "host"  # the role's env wins
    # The library's own variables are never overridden by the options.
    forced = _render(app, env=["ASUPERVISOR_ROLE=x", "TORCHX_RANK0_HOST=y"])
    env = _env(forced.containers[0].config(0))
    assert env["ASUPERVISOR_ROLE"] == "trainer" and env["TORCHX_RANK0_HOST"] == "app-1234-trainer-0"
    # Without copy_env nothing of the submitting process goes in.
    assert "AWS_REGION" not in _env(_render(app, environ=environ).containers[0].config(0))


def test_a_malformed_env_item_is_refused_naming_it_with_every_other_problem() -> None:
    with pytest.raises(SpecError) as caught:
        _render(_app(resource=Resource(gpu=1)), env=["A=1", "B", "=3"])
    assert caught.value.fields == ("cfg.env[1]", "cfg.env[2]", "roles[0].resource.gpu")
    with pytest.raises(SpecError) as caught:
        docker_run_opts().resolve({"env": "A=1;B=2"})  # a list option: the CLI form splits it
    assert caught.value.fields == ("cfg.env",)


def test_privileged_and_shm_only_when_asked() -> None:
    host = _render(_app(), privileged=True).containers[0].body["HostConfig"]
    assert host["Privileged"] is True
    assert "ShmSize" not in host  # no memMB: the engine's default /dev/shm


def test_joining_an_existing_network_creates_and_removes_none() -> None:
    req = _render(_app(num_replicas=2), network="shared-net")
    assert req.network == "shared-net" and not req.owns_network
    assert req.network_body == {}
    for c in req.containers:
        body = c.config(0)
        assert body["HostConfig"]["NetworkMode"] == "shared-net"
        assert body["NetworkingConfig"] == {
            "EndpointsConfig": {"shared-net": {"Aliases": [c.name]}}
        }
    assert "joined" in str(req) and req.to_json()["network_body"] == {}
    assert _render(_app()).owns_network


def test_named_devices_map_to_host_devices_as_torchx_does() -> None:
    """EFA and Neuron hardware is not on this machine: the create body is what is checked."""
    res = Resource(devices={"vpc.amazonaws.com/efa": 2, "aws.amazon.com/neurondevice": 1})
    host = _render(_app(resource=res, mounts=[DeviceMount("/dev/null", "/dev/null")]))
    devices = host.containers[0].body["HostConfig"]["Devices"]
    assert [(d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in devices] == [
        ("/dev/null", "/dev/null", "rwm"),
        ("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rwm"),
        ("/dev/infiniband/uverbs1", "/dev/infiniband/uverbs1", "rwm"),
        ("/dev/neuron0", "/dev/neuron0", "rwm"),
    ]
    with pytest.raises(SpecError) as caught:
        _render(_app(resource=Resource(devices={"example.com/fpga": 1})))
    assert caught.value.fields == ("roles[0].resource.devices",)
    assert "example.com/fpga" in str(caught.value)


def test_every_name_a_replica_resolves_is_a_dns_label_and_unique() -> None:
    label = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
    app_id = "a-forty-character-application-name-xxxx-0123abcd"
    roles = [
        Role("trainer_with_a_rather_long_role_name_a", image="i", entrypoint="e", num_replicas=11),
        Role("trainer_with_a_rather_long_role_name_b", image="i", entrypoint="e"),
    ]
    ctx = DryrunContext(session="s1", app_id=app_id, cwd="/w")
    req = _render(AppDef("a", roles), ctx)
    names = [c.name for c in req.containers]
    assert len(set(names)) == len(names) == 12
    for c in req.containers:
        assert label.fullmatch(c.name), c.name
        assert c.name.endswith(f"-{c.replica_id}")
        body = c.config(0)
        assert body["Hostname"] == c.name
        assert body["NetworkingConfig"]["EndpointsConfig"][req.network]["Aliases"] == [c.name]
        env = _env(body)
        assert env["TORCHX_RANK0_HOST"] == env["ASUPERVISOR_RANK0_HOST"] == names[0]
    assert names[0] == container_name(app_id, roles[0].name, 0)
    # A name that already is a label is kept as it is.
    assert container_name("app-1234", "trainer", 3) == "app-1234-trainer-3"


@pytest.mark.parametrize("app_id", ["nightly 42", "a:b", "x;rm -rf"])
def test_an_app_id_an_engine_refuses_in_a_network_name_still_names_one(app_id: str) -> None:
    """An explicit app id may hold what an engine refuses in a network's name: the
    network was ``asupervisor-nightly 42``, and the submit failed at the engine."""
    req = _render(_app(), DryrunContext(session="s1", app_id=app_id, cwd="/w"))
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", req.network), req.network
    assert req.network != _render(_app(), DryrunContext("s1", app_id + "x", "/w")).network
    assert network_name("app-1234") == "asupervisor-app-1234"


@pytest.mark.parametrize("host", ["/run/docker.sock", "bogus://x", "unix://", "localhost:2375"])
def test_an_engine_address_no_client_takes_is_refused_naming_cfg_host(host: str) -> None:
    """Before: the dry run took it; the submit then failed in the engine's event follower,
    inside the Supervisor's own task group, which died with it (every later verb: "This
    task group is not active")."""
    resolved = docker_run_opts().resolve({"host": host})
    with pytest.raises(SpecError) as caught:
        render(_app(), resolved, CTX, host=host, default_log_dir=Path("/logs"))
    assert caught.value.fields == ("cfg.host",)
    assert repr(host) in str(caught.value)
    for good in ("unix:///run/x.sock", "tcp://h:2375", "https://h:2376", "ssh://u@h"):
        render(_app(), docker_run_opts().resolve({}), CTX, host=good, default_log_dir=Path("/l"))


def test_a_bind_source_missing_on_this_machine_is_refused_for_a_local_engine(
    tmp_path: Path,
) -> None:
    """Podman created a missing bind source (empty, owned by root) and ran on it; dockerd
    refused the container. Both are refused at the dry run now, naming the mount, when the
    engine is on this machine (a unix socket); a remote engine's paths are its own."""
    missing = str(tmp_path / "no-such-dir")
    app = _app(mounts=[BindMount(str(tmp_path), "/ok"), BindMount(missing, "/x")])
    with pytest.raises(SpecError) as caught:
        _render(app)
    assert caught.value.fields == ("roles[0].mounts[1].src_path",)
    assert repr(missing) in str(caught.value)
    assert not Path(missing).exists()
    remote = render(
        app, docker_run_opts().resolve({}), CTX, host="tcp://h:2375", default_log_dir=Path("/l")
    )
    assert remote.containers[0].body["HostConfig"]["Mounts"][2]["Source"] == missing


def test_a_device_missing_on_this_machine_and_a_bad_volume_name_are_refused_naming_them(
    tmp_path: Path,
) -> None:
    """A missing device: Podman refused it at the submit, dockerd made no container and
    the replica read a made-up exit 127. A volume name neither engine takes was refused at
    the container's create, a submit's failure naming no mount. Both are dry-run problems."""
    missing = str(tmp_path / "no-such-device")
    app = _app(
        mounts=[
            DeviceMount("/dev/null", "/dev/ok"),
            DeviceMount(missing, "/dev/x"),
            VolumeMount("bad name!", "/v"),
            VolumeMount("good_name-1.x", "/w"),
        ]
    )
    with pytest.raises(SpecError) as caught:
        _render(app)
    assert caught.value.fields == ("roles[0].mounts[2].src", "roles[0].mounts[1].src_path")
    remote = _app(mounts=[DeviceMount(missing, "/dev/x")])  # a remote engine's paths are its own
    render(
        remote, docker_run_opts().resolve({}), CTX, host="tcp://h:2375", default_log_dir=Path("/l")
    )
