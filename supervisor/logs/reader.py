"""Reading a replica's log files back as filtered async line streams.

Speed comes from never handling a line alone in Python until it is yielded:
files are read in 1 MiB chunks through aiofiles (one open file per follower,
each read in a worker thread), complete lines are cut, dated, decoded and split
as whole runs, and the regex runs through ``filter`` in C. A file that does not
exist yet is simply empty. Log files are only ever appended to, never replaced,
so the file a follower opened is the one it reads to the end.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import re
import time
from bisect import bisect_right
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiofiles
import anyio
import anyio.lowlevel
from aiofiles.threadpool.binary import AsyncFileIO
from asyncinotify import Event, Inotify, Mask

from supervisor.errors import BackendError, Problem, SpecError
from supervisor.logs.inotify_close import close_inotify
from supervisor.logs.lines import MAX_LINE_BYTES, LineSplitter, split_decoded
from supervisor.logs.timestamps import (
    COMBINED_ID,
    FILE_NAMES,
    INDEX_NAME,
    STDERR_ID,
    STDOUT_ID,
    TimestampIndex,
)
from supervisor.logs.watch import FILE_WATCH_MASK, WATCH_MASK, EndSignal, WatchHub

__all__ = [
    "LogQuery",
    "Stream",
    "check_log_query",
    "epoch_or_problem",
    "iter_log_lines",
    "parse_streams",
]

_CHUNK = 1 << 20
# Inotify can be missing (instance limit reached, network file systems);
# this bounds how late a follower notices changes then.
_RECHECK_S = 2.0
# With a working shared watch, events are trusted: the re-check is only a backstop.
_HUB_RECHECK_S = 30.0
# How long after ``until`` output stamped before it may still be on its way
# through the sink's queue to the file.
_UNTIL_GRACE_S = 2.0
# A wake-up for ``until`` lands this much after it, so the clock reads it as passed.
_CLOCK_STEP_S = 0.01

PACE_S = 0.05
"""A follower reads about this often at most (in a burst, ``_PACE_BURST`` reads at once).
Each read is a hop to a worker thread (aiofiles), and a replica that prints a line every
10 ms woke its follower, and cost the host a hop, 100 times a second: with 100 such
followers the host's loop did little else. Lines that come faster are read together;
lines that come slower are each read at once."""
_PACE_BURST = 2.0

LINES_PER_TURN = 512
"""The event loop gets a turn after this many lines given without a pause. One read of
the file (1 MiB: half a million short lines) otherwise came in one turn of the loop to
a caller whose own awaits did not pause (a web server's send while its socket takes the
bytes): a stream of a long log held the loop, and a service's shutdown, for seconds."""

Finished = anyio.Event | EndSignal
"""What tells a follower its replica's output is over (see ``EndSignal``)."""


class Stream(enum.StrEnum):
    """Which of a replica's outputs to read."""

    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


_STREAM_IDS = {Stream.STDOUT: STDOUT_ID, Stream.STDERR: STDERR_ID, Stream.COMBINED: COMBINED_ID}


def parse_streams(value: Stream | str | None) -> Stream:
    """The stream a user asked for; None means both interleaved (``combined``)."""
    problems: list[Problem] = []
    found = _stream(value, problems)
    if found is None:
        raise SpecError(problems, context="invalid log query")
    return found


def _stream(value: Stream | str | None, problems: list[Problem]) -> Stream | None:
    if value is None:
        return Stream.COMBINED
    if isinstance(value, Stream):
        return value
    try:
        return Stream(value.strip().lower())
    except (ValueError, AttributeError):
        allowed = ", ".join(s.value for s in Stream)
        problems.append(
            Problem("streams", f"unsupported log stream {value!r}; expected one of: {allowed}")
        )
        return None


@dataclass(frozen=True, slots=True)
class LogQuery:
    """What to read of a replica's output, checked: every problem named at once."""

    stream: Stream
    pattern: re.Pattern[str] | None
    since: float | None
    until: float | None


def check_log_query(
    stream: Stream | str | None,
    regex: str | re.Pattern[str] | None,
    since: datetime | float | None,
    until: datetime | float | None,
    k: object = 0,
) -> LogQuery:
    """The query, or one ``SpecError`` naming each bad part (``streams``, ``regex``,
    ``since``, ``until``, ``k``): checked before anything is read, or any app looked up."""
    problems: list[Problem] = []
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        # ``1.0 == 1`` found the replica, then its directory "1.0" held nothing: no lines.
        problems.append(Problem("k", f"must be a replica index (an int >= 0), not {k!r}"))
    selected = _stream(stream, problems)
    pattern = _compile(regex, problems)
    since_at, until_at = _window(since, until, problems)
    if problems or selected is None:
        raise SpecError(problems, context="invalid log query")
    return LogQuery(selected, pattern, since_at, until_at)


def iter_log_lines(
    directory: Path,
    *,
    stream: Stream | str = Stream.COMBINED,
    regex: str | re.Pattern[str] | None = None,
    since: datetime | float | None = None,
    until: datetime | float | None = None,
    should_tail: bool = False,
    is_finished: Callable[[], Awaitable[bool]] | None = None,
    extra_watch_dirs: Sequence[Path] = (),
    finished_event: Finished | None = None,
    watch_hub: WatchHub | None = None,
) -> AsyncGenerator[str, None]:
    """Lines of one replica's log, each with its ``\\n`` (a final unterminated one without).

    A line longer than ``MAX_LINE_BYTES`` comes as several pieces of at most
    that size, the last with the ``\\n``; joined, they are the line.

    Arguments are checked here, before the first line is asked for, so a bad
    stream name, regex or time fails at the call (one ``SpecError``, a ``ValueError``).

    * ``should_tail=False``: stop at the current end of the file, yielding a
      trailing partial line as it is.
    * ``should_tail=True``: follow the file. It ends once ``is_finished()``
      (or, without it, ``finished_event``) said True *before* a read that
      then drained the file, so output written just before the end is never
      lost. A partial last line is held back until its ``\\n`` or the end.
      Without either signal it follows until the caller closes it.
    * ``regex``: kept lines are those where ``re.search`` finds it; the line
      is searched with its ``\\n``, so ``$`` still anchors at the line end.
    * ``since``/``until``: epoch seconds or datetimes (naive means local
      time); a line is kept when ``since <= t <= until``, both inclusive,
      where ``t`` is when its first byte arrived (the ``at`` the sink was
      given; in ``combined``, where lines are written whole, when the line
      was complete). Bytes the index does not cover yet count as arriving
      now. The iterator ends early once a line newer than ``until`` is seen,
      or, when following, once the clock passed ``until`` by 2 s and the
      file is drained (the wall clock is assumed not to step back).
    * ``watch_hub``: share one inotify instance with other followers (there
      are only 128 per user); without it each follower opens its own.

    Waiting for data uses inotify on ``directory`` and ``extra_watch_dirs``
    (nearest existing parents while they do not exist), ``finished_event``
    and a re-check every 2 s for file systems inotify does not see. Closing
    the iterator early (``aclose()``) releases everything.
    """
    query = check_log_query(stream, regex, since, until)
    return _follow(
        _Query(
            directory=Path(directory),
            stream=query.stream,
            pattern=query.pattern,
            since=query.since,
            until=query.until,
            should_tail=should_tail,
            is_finished=is_finished,
            extra_watch_dirs=tuple(Path(d) for d in extra_watch_dirs),
            finished_event=finished_event,
            watch_hub=watch_hub,
        )
    )


@dataclass(frozen=True, slots=True)
class _Query:
    directory: Path
    stream: Stream
    pattern: re.Pattern[str] | None
    since: float | None
    until: float | None
    should_tail: bool
    is_finished: Callable[[], Awaitable[bool]] | None
    extra_watch_dirs: tuple[Path, ...]
    finished_event: Finished | None
    watch_hub: WatchHub | None

    @property
    def path(self) -> Path:
        return self.directory / FILE_NAMES[_STREAM_IDS[self.stream]]

    @property
    def clock_end(self) -> float | None:
        """When ``finished`` is true by the clock alone: anything later is newer than until."""
        return None if self.until is None else self.until + _UNTIL_GRACE_S

    async def wait_for_change(self, watcher: _Watcher) -> None:
        """The watcher's wait, bounded by ``clock_end``.

        A quiet replica wakes its follower by no event: without the bound it
        noticed ``until`` only at the watch's 30 s backstop.
        """
        end = self.clock_end
        if end is None:  # the usual follow: no cancel scope per wait
            await watcher.wait(self.finished_event)
            return
        with anyio.move_on_after(max(0.0, end - time.time()) + _CLOCK_STEP_S):
            await watcher.wait(self.finished_event)

    async def finished(self) -> bool:
        end = self.clock_end
        if end is not None and time.time() > end:
            return True  # anything still to come is newer than until
        if self.finished_event is not None and self.finished_event.is_set():
            return True
        if self.is_finished is not None:
            return await self.is_finished()
        return False


def _compile(
    regex: str | re.Pattern[str] | None, problems: list[Problem]
) -> re.Pattern[str] | None:
    if isinstance(regex, re.Pattern) and not isinstance(regex.pattern, str):
        problems.append(Problem("regex", f"must match text, not bytes: {regex!r}"))
        return None
    if regex is None or isinstance(regex, re.Pattern):
        return regex
    if not isinstance(regex, str):
        problems.append(Problem("regex", f"must be a str or a compiled pattern, not {regex!r}"))
        return None
    try:
        return re.compile(regex)
    except (re.error, OverflowError) as exc:  # a repeat count beyond the engine's limit
        problems.append(Problem("regex", f"invalid regex {regex!r}: {exc}"))
        return None


def _window(
    since: datetime | float | None, until: datetime | float | None, problems: list[Problem]
) -> tuple[float | None, float | None]:
    """``since``/``until`` as epoch seconds; a problem named for each bad one.

    ``nan`` compares false with every time, so it would silently select
    nothing; a window that ends before it starts would too.
    """
    since_at = epoch_or_problem(since, "since", problems)
    until_at = epoch_or_problem(until, "until", problems)
    if since_at is not None and until_at is not None and since_at > until_at:
        problems.append(Problem("since", "must not be later than until"))
    return since_at, until_at


def epoch_or_problem(
    value: datetime | float | None, name: str, problems: list[Problem]
) -> float | None:
    """``value`` (a datetime, naive meaning local time, or epoch seconds) as epoch
    seconds; None, and a problem named ``name``, for what is no time (``nan`` too)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        # A naive datetime's timestamp() is taken in local time, as documented;
        # near datetime.min or .max that conversion leaves the calendar (ValueError)
        # or the platform's time range (OverflowError, OSError).
        try:
            return value.timestamp()
        except (ValueError, OverflowError, OSError) as e:
            problems.append(Problem(name, f"{value!r} is not a time this machine can use: {e}"))
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(Problem(name, f"must be a datetime or epoch seconds, not {value!r}"))
        return None
    try:
        seconds = float(value)  # an int too large for a float (10**400) cannot be a time
    except OverflowError:
        problems.append(Problem(name, f"must be a time, got {value!r}"))
        return None
    if math.isnan(seconds):
        problems.append(Problem(name, "must be a time, got nan"))
        return None
    return seconds


async def _follow(query: _Query) -> AsyncGenerator[str, None]:
    path = query.path
    dated = _Dater(query) if query.since is not None or query.until is not None else None
    splitter = LineSplitter(MAX_LINE_BYTES)  # a huge line comes in pieces, never whole
    line_start = 0  # file offset of the first byte the splitter still holds
    read_to = 0  # file offset where the next read starts
    watcher: _Watcher | None = None
    file: AsyncFileIO | None = None
    pace = _Pace()
    unpaused = 0  # lines given since the loop last had a turn
    try:
        while True:
            # Asked before reading: True here means nothing can be appended
            # after the read below, so draining the file is the end.
            final = not query.should_tail or await query.finished()
            if watcher is None and not final:
                # Watched before the first read, so nothing written after that read
                # goes unseen; where it can, without ``prepare``'s hop.
                watcher = _new_watcher(query)
                watcher.watch_at_start()
            if file is None:
                file = await _open(path)
            # This pass reads to the end the file has now, not to whatever end it has
            # when the reads catch up: a replica writing faster than the caller took
            # lines kept a read to the "current end" (or a follow after its end was
            # signalled) going for as long as it wrote.
            end: int | None = None
            more = False  # stopped at ``end``: there may be more already
            while file is not None:
                want = _CHUNK if end is None else min(_CHUNK, end - read_to)
                data = await _read(file, path, want)
                read_to += len(data)
                for block in splitter.feed_runs(data):
                    lines = await _select(query, dated, block, line_start)
                    line_start += len(block)
                    for line in lines:
                        yield line
                        unpaused += 1
                        if unpaused >= LINES_PER_TURN:
                            unpaused = 0
                            await anyio.lowlevel.checkpoint()
                    if dated is not None and dated.past_until:
                        return
                if len(data) < want:
                    break  # the file's end
                if end is None:  # a big backlog: one look at the size, not one per read
                    end = await _size(file, path)
                if read_to >= end or (not final and _is_set(query.finished_event)):
                    more = True  # and, once the end was signalled, the size then is the end
                    break
                unpaused = 0  # the next read is a turn
            if final:
                rest = splitter.flush()
                if rest:
                    for line in await _select(query, dated, rest, line_start):
                        yield line
                return
            if more:
                continue  # ask ``finished`` again, then read on without a wait
            if watcher is None:
                watcher = _new_watcher(query)
            if await watcher.prepare():
                continue  # a new watch: anything before it may have gone unseen
            # An end set since `final` was asked ends the wait at once (every watcher's
            # `wait` sees it): the next pass drains and returns.
            await query.wait_for_change(watcher)
            await pace.take(query.finished_event)
    finally:
        if watcher is not None:
            await watcher.aclose()
        if file is not None:
            with anyio.CancelScope(shield=True):
                await file.close()


def _is_set(event: Finished | None) -> bool:
    return event is not None and event.is_set()


def _new_watcher(query: _Query) -> _Watcher:
    filename = FILE_NAMES[_STREAM_IDS[query.stream]]
    if query.watch_hub is not None:
        return _HubWatcher(query.watch_hub, query.directory, filename, query.extra_watch_dirs)
    return _Watcher(query.directory, filename, query.extra_watch_dirs)


class _Pace:
    """A token bucket: one read per ``PACE_S`` on average, ``_PACE_BURST`` at once.

    A bucket, not a minimum gap after the last read: a read delayed by a gap
    moved the next gap with it, and lines 50 ms apart then came 25 ms late
    each, for ever.
    """

    def __init__(self) -> None:
        self._tokens = _PACE_BURST
        self._at = anyio.current_time()

    def delay(self) -> float:
        """Seconds until the next read may go (0: now), the tokens refilled until now."""
        now = anyio.current_time()
        self._tokens = min(_PACE_BURST, self._tokens + (now - self._at) / PACE_S)
        self._at = now
        return max(0.0, (1.0 - self._tokens) * PACE_S)

    async def take(self, finished: Finished | None) -> None:
        """Wait for a token, unless the output is over (then the last read goes at once)."""
        wait = self.delay()
        if wait > 0 and (finished is None or not finished.is_set()):
            await anyio.sleep(wait)
            self.delay()  # refilled while asleep
        self._tokens = max(0.0, self._tokens - 1.0)


async def _open(path: Path) -> AsyncFileIO | None:
    """The log file, opened for reading; None while it does not exist (yet)."""
    try:
        return await aiofiles.open(path, "rb", buffering=0)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise BackendError(f"cannot read log {path}: {exc}", transient=False) from exc


async def _read(file: AsyncFileIO, path: Path, size: int = _CHUNK) -> bytes:
    """Up to ``size`` bytes from where the last read ended; b"" at the (current) end."""
    try:
        return await file.read(size)
    except OSError as exc:
        raise BackendError(f"cannot read log {path}: {exc}", transient=False) from exc


async def _size(file: AsyncFileIO, path: Path) -> int:
    """The file's size now (a stat of the open file, in a worker thread)."""
    try:
        return (await anyio.to_thread.run_sync(os.fstat, file.fileno())).st_size
    except OSError as exc:
        raise BackendError(f"cannot read log {path}: {exc}", transient=False) from exc


async def _select(query: _Query, dated: _Dater | None, block: bytes, start: int) -> list[str]:
    """The lines of ``block`` (which begins at file offset ``start``) that pass the filters."""
    if dated is None:
        runs = [block]
    else:
        runs = await dated.keep(block, start)
    lines: list[str] = []
    for run in runs:
        # One decode per run: b"\n" never occurs inside a UTF-8 sequence, so
        # replacing errors run-wide equals replacing them line by line.
        text = split_decoded(run.decode("utf-8", errors="replace"))
        if query.pattern is not None:
            text = list(filter(query.pattern.search, text))
        lines.extend(text)
    return lines


class _Dater:
    """Keeps the runs of lines whose time lies in [since, until].

    Lines starting under one index record share its time, so a run is kept
    or dropped whole; Python only loops per record, not per line.
    """

    def __init__(self, query: _Query) -> None:
        self._since = query.since
        self._until = query.until
        self._stream_id = _STREAM_IDS[query.stream]
        self._index_path = query.directory / INDEX_NAME
        self._index: TimestampIndex | None = None
        self.past_until = False

    async def keep(self, block: bytes, start: int) -> list[bytes]:
        index = await self._covering(block, start)
        ends, times = index.records(self._stream_id)
        first = bisect_right(ends, start)
        last = bisect_right(ends, start + _last_line_start(block))
        if last < len(ends):
            # Whole-block verdicts first: with one record per line, looping
            # over records would cost per line what the rest avoids.
            span = times[first : last + 1]
            verdict = self._verdict(min(span), max(span))
            if verdict is not None:
                return [block] if verdict else []
        return self._keep_by_record(block, start, ends, times, first)

    def _verdict(self, earliest: float, latest: float) -> bool | None:
        """True/False when every time in [earliest, latest] is kept/dropped; None if mixed."""
        if self._until is not None and earliest > self._until:
            self.past_until = True
            return False
        if self._since is not None and latest < self._since:
            return False
        if (self._since is None or earliest >= self._since) and (
            self._until is None or latest <= self._until
        ):
            return True
        return None

    def _keep_by_record(
        self,
        block: bytes,
        start: int,
        ends: Sequence[int],
        times: Sequence[float],
        i: int,
    ) -> list[bytes]:
        kept: list[bytes] = []
        pos = 0
        size = len(block)
        while pos < size:
            if i < len(ends):
                at = times[i]
                cut = _first_line_start_at(block, ends[i] - start)
            else:
                # Still not indexed after a re-read: the writer is behind, so
                # this arrived about now.
                at = time.time()
                cut = size
            if self._until is not None and at > self._until:
                self.past_until = True
                break
            if self._since is None or at >= self._since:
                kept.append(block[pos:cut])
            pos = cut
            i = bisect_right(ends, start + pos, lo=i)
        return kept

    async def _covering(self, block: bytes, start: int) -> TimestampIndex:
        """The index, re-read once if it does not reach the last line of ``block`` yet."""
        index = self._index
        last_line = start + _last_line_start(block)
        if index is None or index.covered(self._stream_id) <= last_line:
            if index is None:
                index = self._index = TimestampIndex()
            await anyio.to_thread.run_sync(_refresh, index, self._index_path)
        return index


def _last_line_start(block: bytes) -> int:
    """Offset in ``block`` of its last line (whether or not that ends in ``\\n``)."""
    return block.rfind(b"\n", 0, len(block) - 1) + 1


def _first_line_start_at(block: bytes, pos: int) -> int:
    """Offset of the first line of ``block`` that starts at or after ``pos``."""
    if pos <= 0:
        return 0
    if pos >= len(block):
        return len(block)
    newline = block.find(b"\n", pos - 1)
    return len(block) if newline < 0 else newline + 1


def _refresh(index: TimestampIndex, path: Path) -> None:
    try:
        index.refresh(path)
    except OSError as exc:
        raise BackendError(f"cannot read log index {path}: {exc}", transient=False) from exc


@dataclass(frozen=True, slots=True)
class _Interest:
    """What one watch's events mean to a follower.

    ``names`` None: every entry matters (a state directory). Names in
    ``structural`` are the next step towards a directory or file that does
    not exist yet: when they change, the watches must move. ``file``: the
    watch is on the followed file itself, whose events carry no name: each
    is a change, or (the file went away) a reason to look again.
    """

    names: frozenset[str] | None
    structural: frozenset[str]
    file: bool = False

    def merged(self, other: _Interest) -> _Interest:
        names = None if self.names is None or other.names is None else self.names | other.names
        return _Interest(names, self.structural | other.structural, self.file or other.file)

    @property
    def mask(self) -> Mask:
        return FILE_WATCH_MASK if self.file else WATCH_MASK


_FILE_INTEREST = _Interest(None, frozenset(), file=True)
_FILE_CHANGED = Mask.MODIFY | Mask.CLOSE_WRITE


class _Watcher:
    """Wakes a follower when its file, or a directory it cares about, may have changed.

    Events are hints, never data: after any wake the follower re-reads, so a
    lost or coalesced event costs at most one safety re-check. Directories
    that do not exist yet are waited for by watching their nearest existing
    parent for the next path component. Only this object's inotify
    descriptor outlives a wait; ``close`` releases it.
    """

    def __init__(self, directory: Path, filename: str, extra_dirs: Sequence[Path]) -> None:
        self._set_targets(directory, filename, extra_dirs)
        self._interest: dict[int, _Interest] = {}
        self._dirty = True
        self._inotify: Inotify | None
        try:
            self._inotify = Inotify()
            self._inotify.sync_timeout = 0  # sync_get only drains what is queued
        except OSError:
            self._inotify = None

    async def prepare(self) -> bool:
        """Re-point watches after a structural change; True if the watch set changed."""
        if self._inotify is None or not self._dirty:
            return False
        self._dirty = False
        # Resolving parents and adding watches are path syscalls: off the loop.
        return await anyio.to_thread.run_sync(self._sync_watches, self._inotify)

    def watch_at_start(self) -> None:
        """Watch what ``prepare`` would, without its hop, where that is simple.

        Only a shared watch does it (its watches are added on the loop), and only
        when the replica's directory is all there is to watch. Otherwise, or when
        neither the file nor its directory can be watched, ``prepare`` does it.
        """

    async def wait(self, finished_event: Finished | None) -> None:
        """Until a relevant change, ``finished_event`` (at once if it is set), or the re-check."""
        with anyio.move_on_after(_RECHECK_S) as timer:
            async with anyio.create_task_group() as group:
                if self._inotify is not None:
                    group.start_soon(self._next_change, self._inotify, group.cancel_scope)
                if finished_event is not None:
                    group.start_soon(_wait_event, finished_event, group.cancel_scope)
                if self._inotify is None and finished_event is None:
                    await anyio.sleep_forever()
        if timer.cancelled_caught:
            self._dirty = True  # maybe a directory appeared unseen

    async def aclose(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            await close_inotify(inotify)

    async def _next_change(self, inotify: Inotify, scope: anyio.CancelScope) -> None:
        while not self._relevant(await inotify.get()):
            pass
        # Coalesce a burst of writes into one wake.
        while (event := inotify.sync_get()) is not None:
            self._relevant(event)
        scope.cancel()

    def _set_targets(self, directory: Path, filename: str, extra_dirs: Sequence[Path]) -> None:
        everything = _Interest(None, frozenset())
        self._targets: dict[Path, _Interest] = dict.fromkeys(extra_dirs, everything)
        # In the replica directory only the file being read matters.
        own_name = frozenset({filename})
        self._own = _Interest(own_name, frozenset())
        self._targets[directory] = self._targets.get(directory, self._own).merged(self._own)
        self._file = directory / filename
        # Before the file exists: its creation is what moves the watch (to the file).
        self._awaiting_file = _Interest(own_name, own_name)

    def _relevant(self, event: Event) -> bool:
        watch = event.watch
        interest = None if watch is None else self._interest.get(watch.wd)
        if interest is not None and interest.file:
            if not event.mask & _FILE_CHANGED:  # deleted, moved, or its watch dropped
                self._dirty = True
            return True
        if interest is None or event.name is None:
            # Queue overflow, a stale watch, or a watched directory went away.
            self._dirty = True
            return True
        name = str(event.name)
        if name in interest.structural:
            self._dirty = True
            return True
        return interest.names is None or name in interest.names

    def _wanted(self) -> tuple[dict[Path, _Interest], bool]:
        """What to watch now, and whether every target directory exists. Blocks.

        The followed file itself once it exists: a watch of its directory gets
        an event (and a name to decode) for every file of the replica, three
        per line written. Until then its directory, where its creation moves
        the watch; a directory still to come is waited for in its nearest
        existing ancestor.
        """
        wanted: dict[Path, _Interest] = {}
        complete = True
        for target, interest in self._targets.items():
            found: Path | None = _nearest_dir(target)
            if found is None:
                complete = False
                continue
            if found != target:
                complete = False
                step = frozenset({target.relative_to(found).parts[0]})
                interest = _Interest(step, step)
            elif interest == self._own:  # the replica's directory, for the file alone
                if self._file.is_file():
                    found, interest = self._file, _FILE_INTEREST
                else:
                    interest = self._awaiting_file
            wanted[found] = wanted[found].merged(interest) if found in wanted else interest
        return wanted, complete

    def _sync_watches(self, inotify: Inotify) -> bool:
        wanted, complete = self._wanted()
        by_wd: dict[int, _Interest] = {}
        for path, interest in wanted.items():
            try:
                watch = inotify.add_watch(path, interest.mask)
            except OSError:
                continue  # gone again or not watchable: the re-check covers it
            by_wd[watch.wd] = interest
        for watch in inotify.watches:
            if watch.wd not in by_wd:
                with contextlib.suppress(OSError):
                    inotify.rm_watch(watch)
        changed = by_wd != self._interest
        self._interest = by_wd
        self._look_again_if_moving(changed, complete)
        return changed

    def _look_again_if_moving(self, changed: bool, complete: bool) -> None:
        """Waiting for a directory to appear, look again while the watches still move.

        ``mkdir -p`` of a replica's directory is three creations: the next one can
        come between the look and the watch added for it, unseen, and only the
        re-check (2 s) would find it.
        """
        if changed and not complete:
            self._dirty = True


class _HubWatcher(_Watcher):
    """The same wake-ups as ``_Watcher``, through a ``WatchHub`` shared with other followers."""

    def __init__(
        self, hub: WatchHub, directory: Path, filename: str, extra_dirs: Sequence[Path]
    ) -> None:
        self._set_targets(directory, filename, extra_dirs)
        self._interest = {}
        self._dirty = True
        self._inotify = None
        self._hub = hub
        self._token = WatchHub.new_token()
        self._changed = anyio.Event()
        self._watching = True
        self._complete = False

    async def prepare(self) -> bool:
        if not self._dirty:
            return False
        self._dirty = False
        wanted, complete = await anyio.to_thread.run_sync(self._wanted)
        return self._watch(wanted, complete)

    def watch_at_start(self) -> None:
        # The hop cost the host 0.3-0.7 ms of CPU per follower when a thousand
        # started together, and it was followed by a re-read (another hop).
        if len(self._targets) != 1:
            return  # directories of the app to find too: prepare resolves them all
        # The file itself once it exists, else its directory for the file's creation:
        # what ``_wanted`` chooses, asked of inotify instead of by two stats.
        for path, interest in (
            (self._file, _FILE_INTEREST),
            (self._file.parent, self._awaiting_file),
        ):
            if self._watch({path: interest}, complete=True):
                self._dirty = False
                return

    def _watch(self, wanted: dict[Path, _Interest], complete: bool) -> bool:
        """Subscribe to ``wanted`` in place of the watches held; True if they changed."""
        # Watching an ancestor means waiting for a directory to appear: keep re-checking.
        self._complete = complete
        by_wd: dict[int, _Interest] = {}
        for path, interest in wanted.items():
            wd = self._hub.subscribe(path, self._token, self._on_event, interest.mask)
            if wd is not None:
                by_wd[wd] = interest
        for wd in self._interest:
            if wd not in by_wd:
                self._hub.unsubscribe(wd, self._token)
        changed = by_wd != self._interest
        self._interest = by_wd
        self._watching = bool(by_wd)
        self._look_again_if_moving(changed, complete)
        return changed

    def _wake(self) -> None:
        self._changed.set()

    def _on_event(self, event: Event | None) -> None:
        if event is None:
            self._dirty = True
            self._changed.set()
        elif self._relevant(event):
            self._changed.set()

    async def wait(self, finished_event: Finished | None) -> None:
        healthy = self._watching and self._complete
        with anyio.move_on_after(_HUB_RECHECK_S if healthy else _RECHECK_S) as timer:
            if isinstance(finished_event, anyio.Event):
                async with anyio.create_task_group() as group:
                    group.start_soon(_wait_event, self._changed, group.cancel_scope)
                    group.start_soon(_wait_event, finished_event, group.cancel_scope)
            else:
                # One event to wait for: the end, if any, sets it too (no task per wait).
                if finished_event is not None:
                    finished_event.listen(self._wake)
                try:
                    await self._changed.wait()
                finally:
                    if finished_event is not None:
                        finished_event.unlisten(self._wake)
        if self._changed.is_set():
            self._changed = anyio.Event()
        if timer.cancelled_caught and not healthy:
            self._dirty = True

    async def aclose(self) -> None:
        for wd in self._interest:
            self._hub.unsubscribe(wd, self._token)
        self._interest = {}


def _nearest_dir(path: Path) -> Path | None:
    """``path`` or its closest existing ancestor directory."""
    current = path
    while not current.is_dir():
        if current.parent == current:
            return None
        current = current.parent
    return current


async def _wait_event(event: Finished, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
