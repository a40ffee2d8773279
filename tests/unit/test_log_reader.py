"""iter_log_lines against files written by a real LogSink."""

from __future__ import annotations

import gc
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup

from supervisor.errors import SpecError
from supervisor.logs import LogSink, ReplicaLog, Stream, iter_log_lines, parse_streams, reader
from supervisor.logs.lines import MAX_LINE_BYTES
from supervisor.logs.watch import EndSignal, WatchHub

from ..inotify_watches import watched_inodes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sink() -> AsyncIterator[LogSink]:
    log_sink = LogSink()
    try:
        yield log_sink
    finally:
        await log_sink.aclose()


async def _lines(directory: Path, **options: object) -> list[str]:
    with anyio.fail_after(10):
        return [line async for line in iter_log_lines(directory, **options)]  # type: ignore[arg-type]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _written(sink: LogSink, directory: Path, *chunks: tuple[str, bytes, float]) -> ReplicaLog:
    log = sink.open(directory)
    for stream, data, at in chunks:
        sink.write(log, stream, data, at)  # type: ignore[arg-type]
    await sink.flush()
    return log


def _flag() -> tuple[Callable[[], Awaitable[bool]], Callable[[], None]]:
    state = {"done": False}

    async def is_finished() -> bool:
        return state["done"]

    def finish() -> None:
        state["done"] = True

    return is_finished, finish


@pytest.mark.anyio
async def test_regex_searches_each_line(sink: LogSink, tmp_path: Path) -> None:
    await _written(sink, tmp_path, ("stdout", b"alpha 1\nbeta 2\nalphabet 3\ngamma\n", 1.0))
    assert await _lines(tmp_path, regex="alpha") == ["alpha 1\n", "alphabet 3\n"]
    assert await _lines(tmp_path, regex=re.compile(r"\d$")) == [
        "alpha 1\n",
        "beta 2\n",
        "alphabet 3\n",
    ]
    assert await _lines(tmp_path, regex="^nothing") == []


def test_invalid_regex_fails_at_the_call(tmp_path: Path) -> None:
    # A repeat count beyond the regex engine's limit raises OverflowError, not re.error.
    for regex in ("(unclosed", "a{99999999999}"):
        with pytest.raises(SpecError, match="regex") as err:
            iter_log_lines(tmp_path, regex=regex)
        assert err.value.fields == ("regex",)


def test_a_time_no_float_can_hold_is_a_problem_named_for_its_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        iter_log_lines(tmp_path, since=10**400, until=-(10**400))
    assert err.value.fields == ("since", "until")


@pytest.mark.anyio
async def test_since_and_until_use_arrival_times(sink: LogSink, tmp_path: Path) -> None:
    await _written(
        sink,
        tmp_path,
        ("stdout", b"at 100\n", 100.0),
        ("stdout", b"at 200 a\nat 200 b\n", 200.0),
        ("stdout", b"at 300\n", 300.0),
        ("stdout", b"at 400\n", 400.0),
    )
    assert await _lines(tmp_path, since=200.0) == [
        "at 200 a\n",
        "at 200 b\n",
        "at 300\n",
        "at 400\n",
    ]
    assert await _lines(tmp_path, until=200) == ["at 100\n", "at 200 a\n", "at 200 b\n"]
    assert await _lines(tmp_path, since=150, until=300.0) == [
        "at 200 a\n",
        "at 200 b\n",
        "at 300\n",
    ]
    assert await _lines(tmp_path, stream=Stream.STDOUT, since=250, until=350) == ["at 300\n"]
    assert await _lines(tmp_path, since=500) == []


@pytest.mark.anyio
async def test_since_accepts_datetimes(sink: LogSink, tmp_path: Path) -> None:
    base = datetime(2024, 5, 1, 12, 0, 0).timestamp()  # naive: local time
    await _written(sink, tmp_path, ("stderr", b"old\n", base - 60), ("stderr", b"new\n", base + 60))
    assert await _lines(tmp_path, since=datetime(2024, 5, 1, 12, 0, 0)) == ["new\n"]
    aware = datetime.fromtimestamp(base).astimezone()
    assert await _lines(tmp_path, until=aware) == ["old\n"]


@pytest.mark.anyio
async def test_a_line_is_dated_by_its_first_byte(sink: LogSink, tmp_path: Path) -> None:
    await _written(
        sink,
        tmp_path,
        ("stdout", b"early\nlong line be", 10.0),
        ("stdout", b"gun early\nlate\n", 20.0),
    )
    assert await _lines(tmp_path, stream="stdout", until=15) == [
        "early\n",
        "long line begun early\n",
    ]
    assert await _lines(tmp_path, stream="stdout", since=15) == ["late\n"]
    # combined.log holds whole lines, written when complete.
    assert await _lines(tmp_path, since=15) == ["long line begun early\n", "late\n"]


@pytest.mark.anyio
async def test_streams_are_selectable(sink: LogSink, tmp_path: Path) -> None:
    await _written(
        sink, tmp_path, ("stdout", b"o1\n", 1.0), ("stderr", b"e1\n", 2.0), ("stdout", b"o2\n", 3.0)
    )
    assert await _lines(tmp_path, stream=Stream.STDOUT) == ["o1\n", "o2\n"]
    assert await _lines(tmp_path, stream="stderr") == ["e1\n"]
    assert await _lines(tmp_path) == ["o1\n", "e1\n", "o2\n"]
    assert await _lines(tmp_path, stream=parse_streams(None)) == ["o1\n", "e1\n", "o2\n"]


def test_parse_streams() -> None:
    assert parse_streams(None) is Stream.COMBINED
    assert parse_streams("stdout") is Stream.STDOUT
    assert parse_streams(Stream.STDERR) is Stream.STDERR
    with pytest.raises(SpecError, match="stdout, stderr, combined") as err:
        parse_streams("bogus")
    assert err.value.fields == ("streams",)


def test_bogus_stream_fails_at_the_call(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bogus"):
        iter_log_lines(tmp_path, stream="bogus")


@pytest.mark.anyio
async def test_without_tail_ends_at_the_current_end(sink: LogSink, tmp_path: Path) -> None:
    await _written(sink, tmp_path, ("stdout", b"one\ntwo\nthr", 1.0))
    assert await _lines(tmp_path, stream="stdout") == ["one\n", "two\n", "thr"]


@pytest.mark.anyio
async def test_tail_follows_until_finished_losing_nothing(sink: LogSink, tmp_path: Path) -> None:
    log = await _written(sink, tmp_path, ("stdout", b"before\n", 1.0))
    is_finished, finish = _flag()
    finished = anyio.Event()

    async def produce() -> None:
        for i in range(20):
            await anyio.sleep(0.01)
            sink.write(log, "stdout", f"line {i}\n".encode(), 2.0)
            if i % 5 == 0:
                await sink.flush()
        sink.write(log, "stdout", b"last words", 3.0)  # no newline before the end
        sink.end_stream(log, "stdout")
        sink.end_stream(log, "stderr")
        await sink.flush()
        finish()
        finished.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(produce)
            got = [
                line
                async for line in iter_log_lines(
                    tmp_path, should_tail=True, is_finished=is_finished, finished_event=finished
                )
            ]
    assert got == ["before\n", *(f"line {i}\n" for i in range(20)), "last words"]


@pytest.mark.anyio
async def test_tail_never_loses_output_written_just_before_the_end(
    sink: LogSink, tmp_path: Path
) -> None:
    for attempt in range(15):
        directory = tmp_path / str(attempt)
        log = sink.open(directory)
        is_finished, finish = _flag()
        finished = anyio.Event()

        async def produce(
            log: ReplicaLog = log,
            finish: Callable[[], None] = finish,
            event: anyio.Event = finished,
            phase: int = attempt % 7,
        ) -> None:
            for i in range(30):
                sink.write(log, "stderr", f"{i}\n".encode(), 1.0)
                if i % 7 == phase:
                    await anyio.lowlevel.checkpoint()
            await sink.flush()
            finish()
            event.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(produce)
                got = [
                    line
                    async for line in iter_log_lines(
                        directory,
                        stream="stderr",
                        should_tail=True,
                        is_finished=is_finished,
                        finished_event=finished,
                    )
                ]
        assert got == [f"{i}\n" for i in range(30)]


@pytest.mark.anyio
async def test_without_a_wake_up_the_safety_recheck_ends_the_follow(
    sink: LogSink, tmp_path: Path
) -> None:
    await _written(sink, tmp_path, ("stdout", b"only\n", 1.0))
    is_finished, finish = _flag()

    async def finish_quietly() -> None:
        await anyio.sleep(0.1)
        finish()  # nothing on disk changes: only the periodic re-check can notice

    started = anyio.current_time()
    async with anyio.create_task_group() as group:
        group.start_soon(finish_quietly)
        got = await _lines(tmp_path, should_tail=True, is_finished=is_finished)
    assert got == ["only\n"]
    assert 1.5 < anyio.current_time() - started < 5


@pytest.mark.anyio
async def test_tail_holds_a_partial_line_back(sink: LogSink, tmp_path: Path) -> None:
    log = await _written(sink, tmp_path, ("stdout", b"whole\nhal", 1.0))
    with anyio.fail_after(10):
        async with aclosing(iter_log_lines(tmp_path, should_tail=True)) as lines:
            assert await anext(lines) == "whole\n"
            sink.write(log, "stdout", b"f and half\n", 2.0)
            await sink.flush()
            assert await anext(lines) == "half and half\n"


@pytest.mark.anyio
async def test_tail_wakes_on_a_state_file_in_an_extra_dir(sink: LogSink, tmp_path: Path) -> None:
    await _written(sink, tmp_path / "logs", ("stdout", b"only line\n", 1.0))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    marker = anyio.Path(state_dir / "done")

    async def is_finished() -> bool:
        return await marker.exists()

    async def finish_later() -> None:
        await anyio.sleep(0.1)
        await marker.write_text("exited\n")

    with anyio.fail_after(1.5):  # well under the 2 s safety re-check
        async with anyio.create_task_group() as group:
            group.start_soon(finish_later)
            got = await _lines(
                tmp_path / "logs",
                should_tail=True,
                is_finished=is_finished,
                extra_watch_dirs=[state_dir],
            )
    assert got == ["only line\n"]


@pytest.mark.anyio
async def test_until_in_the_past_stops_following(sink: LogSink, tmp_path: Path) -> None:
    await _written(sink, tmp_path, ("stdout", b"old\n", 10.0), ("stdout", b"new\n", 20.0))
    assert await _lines(tmp_path, should_tail=True, until=15.0) == ["old\n"]
    # No newer line to see: the clock alone says nothing more can qualify.
    assert await _lines(tmp_path, should_tail=True, until=25.0) == ["old\n", "new\n"]


@pytest.mark.anyio
async def test_a_follow_of_a_quiet_file_ends_once_until_has_passed(
    sink: LogSink, tmp_path: Path
) -> None:
    """Nothing is written, so no event wakes the follower: the clock must."""
    now = time.time()
    await _written(sink, tmp_path, ("stdout", b"before\n", now))
    is_finished, _ = _flag()  # the replica runs on, silent
    started = time.monotonic()
    async with anyio.create_task_group() as group:
        got = await _lines(
            tmp_path,
            should_tail=True,
            until=now + 0.5,
            is_finished=is_finished,
            watch_hub=WatchHub(group),  # as the Supervisor follows: events trusted, 30 s backstop
        )
        group.cancel_scope.cancel()
    assert got == ["before\n"]
    # until + 2 s of grace for output still on its way; the watch's backstop is 30 s.
    assert time.monotonic() - started < 8


def test_a_bytes_pattern_is_refused_at_the_call(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="bytes") as err:
        iter_log_lines(tmp_path, regex=re.compile(b"a0"))  # type: ignore[arg-type]
    assert err.value.fields == ("regex",)


@pytest.mark.parametrize("k", [True, 1.0, "0", -1, None])
def test_a_replica_index_that_is_no_index_is_refused(k: object) -> None:
    with pytest.raises(SpecError) as err:
        reader.check_log_query(None, None, None, None, k)
    assert err.value.fields == ("k",)
    assert repr(k) in str(err.value)


@pytest.mark.anyio
async def test_carriage_returns_stay_inside_the_line(sink: LogSink, tmp_path: Path) -> None:
    await _written(sink, tmp_path, ("stdout", b"10%\r50%\r100%\r\ndone\n", 1.0))
    assert await _lines(tmp_path) == ["10%\r50%\r100%\r\n", "done\n"]
    assert await _lines(tmp_path, regex="50%") == ["10%\r50%\r100%\r\n"]


@pytest.mark.anyio
async def test_invalid_utf8_is_replaced(sink: LogSink, tmp_path: Path) -> None:
    await _written(
        sink, tmp_path, ("stderr", b"ok \xff\xfe\ntrunc \xe2\x82\nfine \xe2\x82\xac\n", 1.0)
    )
    assert await _lines(tmp_path) == ["ok \ufffd\ufffd\n", "trunc \ufffd\n", "fine \u20ac\n"]


@pytest.mark.anyio
async def test_a_line_larger_than_a_read_chunk(sink: LogSink, tmp_path: Path) -> None:
    big = b"z" * (3 * 1024 * 1024 + 17) + b"\n"
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"small\n", 1.0)
    for start in range(0, len(big), 65_536):
        sink.write(log, "stdout", big[start : start + 65_536], 2.0)
    sink.write(log, "stdout", b"after\n", 3.0)
    await sink.flush()
    # Longer than MAX_LINE_BYTES: it comes in pieces that join to the line.
    pieces = ["z" * MAX_LINE_BYTES] * 3 + ["z" * 17 + "\n"]
    assert await _lines(tmp_path, stream="stdout") == ["small\n", *pieces, "after\n"]
    assert await _lines(tmp_path, stream="stdout", since=2.0, until=2.0) == pieces
    # combined.log holds whole lines: each piece is one there.
    whole = [p.rstrip("\n") + "\n" for p in pieces]
    assert await _lines(tmp_path) == ["small\n", *whole, "after\n"]


@pytest.mark.anyio
async def test_missing_file_without_tail_is_empty(tmp_path: Path) -> None:
    assert await _lines(tmp_path / "not" / "yet") == []
    assert await _lines(tmp_path / "not" / "yet", since=0.0) == []


@pytest.mark.anyio
async def test_tail_picks_up_a_file_created_later(sink: LogSink, tmp_path: Path) -> None:
    directory = tmp_path / "app" / "role" / "0"
    is_finished, finish = _flag()

    async def produce() -> None:
        await anyio.sleep(0.1)
        log = sink.open(directory)
        sink.write(log, "stdout", b"hello\n", 1.0)
        await sink.flush()
        await anyio.sleep(0.1)
        sink.write(log, "stdout", b"bye\n", 2.0)
        await sink.flush()
        finish()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(produce)
            lines = iter_log_lines(directory, should_tail=True, is_finished=is_finished)
            async with aclosing(lines):
                # Before the finish signal, the first line must arrive by itself.
                with anyio.fail_after(1.5):
                    assert await anext(lines) == "hello\n"
                assert [line async for line in lines] == ["bye\n"]


@pytest.mark.anyio
async def test_early_aclose_releases_everything(sink: LogSink, tmp_path: Path) -> None:
    log = await _written(sink, tmp_path, ("stdout", b"a\n", 1.0))
    before = _open_fds()
    lines = iter_log_lines(tmp_path, should_tail=True)

    async def write_later() -> None:
        await anyio.sleep(0.1)
        sink.write(log, "stdout", b"b\n", 2.0)
        await sink.flush()

    with anyio.fail_after(5):
        assert await anext(lines) == "a\n"
        async with anyio.create_task_group() as group:
            group.start_soon(write_later)
            assert await anext(lines) == "b\n"  # came through a wait: inotify is open
    assert _open_fds() > before
    await lines.aclose()
    assert _open_fds() == before


@pytest.mark.anyio
async def test_breaking_out_of_async_for_releases_everything(sink: LogSink, tmp_path: Path) -> None:
    log = await _written(sink, tmp_path, ("stdout", b"a\n", 1.0))
    before = _open_fds()
    opened_while_following = 0

    async def write_later() -> None:
        await anyio.sleep(0.1)
        sink.write(log, "stdout", b"b\n", 2.0)
        await sink.flush()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(write_later)
            async for line in iter_log_lines(tmp_path, should_tail=True):
                if line == "b\n":
                    opened_while_following = _open_fds() - before
                    break
    for _ in range(5):  # the loop finalizes abandoned async generators in a task
        gc.collect()
        await anyio.sleep(0.01)
    assert opened_while_following > 0
    assert _open_fds() == before


@pytest.mark.anyio
@pytest.mark.parametrize("end_kind", [anyio.Event, EndSignal])
@pytest.mark.parametrize("shared", [True, False], ids=["shared-watch", "own-watch"])
async def test_an_end_between_the_question_and_the_wait_is_not_missed(
    sink: LogSink, tmp_path: Path, end_kind: type[anyio.Event] | type[EndSignal], shared: bool
) -> None:
    """The app ends right after the follower asked (no more writes): it must not wait it out.

    The end is set before the follower's wait starts, so nothing will set it
    again: the wait must see an end already set. Its backstop re-check is
    long (2 s alone, 30 s on a shared watch), and the follow must end well
    before it. The answer after which the follower waits: a shared watch is
    added before the first read, so it waits after the first; a watch of its
    own is added after the first read, which makes it read again first.
    """
    await _written(sink, tmp_path, ("stdout", b"last\n", 1.0))
    ended = end_kind()
    waits_after = 1 if shared else 2
    asked = 0

    async def is_finished() -> bool:
        nonlocal asked
        asked += 1
        done = ended.is_set()
        if asked == waits_after:
            ended.set()  # the end lands between this answer and the wait
        return done

    with anyio.fail_after(1.5):
        async with anyio.create_task_group() as group:
            got = [
                line
                async for line in iter_log_lines(
                    tmp_path,
                    should_tail=True,
                    is_finished=is_finished,
                    finished_event=ended,
                    watch_hub=WatchHub(group) if shared else None,
                )
            ]
            group.cancel_scope.cancel()
    assert got == ["last\n"] and asked == waits_after


class _HubFollower:
    """A follower of ``directory``'s stdout on a shared watch, run in ``group``."""

    def __init__(self, group: TaskGroup, directory: Path, end: anyio.Event | EndSignal) -> None:
        self.got: list[str] = []
        self.ended = anyio.Event()
        group.start_soon(self._follow, WatchHub(group), directory, end)

    async def _follow(self, hub: WatchHub, directory: Path, end: anyio.Event | EndSignal) -> None:
        async for line in iter_log_lines(
            directory, stream="stdout", should_tail=True, finished_event=end, watch_hub=hub
        ):
            self.got.append(line)
        self.ended.set()

    async def lines(self, count: int) -> None:
        """Until the follower got ``count`` lines."""
        while len(self.got) < count:  # noqa: ASYNC110 - the follower's lines: no event
            await anyio.sleep(0.01)


@pytest.mark.anyio
@pytest.mark.parametrize("end_kind", [anyio.Event, EndSignal])
async def test_a_follow_on_a_shared_watch_ends_as_its_end_is_set(
    sink: LogSink, tmp_path: Path, end_kind: type[anyio.Event | EndSignal]
) -> None:
    """A follower waiting on a shared watch (its backstop re-check is 30 s) wakes for new
    output and ends as soon as its end is set, with what was written before it. An
    ``EndSignal`` wakes its single wait by a callback, an ``anyio.Event`` through a task."""
    log = await _written(sink, tmp_path, ("stdout", b"first\n", 1.0))
    end = end_kind()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            follower = _HubFollower(group, tmp_path, end)
            await follower.lines(1)
            sink.write(log, "stdout", b"second\n", 2.0)
            await sink.flush()
            await follower.lines(2)
            sink.write(log, "stdout", b"last\n", 3.0)
            await sink.flush()
            await follower.lines(3)
            await anyio.sleep(0.1)  # waiting again, for a change or its end
            end.set()
            with anyio.fail_after(5):  # far below the shared watch's 30 s re-check
                await follower.ended.wait()
            group.cancel_scope.cancel()
    assert follower.got == ["first\n", "second\n", "last\n"]


@pytest.mark.anyio
async def test_a_follower_on_a_shared_watch_hears_only_its_own_file(
    sink: LogSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It watches the file it reads, once it exists, not the replica's directory: output
    to the other stream (and the combined log and index that come with it) wakes
    nobody, where a directory watch got three events for every chunk written.
    Before the file exists, its creation in the directory moves the watch to it."""
    heard: list[str] = []
    subscribe = WatchHub.subscribe

    def counting(self: WatchHub, path: Path, token: int, listener: Any, *rest: Any) -> int | None:
        def heard_by(event: Any) -> None:
            heard.append(path.name)
            listener(event)

        return subscribe(self, path, token, heard_by, *rest)

    monkeypatch.setattr(WatchHub, "subscribe", counting)
    log = sink.open(tmp_path)
    end = EndSignal()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            follower = _HubFollower(group, tmp_path, end)
            await anyio.sleep(0.2)  # watching the directory: stdout.log is not there yet
            sink.write(log, "stdout", b"first\n", 1.0)
            await sink.flush()
            await follower.lines(1)
            # The follower moves its watch to the file right after: wait until it did.
            stdout_inode = (tmp_path / "stdout.log").stat().st_ino
            while watched_inodes() != [stdout_inode]:  # noqa: ASYNC110 - kernel state
                await anyio.sleep(0.01)
            heard.clear()
            for k in range(20):
                sink.write(log, "stderr", b"noise %d\n" % k, 2.0 + k)
                await sink.flush()
            sink.write(log, "stdout", b"second\n", 30.0)
            await sink.flush()
            await follower.lines(2)
            end.set()
            await follower.ended.wait()
            group.cancel_scope.cancel()  # the hub's reader
    assert follower.got == ["first\n", "second\n"]
    assert heard and set(heard) == {"stdout.log"}, heard
    assert len(heard) <= 4, heard  # the one write of "second" (modify, close), no noise


@pytest.mark.anyio
async def test_the_read_pace_lets_bursts_through_and_never_falls_behind_slower_lines() -> None:
    """A follower's reads: a burst of two at once, then one per ``PACE_S``; reads
    ``PACE_S`` and more apart are never delayed, also right after a delayed one (a
    minimum gap after each read, as first written, kept lines 50 ms apart 25 ms late)."""
    pace = reader._Pace()

    async def took() -> float:
        started = anyio.current_time()
        await pace.take(None)
        return anyio.current_time() - started

    assert await took() < 0.01 and await took() < 0.01  # the burst
    assert await took() >= reader.PACE_S * 0.8  # then the pace
    waited = []
    for _ in range(5):
        await anyio.sleep(reader.PACE_S * 1.2)
        waited.append(await took())
    assert max(waited) < 0.01, waited
    ended = anyio.Event()
    ended.set()
    started = anyio.current_time()
    for _ in range(4):  # the output is over: the last reads go at once, tokens or not
        await pace.take(ended)
    assert anyio.current_time() - started < 0.01
    assert pace.delay() > 0


@pytest.mark.anyio
async def test_a_follow_on_a_shared_watch_watches_before_its_first_read(
    sink: LogSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output that lands right after the follower's first read, before it waits, wakes it
    at once (its shared watch's backstop re-check is 30 s): the watch was in place before
    that read. With the file there, the start makes no hop to look for it (``_wanted``),
    where a thousand followers started together each paid for one, and a re-read.

    The landing is forced by wrapping the real read (a timing no real writer gives on
    demand); the write itself goes through the real sink."""
    log = await _written(sink, tmp_path, ("stdout", b"first\n", 1.0))
    real_read, reads = reader._read, 0

    async def read_then_write(file: Any, path: Path, size: int = reader._CHUNK) -> bytes:
        nonlocal reads
        data = await real_read(file, path, size)
        reads += 1
        if reads == 1:
            sink.write(log, "stdout", b"right after\n", 2.0)
            await sink.flush()
        return data

    looked = 0
    real_wanted = reader._Watcher._wanted

    def counted_wanted(self: Any) -> Any:
        nonlocal looked
        looked += 1
        return real_wanted(self)

    monkeypatch.setattr(reader, "_read", read_then_write)
    monkeypatch.setattr(reader._Watcher, "_wanted", counted_wanted)
    end = EndSignal()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            follower = _HubFollower(group, tmp_path, end)
            with anyio.fail_after(5):  # far below the 30 s re-check
                await follower.lines(2)
            end.set()
            await follower.ended.wait()
            group.cancel_scope.cancel()
    assert follower.got == ["first\n", "right after\n"]
    assert looked == 0


@pytest.mark.anyio
@pytest.mark.parametrize("exists", ["directory", "nothing"])
async def test_a_follow_on_a_shared_watch_picks_up_a_file_created_later(
    sink: LogSink, tmp_path: Path, exists: str
) -> None:
    """Whether the replica's directory is there when the follow starts (watched at once,
    on the loop) or not (its nearest parent, found off the loop), the file's creation
    and each later line reach the follower by themselves, long before the re-checks."""
    directory = tmp_path / "app" / "role" / "0"
    if exists == "directory":
        directory.mkdir(parents=True)
    end = EndSignal()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            follower = _HubFollower(group, directory, end)
            await anyio.sleep(0.2)  # waiting: nothing to read yet
            log = sink.open(directory)
            sink.write(log, "stdout", b"hello\n", 1.0)
            await sink.flush()
            with anyio.fail_after(1.5):  # the re-check without a complete watch is 2 s
                await follower.lines(1)
            sink.write(log, "stdout", b"bye\n", 2.0)
            await sink.flush()
            with anyio.fail_after(1.5):
                await follower.lines(2)
            end.set()
            await follower.ended.wait()
            group.cancel_scope.cancel()
    assert follower.got == ["hello\n", "bye\n"]


@pytest.mark.anyio
async def test_a_caller_that_never_pauses_still_lets_the_loop_turn(
    sink: LogSink, tmp_path: Path
) -> None:
    """The lines of one read came in one turn of the loop to a caller whose awaits did not
    pause (a server's send while its socket takes the bytes): 100,000 short lines held the
    loop, and everything else on it, from the first line to the last."""
    count = 100_000
    await _written(sink, tmp_path, ("stdout", b"x\n" * count, 1.0))
    turns = 0
    reading = True

    async def ticker() -> None:
        nonlocal turns
        while reading:
            turns += 1
            await anyio.lowlevel.checkpoint()

    got = 0
    first = 0  # the ticker's turns when the first line came (the reads' hops let it run)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async for _ in iter_log_lines(tmp_path, stream="stdout"):
            got += 1
            if got == 1:
                first = turns
        reading = False
    assert got == count
    # Between the first line and the last: every line is in the first read.
    assert turns - first >= count // reader.LINES_PER_TURN - 1, turns - first
