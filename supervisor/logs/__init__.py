"""Replica output: written off the loop by ``LogSink``, read back by ``iter_log_lines``.

A replica's log directory holds ``stdout.log`` and ``stderr.log`` (raw bytes
as received), ``combined.log`` (both, interleaved by whole lines in arrival
order) and ``timestamps.bin`` (when each run of bytes arrived). This package
knows nothing of backends or state machines; backends feed it bytes and
callers read lines.
"""

from supervisor.logs.lines import LineSplitter, decode_line
from supervisor.logs.reader import (
    LogQuery,
    Stream,
    check_log_query,
    epoch_or_problem,
    iter_log_lines,
    parse_streams,
)
from supervisor.logs.sink import LogSink, ReplicaLog, StreamName
from supervisor.logs.timestamps import TimestampIndex
from supervisor.logs.watch import EndSignal, WatchHub

__all__ = [
    "EndSignal",
    "LineSplitter",
    "LogQuery",
    "LogSink",
    "ReplicaLog",
    "Stream",
    "StreamName",
    "TimestampIndex",
    "WatchHub",
    "check_log_query",
    "decode_line",
    "epoch_or_problem",
    "iter_log_lines",
    "parse_streams",
]
