"""``run_uncut``: the work runs to its end whatever befalls its caller, and the caller's
asyncio-native cancel comes out once it has."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from supervisor.uncut import run_uncut

pytestmark = pytest.mark.anyio


async def test_a_native_cancel_of_the_caller_waits_for_the_work_then_is_returned() -> None:
    steps: list[str] = []

    async def work() -> str:
        await anyio.sleep(0.2)
        steps.append("worked")
        return "done"

    async def caller(tg: anyio.abc.TaskGroup) -> tuple[str, BaseException | None]:
        return await run_uncut(tg, "work", work)

    async with anyio.create_task_group() as tg:
        task = asyncio.ensure_future(caller(tg))
        await asyncio.sleep(0.05)
        task.cancel()
        task.cancel()  # twice: still the work's end first
        result, cut = await task
    assert steps == ["worked"] and result == "done"
    assert isinstance(cut, asyncio.CancelledError)


async def test_the_works_failure_is_raised_and_a_cut_wins_over_it() -> None:
    async def fails() -> None:
        await anyio.sleep(0.1)
        raise ValueError("boom")

    async with anyio.create_task_group() as tg:
        with pytest.raises(ValueError, match="boom"):
            await run_uncut(tg, "fails", fails)
        task = asyncio.ensure_future(run_uncut(tg, "fails", fails))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as cut:
            await task
        assert isinstance(cut.value.__cause__, ValueError)


async def test_a_task_group_that_has_ended_runs_the_work_in_the_caller() -> None:
    async with anyio.create_task_group() as ended:
        pass

    async def work() -> int:
        await anyio.lowlevel.checkpoint()
        return 7

    assert await run_uncut(ended, "work", work) == (7, None)
