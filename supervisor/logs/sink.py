"""Persisting replica output without ever blocking the event loop.

Backends read pipes on the loop; disk writes can stall for milliseconds (or
much longer on a busy or networked disk). ``LogSink`` hands every chunk to one
writer thread through an unbounded queue, so the loop only pays for a
``put``. One thread per sink, not per replica: a thousand replicas must not
mean a thousand threads, and a single consumer keeps arrival order, which is
what ``combined.log`` interleaves by.

The queue is unbounded in items but not in effect: readers of replica pipes
ask ``room()`` before each read, which waits while more than
``QUEUED_BYTES_HIGH`` bytes are queued. A replica writing faster than the disk
takes its output is slowed to the disk's pace (its pipe fills, its writes
block) instead of growing the supervisor's memory without limit.

Files are opened lazily and closed once both streams of an attempt ended, so
idle replicas hold no descriptors; running ones are capped by an LRU of open
replicas because a process has far fewer descriptors than a cluster has
replicas.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import contextlib
import errno
import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio

from supervisor.errors import BackendError
from supervisor.logs.files import STREAM_IDS, ReplicaFiles, StreamName
from supervisor.logs.timestamps import (
    COMBINED_ID,
    FILE_NAMES,
    INDEX_NAME,
    RECORD,
    STDERR_ID,
    STDOUT_ID,
)

__all__ = ["LogSink", "ReplicaLog", "StreamName", "attempt_marks"]

_STREAMS: Final[tuple[StreamName, ...]] = ("stdout", "stderr")

QUEUED_BYTES_HIGH: Final = 8 << 20
"""Bytes waiting for the writer thread above which ``room()`` makes readers wait."""
QUEUED_BYTES_LOW: Final = 2 << 20
"""Readers waiting for room are released once the backlog fell to this."""

LAZY_PUSH_S: Final = 0.02
"""How long an item nobody waits for (the end of a stream with no line left open,
which only closes files) waits for the next hand-over to the writer thread.

Handed over in the turn it came, as the other items are, it woke the writer right
as the replica's pipes closed, that is as its exit report was coming in: the
writer's turn of the GIL came first, and every one-replica ``wait`` took 0.1-0.3
ms longer (measured 2026-12-05)."""

EXIT_DRAIN_S: Final = 10.0
"""At interpreter exit, how long each sink left open may take to write what it still holds."""

_OPEN_SINKS: weakref.WeakSet[LogSink] = weakref.WeakSet()
"""Sinks whose writer thread runs: drained at exit by ``_drain_open_sinks``."""


@dataclass(eq=False, slots=True)
class ReplicaLog:
    """Where one replica's output goes.

    All file state lives on the writer thread, keyed by directory, so two
    handles for one directory share offsets and line buffers instead of
    corrupting each other. The handle only keeps, on the loop's side, what
    ``flush`` needs to know whether it has anything to wait for.
    """

    directory: Path
    content_through: int = field(default=0, repr=False)
    """The queue position of the last item through this handle that changes its files'
    content: once the writer handled that many items, ``flush`` has nothing to wait for."""
    open_lines: set[StreamName] = field(default_factory=set, repr=False)
    """Streams whose last chunk left a line open: their end completes it in combined.log."""


@dataclass(frozen=True, slots=True)
class _Open:
    directory: Path


@dataclass(frozen=True, slots=True)
class _Write:
    directory: Path
    stream: StreamName
    data: bytes
    at: float


@dataclass(frozen=True, slots=True)
class _End:
    directory: Path
    stream: StreamName


@dataclass(frozen=True, slots=True)
class _Barrier:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class _Marked:
    """The sizes of a directory's files where an attempt's output starts."""

    sizes: dict[int, int]
    index: int


@dataclass(frozen=True, slots=True)
class _Mark:
    directory: Path
    at: _Marked | None = None


@dataclass(frozen=True, slots=True)
class _Rewind:
    directory: Path


class _Retimer:
    """Arrival times of rewound output, for the same bytes written again.

    A rewritten attempt's bytes keep the times the index gave them when they
    first arrived (matched by offset from the mark), not the time of the rewrite.
    """

    __slots__ = ("ends", "times", "written")

    def __init__(self, raw: bytes) -> None:
        self.ends: dict[int, list[int]] = {sid: [] for sid in STREAM_IDS.values()}
        self.times: dict[int, list[float]] = {sid: [] for sid in STREAM_IDS.values()}
        self.written: dict[int, int] = dict.fromkeys(STREAM_IDS.values(), 0)
        for stream_id, end, at in RECORD.iter_unpack(raw):
            if stream_id in self.ends:
                self.ends[stream_id].append(end)
                self.times[stream_id].append(at)

    def at(self, stream_id: int, size: int, fallback: float) -> float:
        """When the first of the next ``size`` bytes of ``stream_id`` first arrived."""
        ends, offset = self.ends[stream_id], self.written[stream_id]
        self.written[stream_id] = offset + size
        i = bisect.bisect_right(ends, offset)
        return self.times[stream_id][i] if i < len(ends) else fallback


class _Stop:
    """Sentinel: everything before it is written, then the thread exits."""


_STOP: Final = _Stop()
_Item = _Open | _Write | _End | _Mark | _Rewind | _Barrier | _Stop


class _Writer:
    """Everything the writer thread owns; deliberately holds no reference to the sink.

    Keeping the sink out lets a forgotten, garbage-collected sink stop its
    thread through a finalizer instead of keeping the interpreter alive.
    """

    def __init__(self, max_open_replicas: int) -> None:
        # An item, or the items one turn of the loop queued (see ``LogSink._submit``).
        self.queue: queue.SimpleQueue[_Item | list[_Item]] = queue.SimpleQueue()
        self._replicas: dict[Path, ReplicaFiles] = {}
        self._open: OrderedDict[Path, None] = OrderedDict()
        self._max_open = max_open_replicas
        # Bytes of _Write items queued and not yet written, and who waits for room.
        self._backlog_lock = threading.Lock()
        self._backlog = 0
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._stopped = False  # the thread ended: nobody will ever make room again
        self._error_lock = threading.Lock()
        # The first failure per directory: one app's full disk is not another's news.
        self._errors: dict[Path, OSError | Exception] = {}
        # Per directory with a kept failure: bytes of output that did not reach its files.
        self._lost: dict[Path, int] = {}
        # Per directory: where its current attempt starts, and times of rewound output.
        self._marks: dict[Path, _Marked] = {}
        self._retimers: dict[Path, _Retimer] = {}
        # Items handled so far; written by this thread only, after each item is done.
        self.handled = 0

    def run(self) -> None:
        while True:
            got = self.queue.get()
            if isinstance(got, _Stop):
                break
            for item in got if isinstance(got, list) else (got,):
                self._handle(item)
                self.handled += 1
                if isinstance(item, _Write):
                    self.written(len(item.data))
        self._shutdown()
        self.release_waiters()

    def queued(self, size: int) -> None:
        with self._backlog_lock:
            self._backlog += size

    def written(self, size: int) -> None:
        with self._backlog_lock:
            self._backlog -= size
            if self._backlog > QUEUED_BYTES_LOW or not self._room_waiters:
                return
            waiters, self._room_waiters = self._room_waiters, []
        for loop, future in waiters:
            _set_later(loop, future)

    def release_waiters(self) -> None:
        with self._backlog_lock:
            self._stopped = True
            waiters, self._room_waiters = self._room_waiters, []
        for loop, future in waiters:
            _set_later(loop, future)

    def has_room(self) -> bool:
        with self._backlog_lock:
            return self._backlog <= QUEUED_BYTES_HIGH or self._stopped

    def wait_for_room(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """None when the backlog is small; else a future set once it shrank."""
        with self._backlog_lock:
            if self._backlog <= QUEUED_BYTES_HIGH or self._stopped:
                return None
            future: asyncio.Future[None] = loop.create_future()
            self._room_waiters.append((loop, future))
            return future

    def take_error(self, directory: Path | None = None) -> BackendError | None:
        """The kept failure of ``directory`` (of any directory when None), forgetting it.

        Its message says how many bytes of output were lost since it happened.
        """
        with self._error_lock:
            if directory is None:
                if not self._errors:
                    return None
                directory = next(iter(self._errors))
            exc = self._errors.pop(directory, None)
            lost = self._lost.pop(directory, 0)
        if exc is None:
            return None
        error = BackendError(_lost_output(directory, exc, lost), transient=False)
        error.__cause__ = exc
        return error

    def _record(self, exc: Exception, directory: Path, lost: int = 0) -> None:
        with self._error_lock:
            self._errors.setdefault(directory, exc)
            self._lost[directory] = self._lost.get(directory, 0) + lost

    def _handle(self, item: _Item) -> None:
        if isinstance(item, _Barrier):
            _resolve_later(item)
            return
        if isinstance(item, _Stop):
            return
        try:
            if isinstance(item, _Open):
                os.makedirs(item.directory, exist_ok=True)
            elif isinstance(item, _Write):
                self._write(item)
            elif isinstance(item, _Mark):
                self._mark(item.directory, item.at)
            elif isinstance(item, _Rewind):
                self._rewind(item.directory)
            else:
                self._end(item)
        except Exception as exc:
            # Never let the thread die: the loop would queue forever into a void.
            # A chunk whose write failed counts as lost whole (a part may have landed).
            self._record(exc, item.directory, len(item.data) if isinstance(item, _Write) else 0)
            self._close_quietly(item.directory)

    def _state(self, directory: Path) -> ReplicaFiles:
        state = self._replicas.get(directory)
        if state is None:
            state = self._replicas[directory] = ReplicaFiles(directory)
        return state

    def _touch(self, directory: Path) -> None:
        """Mark ``directory`` as about to hold descriptors; close the least recent past the cap."""
        self._open[directory] = None
        self._open.move_to_end(directory)
        while len(self._open) > self._max_open:
            oldest, _ = self._open.popitem(last=False)
            victim = self._replicas.get(oldest)
            if victim is not None:
                try:
                    victim.close_files()
                except OSError as exc:
                    self._record(exc, oldest)

    def _write(self, item: _Write) -> None:
        state = self._state(item.directory)
        # Output after an end is a restarted attempt: the stream is live again.
        state.ended.discard(item.stream)
        self._touch(item.directory)
        at = item.at
        retimer = self._retimers.get(item.directory)
        if retimer is not None:
            at = retimer.at(STREAM_IDS[item.stream], len(item.data), at)
        state.record(item.stream, item.data, at)

    @staticmethod
    def _sizes(directory: Path) -> _Marked:
        sizes = {}
        for stream_id, name in FILE_NAMES.items():
            try:
                sizes[stream_id] = os.stat(directory / name).st_size
            except FileNotFoundError:
                sizes[stream_id] = 0
        try:
            index = os.stat(directory / INDEX_NAME).st_size
        except FileNotFoundError:
            index = 0
        return _Marked(sizes, index - index % RECORD.size)

    def _mark(self, directory: Path, at: _Marked | None) -> None:
        """Everything queued before is written (one thread): the files' sizes are the mark."""
        self._retimers.pop(directory, None)
        self._marks[directory] = at if at is not None else self._sizes(directory)

    def _rewind(self, directory: Path) -> None:
        """Drop what the files got since the mark; the next writes start the attempt over.

        Partial lines held for combined.log go too: they are part of what is dropped.
        """
        mark = self._marks.get(directory)
        if mark is None:
            raise ValueError(f"no attempt was marked in {directory} to rewind to")
        self._open.pop(directory, None)
        state = self._replicas.pop(directory, None)
        if state is not None:
            state.close_files()
        index = directory / INDEX_NAME
        raw = b""
        with contextlib.suppress(FileNotFoundError):
            with open(index, "rb") as f:
                f.seek(mark.index)
                raw = f.read()
            os.truncate(index, mark.index)
        raw = raw[: len(raw) - len(raw) % RECORD.size]
        retimer = _Retimer(raw)
        for stream_id, size in mark.sizes.items():
            path = directory / FILE_NAMES[stream_id]
            with contextlib.suppress(FileNotFoundError):
                os.truncate(path, size)
            ends = retimer.ends.get(stream_id)
            if ends is not None:
                # Offsets from the mark, as the rewritten bytes will count them.
                ends[:] = [end - size for end in ends]
        self._retimers[directory] = retimer

    def _end(self, item: _End) -> None:
        state = self._state(item.directory)
        self._flush_partial(state, item.stream)
        state.ended.add(item.stream)
        if len(state.ended) == len(STREAM_IDS):
            self._open.pop(item.directory, None)
            del self._replicas[item.directory]
            state.close_files()

    def _flush_partial(self, state: ReplicaFiles, stream: StreamName) -> None:
        if state.splitters[stream].pending_size:
            self._touch(state.directory)
            state.flush_partial(stream)

    def _close_quietly(self, directory: Path) -> None:
        """After a failed write offsets are unknown; reopening re-reads them from disk."""
        self._open.pop(directory, None)
        state = self._replicas.get(directory)
        if state is not None:
            with contextlib.suppress(OSError):
                state.close_files()

    def _shutdown(self) -> None:
        """Closing mid-attempt still completes combined.log with the partial lines."""
        for directory, state in list(self._replicas.items()):
            try:
                for stream in _STREAMS:
                    if stream not in state.ended:
                        self._flush_partial(state, stream)
                state.close_files()
            except Exception as exc:
                self._record(exc, directory)
                self._close_quietly(directory)
        self._replicas.clear()
        self._open.clear()


_MARK_KEYS: Final = {STDOUT_ID: "stdout", STDERR_ID: "stderr", COMBINED_ID: "combined"}


def attempt_marks(directory: Path) -> dict[str, int]:
    """Blocking: the sizes of ``directory``'s files (``stdout``, ``stderr``, ``combined``,
    ``index``), for ``mark_attempt(at=...)`` in a process that did not write them."""
    sizes = _Writer._sizes(directory)
    return {**{name: sizes.sizes[sid] for sid, name in _MARK_KEYS.items()}, "index": sizes.index}


_FULL: Final = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up"}


def _lost_output(directory: Path, exc: Exception, lost: int) -> str:
    """What a replica is told: that output was lost, why, and how much."""
    code = exc.errno if isinstance(exc, OSError) else None
    why = _FULL.get(code) if code is not None else None
    # Counted by the chunks whose write failed: a part of the first may have landed.
    amount = f"about {lost} bytes of output" if lost else "output"
    head = f"{amount} lost: " if lost or why else ""
    if why:
        return f"{head}{why} (writing logs to {directory} failed: {exc})"
    return f"{head}writing logs to {directory} failed: {exc}"


def _resolve_later(barrier: _Barrier) -> None:
    _set_later(barrier.loop, barrier.future)


def _set_later(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    # The loop may be gone (closed without waiting); then nobody is waiting.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_set_done, future)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LogSink:
    """Appends replica output to log files from one lazily started writer thread.

    ``write`` and ``end_stream`` are for the event loop thread and never block.
    Write failures (disk full, directory removed) are kept per directory and
    raised, once, as ``BackendError(transient=False)`` by the next ``flush``
    of that directory (or of any, for a ``flush()`` without one; or by
    ``close``/``aclose`` when no flush came), so they are never silent and
    never reported to a replica whose own files are fine. The message says
    how much output was lost meanwhile, and when the disk was full, says so.

    Call ``aclose`` (or ``close`` outside async code). A sink left open
    still ends well: garbage collected, it stops its thread; alive at
    interpreter exit, what it holds is written then (``EXIT_DRAIN_S`` at
    most). The thread is a daemon so that a sink never closed cannot hold the
    exit for ever, as a non-daemon one did: ``threading`` joins those before
    any ``atexit`` hook could tell them to stop.
    """

    def __init__(self, *, max_open_replicas: int = 256) -> None:
        if max_open_replicas < 1:
            raise ValueError("max_open_replicas must be at least 1")
        self._writer = _Writer(max_open_replicas)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._submitted = 0  # items queued so far
        # Items of this turn of the loop, handed to the thread together at its end: one
        # wake-up of the writer per turn, not per item (a gang's exits end 2 streams each).
        self._batch: list[_Item] = []
        self._push_soon = False  # a hand-over of the batch at this turn's end is scheduled
        self._push_later = False  # one after ``LAZY_PUSH_S`` is (for lazy items alone)
        self._barrier: tuple[int, asyncio.Future[None]] | None = None  # the latest, and when

    def open(self, directory: Path, *, made: bool = False) -> ReplicaLog:
        """A handle for ``directory``; the writer thread creates it, unless ``made``.

        ``made``: the caller created it already (an app's store makes every
        replica's directory). Nothing is queued then: for a thousand replicas,
        a thousand no-op ``makedirs`` in the writer thread cost the loop's
        thread tens of milliseconds in turns of the GIL, during the submit.
        """
        log = ReplicaLog(directory)
        if not made:
            self._submit_content(log, _Open(directory))
        return log

    def write(self, log: ReplicaLog, stream: StreamName, data: bytes, at: float) -> None:
        """Queue ``data`` that arrived on ``stream`` at wall time ``at``."""
        if stream not in STREAM_IDS:
            raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
        if data:
            self._writer.queued(len(data))
            try:
                self._submit_content(log, _Write(log.directory, stream, bytes(data), at))
            except BaseException:
                self._writer.written(len(data))
                raise
            if data.endswith(b"\n"):
                log.open_lines.discard(stream)
            else:
                log.open_lines.add(stream)

    def mark_attempt(self, log: ReplicaLog, at: Mapping[str, int] | None = None) -> None:
        """An attempt's output starts here: ``rewind`` drops what was written after it.

        ``at``: where it started, as ``attempt_marks`` gave it (another process marked
        it), instead of the files' sizes once everything queued before is written.
        """
        marked = None
        if at is not None:
            sizes = {sid: int(at[name]) for sid, name in _MARK_KEYS.items()}
            marked = _Marked(sizes, int(at["index"]))
        self._submit_content(log, _Mark(log.directory, marked))

    def rewind(self, log: ReplicaLog) -> None:
        """Drop ``log``'s output written since its ``mark_attempt``, to write it again.

        For a copy found wrong once the whole output can be had (an engine's
        follow stream lost or reordered bytes): the next writes replace it,
        keeping the arrival times the dropped bytes had. Readers following
        the files meanwhile are not told; readers that wait for the copy's
        end (``log_iter`` after ``wait``) see only the rewritten output.
        A failure is kept and raised by ``flush`` like a failed write.
        """
        self._submit_content(log, _Rewind(log.directory))

    async def room(self) -> None:
        """Return once the writer's backlog is small enough to queue more; usually at once.

        Readers of replica output call this before each read, so a replica
        that writes faster than the disk is slowed down, not buffered in memory.
        """
        if self._closed or self._thread is None:
            return
        future = self._writer.wait_for_room(asyncio.get_running_loop())
        if future is not None:
            await future

    def has_room(self) -> bool:
        """Whether ``room`` would return at once: for readers that stop reading otherwise."""
        return self._closed or self._thread is None or self._writer.has_room()

    def end_stream(self, log: ReplicaLog, stream: StreamName) -> None:
        """The pipe of ``stream`` hit EOF for this attempt.

        Its unterminated last line goes to combined.log now; once both
        streams ended the replica's files are closed. Later writes (a
        restarted attempt) reopen them in append mode. After ``close`` this
        does nothing: closing already completed every partial line.
        """
        if stream not in STREAM_IDS:
            raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
        open_line = stream in log.open_lines
        # Without an open line it only closes files: nobody waits for that (``LAZY_PUSH_S``).
        # Without a thread nothing was ever queued, so no file is open: no thread is started
        # for it (a new thread on the way to ``wait``, for replicas that wrote nothing).
        queued = self._submit(
            _End(log.directory, stream), strict=False, start=False, lazy=not open_line
        )
        if queued and open_line:
            log.open_lines.discard(stream)
            log.content_through = self._submitted

    def flush_now(self, log: ReplicaLog | None = None) -> bool:
        """``flush(log)`` where it need not wait: False when it would wait for the writer.

        Written already: a replica's last line usually is by the time its exit is
        reported; its pipes' ends, queued at that moment, only close files unless
        a line was left open. No round trip to the writer thread on the way to ``wait``.
        """
        through = self._submitted if log is None else log.content_through
        if self._writer.handled < through:
            return False
        self._raise_pending(None if log is None else log.directory)
        return True

    async def flush(self, log: ReplicaLog | None = None) -> None:
        """Return once what was queued before the call is written (no fsync).

        With ``log``, what was queued through that handle and changes its files'
        content (closing them may come later); without, everything. Then raise
        the kept write failure of ``log``'s directory, or, without ``log``, of
        any directory.
        """
        if self.flush_now(log):
            return
        directory = None if log is None else log.directory
        loop = asyncio.get_running_loop()
        pending = self._barrier
        if pending is not None and pending[0] == self._submitted and not pending[1].done():
            # Nothing was queued since that barrier: many replicas ending at once
            # share one round trip to the writer thread.
            await asyncio.shield(pending[1])
            self._raise_pending(directory)
            return
        future: asyncio.Future[None] = loop.create_future()
        # Without a thread nothing was ever queued: no reason to start one.
        if self._submit(_Barrier(loop, future), strict=False, start=False):
            self._barrier = (self._submitted, future)
            await asyncio.shield(future)
        self._raise_pending(directory)

    def close(self) -> None:
        """Write everything queued, close all files, stop the thread. Blocks; idempotent."""
        thread = self._begin_close()
        if thread is not None:
            thread.join()
        self._raise_pending()

    async def aclose(self) -> None:
        """``close`` for async code: the wait for the thread happens off the loop."""
        thread = self._begin_close()
        if thread is not None and thread.is_alive():
            # run_sync only returns once join did, even if we are cancelled.
            await anyio.to_thread.run_sync(thread.join)
        self._raise_pending()

    async def __aenter__(self) -> LogSink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _submit(
        self, item: _Item, *, strict: bool = True, start: bool = True, lazy: bool = False
    ) -> bool:
        """Queue ``item``; False if it was not (closed and not ``strict``, or no thread).

        ``lazy``: nobody waits for it; it goes with the next hand-over, at the latest
        ``LAZY_PUSH_S`` from now.
        """
        with self._lock:
            if self._closed:
                if strict:
                    raise BackendError("the log sink is closed", transient=False)
                return False
            if self._thread is None:
                if not start:
                    return False
                thread = threading.Thread(
                    target=self._writer.run, name="asupervisor-log-writer", daemon=True
                )
                thread.start()
                self._thread = thread
                weakref.finalize(self, self._writer.queue.put, _STOP)
                _OPEN_SINKS.add(self)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not on a loop: straight to the thread, behind the batch
                self._push_locked()
                self._writer.queue.put(item)
            else:
                self._batch.append(item)
                self._schedule_push(loop, lazy)
            self._submitted += 1
            return True

    def _submit_content(self, log: ReplicaLog, item: _Item) -> None:
        """``_submit`` an item that changes ``log``'s files: its ``flush`` waits for it."""
        self._submit(item)
        log.content_through = self._submitted

    def _schedule_push(self, loop: asyncio.AbstractEventLoop, lazy: bool) -> None:
        """Hand the batch over at the end of this turn, or, for an item nobody waits for
        with no hand-over due, ``LAZY_PUSH_S`` from now."""
        if self._push_soon or (lazy and self._push_later):
            return
        if lazy:
            self._push_later = True
            loop.call_later(LAZY_PUSH_S, self._push)
        else:
            self._push_soon = True
            loop.call_soon(self._push)

    def _push(self) -> None:
        with self._lock:
            self._push_locked()

    def _push_locked(self) -> None:
        # A hand-over still scheduled finds nothing, or what came since: no harm either way.
        self._push_soon = self._push_later = False
        if self._batch:
            batch, self._batch = self._batch, []
            self._writer.queue.put(batch)

    def _begin_close(self) -> threading.Thread | None:
        with self._lock:
            _OPEN_SINKS.discard(self)
            if not self._closed:
                self._closed = True
                if self._thread is not None:
                    self._push_locked()
                    self._writer.queue.put(_STOP)
            return self._thread

    def _raise_pending(self, directory: Path | None = None) -> None:
        error = self._writer.take_error(directory)
        if error is not None:
            raise error


@atexit.register
def _drain_open_sinks() -> None:
    """Write out every sink still open at exit, then raise the first kept write failure.

    Runs after ``threading`` joined the non-daemon threads and before daemon
    ones are frozen, so the writers are still there to finish their queues.
    A failure raised here is printed by the interpreter, not lost.
    """
    sinks = list(_OPEN_SINKS)
    for sink in sinks:
        thread = sink._begin_close()
        if thread is not None:
            thread.join(EXIT_DRAIN_S)
    for sink in sinks:
        sink._raise_pending()
