"""Bad values that used to be accepted are SpecErrors naming their field (issue 8, item 5),
and the local request keeps the TorchX environment contract (item 14)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from supervisor import (
    AppDef,
    InvalidHandleError,
    Role,
    RunOpt,
    RunOpts,
    SpecError,
    macros,
    parse_handle,
)
from supervisor.backends.base import DryrunContext
from supervisor.backends.local.request import join_path, local_run_opts, render
from supervisor.logs import iter_log_lines
from supervisor.runopts import OptType, parse_cfg_string
from supervisor.validate import Capabilities, check_name, validate

CTX = DryrunContext(session="svc", app_id="app-1", cwd="/work/dir")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 3600.5, 10**400])
def test_stop_grace_out_of_range_names_the_field(value: float) -> None:
    with pytest.raises(SpecError) as err:
        local_run_opts().resolve({"stop_grace": value})
    assert err.value.fields == ("cfg.stop_grace",)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-0.5"])
def test_stop_grace_from_the_command_line_form(text: str) -> None:
    opts = local_run_opts()
    with pytest.raises(SpecError) as err:
        opts.resolve(parse_cfg_string(f"stop_grace={text}", opts))
    assert err.value.fields == ("cfg.stop_grace",)


def test_stop_grace_bounds_are_inclusive_and_every_problem_is_reported() -> None:
    opts = local_run_opts()
    assert opts.resolve({"stop_grace": 0})["stop_grace"] == 0.0
    assert opts.resolve({"stop_grace": 3600})["stop_grace"] == 3600.0
    with pytest.raises(SpecError) as err:
        opts.resolve({"stop_grace": math.nan, "max_replicas_per_role": 0, "log_dri": "x"})
    assert set(err.value.fields) == {"cfg.stop_grace", "cfg.max_replicas_per_role", "cfg.log_dri"}
    assert "(0..3600)" in str(opts)  # the help table says what is accepted


def test_bounds_are_checked_when_declared() -> None:
    with pytest.raises(SpecError) as err:
        RunOpt("name", OptType.STR, minimum=1)
    assert err.value.fields == ("runopts.name.minimum",)
    with pytest.raises(SpecError) as err:
        RunOpt("grace", OptType.FLOAT, default=-1.0, minimum=0)
    assert err.value.fields == ("runopts.grace.default",)
    with pytest.raises(SpecError) as err:
        RunOpt("grace", OptType.FLOAT, maximum=math.inf)
    assert err.value.fields == ("runopts.grace.maximum",)
    bounded = RunOpts([RunOpt("n", OptType.INT, default=3, minimum=1, maximum=5)])
    assert bounded.resolve({"n": 5})["n"] == 5
    with pytest.raises(SpecError, match="must be <= 5"):
        bounded.resolve({"n": 6})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("..", "is not allowed"),
        (".", "is not allowed"),
        ("a/b", "must not contain '/'"),
        ("", "must be non-empty"),
        ("x" * 300, "at most 64 characters, got 300"),
        ("tab\there", "control characters"),
        (7, "must be a string"),
    ],
)
def test_path_component_names(value: object, message: str) -> None:
    (problem,) = check_name("session", value)
    assert problem.field == "session"
    assert message in problem.message


def test_long_role_name_is_a_spec_error() -> None:
    app = AppDef(name="a", roles=[Role(name="r" * 300, entrypoint="x")])
    with pytest.raises(SpecError) as err:
        validate(app, Capabilities(backend="local"))
    assert err.value.fields == ("roles[0].name",)
    assert "at most 64" in str(err.value)


def test_replica_limit_says_how_to_raise_it() -> None:
    caps = Capabilities(backend="local", max_replicas_per_role=1024, replicas_hint="raise it")
    app = AppDef(name="a", roles=[Role(name="r", entrypoint="x", num_replicas=10**6)])
    with pytest.raises(SpecError) as err:
        validate(app, caps)
    assert err.value.fields == ("roles[0].num_replicas",)
    assert "must be <= 1024 on backend 'local' (raise it)" in str(err.value)


@pytest.mark.parametrize(
    "handle",
    [
        "local://../x",
        "local://./x",
        "local://s/..",
        "local://s/" + "x" * 300,
        "local://" + "s" * 300 + "/x",
    ],
)
def test_handles_that_could_only_escape_or_overflow_are_invalid(handle: str) -> None:
    with pytest.raises(InvalidHandleError):
        parse_handle(handle)


def test_since_nan_and_an_empty_window_name_their_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        iter_log_lines(tmp_path, since=math.nan, until=math.nan)
    assert err.value.fields == ("since", "until")
    with pytest.raises(SpecError) as err:
        iter_log_lines(tmp_path, since=20.0, until=10.0)
    assert err.value.fields == ("since",)


def test_a_datetime_before_the_calendar_names_its_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: ``since=datetime(1, 1, 1)`` (naive: local time) raised a bare ValueError.

    In UTC (pinned here: the conversion depends on the zone) that local midnight
    is no time the platform can express; an aware one a day later is.
    """
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        with pytest.raises(SpecError) as err:
            iter_log_lines(tmp_path, since=datetime(1, 1, 1), until=datetime.max)
        assert err.value.fields == ("since",)
        assert "datetime.datetime(1, 1, 1, 0, 0) is not a time" in str(err.value)
        with pytest.raises(SpecError) as err:
            iter_log_lines(tmp_path, until=datetime.min)
        assert err.value.fields == ("until",)
        iter_log_lines(tmp_path, since=datetime(1, 1, 2, tzinfo=UTC), until=10.0)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_macros_reach_nested_metadata_without_touching_the_original() -> None:
    paths: list[object] = ["/ckpt/${app_id}/${replica_id}", 3]
    inner: dict[str, object] = {"paths": paths, "deep": {"k": ("${app_id}",)}}
    role = Role(name="r", entrypoint="x", metadata={"top": "${replica_id}", "nested": inner})
    values = macros.Values(img_root="/img", app_id="app-9", replica_id="2", rank0_env="R")
    applied = values.apply(role).metadata
    assert applied["top"] == "2"
    assert applied["nested"]["paths"] == ["/ckpt/app-9/2", 3]
    assert applied["nested"]["deep"] == {"k": ("app-9",)}
    assert paths[0] == "/ckpt/${app_id}/${replica_id}"  # the caller's object is intact


def test_a_cyclic_metadata_value_does_not_recurse_forever() -> None:
    loop: list[object] = ["${app_id}"]
    loop.append(loop)
    role = Role(name="r", entrypoint="x", metadata={"loop": loop})
    values = macros.Values(img_root="", app_id="a", replica_id="0", rank0_env="R")
    applied = values.apply(role).metadata["loop"]
    assert applied[0] == "a"


def test_relative_log_dir_is_stored_absolute() -> None:
    app = AppDef(name="a", roles=[Role(name="r", entrypoint="x")])
    cfg = local_run_opts().resolve({"log_dir": "runs/../logs"})
    request = render(app, cfg, CTX, Path("/state/logs"))
    assert request.app_dir == "/work/dir/logs/svc/app-1"
    assert request.replicas[0].log_dir == "/work/dir/logs/svc/app-1/r/0"


def test_role_error_file_and_log_dir_are_kept() -> None:
    env = {"TORCHELASTIC_ERROR_FILE": "/tmp/e-${replica_id}.json", "PET_LOG_DIR": "/tmp/pet"}
    app = AppDef(name="a", roles=[Role(name="r", entrypoint="x", env=env, num_replicas=2)])
    request = render(app, local_run_opts().resolve({}), CTX, Path("/s"))
    first, second = request.replicas
    assert first.env["TORCHELASTIC_ERROR_FILE"] == "/tmp/e-0.json"
    assert second.error_file == "/tmp/e-1.json"
    assert first.env["PET_LOG_DIR"] == "/tmp/pet"
    relative = AppDef(
        name="a", roles=[Role(name="r", entrypoint="x", env={"TORCHELASTIC_ERROR_FILE": "e.json"})]
    )
    (only,) = render(relative, local_run_opts().resolve({}), CTX, Path("/s")).replicas
    assert only.error_file == "/work/dir/e.json"  # where the replica (cwd /work/dir) writes it


def test_role_path_is_joined_in_front_of_the_inherited_one() -> None:
    app = AppDef(name="a", roles=[Role(name="r", entrypoint="x", env={"PATH": "/opt/a:/opt/b:"})])
    (plain,) = render(app, local_run_opts().resolve({}), CTX, Path("/s")).replicas
    assert "PATH" not in plain.env  # never replaces the inherited PATH
    assert plain.path_prepend == "/opt/a:/opt/b"
    assert plain.path_append == "/work/dir"  # the working directory goes last (TorchX)
    assert "PATH=/opt/a:/opt/b:$PATH:/work/dir" in plain.command_line()
    assert plain.spawn_path("/usr/bin") == "/opt/a:/opt/b:/usr/bin:/work/dir"
    cfg = local_run_opts().resolve({"prepend_cwd": True})
    (first,) = render(app, cfg, CTX, Path("/s")).replicas
    assert first.path_prepend == "/work/dir:/opt/a:/opt/b"
    assert first.path_append is None
    assert join_path(None, "", ":/x:", "/y") == "/x:/y"
