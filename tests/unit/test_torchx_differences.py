"""One pin per row of docs/torchx.md: a row of that table cannot silently become false.

Each test names its row. Rows whose behaviour needs a cluster or an engine are
pinned where that behaviour is tested for real; the test here then pins what
can be checked without one (the rendered request, the state map) and its
docstring names the real test.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import signal
import sys
from pathlib import Path

import pytest

from supervisor import (
    AppDef,
    AppState,
    DuplicateAppError,
    Resource,
    Role,
    SpecError,
    Supervisor,
    UnknownAppError,
    WaitTimeout,
    parse_handle,
)
from supervisor.backends.base import DryrunContext
from supervisor.backends.docker.options import docker_run_opts
from supervisor.backends.docker.request import LABEL
from supervisor.backends.docker.request import render as docker_render
from supervisor.backends.local.backend import LOCAL_CAPABILITIES
from supervisor.backends.local.request import local_run_opts
from supervisor.backends.local.request import render as local_render
from supervisor.backends.slurm.options import slurm_run_opts
from supervisor.backends.slurm.script import ClusterFacts
from supervisor.backends.slurm.script import render as slurm_render
from supervisor.backends.slurm.states import Meaning, meaning_of
from supervisor.runopts import parse_cfg_string
from supervisor.status import ReplicaStatus
from supervisor.validate import validate

CTX = DryrunContext(session="svc", app_id="train-0001", cwd="/work")
FACTS = ClusterFacts(version=(22, 5), default_partition="debug", real_memory_mb={"debug": 4000})
ROLE = Role(name="r", image="img:1", entrypoint="echo", args=["${app_id}"], num_replicas=2)
APP = AppDef(name="train", roles=[ROLE])


def py_role(name: str, code: str) -> Role:
    """A role whose replica runs a snippet of Python (tests marked integration spawn it)."""
    return Role(name=name, entrypoint=sys.executable, args=["-c", code])


def app(*roles: Role) -> AppDef:
    return AppDef(name="diff", roles=list(roles))


def _local(app: AppDef = APP, **cfg: object) -> str:
    return str(local_render(app, local_run_opts().resolve(cfg), CTX, Path("/state/logs")))


def _slurm(app: AppDef = APP, **cfg: object) -> str:
    request = slurm_render(
        app,
        slurm_run_opts().resolve(cfg),
        CTX,
        facts=FACTS,
        default_log_dir=Path("/state/logs"),
        job_dir=None,
    )
    return request.script


def _docker_envs(app: AppDef = APP) -> list[dict[str, str]]:
    request = docker_render(
        app,
        docker_run_opts().resolve({}),
        CTX,
        host="unix:///x.sock",
        default_log_dir=Path("/state/logs"),
    )
    return [dict(e.partition("=")[::2] for e in c.body["Env"]) for c in request.containers]


# -- API -----------------------------------------------------------------------------


def test_the_object_you_use_is_async() -> None:
    """Row "The object you use": an async context manager whose verbs are coroutines."""
    assert hasattr(Supervisor, "__aenter__") and hasattr(Supervisor, "__aexit__")
    for verb in ("submit", "wait", "describe", "cancel", "list"):
        assert inspect.iscoroutinefunction(getattr(Supervisor, verb)), verb
    assert inspect.isasyncgenfunction(Supervisor.log_iter)
    assert inspect.isasyncgenfunction(Supervisor.watch)  # row "watch(handle)"


@pytest.mark.anyio
@pytest.mark.integration
async def test_wait_has_a_timeout(state_dir: Path) -> None:
    """Row "wait(handle)": ``timeout=`` raises WaitTimeout (TorchX's wait has none)."""
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(app(py_role("r", "import time; time.sleep(60)")), "local")
        with pytest.raises(WaitTimeout):
            await sv.wait(handle, timeout=0.2)
        await sv.cancel(handle)


@pytest.mark.anyio
@pytest.mark.integration
async def test_wait_and_cancel_of_an_unknown_handle_raise(state_dir: Path) -> None:
    """Row "wait/cancel of a handle whose app does not exist": UnknownAppError, not a hang."""
    async with Supervisor(session="diff") as sv:
        missing = "local://diff/never-submitted-0000"
        assert await sv.describe(missing) is None
        with pytest.raises(UnknownAppError):
            await sv.wait(missing, timeout=30)
        with pytest.raises(UnknownAppError):
            await sv.cancel(missing)


def test_appdef_and_role_are_frozen() -> None:
    """Row "AppDef/Role": frozen; changed copies come from replace_role and with_env."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        ROLE.num_replicas = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        ROLE.env["A"] = "1"  # type: ignore[index]
    assert APP.replace_role("r", num_replicas=4).roles[0].num_replicas == 4
    assert ROLE.num_replicas == 2


def test_invalid_input_is_reported_all_at_once() -> None:
    """Row "Invalid input": one SpecError listing every problem with its field path."""
    bad = AppDef(name="x", roles=[Role(name="r", entrypoint="", num_replicas=0)])
    with pytest.raises(SpecError) as caught:
        validate(bad, LOCAL_CAPABILITIES)
    fields = {p.field for p in caught.value.problems}
    assert {"roles[0].entrypoint", "roles[0].num_replicas"} <= fields


def test_an_unknown_run_option_is_an_error_with_a_did_you_mean() -> None:
    """Row "Unknown run option": TorchX drops it silently."""
    with pytest.raises(SpecError, match="did you mean 'log_dir'"):
        local_run_opts().resolve({"log_dri": "/tmp/x"})


def test_list_items_are_separated_by_semicolons() -> None:
    """Row "Run option string form": ``,`` between options, ``;`` between list items."""
    parsed = parse_cfg_string("env_policy=allow,env_allow=HOME;LC_*", local_run_opts())
    assert local_run_opts().resolve(parsed).get_list("env_allow") == ("HOME", "LC_*")


def test_app_id_macro_is_the_handles_app_id_on_every_backend() -> None:
    """Row "${app_id} macro": the handle's app id, known at dryrun (TorchX's Slurm: the job id)."""
    assert "echo train-0001" in _local()
    assert "train-0001" in _slurm().split("echo", 1)[1]
    request = docker_render(
        APP, docker_run_opts().resolve({}), CTX, host="unix:///x", default_log_dir=Path("/l")
    )
    assert all(c.body["Cmd"] == ["train-0001"] for c in request.containers)


@pytest.mark.anyio
@pytest.mark.integration
async def test_submitting_twice_does_not_run_twice(state_dir: Path) -> None:
    """Row "Submitting twice": an idempotency key returns the first handle; a same-id
    schedule raises DuplicateAppError."""
    quick = app(Role(name="r", entrypoint=sys.executable, args=["-c", "pass"]))
    async with Supervisor(session="diff") as sv:
        first = await sv.submit(quick, "local", idempotency_key="k1")
        assert await sv.submit(quick, "local", idempotency_key="k1") == first
        info = sv.dryrun(quick, "local", app_id="fixed-id")
        await sv.schedule(info)
        with pytest.raises(DuplicateAppError):
            await sv.schedule(sv.dryrun(quick, "local", app_id="fixed-id"))
        await sv.wait(first, timeout=60)


def test_handles_round_trip_even_with_a_slash_in_the_app_id() -> None:
    """Row "Handles": strict parsing; ``parse_handle(str(h)) == h``."""
    parsed = parse_handle("slurm://svc/a/b")
    assert (parsed.session, parsed.app_id) == ("svc", "a/b")
    assert parse_handle(str(parsed)) == parsed


def test_replica_status_says_how_it_ended() -> None:
    """Row "Per-replica status": exit code, signal and restart count beside TorchX's fields."""
    fields = {f.name for f in dataclasses.fields(ReplicaStatus)}
    assert {"exit_code", "signal", "restarts", "hostname", "structured_error_msg"} <= fields


# -- Behaviour -------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.integration
async def test_local_state_and_fail_fast(state_dir: Path) -> None:
    """Rows "Local state" and "A failed replica": the app ends FAILED without anyone calling
    describe, and the sibling that would have run a minute is stopped."""
    roles = [
        py_role("bad", "raise SystemExit(3)"),
        py_role("sleeper", "import time; time.sleep(60)"),
    ]
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(app(*roles), "local")
        status = await sv.wait(handle, timeout=50)
    assert status.state is AppState.FAILED
    sleeper = status.replica("sleeper", 0)
    assert sleeper is not None and sleeper.state.name in ("CANCELLED", "FAILED")


def test_preemption_is_a_requeue_not_a_failure() -> None:
    """Row "Preemption, requeue": Slurm's PREEMPTED means back in the queue
    (for real: tests/integration/test_slurm_more.py)."""
    assert meaning_of("PREEMPTED") is Meaning.REQUEUED


@pytest.mark.anyio
@pytest.mark.integration
async def test_no_signal_handlers_and_logs_kept_after_close(
    state_dir: Path, tmp_path: Path
) -> None:
    """Rows "Signal handling" (none installed) and "close()" (logs never deleted); the
    SIGKILL row: test_local_orphans.py::test_no_replica_survives_the_supervisor."""
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    logs = tmp_path / "logs"
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(
            app(py_role("r", "print('kept')")), "local", {"log_dir": str(logs)}
        )
        await sv.wait(handle, timeout=60)
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    app_id = parse_handle(handle).app_id
    assert (logs / "diff" / app_id / "r" / "0" / "stdout.log").read_text() == "kept\n"


@pytest.mark.anyio
@pytest.mark.integration
async def test_list_logs_since_and_long_lines(state_dir: Path) -> None:
    """Rows "list() locally", "log_iter(should_tail=False)" (stops at the current end),
    "Long lines" (whole) and "since/until" (honoured)."""
    code = "import sys, time; print('x' * 200000); print('ready', flush=True); time.sleep(60)"
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(app(py_role("r", code)), "local")
        async for line in sv.log_iter(handle, "r", 0, should_tail=True):
            if line == "ready\n":
                break
        now = [line async for line in sv.log_iter(handle, "r", 0)]  # returns: app still runs
        assert now == ["x" * 200000 + "\n", "ready\n"]
        assert [line async for line in sv.log_iter(handle, "r", 0, since=2**40)] == []
        assert handle in {entry.app_handle for entry in await sv.list("local")}
        await sv.cancel(handle)


@pytest.mark.anyio
@pytest.mark.integration
async def test_regex_searches_and_lines_keep_their_endings(state_dir: Path) -> None:
    """Rows "log_iter(regex=...)" (re.search, not re.match) and "Line endings" (kept)."""
    code = "import sys; sys.stdout.write('step 1 loss=3\\r\\n10%\\r100%\\nloss=2\\n')"
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(app(py_role("r", code)), "local")
        await sv.wait(handle, timeout=30)
        lines = [line async for line in sv.log_iter(handle, "r", 0)]
        found = [line async for line in sv.log_iter(handle, "r", 0, regex="loss")]
        anchored = [line async for line in sv.log_iter(handle, "r", 0, regex="^loss")]
    assert lines == ["step 1 loss=3\r\n", "10%\r100%\n", "loss=2\n"]
    assert found == ["step 1 loss=3\r\n", "loss=2\n"]
    assert anchored == ["loss=2\n"]


# -- Backends -------------------------------------------------------------------------


def test_slurm_job_comment_starts_with_our_tag() -> None:
    """Row "Slurm job comment": ``asupervisor:{session}/{app_id}``, then the option."""
    assert "#SBATCH '--comment=asupervisor:svc/train-0001 nightly'\n" in _slurm(comment="nightly")
    assert "#SBATCH --comment=asupervisor:svc/train-0001\n" in _slurm()


def test_slurm_requests_are_frozen_and_logs_under_log_dir() -> None:
    """Rows "Slurm schedule" (frozen requests) and "Slurm log files" (under log_dir)."""
    request = slurm_render(
        APP,
        slurm_run_opts().resolve({}),
        CTX,
        facts=FACTS,
        default_log_dir=Path("/state/logs"),
        job_dir=None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.script = ""  # type: ignore[misc]
    assert request.app_dir == "/state/logs/svc/train-0001"


def test_docker_containers_are_found_by_labels() -> None:
    """Row "Docker containers": labelled with the session and app id (the removal and the
    CANCELLED end are tests/integration/test_docker_lifecycle.py, on both engines; the
    removal by the next reader, test_docker_attach.py)."""
    request = docker_render(
        APP, docker_run_opts().resolve({}), CTX, host="unix:///x", default_log_dir=Path("/l")
    )
    for c in request.containers:
        assert c.body["Labels"][LABEL.SESSION] == "svc"
        assert c.body["Labels"][LABEL.APP_ID] == "train-0001"


# -- Local ------------------------------------------------------------------------------


def test_one_local_backend_for_local_cwd_and_local_dir() -> None:
    """Row "Local schedulers": a path-like image that is not a directory is not an error
    (TorchX's local_dir raises); the replica runs in the working directory."""
    role = Role(name="r", image="./missing-dir", entrypoint="p", args=["${img_root}"])
    request = local_render(
        AppDef(name="x", roles=[role]), local_run_opts().resolve({}), CTX, Path("/s")
    )
    (replica,) = request.replicas
    assert (replica.cwd, replica.argv) == ("/work", ("p", "/work"))
    assert replica.env["TORCHX_JOB_ID"] == "local://svc/train-0001"


def test_torchx_job_id_is_set_by_the_local_backend_only() -> None:
    """Row "TORCHX_JOB_ID": Docker and Slurm replicas get ASUPERVISOR_SESSION/APP_ID."""
    assert all("TORCHX_JOB_ID" not in env for env in _docker_envs())
    assert all(env["ASUPERVISOR_APP_ID"] == "train-0001" for env in _docker_envs())
    assert "TORCHX_JOB_ID" not in _slurm()


def test_a_roles_path_is_joined_not_replaced() -> None:
    """Row "A role's PATH": put in front of the inherited one (TorchX replaces it)."""
    role = Role(name="r", entrypoint="p", env={"PATH": "/opt/tool/bin"})
    request = local_render(
        AppDef(name="x", roles=[role]), local_run_opts().resolve({}), CTX, Path("/s")
    )
    (replica,) = request.replicas
    assert "PATH" not in replica.env
    assert replica.spawn_path("/usr/bin") == "/opt/tool/bin:/usr/bin:/work"
    on_slurm = AppDef(name="x", roles=[role])
    assert ' PATH=/opt/tool/bin:"$PATH" ' in _slurm(on_slurm)


def test_default_local_log_dir_is_under_the_state_directory() -> None:
    """Row "Local log_dir": ``<state dir>/logs`` (TorchX: a new /tmp/torchx_* per scheduler)."""
    request = local_render(APP, local_run_opts().resolve({}), CTX, Path("/state/logs"))
    assert request.app_dir == "/state/logs/svc/train-0001"


@pytest.mark.anyio
@pytest.mark.integration
async def test_a_replicas_stdin_is_dev_null(state_dir: Path) -> None:
    """Row "stdin of a local replica": /dev/null (TorchX's replicas share the caller's)."""
    code = (
        "import json, os, sys; "
        "print(json.dumps([sys.stdin.read(), os.path.realpath('/proc/self/fd/0')]))"
    )
    async with Supervisor(session="diff") as sv:
        handle = await sv.submit(app(py_role("r", code)), "local")
        await sv.wait(handle, timeout=60)
        out = [line async for line in sv.log_iter(handle, "r", 0)]
    assert json.loads("".join(out)) == ["", "/dev/null"]


def test_gpus_are_left_alone_when_too_few() -> None:
    """Row "auto_set_cuda_visible_devices": with too few GPUs nothing is set (TorchX warns,
    then hands out overlapping or missing devices anyway)."""
    role = Role(name="r", entrypoint="p", num_replicas=2, resource=Resource(gpu=2))
    request = local_render(
        AppDef(name="x", roles=[role]),
        local_run_opts().resolve({"auto_set_cuda_visible_devices": True}),
        dataclasses.replace(CTX, gpu_count=3),
        Path("/s"),
    )
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in request.replicas)


def test_local_replicas_per_role_are_bounded() -> None:
    """Row "Replicas per local role": at most 1024 unless ``max_replicas_per_role`` says more."""
    many = AppDef(name="x", roles=[Role(name="r", entrypoint="p", num_replicas=1025)])
    with pytest.raises(SpecError, match="max_replicas_per_role"):
        validate(many, LOCAL_CAPABILITIES)
    raised = local_run_opts().resolve({"max_replicas_per_role": 2000})
    limit = raised.get_int("max_replicas_per_role")
    validate(many, dataclasses.replace(LOCAL_CAPABILITIES, max_replicas_per_role=limit))


def test_an_image_on_slurm_runs_with_pyxis_or_is_refused() -> None:
    """Row "`Role.image` and mounts on Slurm": rendered as pyxis options, refused at dryrun
    on a cluster without pyxis unless ``image_is_tag``; real runs in test_slurm_mpi.py."""

    def script(cfg: dict[str, object], pyxis: bool) -> str:
        facts = dataclasses.replace(FACTS, pyxis=pyxis)
        opts = slurm_run_opts().resolve(cfg)
        return slurm_render(
            APP, opts, CTX, facts=facts, default_log_dir=Path("/l"), job_dir=None
        ).script

    assert "--container-image=img:1" in script({}, pyxis=True)
    with pytest.raises(SpecError) as e:
        script({}, pyxis=False)
    assert [p.field for p in e.value.problems] == ["roles[0].image"]
    assert "--container" not in script({"image_is_tag": True}, pyxis=False)
