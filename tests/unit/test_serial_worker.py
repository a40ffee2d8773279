"""SerialWorker: the records' thread runs calls in order, off the loop, and to their end."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
import weakref

import anyio
import pytest

from supervisor.backends.serial import SerialWorker


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_calls_run_in_order_in_one_thread_other_than_the_loops() -> None:
    worker = SerialWorker("test-records")
    ran: list[tuple[int, int]] = []

    def call(k: int) -> int:
        time.sleep(0.01 if k == 0 else 0)  # the first is the slowest: order still holds
        ran.append((k, threading.get_ident()))
        return k * 10

    try:
        async with anyio.create_task_group() as tg:
            results: dict[int, int] = {}

            async def one(k: int) -> None:
                results[k] = await worker.run(call, k)

            for k in range(5):
                tg.start_soon(one, k)
                await anyio.lowlevel.checkpoint()  # queued in this order
        assert [k for k, _ in ran] == [0, 1, 2, 3, 4]
        assert len({ident for _, ident in ran}) == 1
        assert ran[0][1] != threading.get_ident()
        assert results == {k: k * 10 for k in range(5)}
    finally:
        await worker.aclose()


@pytest.mark.anyio
async def test_an_error_reaches_the_caller_and_the_worker_goes_on() -> None:
    worker = SerialWorker("test-records")

    def broken() -> None:
        raise FileNotFoundError(2, "gone", "/nowhere")

    try:
        with pytest.raises(FileNotFoundError, match="gone"):
            await worker.run(broken)
        assert await worker.run(lambda: "still here") == "still here"
    finally:
        await worker.aclose()


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    """A record is never left half written by a writer that moved on."""
    worker = SerialWorker("test-records")
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        finished.set()

    try:
        with anyio.move_on_after(0.05) as scope:
            await worker.run(slow)
            await anyio.sleep(10)  # the cancellation lands here, once the call is over
        assert scope.cancelled_caught
        assert finished.is_set()
    finally:
        await worker.aclose()


@pytest.mark.anyio
async def test_close_runs_what_was_queued_then_stops_the_thread() -> None:
    worker = SerialWorker("test-records-close")
    done: list[int] = []
    async with anyio.create_task_group() as tg:
        for k in range(3):
            tg.start_soon(worker.run, done.append, k)
        await anyio.lowlevel.checkpoint()
        await worker.aclose()
    assert done == [0, 1, 2]
    assert not any(t.name == "test-records-close" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run(done.append, 3)


@pytest.mark.anyio
async def test_nothing_of_a_call_is_kept_once_it_returned() -> None:
    """An ended app's last call (its runtime bound in) must not stay alive in the thread."""
    worker = SerialWorker("test-records")

    class Payload:
        pass

    payload = Payload()
    alive = weakref.ref(payload)
    try:
        await worker.run(lambda p: None, payload)
        del payload
        gc.collect()
        assert alive() is None
    finally:
        await worker.aclose()


def test_a_worker_left_open_does_not_hold_the_interpreters_exit() -> None:
    """A Supervisor never closed must not hang its process at exit on the records' thread."""
    code = (
        "import asyncio\n"
        "from supervisor.backends.serial import SerialWorker\n"
        "kept = []\n"
        "async def main():\n"
        "    kept.append(SerialWorker('left-open'))\n"
        "    await kept[0].run(print, 'ran')\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"


@pytest.mark.anyio
async def test_a_posted_call_runs_before_the_calls_queued_after_it() -> None:
    """Work done ahead (``post``) is there for the ``run`` that follows, which waits for it."""
    worker = SerialWorker("test-records")
    ran: list[str] = []

    def ahead() -> None:
        time.sleep(0.05)  # slower than the hop of the run queued after it
        ran.append("ahead")

    try:
        assert worker.post(ahead)
        assert await worker.run(lambda: list(ran)) == ["ahead"]
    finally:
        await worker.aclose()


@pytest.mark.anyio
async def test_a_posted_call_that_raises_reaches_the_loops_exception_handler() -> None:
    """Nobody waits for a posted call: what it raises all the same is not lost."""
    worker = SerialWorker("test-records")
    heard: list[dict[str, object]] = []
    arrived = anyio.Event()
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()

    def hear(_loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        heard.append(context)
        arrived.set()

    loop.set_exception_handler(hear)

    def broken() -> None:
        raise OSError(28, "No space left on device")

    try:
        assert worker.post(broken)
        assert await worker.run(lambda: "still here") == "still here"  # the worker goes on
        with anyio.fail_after(5):
            await arrived.wait()
        error = heard[0]["exception"]
        assert isinstance(error, OSError) and error.errno == 28
        assert "broken" in str(heard[0]["message"])
    finally:
        loop.set_exception_handler(before)
        await worker.aclose()


@pytest.mark.anyio
async def test_nothing_is_posted_to_a_closed_worker() -> None:
    worker = SerialWorker("test-records")
    await worker.aclose()
    ran: list[int] = []
    assert not worker.post(ran.append, 1)
    assert ran == []


@pytest.mark.anyio
async def test_pending_counts_the_calls_queued_or_running_and_not_one_that_returned() -> None:
    """``pending`` is what a call queued now would wait for; a call whose caller has its
    result is no longer counted (the worker counts it before it answers)."""
    worker = SerialWorker("test-records")
    release = threading.Event()
    try:
        assert worker.pending == 0
        assert worker.post(release.wait, 10)
        assert worker.post(lambda: None)
        assert worker.pending == 2
        release.set()
        assert await worker.run(lambda: "done") == "done"
        assert worker.pending == 0
    finally:
        release.set()
        await worker.aclose()
