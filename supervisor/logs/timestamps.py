"""When each byte of a log arrived: a fixed-record, append-only side index.

This module also names the files of a replica's log directory, the one
layout writer and readers must agree on.

Putting times into the log text would change what the program printed;
keeping them beside it leaves ``stdout.log`` byte-exact. Records are fixed
size so a reader can pick up exactly where it stopped and ignore a record
the writer is still in the middle of appending.

A record ``(stream, end, at)`` says: the bytes of ``stream`` up to offset
``end`` (exclusive) that no earlier record covered arrived at wall time ``at``.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "COMBINED_ID",
    "FILE_NAMES",
    "INDEX_NAME",
    "RECORD",
    "STDERR_ID",
    "STDOUT_ID",
    "IndexAppender",
    "TimestampIndex",
    "write_all",
]

INDEX_NAME = "timestamps.bin"
STDOUT_ID = 0
STDERR_ID = 1
COMBINED_ID = 2
_STREAM_COUNT = 3

#: The file of each stream id inside a replica's log directory.
FILE_NAMES: Final[dict[int, str]] = {
    STDOUT_ID: "stdout.log",
    STDERR_ID: "stderr.log",
    COMBINED_ID: "combined.log",
}

#: stream id, end offset in that stream's file after the write, time.time() of arrival.
RECORD = struct.Struct("<BQd")

_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until done: a short write (disk nearly full) must not drop bytes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class IndexAppender:
    """Writer-thread side: buffers one item's records and appends them in one call.

    Blocking on purpose: it only ever runs on the sink's writer thread.
    """

    __slots__ = ("_buffer", "_fd", "_path")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._buffer = bytearray()

    def add(self, stream_id: int, end: int, at: float) -> None:
        self._buffer += RECORD.pack(stream_id, end, at)

    def write_pending(self) -> None:
        """Append the buffered records; called after the data they describe is written."""
        if not self._buffer:
            return
        if self._fd is None:
            self._fd = os.open(self._path, _OPEN_FLAGS, 0o644)
        data = bytes(self._buffer)
        self._buffer.clear()
        write_all(self._fd, data)

    def discard_pending(self) -> None:
        self._buffer.clear()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class TimestampIndex:
    """Reader side: arrival time of any byte offset, by binary search.

    Loading reads a file and is blocking; async callers run ``load`` and
    ``refresh`` in a worker thread. ``refresh`` is incremental so following a
    growing log never re-parses what it already has.
    """

    __slots__ = ("_consumed", "_ends", "_times")

    def __init__(self) -> None:
        self._ends: tuple[list[int], ...] = tuple([] for _ in range(_STREAM_COUNT))
        self._times: tuple[list[float], ...] = tuple([] for _ in range(_STREAM_COUNT))
        self._consumed = 0

    @classmethod
    def load(cls, path: Path) -> TimestampIndex:
        """The index stored at ``path``; empty when the file does not exist (yet)."""
        index = cls()
        index.refresh(path)
        return index

    def refresh(self, path: Path) -> bool:
        """Read the records appended since the last call; True when there were any.

        A trailing partial record (the writer is mid-append) is left for the
        next call. A missing file is simply an index with nothing in it yet.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            size = os.fstat(fd).st_size
            whole = (size - self._consumed) // RECORD.size * RECORD.size
            if whole <= 0:
                return False
            raw = os.pread(fd, whole, self._consumed)
        finally:
            os.close(fd)
        usable = len(raw) // RECORD.size * RECORD.size
        self.feed(raw[:usable])
        return usable > 0

    def feed(self, raw: bytes) -> None:
        """Add whole records (``len(raw)`` must be a multiple of ``RECORD.size``)."""
        ends = self._ends
        times = self._times
        for stream_id, end, at in RECORD.iter_unpack(raw):
            if stream_id < _STREAM_COUNT:
                ends[stream_id].append(end)
                times[stream_id].append(at)
        self._consumed += len(raw)

    def time_at(self, stream: int, offset: int) -> float | None:
        """When the byte at ``offset`` of ``stream`` arrived; None if not indexed yet."""
        ends = self._ends[stream]
        i = bisect_right(ends, offset)
        if i >= len(ends):
            return None
        return self._times[stream][i]

    def covered(self, stream: int) -> int:
        """How many leading bytes of ``stream`` have a known arrival time."""
        ends = self._ends[stream]
        return ends[-1] if ends else 0

    def records(self, stream: int) -> tuple[Sequence[int], Sequence[float]]:
        """The raw (end offsets, times) of ``stream``, for callers walking many lines."""
        return self._ends[stream], self._times[stream]
