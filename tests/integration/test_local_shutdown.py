"""Prompt shutdown: ``begin_shutdown`` and ``close`` end every open follow, watch, events and wait.

A service's server waits for its open responses before it runs its shutdown code,
so a stream that only ends with its app would hold the server up. These use real
processes that run for a minute: whatever ends the streams, it is not the app.
The bounds are ``fail_after`` limits far below the app's minute and the readers'
30 s re-check, not timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from supervisor import (
    AppEvent,
    AppState,
    NotEnteredError,
    ShuttingDown,
    Supervisor,
    Transition,
    WaitTimeout,
)
from supervisor.backends.local.backend import LocalRuntime
from supervisor.errors import BackendError

from .helpers import app, pid_alive, py_role, running_with

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SLEEPER = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
# Far below the app's 60 s and the followers' 30 s re-check; the path itself is event-driven.
BOUND_S = 10


class Streams:
    """One follow, one watch and one wait of an app, each recording how it ended."""

    def __init__(self, sv: Supervisor, handle: str) -> None:
        self.sv, self.handle = sv, handle
        self.lines: list[str] = []
        self.transitions: list[Transition] = []
        self.wait_error: BaseException | None = None
        self.first_line = anyio.Event()
        self.running = anyio.Event()  # the watch gave the app's RUNNING
        self.ended = {"log": False, "watch": False, "wait": False, "events": False}
        self.all_ended = anyio.Event()

    def _end(self, what: str) -> None:
        self.ended[what] = True
        if all(self.ended.values()):
            self.all_ended.set()

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        tg.start_soon(self._follow)
        tg.start_soon(self._watch)
        tg.start_soon(self._wait)
        tg.start_soon(self._events, self.sv.events())

    async def _events(self, stream: AsyncIterator[AppEvent]) -> None:
        async for _ in stream:
            pass
        self._end("events")

    async def _follow(self) -> None:
        async for line in self.sv.log_iter(self.handle, "s", 0, should_tail=True):
            self.lines.append(line)
            self.first_line.set()
        self._end("log")

    async def _watch(self) -> None:
        async for t in self.sv.watch(self.handle):
            self.transitions.append(t)
            if t.role is None and t.dest == "RUNNING":
                self.running.set()
        self._end("watch")

    async def _wait(self) -> None:
        try:
            await self.sv.wait(self.handle)
        except ShuttingDown as e:
            self.wait_error = e
        self._end("wait")


async def test_begin_shutdown_ends_follows_watches_and_waits_and_leaves_the_app(
    state_dir: Path,
) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("s", SLEEPER)), "local")
        streams = Streams(sv, handle)
        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                streams.start(tg)
                await streams.first_line.wait()
                assert not sv.shutting_down
                sv.begin_shutdown()
                sv.begin_shutdown()  # idempotent
                assert sv.shutting_down
        assert streams.ended == {"log": True, "watch": True, "wait": True, "events": True}
        assert isinstance(streams.wait_error, ShuttingDown)
        pid = int(streams.lines[0])
        assert [t.dest for t in streams.transitions if t.role is None][-1] == "RUNNING"
        # The app is not touched by it: still running, and cancel still works.
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        assert pid_alive(pid)
        with pytest.raises(ShuttingDown):
            await sv.submit(app(py_role("s", "pass")), "local")
        with pytest.raises(ShuttingDown):
            await sv.wait(handle, timeout=5)
        # Streams opened now give what is there and end.
        with anyio.fail_after(BOUND_S):
            assert [x async for x in sv.log_iter(handle, "s", 0, should_tail=True)] == [f"{pid}\n"]
            assert [t async for t in sv.watch(handle)] == list(streams.transitions)
        await sv.cancel(handle)
    assert not pid_alive(pid)
    async with Supervisor(session="other") as other:
        described = await other.describe(handle)
    assert described is not None and described.state is AppState.CANCELLED


async def test_leaving_async_with_ends_streams_still_open(state_dir: Path) -> None:
    async with anyio.create_task_group() as tg:
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(app(py_role("s", SLEEPER)), "local")
            streams = Streams(sv, handle)
            streams.start(tg)
            await streams.first_line.wait()
        # Left: close() began the shutdown, then stopped the local app.
        with anyio.fail_after(BOUND_S):
            await streams.all_ended.wait()
    assert isinstance(streams.wait_error, ShuttingDown)
    assert not pid_alive(int(streams.lines[0]))
    assert sv.shutting_down


async def test_close_ends_open_streams_and_a_wait_of_an_ended_app_still_answers(
    state_dir: Path,
) -> None:
    async with Supervisor(session="svc") as sv:
        done = await sv.submit(app(py_role("s", "print('x')")), "local")
        assert (await sv.wait(done, timeout=30)).state is AppState.SUCCEEDED
        handle = await sv.submit(app(py_role("s", SLEEPER)), "local")
        streams = Streams(sv, handle)
        with anyio.fail_after(BOUND_S + 30):  # close also stops the app (its stop grace)
            async with anyio.create_task_group() as tg:
                streams.start(tg)
                await streams.first_line.wait()
                await sv.close()
        assert streams.ended == {"log": True, "watch": True, "wait": True, "events": True}
        assert isinstance(streams.wait_error, ShuttingDown)
        # An app that had ended answers as before.
        assert (await sv.wait(done)).state is AppState.SUCCEEDED
        final = sv.status(handle)
        assert final is not None and final.state is AppState.CANCELLED


async def test_begin_shutdown_ends_streams_of_an_app_another_supervisor_follows(
    state_dir: Path,
) -> None:
    """The watch, follow and wait of an app the shutting-down Supervisor does not follow
    (it reads that app's records) end at once too; the app and its owner go on."""
    async with Supervisor(session="svc") as owner, Supervisor(session="observer") as sv:
        handle = await owner.submit(app(py_role("s", SLEEPER)), "local")
        streams = Streams(sv, handle)
        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                streams.start(tg)
                await streams.first_line.wait()
                await streams.running.wait()  # the watch got the recorded RUNNING
                sv.begin_shutdown()
        assert streams.ended == {"log": True, "watch": True, "wait": True, "events": True}
        assert isinstance(streams.wait_error, ShuttingDown)
        status = owner.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        await owner.cancel(handle)
        assert (await owner.wait(handle, timeout=BOUND_S)).state is AppState.CANCELLED


def _children() -> set[int]:
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/self/task/{task}/children").read_text()
            found.update(int(pid) for pid in text.split())
    return found


async def test_a_close_that_fails_still_closes_the_rest_then_says_so(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app's close that raises (a log failure no exit told) is raised by the
    Supervisor's close, once everything else is closed: the reaper process too, which
    was left running (and its socket open) when the first failure cut the close short.
    The failure is injected: no real fault makes it on demand."""
    real = LocalRuntime.aclose

    async def failing(runtime: LocalRuntime) -> None:
        await real(runtime)
        raise BackendError("injected close failure", transient=False)

    before = _children()
    monkeypatch.setattr(LocalRuntime, "aclose", failing)
    sv = Supervisor(session="svc")
    await sv.__aenter__()
    handle = await sv.submit(app(py_role("a", "pass")), "local")
    assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    reapers = _children() - before
    assert reapers, "no reaper process was started"
    with pytest.raises(BackendError, match="injected close failure"):
        await sv.close()
    assert not any(pid_alive(pid) for pid in reapers), reapers


async def test_every_close_raises_the_failure_of_the_one_close_work(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two closes at once (a signal's and the lifespan's) when a backend's close fails:
    the first raised the failure and the second returned as if all was well, so the
    failure was lost to whichever caller came second. Each close, at once or later,
    now raises it. The failure is injected: no real fault makes it on demand."""
    real = LocalRuntime.aclose

    async def failing(runtime: LocalRuntime) -> None:
        await real(runtime)
        raise BackendError("injected close failure", transient=False)

    monkeypatch.setattr(LocalRuntime, "aclose", failing)
    sv = Supervisor(session="svc")
    await sv.__aenter__()
    handle = await sv.submit(app(py_role("a", "pass")), "local")
    assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    raised: dict[int, BaseException | None] = {}

    async def close(k: int) -> None:
        try:
            await sv.close()
            raised[k] = None
        except BackendError as e:
            raised[k] = e

    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(close, 1)
            await anyio.lowlevel.checkpoint()  # the first's work is under way
            tg.start_soon(close, 2)
    assert raised[1] is not None and raised[1] is raised[2]
    with pytest.raises(BackendError, match="injected close failure"):
        await sv.close()  # later still: the same
    with pytest.raises(BackendError, match="injected close failure"):
        await sv.__aexit__(None, None, None)


async def test_begin_shutdown_from_another_thread_is_refused(state_dir: Path) -> None:
    """``begin_shutdown`` from a thread other than the loop's cancelled the loop's scopes
    and set its events from there (not thread-safe) and was let through. It is refused,
    ending nothing; through ``call_soon_threadsafe``, as the docs say, it works."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("s", SLEEPER)), "local")
        with pytest.raises(NotEnteredError, match="call_soon_threadsafe"):
            await anyio.to_thread.run_sync(sv.begin_shutdown)
        assert not sv.shutting_down
        with pytest.raises(WaitTimeout):  # open waits were not ended
            await sv.wait(handle, timeout=0.1)

        loop = asyncio.get_running_loop()
        await anyio.to_thread.run_sync(loop.call_soon_threadsafe, sv.begin_shutdown)
        with anyio.fail_after(BOUND_S):
            while not sv.shutting_down:  # the loop runs it at one of its next turns
                await anyio.lowlevel.checkpoint()
        with pytest.raises(ShuttingDown):
            await sv.wait(handle)


async def test_the_block_goes_on_after_close(state_dir: Path) -> None:
    """``await sv.close()`` inside the block ends the Supervisor, not the block: the
    verbs that read (describe, logs) answer after it, and the code after the block runs.
    Before, close cancelled a scope that held the block too: its next checkpoint raised
    a CancelledError that escaped ``anyio.run``."""
    reached = []
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("s", "print('hi')")), "local")
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        await sv.close()
        await anyio.lowlevel.checkpoint()  # the block is not cancelled
        described = await sv.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED
        assert [line async for line in sv.log_iter(handle, "s", 0)] == ["hi\n"]
        reached.append("block")
    reached.append("after")
    assert reached == ["block", "after"]


# Says when it got SIGTERM, so the log shows whether the stop was the graceful one.
TERMED = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


class SiblingFailed(Exception):
    pass


@pytest.mark.parametrize("how", ["scope cancelled", "sibling task failed"])
async def test_a_block_ended_from_outside_stops_its_apps_as_close_does(
    state_dir: Path, how: str
) -> None:
    """A scope cancelled around the block (``move_on_after``) or a sibling task that
    fails in the caller's task group ends the block; the apps then stop as at any exit:
    SIGTERM, then their stop grace, and a final record of CANCELLED that any Supervisor
    reads. Before, the cancellation reached the apps' own tasks: their replicas were
    SIGKILLed and their record stayed RUNNING, so a ``wait`` of them never returned."""
    handle = ""

    async def supervise(ready: anyio.Event) -> None:
        nonlocal handle
        async with Supervisor(session="svc") as sv:
            handle = await sv.submit(app(py_role("s", TERMED)), "local", {"stop_grace": 20})
            async for line in sv.log_iter(handle, "s", 0, should_tail=True):
                assert line == "ready\n"
                break
            ready.set()
            await anyio.sleep(60)

    async def fail_when(ready: anyio.Event) -> None:
        await ready.wait()
        raise SiblingFailed()

    async def beside_a_failing_sibling() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervise, ready)
            tg.start_soon(fail_when, ready)

    ready = anyio.Event()
    with anyio.fail_after(BOUND_S + 20):
        if how == "scope cancelled":
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(supervise, ready)
                    await ready.wait()
                    scope.cancel()
            assert scope.cancelled_caught
        else:
            with pytest.raises(ExceptionGroup) as raised:
                await beside_a_failing_sibling()
            assert raised.group_contains(SiblingFailed)
    async with Supervisor(session="other") as other:
        assert (await other.wait(handle, timeout=BOUND_S)).state is AppState.CANCELLED
        lines = [line async for line in other.log_iter(handle, "s", 0)]
    assert lines == ["ready\n", "got SIGTERM\n"]


async def test_a_submit_under_way_when_the_block_ends_is_stopped_with_the_rest(
    state_dir: Path,
) -> None:
    """A task still launching when ``close`` ran: its app was registered after ``close``
    had gathered the apps to stop, so the backend's close SIGKILLed it (recorded FAILED)
    while the submit returned a handle as if all were well."""
    outcomes: list[str | BaseException] = []

    async def submit(sv: Supervisor, n: int) -> None:
        role = py_role("w", "import time; time.sleep(77)", num_replicas=100)
        try:
            outcomes.append(await sv.submit(app(role, name=f"late-{n}"), "local"))
        except ShuttingDown as e:
            outcomes.append(e)

    async with anyio.create_task_group() as background, Supervisor(session="svc") as sv:
        for n in range(3):
            background.start_soon(submit, sv, n)
        await anyio.sleep(0.1)  # launches under way
    assert len(outcomes) == 3
    async with Supervisor(session="reader") as reader:
        listed = await reader.list("local")
        described = [await reader.describe(entry.app_handle) for entry in listed]
    assert described, outcomes  # at least one app was launched
    for d in described:
        assert d is not None and d.state is AppState.CANCELLED, d
        replicas = [r for role in d.roles_statuses for r in role.replicas]
        assert not [r for r in replicas if r.signal == "SIGKILL"], d
    returned = {o for o in outcomes if isinstance(o, str)}
    assert returned <= {entry.app_handle for entry in listed}


async def test_a_submit_under_way_at_begin_shutdown_raises_and_its_app_is_stopped_at_once(
    state_dir: Path,
) -> None:
    """No handle of it reached anyone, so nobody could stop it: stopped once launched,
    before ``close``, saying why; an app submitted before is untouched."""
    outcome: list[str | BaseException] = []

    async def submit(sv: Supervisor) -> None:
        role = py_role("w", "import time; time.sleep(77)", num_replicas=100)
        try:
            outcome.append(await sv.submit(app(role, name="late"), "local"))
        except ShuttingDown as e:
            outcome.append(e)

    async with Supervisor(session="svc") as sv:
        before = await sv.submit(app(py_role("s", SLEEPER)), "local")
        async with anyio.create_task_group() as tg:
            tg.start_soon(submit, sv)
            await anyio.sleep(0.03)  # its launch under way
            sv.begin_shutdown()
        [late] = await sv.list("local", name="late")
        with anyio.fail_after(BOUND_S):
            while True:  # the stop runs in a task of its own: its record says when it ended
                described = await sv.describe(late.app_handle)
                if described is not None and described.to_status().is_terminal:
                    break
                if isinstance(outcome[0], str):
                    break  # launched before the shutdown began: its handle was returned
                await anyio.sleep(0.05)
        if isinstance(outcome[0], ShuttingDown):
            assert described is not None and described.state is AppState.CANCELLED, described
            assert described.msg == "the supervisor began shutting down before the submit returned"
        else:
            assert outcome[0] == late.app_handle
            assert sv.status(late.app_handle) is not None
        status = sv.status(before)
        assert status is not None and status.state is AppState.RUNNING


async def test_a_second_close_returns_only_once_the_apps_are_stopped(state_dir: Path) -> None:
    """Two closes at once (a signal's and the lifespan's): the second returned at once,
    while the first still waited for a replica that takes a second to stop."""
    slow_stop = (
        "import os, signal, sys, time;"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)));"
        "print(os.getpid(), flush=True); time.sleep(60)"
    )
    returned: list[tuple[int, bool]] = []
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("s", slow_stop)), "local")
        async for line in sv.log_iter(handle, "s", 0, should_tail=True):
            pid = int(line)
            break

        async def close(k: int) -> None:
            await sv.close()
            returned.append((k, pid_alive(pid)))

        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(close, 1)
                await anyio.sleep(0.01)
                tg.start_soon(close, 2)
    assert sorted(returned) == [(1, False), (2, False)]


async def test_a_wait_on_records_ends_at_a_shutdown_begun_while_it_first_read_them(
    state_dir: Path,
) -> None:
    """``begin_shutdown`` while a ``wait`` of another Supervisor's app read its records
    (before its scope could be cancelled): the wait ran its whole timeout."""
    async with Supervisor(session="svc") as owner:
        handle = await owner.submit(app(py_role("s", SLEEPER)), "local")
        for _ in range(3):
            async with Supervisor(session="svc") as other:
                outcome: list[BaseException] = []

                async def wait(sv: Supervisor, into: list[BaseException]) -> None:
                    try:
                        await sv.wait(handle, timeout=60)
                    except (ShuttingDown, WaitTimeout) as e:
                        into.append(e)

                with anyio.fail_after(BOUND_S):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(wait, other, outcome)
                        await anyio.lowlevel.checkpoint()  # the wait is reading the records
                        other.begin_shutdown()
                assert len(outcome) == 1 and isinstance(outcome[0], ShuttingDown), outcome
        await owner.cancel(handle)


IGNORES_TERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


async def test_leaving_the_block_cut_by_an_asyncio_cancel_still_ends_it(state_dir: Path) -> None:
    """An asyncio-native cancel during the close (a timeout around the block, Ctrl-C
    under ``asyncio.run``) went through anyio's shield and cut it before it ended the
    task group: leaving ``async with`` then waited for ever, and the reaper ran on. Cut
    at several points, the block is left with the cancel once the apps are stopped,
    and nothing of it runs on."""
    reapers = f"reaper.py\0{os.getpid()}\0"
    before = running_with(reapers)
    for steps in (0, 1, 2, 5, 20, 100):
        token = f"asv-cut-close-{os.getpid()}-{steps}"
        leaving = asyncio.Event()

        async def block(token: str = token, leaving: asyncio.Event = leaving) -> None:
            async with Supervisor(session="cut") as sv:
                role = py_role("w", IGNORES_TERM, num_replicas=2, args=[token])
                handle = await sv.submit(app(role), "local", {"stop_grace": 0.5})
                async for line in sv.log_iter(handle, "w", 1, should_tail=True):
                    if line.startswith("up"):
                        break
                leaving.set()

        task = asyncio.ensure_future(block())
        await leaving.wait()
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with anyio.fail_after(30):  # for ever, before
            with pytest.raises(asyncio.CancelledError):
                await task
        assert running_with(token) == [], f"cut after {steps} steps"
        assert running_with(reapers) == before, f"cut after {steps} steps"
    async with Supervisor(session="cut") as other:
        states = {a.state for a in await other.list("local")}
    assert states == {AppState.CANCELLED}
