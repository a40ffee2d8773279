"""Backends are found by name: built-ins, the entry-point group, or given explicitly."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import SpecError, Supervisor, UnknownBackendError
from supervisor.backends.base import BackendRegistry
from supervisor.backends.local import LocalBackend

pytestmark = pytest.mark.anyio


def test_builtin_local_is_lazy_and_resolves() -> None:
    registry = BackendRegistry()
    assert "local" in registry.names()
    assert registry.factory("local") is LocalBackend


def test_the_installed_entry_point_group_is_read() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="asupervisor.backends")}
    assert "local" in names  # declared in pyproject.toml


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(UnknownBackendError, match="local") as err:
        BackendRegistry().factory("nope")
    assert isinstance(err.value, KeyError)


def test_extra_backends_are_per_registry() -> None:
    mine = BackendRegistry({"mine": LocalBackend})
    assert mine.factory("mine") is LocalBackend
    assert "mine" not in BackendRegistry().names()


async def test_supervisor_uses_its_own_registry(state_dir: Path) -> None:
    async with Supervisor(session="s", backends={"alias": LocalBackend}) as sv:
        assert "alias" in sv.backends()
        assert "log_dir" in sv.run_opts("alias")
        with pytest.raises(UnknownBackendError):
            sv.run_opts("nope")


def test_backends_that_are_no_backend_are_refused_naming_each() -> None:
    """``backends={"x": 42}`` was taken, then failed at the first use with a bare
    "'int' object is not callable"; a module that is not there, with ModuleNotFoundError."""
    with pytest.raises(SpecError) as err:
        BackendRegistry({"x": 42, "y": "no-colon", "z": LocalBackend})  # type: ignore[dict-item]
    assert err.value.fields == ("backends['x']", "backends['y']")
    registry = BackendRegistry({"gone": "no_such_module_xyz:Backend"})
    with pytest.raises(UnknownBackendError, match=r"'gone'.*cannot be loaded"):
        registry.factory("gone")
