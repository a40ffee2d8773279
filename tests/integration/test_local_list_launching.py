"""``list`` while apps are being submitted: an app whose launch is under way is not listed.

Found probing ``Supervisor.list`` as a service would call it: with 50 local
submits in flight, each ``list`` showed some of them half made (SUBMITTED, "no
state recorded yet", no submit time). With no submit time, ``since`` dropped
the newest apps and newest-first put them last; a launch that then failed
vanished from the next ``list``. Such an app's submit has not returned yet, so
no handle reached anyone: it is listed once its first state is recorded (before
its submit returns). Real local apps, submitted concurrently with the lists.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from supervisor import AppState, Supervisor
from supervisor.status import ListAppResponse

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SUBMITS = 50


async def test_list_during_concurrent_submits_shows_only_whole_apps(state_dir: Path) -> None:
    started = time.time()
    half_made: list[ListAppResponse] = []
    lists = 0
    async with Supervisor(session="svc") as sv:
        handles: list[str] = []
        done = anyio.Event()

        async def lister() -> None:
            nonlocal lists
            while not done.is_set():
                for listed in await sv.list("local"):
                    if listed.times.submitted is None or listed.state is AppState.UNKNOWN:
                        half_made.append(listed)
                lists += 1
                await anyio.lowlevel.checkpoint()

        async def submit(i: int) -> None:
            handles.append(await sv.submit(app(py_role("a", "pass"), name=f"c{i}"), "local"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(lister)
            async with anyio.create_task_group() as submits:
                for i in range(SUBMITS):
                    submits.start_soon(submit, i)
            done.set()
        assert lists > 1
        assert half_made == []
        # Every submit returned: each app is listed, with its submit time, newest first.
        recent = await sv.list("local", since=started)
        assert sorted(a.app_handle for a in recent) == sorted(handles)
        times = [a.times.submitted for a in recent]
        assert all(t is not None for t in times)
        assert times == sorted(times, reverse=True)  # type: ignore[type-var]
        for handle in handles:
            await sv.wait(handle, timeout=60)
