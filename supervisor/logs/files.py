"""The files of one replica's log directory, written from a single thread or process.

Shared by ``LogSink``'s writer thread and by ``pump.py`` (which runs beside a
replica on a cluster node), so both produce byte-for-byte the same layout:
``stdout.log`` and ``stderr.log`` exactly as received, ``combined.log`` by
whole lines in arrival order, ``timestamps.bin`` saying when bytes arrived.

Lines never run into each other: an attempt's last line without a newline
gets one added before the next attempt's output lands in the same file, and
in ``combined.log`` before the next line of any stream. Lines longer than
``MAX_LINE_BYTES`` go to ``combined.log`` in pieces (see ``lines``).
Imports nothing outside the standard library and its sibling modules
``lines`` and ``timestamps``, so it can be shipped to nodes without the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from supervisor.logs.lines import MAX_LINE_BYTES, LineSplitter
from supervisor.logs.timestamps import (
    COMBINED_ID,
    FILE_NAMES,
    INDEX_NAME,
    STDERR_ID,
    STDOUT_ID,
    IndexAppender,
    write_all,
)

__all__ = ["STREAM_IDS", "ReplicaFiles", "StreamName"]

StreamName = Literal["stdout", "stderr"]

STREAM_IDS: Final[dict[str, int]] = {"stdout": STDOUT_ID, "stderr": STDERR_ID}
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class ReplicaFiles:
    """Writer-thread state of one log directory: descriptors, offsets, partial lines."""

    __slots__ = (
        "_fds",
        "_fresh",
        "_open_line",
        "_sizes",
        "directory",
        "ended",
        "index",
        "last_at",
        "splitters",
    )

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        # Per file: does it end inside a line (no final newline)? Survives closing
        # the descriptors (only this object writes the files); read from disk once.
        self._open_line: dict[int, bool] = {}
        # Streams whose next write starts a new attempt (a new object is a new one).
        self._fresh: set[int] = {STDOUT_ID, STDERR_ID}
        self.index = IndexAppender(directory / INDEX_NAME)
        self.splitters: dict[str, LineSplitter] = {
            "stdout": LineSplitter(MAX_LINE_BYTES),
            "stderr": LineSplitter(MAX_LINE_BYTES),
        }
        # combined.log gets a stream's last partial line only at end_stream;
        # it is dated by the arrival of its last byte, not by the EOF.
        self.last_at: dict[str, float] = {"stdout": 0.0, "stderr": 0.0}
        self.ended: set[str] = set()

    def append(self, stream_id: int, data: bytes, at: float, *, separate: bool = False) -> None:
        """Append to a stream's file and queue the index record for it.

        ``separate``: if the file ends inside a line, end that line first, so
        ``data`` starts a line of its own.
        """
        fd = self._fds.get(stream_id)
        if fd is None:
            path = self.directory / FILE_NAMES[stream_id]
            fd = os.open(path, _OPEN_FLAGS, 0o644)
            self._fds[stream_id] = fd
            # Offsets continue where a previous attempt (or process) stopped.
            self._sizes[stream_id] = os.fstat(fd).st_size
            if stream_id not in self._open_line:
                self._open_line[stream_id] = _ends_inside_a_line(path, self._sizes[stream_id])
        if separate and self._open_line[stream_id]:
            data = b"\n" + data
        write_all(fd, data)
        self._open_line[stream_id] = not data.endswith(b"\n")
        self._sizes[stream_id] += len(data)
        self.index.add(stream_id, self._sizes[stream_id], at)

    def record(self, stream: StreamName, data: bytes, at: float) -> None:
        """Append a chunk of one stream, and to combined.log every line it completes."""
        stream_id = STREAM_IDS[stream]
        # The first output of an attempt must not continue the last one's line.
        try:
            self.append(stream_id, data, at, separate=stream_id in self._fresh)
        except OSError:
            # The chunk is lost, and with it the rest of the line whose start the
            # splitter holds: that start must not reach combined.log at the stream's
            # end, a second failure (on a full disk) after the exit was told.
            self.splitters[stream].flush()
            raise
        self._fresh.discard(stream_id)
        self.last_at[stream] = at
        for run in self.splitters[stream].feed_runs(data):
            # A run without its newline is a piece of an over-long line: a line here.
            self.append(COMBINED_ID, run if run.endswith(b"\n") else run + b"\n", at, separate=True)
        self.index.write_pending()

    def flush_partial(self, stream: StreamName) -> None:
        """The stream ended: its unterminated last line goes to combined.log as it is."""
        rest = self.splitters[stream].flush()
        self._fresh.add(STREAM_IDS[stream])
        if rest:
            self.append(COMBINED_ID, rest, self.last_at[stream], separate=True)
            self.index.write_pending()

    def close_files(self) -> None:
        """Close every descriptor, even if some close fails; raise the first failure."""
        first: OSError | None = None
        fds = list(self._fds.values())
        self._fds.clear()
        self._sizes.clear()
        self.index.discard_pending()
        for fd in fds:
            try:
                os.close(fd)
            except OSError as exc:
                first = first or exc
        try:
            self.index.close()
        except OSError as exc:
            first = first or exc
        if first is not None:
            raise first


def _ends_inside_a_line(path: Path, size: int) -> bool:
    """Whether a file of ``size`` bytes lacks a final newline (its last byte is read)."""
    if size == 0:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, 1, size - 1) != b"\n"
    finally:
        os.close(fd)
