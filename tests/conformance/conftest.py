"""The targets (every ``targets_*`` module's ``TARGETS``) and the fixtures each case uses."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor import AppState, Supervisor

from .target import Target


def _targets() -> list[Target]:
    found: list[Target] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name.startswith("targets_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            found.extend(module.TARGETS)
    ids = [t.id for t in found]
    assert len(set(ids)) == len(ids), f"two targets share an id: {ids}"
    return found


TARGETS = _targets()


@pytest.fixture(
    scope="session",
    params=[pytest.param(t, id=t.id, marks=list(t.marks)) for t in TARGETS],
)
def target(request: pytest.FixtureRequest) -> Target:
    """Each case runs once per target; the target's component is brought up once."""
    found: Target = request.param
    found.ensure()
    return found


@pytest.fixture
def exchange(tmp_path: Path) -> Path:
    """A directory the replicas (as ``$CONF_DIR``) and the test both read and write."""
    path = tmp_path / "exchange"
    path.mkdir()
    return path


@pytest.fixture
def cfg(target: Target, tmp_path: Path) -> dict[str, object]:
    return target.cfg(tmp_path)


@pytest.fixture
async def sv(target: Target, state_dir: Path) -> AsyncIterator[Supervisor]:
    """The Supervisor that submits; closed (stopping what is not durable) after the case."""
    async with target.supervisor("conf") as found:
        try:
            yield found
        finally:
            # A durable backend keeps what a failed case left: cancel it, never leak jobs.
            for left in await found.list(target.backend):
                if left.state not in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
                    await found.cancel(left.app_handle)


# Bugs the suite found in a backend and left for its owners to fix: (case, target ids,
# parameter) -> what is wrong. Strict: the case starts failing CI once the bug is fixed,
# so the entry is removed then.
KNOWN_BUGS: dict[tuple[str, tuple[str, ...], str | None], str] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
        # This hook sees every collected item, not only this folder's.
        target = params.get("target")
        if not isinstance(target, Target):
            continue
        target_id = target.id
        policy = params.get("policy")
        for (case, targets, param), reason in KNOWN_BUGS.items():
            name = getattr(item, "originalname", item.name)
            wanted = param is None or getattr(policy, "value", None) == param
            if name == case and target_id in targets and wanted:
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
