"""The channel to the local reaper never blocks the event loop (issue 16, item 1).

The kernel lets only a few datagrams queue on the SOCK_SEQPACKET socket
(``net.unix.max_dgram_qlen``), so the socket is filled for real here: the
real reaper process is stopped with SIGSTOP while many spawns are asked of
it. A blocking send would freeze the loop until it is resumed; the channel
must instead queue, keep ticking, and deliver every message, in order and
each with its own pipes, once the reaper reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from supervisor.backends.local.reaper_client import Reaper

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SPAWNS = 200
# A service's environment is a few KiB: 200 such spawns are more than the socket's
# send buffer holds (net.core.wmem_default, 208 KiB), so the socket fills for real.
ENV = {"PATH": os.defpath, "PAD": "x" * 4096}


async def test_a_full_socket_queues_spawns_without_blocking_the_loop() -> None:
    ticks = 0
    stopped_ticks = 0
    results: dict[int, tuple[int, int]] = {}  # k -> (pid, read end of its stdout)
    pipes: list[tuple[int, int]] = []
    async with anyio.create_task_group() as tg:
        reaper = Reaper(tg)
        # One spawn first: the reaper process is running and answers.
        r0, w0 = os.pipe()
        _, report0 = await reaper.spawn(
            ["true"], cwd="/", env={"PATH": os.defpath}, group="g", stdout=w0, stderr=w0
        )
        os.close(w0)
        os.close(r0)
        await report0.done.wait()
        conn = reaper._conn
        assert conn is not None
        seen: list[int] = []
        dispatch = conn._dispatch

        def spy(msg: dict[str, object]) -> None:
            if msg["op"] in ("spawned", "failed"):
                seen.append(int(msg["id"]))  # type: ignore[call-overload]
            dispatch(msg)

        conn._dispatch = spy  # type: ignore[method-assign]
        reaper_pid = conn.popen.pid
        os.kill(reaper_pid, signal.SIGSTOP)
        # A safety net: were sends blocking, this resumes the reaper after a while and
        # the test fails on its tick count instead of hanging.
        net = threading.Timer(15, os.kill, (reaper_pid, signal.SIGCONT))
        net.start()
        stop_ticking = anyio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop_ticking.is_set():
                await anyio.sleep(0.005)
                ticks += 1

        async def spawn(k: int) -> None:
            r, w = os.pipe()
            pipes.append((r, w))
            pid, report = await reaper.spawn(
                ["sh", "-c", f"echo {k}"],
                cwd="/",
                env=ENV,
                group="g",
                stdout=w,
                stderr=w,
            )
            results[k] = (pid, r)
            await report.done.wait()

        try:
            tg.start_soon(ticker)
            async with anyio.create_task_group() as spawns:
                first_id = reaper._next_id + 1
                for k in range(SPAWNS):
                    spawns.start_soon(spawn, k)
                started = time.monotonic()
                await anyio.sleep(0.5)
                stopped_ticks = ticks
                queued = conn.queued
                os.kill(reaper_pid, signal.SIGCONT)
                resumed_after = time.monotonic() - started
        finally:
            net.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(reaper_pid, signal.SIGCONT)
            stop_ticking.set()
        assert resumed_after < 5, "the spawns held the loop while the reaper was stopped"
        assert stopped_ticks > 0, "no tick ran while the reaper's socket was full"
        assert queued > 0, "the socket never filled: the test did not exercise the queue"
        # Every spawn answered, in the order asked, each replica writing to its own pipe.
        assert seen == list(range(first_id, first_id + SPAWNS))
        assert sorted(results) == list(range(SPAWNS))
        for k, (_, r) in results.items():
            assert os.read(r, 100) == f"{k}\n".encode()
        for r, w in pipes:
            os.close(r)
            os.close(w)
        await reaper.aclose()


async def test_a_spawn_longer_than_a_datagram_reaches_the_reaper_and_others_go_on() -> None:
    """A spawn far longer than one datagram goes in parts: the reaper gets it whole and
    ``execve`` says why it cannot start (it was refused as "Message too long")."""
    async with anyio.create_task_group() as tg:
        reaper = Reaper(tg)
        r, w = os.pipe()
        try:
            huge = {"PATH": os.defpath, "BIG": "x" * (8 << 20)}
            with pytest.raises(OSError, match="Argument list too long") as refused:
                await reaper.spawn(["true"], cwd="/", env=huge, group="g", stdout=w, stderr=w)
            assert refused.value.errno == errno.E2BIG
            _, report = await reaper.spawn(
                ["sh", "-c", "echo ok"], cwd="/", env={"PATH": os.defpath}, group="g",
                stdout=w, stderr=w,
            )  # fmt: skip
            await report.done.wait()
            assert report.returncode == 0
            assert os.read(r, 100) == b"ok\n"
        finally:
            os.close(r)
            os.close(w)
            await reaper.aclose()


async def test_the_reaper_is_started_off_the_loop_once_for_concurrent_first_spawns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Starting the reaper forks and execs (milliseconds): done in a worker thread,
    never on the event loop's, and once however many spawns ask for it together.

    The real start is wrapped, only to see which thread ran it and how often.
    """
    from supervisor.backends.local import reaper_client

    real_start = reaper_client._start_reaper
    starts: list[int] = []

    def watched_start() -> object:
        starts.append(threading.get_ident())
        return real_start()

    monkeypatch.setattr(reaper_client, "_start_reaper", watched_start)
    loop_thread = threading.get_ident()
    reports = []
    pipes = [os.pipe() for _ in range(3)]
    try:
        async with anyio.create_task_group() as tg:
            reaper = Reaper(tg)
            try:
                reaper.warm_up()  # a burst about to come: the start begins in the background

                async def spawn(k: int) -> None:
                    _, w = pipes[k]
                    _, report = await reaper.spawn(
                        ["sh", "-c", f"echo {k}"], cwd="/", env={"PATH": os.defpath},
                        group="g", stdout=w, stderr=w,
                    )  # fmt: skip
                    reports.append(report)
                    await report.done.wait()

                async with anyio.create_task_group() as spawns:
                    for k in range(len(pipes)):
                        spawns.start_soon(spawn, k)
            finally:
                await reaper.aclose()
    finally:
        outputs = [os.read(r, 100) for r, _ in pipes]
        for r, w in pipes:
            os.close(r)
            os.close(w)
    assert len(starts) == 1, f"{len(starts)} reapers were started for one Reaper"
    assert starts[0] != loop_thread, "the reaper was started on the event loop's thread"
    assert [rep.returncode for rep in reports] == [0, 0, 0]
    assert outputs == [b"0\n", b"1\n", b"2\n"]


async def test_no_reaper_is_left_running_when_a_warm_up_meets_the_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst's warm-up starts the reaper in a task of its own: a close that comes first
    leaves no reaper process behind (none is started after it; one under way is closed).

    The real start is wrapped, only to keep the processes it started.
    """
    from supervisor.backends.local import reaper_client

    real_start = reaper_client._start_reaper
    started: list[Any] = []

    def watched_start() -> object:
        sock, popen = real_start()
        started.append(popen)
        return sock, popen

    monkeypatch.setattr(reaper_client, "_start_reaper", watched_start)
    for pause in (False, True):  # the close before the start, then during it
        async with anyio.create_task_group() as tg:
            reaper = Reaper(tg)
            reaper.warm_up()
            if pause:
                await anyio.lowlevel.checkpoint()  # the warm-up's task begins the start
            await reaper.aclose()
            assert reaper.containment == "not started"
    # Closed means waited for: each reaper started has exited and was reaped.
    assert [popen.poll() is not None for popen in started] == [True] * len(started)


def _statuses_run_here(programs: dict[str, str], cwd: Path) -> dict[str, int]:
    """Blocking: each ``sh -c`` program run by this process, its raw status from ``waitpid``."""
    found = {}
    for name, script in programs.items():
        direct = subprocess.Popen(["sh", "-c", script], cwd=cwd)
        found[name] = os.waitpid(direct.pid, 0)[1]
        direct.returncode = 0  # reaped above: Popen must not wait for it again
    return found


async def test_an_exit_is_told_as_waitpid_tells_it_and_the_socket_is_let_go(
    tmp_path: Path,
) -> None:
    """The reaper tells an exit from ``waitid`` before it reaps the child: the status is
    the one ``waitpid`` gives the same program run here (a code, a signal, a core dump).
    The reaper's socket stays registered with the loop while the reaper lives and is let
    go when it is closed (its number is soon another file's)."""
    programs = {
        "ok": "exit 0",
        "code": "exit 7",
        "killed": "kill -KILL $$",
        "dumped": "ulimit -c unlimited; kill -SEGV $$",
    }
    expected = await anyio.to_thread.run_sync(_statuses_run_here, programs, tmp_path)
    assert os.WCOREDUMP(expected["dumped"]), "core_pattern writes cores here"
    loop = asyncio.get_running_loop()
    async with anyio.create_task_group() as tg:
        reaper = Reaper(tg)
        try:
            told = {}
            for name, script in programs.items():
                r, w = os.pipe()
                try:
                    _, report = await reaper.spawn(
                        ["sh", "-c", script], cwd=str(tmp_path), env={"PATH": os.defpath},
                        group="g", stdout=w, stderr=w,
                    )  # fmt: skip
                    await report.done.wait()
                finally:
                    os.close(r)
                    os.close(w)
                told[name] = report.status
            assert told == expected
            conn = reaper._conn
            assert conn is not None
            fd = conn.sock.fileno()
        finally:
            await reaper.aclose()
    assert not loop.remove_reader(fd)  # nothing of ours is left registered
