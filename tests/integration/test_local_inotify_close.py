"""Every inotify instance the library closes is closed off the event loop's thread.

Closing an instance that held watches waits in the kernel for a grace period
(13 ms measured here), so a close on the loop's thread stalls every task of a
service. The instances here are real; ``Inotify.close`` is wrapped only to note
the thread it runs in.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import asyncinotify
import pytest

from supervisor import AppState, Supervisor, WaitTimeout
from supervisor.logs import iter_log_lines
from supervisor.logs.inotify_close import close_inotify

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each close of an instance: True if it ran on the loop's thread."""
    loop_thread = threading.get_ident()
    seen: list[bool] = []
    real_close = asyncinotify.Inotify.close

    def close(self: asyncinotify.Inotify) -> None:
        seen.append(threading.get_ident() == loop_thread)
        real_close(self)

    monkeypatch.setattr(asyncinotify.Inotify, "close", close)
    return seen


async def test_sessions_foreign_waits_and_own_followers_close_off_the_loop(
    state_dir: Path, tmp_path: Path, closes: list[bool]
) -> None:
    role = py_role("sleeper", "import time; time.sleep(60)")
    async with Supervisor(session="owner") as owner, Supervisor(session="other") as other:
        handle = await owner.submit(app(role), "local")
        with pytest.raises(WaitTimeout):  # a foreign wait, cancelled by its timeout
            await other.wait(handle, timeout=0.3)
        followed = [line async for line in owner.log_iter(handle, "sleeper", 0)]
        await other.cancel(handle)
        with anyio.fail_after(20):  # a foreign wait to the end
            assert (await other.wait(handle)).state is AppState.CANCELLED
        assert followed == []
    # A follower with a watch of its own (no Supervisor, so no shared hub), to its end.
    replica = tmp_path / "replica"
    replica.mkdir()
    ended = anyio.Event()
    lines: list[str] = []

    async def follow() -> None:
        async for line in iter_log_lines(replica, should_tail=True, finished_event=ended):
            lines.append(line)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.sleep(0.2)  # its watch is on
        ended.set()
    assert lines == []
    # Two foreign waits, two sessions' shared hubs or cancel watches, one own follower.
    assert len(closes) >= 4, closes
    assert not any(closes), f"closed on the loop's thread: {closes}"


async def test_a_cancelled_caller_still_closes_the_instance(tmp_path: Path) -> None:
    inotify = asyncinotify.Inotify()
    inotify.add_watch(tmp_path, asyncinotify.Mask.CREATE)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await close_inotify(inotify)
    with pytest.raises(ValueError, match="closed inotify"):
        inotify.add_watch(tmp_path, asyncinotify.Mask.CREATE)
