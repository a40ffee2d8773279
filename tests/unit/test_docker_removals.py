"""The end of a Docker app removes every container and its network: ``remove_each``.

A fake engine call stands in for an engine slow under load and for one that
refuses a removal: the real engines cannot be made that slow, or refuse one
removal among several, on demand. The real removals are exercised by the docker
integration tests (tests/integration/test_docker_load.py, test_docker_faults.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from supervisor.backends.docker.runtime import remove_each
from supervisor.errors import BackendError

pytestmark = pytest.mark.anyio


def _removal(
    name: str, done: list[str], seconds: float = 0.0, error: BackendError | None = None
) -> tuple[str, Callable[[], Awaitable[None]]]:
    async def remove() -> None:
        await anyio.sleep(seconds)
        if error is not None:
            raise error
        done.append(name)

    return f"cannot remove {name}", remove


async def test_slow_removals_all_happen_when_together_they_outlast_the_bound() -> None:
    """The bound is time without progress: four removals of 1.5 s each take 6 s, well over
    a bound of 2 s, and each one still happens (CI's load test left three containers
    when one bound covered them all)."""
    done: list[str] = []
    names = [f"c{i}" for i in range(4)]
    await remove_each([_removal(n, done, seconds=1.5) for n in names], bound=2.0)
    assert done == names


async def test_a_refused_removal_stops_none_of_the_others_and_is_named() -> None:
    done: list[str] = []
    # The engine's own refusal names the container (engine.remove says which).
    refused = BackendError("cannot remove container c1: conflict", transient=False)
    removals = [
        _removal("c0", done),
        _removal("c1", done, error=refused),
        _removal("c2", done),
        _removal("network", done),
    ]
    with pytest.raises(BackendError) as caught:
        await remove_each(removals, bound=1.0)
    assert done == ["c0", "c2", "network"]
    assert str(caught.value) == "cannot remove container c1: conflict"
    assert caught.value.transient is False


async def test_an_engine_away_is_retried_until_it_answers() -> None:
    """Connection refused while dockerd restarts: retried (each second) within the bound."""
    done: list[str] = []
    answers = iter([BackendError("no socket", transient=True), None])

    async def flaky() -> None:
        error = next(answers)
        if error is not None:
            raise error
        done.append("c0")

    await remove_each([("cannot remove c0", flaky)], bound=5.0)
    assert done == ["c0"]


async def test_an_engine_that_stays_away_ends_the_removals_after_the_bound() -> None:
    away = BackendError("no socket", transient=True)
    done: list[str] = []
    with anyio.fail_after(10):
        with pytest.raises(BackendError) as caught:
            await remove_each([_removal("c0", done, error=away)], bound=2.0)
    assert str(caught.value) == "cannot remove c0: no socket"
    assert caught.value.transient is True
