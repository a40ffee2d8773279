"""The files of one replica's log directory, written from a single thread or process.

Shared by ``LogSink``'s writer thread and by ``pump.py`` (which runs beside a
replica on a cluster node), so both produce byte-for-byte the same layout:
``stdout.log`` and ``stderr.log`` exactly as received, ``combined.log`` by
whole lines in arrival order, ``timestamps.bin`` saying when bytes arrived.
Imports nothing outside the standard library and its sibling modules
``lines`` and ``timestamps``, so it can be shipped to nodes without the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from supervisor.logs.lines import LineSplitter
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

    __slots__ = ("_fds", "_sizes", "directory", "ended", "index", "last_at", "splitters")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self.index = IndexAppender(directory / INDEX_NAME)
        self.splitters: dict[str, LineSplitter] = {
            "stdout": LineSplitter(),
            "stderr": LineSplitter(),
        }
        # combined.log gets a stream's last partial line only at end_stream;
        # it is dated by the arrival of its last byte, not by the EOF.
        self.last_at: dict[str, float] = {"stdout": 0.0, "stderr": 0.0}
        self.ended: set[str] = set()

    def append(self, stream_id: int, data: bytes, at: float) -> None:
        """Append to a stream's file and queue the index record for it."""
        fd = self._fds.get(stream_id)
        if fd is None:
            fd = os.open(self.directory / FILE_NAMES[stream_id], _OPEN_FLAGS, 0o644)
            self._fds[stream_id] = fd
            # Offsets continue where a previous attempt (or process) stopped.
            self._sizes[stream_id] = os.fstat(fd).st_size
        write_all(fd, data)
        self._sizes[stream_id] += len(data)
        self.index.add(stream_id, self._sizes[stream_id], at)

    def record(self, stream: StreamName, data: bytes, at: float) -> None:
        """Append a chunk of one stream, and to combined.log every line it completes."""
        self.append(STREAM_IDS[stream], data, at)
        self.last_at[stream] = at
        lines = self.splitters[stream].feed_block(data)
        if lines:
            self.append(COMBINED_ID, lines, at)
        self.index.write_pending()

    def flush_partial(self, stream: StreamName) -> None:
        """The stream ended: its unterminated last line goes to combined.log as it is."""
        rest = self.splitters[stream].flush()
        if rest:
            self.append(COMBINED_ID, rest, self.last_at[stream])
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
