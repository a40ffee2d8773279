"""What of the service's environment reaches a local replica, under each ``env_policy``.

Real replicas print their own environment; the test reads it back from their
logs. A secret of the supervising process (``MY_DB_PASSWORD``) must reach a
replica only under ``inherit`` (the default, as TorchX).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from supervisor import AppState, SpecError, Supervisor

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


async def _replica_env(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path, cfg: Mapping[str, object]
) -> dict[str, str]:
    monkeypatch.setenv("MY_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("ALLOWED_VAR", "yes")
    monkeypatch.setenv("ALLOWED_OTHER", "also")
    monkeypatch.setenv("LANG_TEST_X", "fr")
    role = py_role("r", PRINT_ENV, env={"ROLE_VAR": "from-role"})
    async with Supervisor(session="env") as sv:
        handle = await sv.submit(app(role), "local", cfg)
        status = await sv.wait(handle)
        assert status.state is AppState.SUCCEEDED, status
        lines = [line async for line in sv.log_iter(handle, "r", 0)]
    return dict(json.loads("".join(lines)))


async def test_inherit_is_the_default_and_passes_everything(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    env = await _replica_env(monkeypatch, state_dir, {})
    assert env["MY_DB_PASSWORD"] == "hunter2"
    assert env["ALLOWED_VAR"] == "yes"
    assert env["ROLE_VAR"] == "from-role"
    explicit = await _replica_env(monkeypatch, state_dir, {"env_policy": "inherit"})
    assert explicit["MY_DB_PASSWORD"] == "hunter2"


async def test_clean_passes_nothing_of_the_service(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    env = await _replica_env(monkeypatch, state_dir, {"env_policy": "clean"})
    assert "MY_DB_PASSWORD" not in env
    assert "ALLOWED_VAR" not in env
    assert "HOME" not in env
    assert env["PATH"] == f"/bin:/usr/bin:{os.getcwd()}"  # the cwd last, as TorchX
    # What the library sets and what the role asks for still arrive.
    assert env["ROLE_VAR"] == "from-role"
    assert env["ASUPERVISOR_ROLE"] == "r"
    assert env["ASUPERVISOR_ATTEMPT"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    library = {k for k in env if k.startswith(("ASUPERVISOR_", "TORCH", "PET_"))}
    python_own = {"LC_CTYPE"}  # set by the interpreter itself at start (PEP 538)
    assert set(env) - library - python_own == {"PATH", "PYTHONUNBUFFERED", "ROLE_VAR"}


async def test_allow_passes_only_the_named_variables(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    cfg = {"env_policy": "allow", "env_allow": ["ALLOWED_*", "LANG_TEST_X"]}
    env = await _replica_env(monkeypatch, state_dir, cfg)
    assert "MY_DB_PASSWORD" not in env
    assert env["ALLOWED_VAR"] == "yes"
    assert env["ALLOWED_OTHER"] == "also"
    assert env["LANG_TEST_X"] == "fr"
    assert env["PATH"] == f"/bin:/usr/bin:{os.getcwd()}"  # PATH was not allowed
    assert env["ROLE_VAR"] == "from-role"


async def test_allow_of_path_keeps_the_inherited_one(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv("PATH", "/opt/made-up/bin:/usr/bin:/bin")
    env = await _replica_env(monkeypatch, state_dir, {"env_policy": "allow", "env_allow": ["PATH"]})
    assert env["PATH"] == f"/opt/made-up/bin:/usr/bin:/bin:{os.getcwd()}"
    assert "MY_DB_PASSWORD" not in env


async def test_a_bad_policy_is_refused_naming_the_field(state_dir: Path) -> None:
    role = py_role("r", "pass")
    async with Supervisor(session="env") as sv:
        with pytest.raises(SpecError) as bad:
            await sv.submit(app(role), "local", {"env_policy": "none"})
        assert [p.field for p in bad.value.problems] == ["cfg.env_policy"]
        assert "inherit, clean, allow" in str(bad.value)
        with pytest.raises(SpecError) as bad:
            await sv.submit(app(role), "local", {"env_policy": "allow"})
        assert [p.field for p in bad.value.problems] == ["cfg.env_allow"]
