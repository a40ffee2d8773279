"""Fixtures the docker test modules share: the engines, brought up once, and one engine per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .docker_engines import ENGINES, EngineUnderTest, engine_under_test, ensure_engines


@pytest.fixture(scope="session")
def docker_facts() -> dict[str, Any]:
    return ensure_engines()


@pytest.fixture(params=ENGINES)
def engine(
    request: pytest.FixtureRequest, docker_facts: dict[str, Any], state_dir: Path
) -> Iterator[EngineUnderTest]:
    """Each test on dockerd and on Podman, in a session of its own; leftovers fail it."""
    yield from engine_under_test(request, docker_facts)
