"""Log iteration over real replicas' output."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import AppState, SpecError, Supervisor
from supervisor.logs import reader

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def _collect(sv: Supervisor, handle: str, role: str, k: int = 0, **kw: object) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, **kw)]  # type: ignore[arg-type]


async def test_streams_regex_and_edge_cases(state_dir: Path) -> None:
    code = (
        "import sys;"
        "sys.stdout.write('loss=1\\nacc=2\\n'); sys.stdout.flush();"
        "sys.stderr.write('warn\\n'); sys.stderr.flush();"
        "sys.stdout.buffer.write(b'bad \\xff\\xfe utf8\\n');"
        "sys.stdout.write('progress 10%\\rprogress 100%\\n');"
        "sys.stdout.write('x' * 1_000_000 + '\\n');"
        "sys.stdout.write('loss=0.5 no newline at the end')"
    )
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        out = await _collect(sv, handle, "t", streams="stdout")
        err = await _collect(sv, handle, "t", streams="stderr")
        combined = await _collect(sv, handle, "t")
        losses = await _collect(sv, handle, "t", regex="loss")
        with pytest.raises(ValueError, match="stdout"):
            await _collect(sv, handle, "t", streams="bogus")
    assert out[:2] == ["loss=1\n", "acc=2\n"]
    assert out[2] == "bad \ufffd\ufffd utf8\n"
    assert out[3] == "progress 10%\rprogress 100%\n"
    assert out[4] == "x" * 1_000_000 + "\n"
    assert out[5] == "loss=0.5 no newline at the end"
    assert err == ["warn\n"]
    assert sorted(combined) == sorted(out + err)
    assert losses == ["loss=1\n", "loss=0.5 no newline at the end"]


async def test_since_and_until_select_lines_by_time(state_dir: Path) -> None:
    code = "import time; print('early', flush=True); time.sleep(1.5); print('late', flush=True)"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.SUCCEEDED
        marker = time.time() - 0.7  # between the two lines: 'late' was printed ~now-0.1s
        assert await _collect(sv, handle, "t", since=marker) == ["late\n"]
        assert await _collect(sv, handle, "t", until=marker) == ["early\n"]
        assert await _collect(sv, handle, "t", since=marker, until=time.time() + 1) == ["late\n"]


async def test_tailing_follows_live_output_to_the_end(state_dir: Path) -> None:
    code = "import time\nfor i in range(5):\n    print(f'step {i}', flush=True); time.sleep(0.2)\n"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        seen: list[tuple[str, AppState | None]] = []
        with anyio.fail_after(30):
            async for line in sv.log_iter(handle, "t", 0, should_tail=True):
                status = sv.status(handle)
                seen.append((line, status.state if status else None))
        assert [line for line, _ in seen] == [f"step {i}\n" for i in range(5)]
        # The first lines arrived while the replica was still running: live, not at the end.
        assert seen[0][1] is AppState.RUNNING
        final = sv.status(handle)
        assert final is not None and final.is_terminal


async def test_a_follower_reads_a_fast_talker_in_batches_and_a_lone_line_at_once(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 lines 10 ms apart take a few dozen reads, not one each (every read is a
    worker-thread hop); a line after a quiet while still comes at once."""
    reads: list[float] = []
    read = reader._read

    async def counted(file: Any, path: Path, size: int = reader._CHUNK) -> bytes:
        reads.append(time.monotonic())
        return await read(file, path, size)

    monkeypatch.setattr(reader, "_read", counted)
    code = (
        "import time\n"
        "for i in range(100):\n"
        "    print(f'line {i}', flush=True); time.sleep(0.01)\n"
        "time.sleep(1.5)\n"
        "print('last', time.time(), flush=True)\n"
        "time.sleep(0.5)\n"
    )
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        lines: list[str] = []
        burst_reads = 0
        lag = float("inf")
        with anyio.fail_after(30):
            async for line in sv.log_iter(handle, "t", 0, should_tail=True):
                lines.append(line)
                if line == "line 99\n":
                    burst_reads = len(reads)
                elif line.startswith("last "):
                    lag = time.time() - float(line.split()[1])
    assert lines[:100] == [f"line {i}\n" for i in range(100)] and len(lines) == 101
    # About one read per ``reader.PACE_S`` (0.05 s) over the second of the burst, 20;
    # without the pace, about 100.
    assert burst_reads <= 45, burst_reads
    assert lag < 1.0, lag


async def test_not_tailing_returns_at_the_current_end(state_dir: Path) -> None:
    code = "import time; print('first', flush=True); time.sleep(60)"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        async for _ in sv.log_iter(handle, "t", 0, should_tail=True):
            break
        with anyio.fail_after(5):
            lines = await _collect(sv, handle, "t")
        assert lines == ["first\n"]
        await sv.cancel(handle)


def _inotify_instances() -> int:
    fd_dir = Path("/proc/self/fd")
    count = 0
    for fd in fd_dir.iterdir():
        try:
            if "inotify" in os.readlink(fd):
                count += 1
        except OSError:
            continue
    return count


async def test_following_many_replicas_shares_one_inotify_instance(state_dir: Path) -> None:
    # Linux allows 128 inotify instances per user: 150 followers must share.
    role = py_role("w", "import time; time.sleep(1); print('tick', flush=True)", num_replicas=150)
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        counts: list[int] = []

        async def follow(k: int) -> None:
            async for line in sv.log_iter(handle, "w", k, should_tail=True):
                assert line == "tick\n"
                counts.append(_inotify_instances())

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for k in range(150):
                    tg.start_soon(follow, k)
        assert len(counts) == 150
        assert max(counts) <= 3  # the backend's, the hub's, and none per follower


async def test_follows_that_stop_early_leave_nothing_on_the_running_app(
    state_dir: Path,
) -> None:
    """A service opens and drops log streams of a long app all day: each follow listens
    to the app's end (no task of its own), and stops listening when it stops, so
    nothing of it stays until the app ends. Follows that run to the end still end
    with the app."""
    code = "import time\nprint('up', flush=True)\ntime.sleep(1.5)\nprint('down', flush=True)\n"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        end = sv._actors[handle].done

        async def first_line() -> str:
            # Closed at once, as a careful caller does (else asyncio closes it later).
            lines = sv.log_iter(handle, "t", 0, should_tail=True)
            async with aclosing(lines):
                async for line in lines:
                    return line
            raise AssertionError("the follow ended without a line")

        with anyio.fail_after(30):
            for _ in range(20):
                assert await first_line() == "up\n"
            assert not end._listeners
            assert await _collect(sv, handle, "t", should_tail=True) == ["up\n", "down\n"]
            assert end.is_set()


async def test_a_replica_outrunning_the_writer_is_paused_and_loses_nothing(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipe's reader is taken off the loop while the writer's backlog is over its
    mark, and put back once there is room: every line arrives, in order. The mark is
    lowered to nothing here, so that the pause happens on every chunk, on any disk."""
    from supervisor.logs import sink

    monkeypatch.setattr(sink, "QUEUED_BYTES_HIGH", 0)
    full: list[bool] = []
    has_room = sink._Writer.has_room

    def counted(self: sink._Writer) -> bool:
        room = has_room(self)
        full.append(not room)
        return room

    monkeypatch.setattr(sink._Writer, "has_room", counted)
    lines = 200_000
    code = f"import sys\nfor i in range({lines}):\n    sys.stdout.write(f'line {{i}}\\n')\n"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED
        out = await _collect(sv, handle, "t", streams="stdout")
    assert any(full), "the reader was never paused"
    assert out == [f"line {i}\n" for i in range(lines)]


async def test_a_replica_index_that_is_no_int_is_refused_naming_k(state_dir: Path) -> None:
    """``1.0 == 1`` found the replica, then its directory "1.0" held no output: no lines."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", "print('hi')", num_replicas=2)), "local")
        await sv.wait(handle, timeout=30)
        assert await _collect(sv, handle, "t", 1) == ["hi\n"]
        for k in (1.0, True, "0"):
            with pytest.raises(SpecError) as err:
                await _collect(sv, handle, "t", k)  # type: ignore[arg-type]
            assert err.value.fields == ("k",)


async def test_a_follow_after_close_reads_what_there_is_and_ends(state_dir: Path) -> None:
    """Reads still work after the block; a follow has nothing more to wait for."""
    sv = Supervisor(session="svc")
    async with sv:
        handle = await sv.submit(app(py_role("t", "print('x')")), "local")
        await sv.wait(handle, timeout=30)
    assert await _collect(sv, handle, "t") == ["x\n"]
    with anyio.fail_after(10):
        assert await _collect(sv, handle, "t", should_tail=True) == ["x\n"]


async def test_a_follow_of_a_quiet_replica_ends_soon_after_until(state_dir: Path) -> None:
    code = "import time; print('hello', flush=True); time.sleep(120)"
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", code)), "local")
        async for _ in sv.log_iter(handle, "t", should_tail=True):
            break  # it printed, and now stays quiet
        started = time.monotonic()
        with anyio.fail_after(20):  # the watch's backstop was 30 s
            got = await _collect(sv, handle, "t", until=time.time() + 1, should_tail=True)
        assert got == ["hello\n"]
        assert time.monotonic() - started < 10
        await sv.cancel(handle)


# A replica that writes about 10 MB/s for as long as it runs, read by a caller that
# takes about 2 MB/s (a slow client): each read finds more than the last one left.
_FAST_TALKER = (
    "import sys, time\nblock = ('q' * 99 + '\\n') * 10_000\n"
    "while True:\n    sys.stdout.write(block); sys.stdout.flush(); time.sleep(0.1)\n"
)


async def _backlog(sv: Supervisor, handle: str) -> None:
    """Until the talker wrote a few reads' worth (read here at full speed): every
    read of a slow caller's then finds a full chunk."""
    seen = 0
    with anyio.fail_after(30):
        async with aclosing(sv.log_iter(handle, "t", should_tail=True)) as lines:
            async for line in lines:
                seen += len(line)
                if seen > 3 << 20:
                    break


async def _read_slowly(lines: AsyncGenerator[str, None]) -> int:
    """Lines taken at about 2 MB/s; every one must be the talker's whole line."""
    count = 0
    async with aclosing(lines):
        async for line in lines:
            assert line.strip("q") in ("\n", ""), line  # whole, or the last line cut short
            count += 1
            if count % 200 == 0:
                await anyio.sleep(0.01)
    return count


async def test_a_read_to_the_current_end_ends_while_the_replica_outruns_its_caller(
    state_dir: Path,
) -> None:
    """``should_tail=False`` stops at the end the file had: it read on to whatever end
    the file had when the reads caught up, never, while the replica wrote faster."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", _FAST_TALKER)), "local")
        await _backlog(sv, handle)
        with anyio.fail_after(30):  # a few seconds' reading
            await _read_slowly(sv.log_iter(handle, "t", streams="stdout"))
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        await sv.cancel(handle)


async def test_a_follow_ends_after_begin_shutdown_while_the_replica_outruns_it(
    state_dir: Path,
) -> None:
    """After ``begin_shutdown`` a follow gives the lines already there, then ends: it
    followed on for as long as the replica wrote faster than its caller read."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("t", _FAST_TALKER)), "local")
        await _backlog(sv, handle)
        follow = sv.log_iter(handle, "t", should_tail=True, streams="stdout")
        first = await anext(follow)
        sv.begin_shutdown()
        with anyio.fail_after(30):
            await _read_slowly(follow)
        assert first == "q" * 99 + "\n"
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
