"""Frozen specs: TorchX code mutates roles in place; ours gets changed copies instead."""

from __future__ import annotations

import pytest

from supervisor import AppDef, Resource, Role


def _app() -> AppDef:
    return AppDef(
        name="job",
        roles=[
            Role(name="trainer", entrypoint="python", env={"A": "1"}, num_replicas=2),
            Role(name="ps", entrypoint="python"),
        ],
    )


def test_role_env_cannot_be_updated_in_place() -> None:
    role = _app().roles[0]
    with pytest.raises(AttributeError):
        role.env.update({"B": "2"})  # type: ignore[attr-defined]


def test_with_env_merges_into_a_copy_and_leaves_the_original() -> None:
    app = _app()
    changed = app.with_env({"A": "9", "B": "2"}, roles=["trainer"])
    assert dict(changed.roles[0].env) == {"A": "9", "B": "2"}
    assert dict(changed.roles[1].env) == {}
    assert dict(app.roles[0].env) == {"A": "1"}
    everywhere = app.with_env({"B": "2"})
    assert [dict(r.env)["B"] for r in everywhere.roles] == ["2", "2"]
    assert dict(app.roles[1].with_env({"C": "3"}).env) == {"C": "3"}
    # One name given as a string is that role, not a role per letter of it.
    assert app.with_env({"B": "2"}, roles="trainer") == app.with_env({"B": "2"}, roles=["trainer"])


def test_replace_role_changes_only_the_named_role() -> None:
    app = _app()
    changed = app.replace_role("trainer", num_replicas=4, max_retries=1)
    assert (changed.roles[0].num_replicas, changed.roles[0].max_retries) == (4, 1)
    assert changed.roles[1] == app.roles[1]
    assert app.roles[0].num_replicas == 2


def test_an_unknown_role_name_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        _app().replace_role("nope", num_replicas=1)
    with pytest.raises(ValueError, match="Role has no field 'num_replica'"):
        _app().replace_role("trainer", num_replica=4)
    with pytest.raises(ValueError, match="'nope'"):
        _app().with_env({"A": "2"}, roles=["nope"])


def test_resource_copy_merges_capabilities_as_torchx() -> None:
    """``Resource.copy(original, **capabilities)``: TorchX's static method, same call."""
    original = Resource(cpu=2, gpu=1, memMB=1024, capabilities={"a": 1, "b": 2}, devices={"efa": 1})
    copied = Resource.copy(original, b=3, c="x")
    assert (copied.cpu, copied.gpu, copied.memMB) == (2, 1, 1024)
    assert dict(copied.capabilities) == {"a": 1, "b": 3, "c": "x"}
    assert dict(copied.devices) == {"efa": 1}
    assert dict(original.capabilities) == {"a": 1, "b": 2}  # the original is not changed
    assert Resource.copy(original) == original
    with pytest.raises(TypeError):
        copied.capabilities["d"] = 1  # type: ignore[index]
