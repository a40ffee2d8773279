"""LogSink: what lands on disk, when, and that nothing is left open."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from supervisor.errors import BackendError
from supervisor.logs import LogSink, TimestampIndex
from supervisor.logs import files as log_files
from supervisor.logs import sink as sink_module
from supervisor.logs.files import ReplicaFiles
from supervisor.logs.lines import MAX_LINE_BYTES
from supervisor.logs.sink import QUEUED_BYTES_HIGH, QUEUED_BYTES_LOW
from supervisor.logs.timestamps import COMBINED_ID, INDEX_NAME, RECORD, STDERR_ID, STDOUT_ID


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


def _read(directory: Path, name: str) -> bytes:
    return (directory / name).read_bytes()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.anyio
async def test_raw_streams_and_combined_by_whole_lines(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path / "r0")
    sink.write(log, "stdout", b"ab", 1.0)
    sink.write(log, "stderr", b"x\n", 2.0)
    sink.write(log, "stdout", b"c\n", 3.0)
    await sink.flush()
    directory = tmp_path / "r0"
    assert _read(directory, "stdout.log") == b"abc\n"
    assert _read(directory, "stderr.log") == b"x\n"
    assert _read(directory, "combined.log") == b"x\nabc\n"


@pytest.mark.anyio
async def test_timestamp_index_covers_every_byte(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"one\ntw", 10.0)
    sink.write(log, "stderr", b"err\n", 11.0)
    sink.write(log, "stdout", b"o\nthree\n", 12.0)
    await sink.flush()
    raw = _read(tmp_path, INDEX_NAME)
    assert len(raw) % RECORD.size == 0
    index = TimestampIndex.load(tmp_path / INDEX_NAME)
    for stream_id, name in ((STDOUT_ID, "stdout.log"), (STDERR_ID, "stderr.log")):
        size = len(_read(tmp_path, name))
        assert index.covered(stream_id) == size
        assert all(index.time_at(stream_id, offset) is not None for offset in range(size))
        assert index.time_at(stream_id, size) is None
    combined = _read(tmp_path, "combined.log")
    assert combined == b"one\nerr\ntwo\nthree\n"
    assert index.covered(COMBINED_ID) == len(combined)
    # stdout: "one\ntw" arrived at 10, "o\nthree\n" at 12.
    assert index.time_at(STDOUT_ID, 0) == 10.0
    assert index.time_at(STDOUT_ID, 5) == 10.0
    assert index.time_at(STDOUT_ID, 6) == 12.0
    # combined: lines are dated by the write that completed them.
    assert index.time_at(COMBINED_ID, 0) == 10.0
    assert index.time_at(COMBINED_ID, 4) == 11.0
    assert index.time_at(COMBINED_ID, 8) == 12.0


@pytest.mark.anyio
async def test_end_stream_flushes_the_partial_line(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"done\nno newline", 1.0)
    await sink.flush()
    assert _read(tmp_path, "combined.log") == b"done\n"
    sink.end_stream(log, "stdout")
    await sink.flush()
    assert _read(tmp_path, "combined.log") == b"done\nno newline"
    index = TimestampIndex.load(tmp_path / INDEX_NAME)
    assert index.time_at(COMBINED_ID, len(b"done\n")) == 1.0


@pytest.mark.anyio
async def test_restart_after_both_streams_ended_appends(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"first attempt\n", 1.0)
    sink.write(log, "stderr", b"oops", 1.5)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    sink.write(log, "stdout", b"second attempt\n", 2.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    await sink.flush()
    assert _read(tmp_path, "stdout.log") == b"first attempt\nsecond attempt\n"
    # The first attempt's unterminated stderr line ends before the second's output.
    assert _read(tmp_path, "combined.log") == b"first attempt\noops\nsecond attempt\n"
    index = TimestampIndex.load(tmp_path / INDEX_NAME)
    assert index.covered(STDOUT_ID) == len(b"first attempt\nsecond attempt\n")
    assert index.time_at(STDOUT_ID, len(b"first attempt\n")) == 2.0


@pytest.mark.anyio
async def test_attempts_lines_never_run_into_each_other(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"one\nno newline", 1.0)
    sink.end_stream(log, "stdout")
    sink.write(log, "stderr", b"err\n", 1.5)  # the same attempt's other stream, still open
    sink.end_stream(log, "stderr")
    sink.write(log, "stdout", b"next attempt\n", 2.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    await sink.flush()
    assert _read(tmp_path, "stdout.log") == b"one\nno newline\nnext attempt\n"
    assert _read(tmp_path, "combined.log") == b"one\nno newline\nerr\nnext attempt\n"
    # Another writer of the same directory (a later process) sees the open line on disk.
    other = LogSink()
    try:
        again = other.open(tmp_path)
        other.write(again, "stderr", b"tail", 3.0)
        other.end_stream(again, "stderr")
        other.write(again, "stderr", b"later process\n", 4.0)
        await other.flush()
    finally:
        await other.aclose()
    assert _read(tmp_path, "stderr.log") == b"err\ntail\nlater process\n"
    assert _read(tmp_path, "combined.log").endswith(b"next attempt\ntail\nlater process\n")


@pytest.mark.anyio
async def test_an_endless_line_is_cut_into_pieces_in_combined(
    sink: LogSink, tmp_path: Path
) -> None:
    log = sink.open(tmp_path)
    euro = "\u20ac".encode()  # 3 bytes: cuts must never split it
    data = b"a" + euro * MAX_LINE_BYTES
    for start in range(0, len(data), 65_536):
        sink.write(log, "stdout", data[start : start + 65_536], 1.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    await sink.flush()
    assert _read(tmp_path, "stdout.log") == data
    pieces = _read(tmp_path, "combined.log").split(b"\n")
    assert len(pieces) == 4  # three cut pieces and the unterminated rest
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= MAX_LINE_BYTES
    for piece in pieces:
        piece.decode()  # whole UTF-8 sequences in every piece


@pytest.mark.anyio
async def test_flush_waits_for_everything_queued_before(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    chunk = b"y" * 65_535 + b"\n"
    for i in range(400):  # 25 MiB: far more than the thread writes in no time
        sink.write(log, "stdout", chunk, float(i))
    await sink.flush()
    assert (tmp_path / "stdout.log").stat().st_size == 400 * len(chunk)
    assert (tmp_path / "combined.log").stat().st_size == 400 * len(chunk)
    index = TimestampIndex.load(tmp_path / INDEX_NAME)
    assert index.covered(COMBINED_ID) == 400 * len(chunk)


@pytest.mark.anyio
async def test_megabyte_line_in_many_chunks_stays_one_line(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    line = bytes(range(32, 127)) * 10_600 + b"\n"
    for start in range(0, len(line), 3000):
        sink.write(log, "stdout", line[start : start + 3000], 5.0)
        sink.write(log, "stderr", b"e\n", 6.0)
    await sink.flush()
    combined = _read(tmp_path, "combined.log")
    assert line in combined
    assert combined.count(b"\n") == 1 + combined.count(b"e\n")
    assert _read(tmp_path, "stdout.log") == line


@pytest.mark.anyio
async def test_write_error_surfaces_from_the_next_flush(sink: LogSink, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    broken = sink.open(blocker / "replica")
    sink.write(broken, "stdout", b"lost\n", 1.0)
    with pytest.raises(BackendError) as caught:
        await sink.flush()
    assert caught.value.transient is False
    assert isinstance(caught.value.__cause__, OSError)
    # Reported once; the thread survived and keeps writing other replicas.
    healthy = sink.open(tmp_path / "ok")
    sink.write(healthy, "stdout", b"fine\n", 2.0)
    await sink.flush()
    assert _read(tmp_path / "ok", "stdout.log") == b"fine\n"


@pytest.mark.anyio
async def test_a_write_error_is_reported_to_its_own_replica_only(
    sink: LogSink, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    broken = sink.open(blocker / "replica")
    healthy = sink.open(tmp_path / "ok")
    sink.write(broken, "stdout", b"lost\n", 1.0)
    sink.write(healthy, "stdout", b"fine\n", 2.0)
    await sink.flush(healthy)  # the other replica's failure is not this one's news
    with pytest.raises(BackendError, match="not-a-directory"):
        await sink.flush(broken)
    await sink.flush()  # reported once


@pytest.mark.anyio
async def test_directory_removed_under_the_sink_is_reported(sink: LogSink, tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    log = sink.open(directory)
    await sink.flush()
    directory.rmdir()
    sink.write(log, "stderr", b"where to?\n", 1.0)
    with pytest.raises(BackendError, match="gone"):
        await sink.flush()


@pytest.mark.anyio
async def test_close_is_idempotent_and_drains(tmp_path: Path) -> None:
    log_sink = LogSink()
    log = log_sink.open(tmp_path)
    log_sink.write(log, "stdout", b"partial", 1.0)
    await log_sink.aclose()
    await log_sink.aclose()
    log_sink.close()
    # Closing mid-attempt still completes combined.log.
    assert _read(tmp_path, "combined.log") == b"partial"
    with pytest.raises(BackendError):
        log_sink.write(log, "stdout", b"late\n", 2.0)
    log_sink.end_stream(log, "stdout")  # a pipe closing late is no error


def test_close_without_use_starts_nothing() -> None:
    log_sink = LogSink()
    log_sink.close()
    log_sink.close()


def _writer_threads() -> int:
    return sum(t.name == "asupervisor-log-writer" for t in threading.enumerate())


@pytest.mark.anyio
async def test_replicas_that_wrote_nothing_start_no_writer(tmp_path: Path) -> None:
    """Their streams' ends have no file to close: no thread is started for them (one
    used to be, in the same turn of the loop as the replica's exit report)."""
    before = _writer_threads()
    log_sink = LogSink()
    try:
        (tmp_path / "silent").mkdir()
        silent = log_sink.open(tmp_path / "silent", made=True)
        log_sink.end_stream(silent, "stdout")
        log_sink.end_stream(silent, "stderr")
        assert log_sink.flush_now(silent)
        await log_sink.flush()
        assert _writer_threads() == before
        # A later attempt that writes is written whole, and its ends close its files.
        fds = _open_fds()
        log_sink.write(silent, "stdout", b"second attempt\n", 2.0)
        log_sink.write(silent, "stderr", b"open", 2.5)
        await log_sink.flush()
        assert _writer_threads() == before + 1
        log_sink.end_stream(silent, "stdout")
        log_sink.end_stream(silent, "stderr")
        await log_sink.flush()
        assert _open_fds() == fds
        assert _read(tmp_path / "silent", "combined.log") == b"second attempt\nopen"
    finally:
        await log_sink.aclose()
    assert _writer_threads() == before


@pytest.mark.anyio
async def test_no_descriptors_left_once_streams_ended(sink: LogSink, tmp_path: Path) -> None:
    await sink.flush()  # the writer thread exists before counting
    before = _open_fds()
    logs = [sink.open(tmp_path / f"r{k}") for k in range(50)]
    for log in logs:
        sink.write(log, "stdout", b"out\n", 1.0)
        sink.write(log, "stderr", b"err", 1.0)
    await sink.flush()
    assert _open_fds() > before
    for log in logs:
        sink.end_stream(log, "stdout")
        sink.end_stream(log, "stderr")
    await sink.flush()
    assert _open_fds() == before
    assert _read(tmp_path / "r7", "combined.log") == b"out\nerr"


@pytest.mark.anyio
async def test_a_stream_ending_with_no_open_line_does_not_wake_the_writer_at_once(
    sink: LogSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such an end only closes files, and its pipes close as the replica's exit report
    comes in: woken then, the writer thread took the GIL before the report got it. It
    goes with the next hand-over (a flush, any write), at the latest ``LAZY_PUSH_S``
    later; an open line's end still goes at once (a flush waits for that line)."""
    await sink.flush()  # the writer thread exists before counting
    before = _open_fds()
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"whole line\n", 1.0)
    await sink.flush()
    opened = _open_fds()
    assert opened > before
    monkeypatch.setattr(sink_module, "LAZY_PUSH_S", 60.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    assert sink.flush_now(log)  # nothing of the replica's output waits for the writer
    await anyio.sleep(0.2)
    assert _open_fds() == opened  # not handed over: the writer was not woken
    await sink.flush()  # a hand-over takes it along
    assert _open_fds() == before

    monkeypatch.undo()
    log = sink.open(tmp_path / "later")
    sink.write(log, "stderr", b"last\n", 2.0)
    await sink.flush()
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    with anyio.fail_after(10):  # nothing else comes: the timer hands it over
        while _open_fds() != before:  # noqa: ASYNC110 - a count of descriptors: no event
            await anyio.sleep(sink_module.LAZY_PUSH_S / 4)

    log = sink.open(tmp_path / "open-line")
    sink.write(log, "stdout", b"no newline", 3.0)
    sink.end_stream(log, "stdout")
    assert not sink.flush_now(log)
    await sink.flush(log)
    assert _read(tmp_path / "open-line", "combined.log") == b"no newline"


@pytest.mark.anyio
async def test_open_descriptors_are_capped(tmp_path: Path) -> None:
    async with LogSink(max_open_replicas=4) as log_sink:
        await log_sink.flush()
        before = _open_fds()
        logs = [log_sink.open(tmp_path / f"r{k}") for k in range(20)]
        for round_ in range(3):
            for log in logs:
                log_sink.write(log, "stdout", f"{round_}\n".encode(), float(round_))
        await log_sink.flush()
        # stdout.log, combined.log and the index of at most 4 replicas.
        assert _open_fds() - before <= 4 * 3
        assert _read(tmp_path / "r0", "stdout.log") == b"0\n1\n2\n"
        index = TimestampIndex.load(tmp_path / "r0" / INDEX_NAME)
        assert index.covered(STDOUT_ID) == 6
        assert index.time_at(STDOUT_ID, 4) == 2.0


def test_bad_stream_name_is_rejected(tmp_path: Path) -> None:
    log_sink = LogSink()
    try:
        log = log_sink.open(tmp_path)
        with pytest.raises(ValueError, match="stdout"):
            log_sink.write(log, "stdin", b"x", 1.0)  # type: ignore[arg-type]
    finally:
        log_sink.close()


@pytest.mark.anyio
async def test_room_waits_while_the_writer_is_behind(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path)
    chunk = b"w" * 65_535 + b"\n"
    count = 4 * QUEUED_BYTES_HIGH // len(chunk)
    for _ in range(count):  # far faster than the thread writes: a backlog builds up
        sink.write(log, "stdout", chunk, 1.0)
    await sink.room()
    # Nothing was queued since: once room() returned, the backlog is at most the low mark.
    assert sink._writer._backlog <= QUEUED_BYTES_LOW
    await sink.flush()
    assert sink._writer._backlog == 0
    assert (tmp_path / "stdout.log").stat().st_size == count * len(chunk)


@pytest.mark.anyio
async def test_room_never_waits_on_a_closed_sink(tmp_path: Path) -> None:
    sink = LogSink()
    log = sink.open(tmp_path)
    for _ in range(300):
        sink.write(log, "stdout", b"c" * 65_536, 1.0)
    await sink.aclose()
    with anyio.fail_after(5):
        await sink.room()


@pytest.mark.anyio
async def test_rewind_drops_the_attempt_and_keeps_its_arrival_times(
    sink: LogSink, tmp_path: Path
) -> None:
    """An attempt's copy found wrong is written again from its mark: the earlier attempt
    stays, the wrong bytes go from every file (and the index), a held partial line too,
    and the bytes written again keep the times they first arrived at."""
    directory = tmp_path / "r0"
    log = sink.open(directory)
    sink.write(log, "stdout", b"first attempt\nno newline", 1.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    sink.mark_attempt(log)
    sink.write(log, "stdout", b"a\nc\n", 5.0)  # "b\n" lost by the copy
    sink.write(log, "stderr", b"e", 6.0)  # a partial line held back from combined.log
    sink.write(log, "stdout", b"d", 7.0)
    await sink.flush()
    sink.rewind(log)
    sink.write(log, "stdout", b"a\n", 100.0)
    sink.write(log, "stdout", b"b\nc\nd\n", 101.0)
    sink.write(log, "stderr", b"err\n", 102.0)
    sink.end_stream(log, "stdout")
    sink.end_stream(log, "stderr")
    await sink.flush()
    assert _read(directory, "stdout.log") == b"first attempt\nno newline\na\nb\nc\nd\n"
    assert _read(directory, "stderr.log") == b"err\n"
    assert _read(directory, "combined.log") == (b"first attempt\nno newline\na\nb\nc\nd\nerr\n")
    index = TimestampIndex.load(directory / INDEX_NAME)
    start = len(b"first attempt\nno newline\n")
    assert index.time_at(STDOUT_ID, 0) == 1.0
    assert index.time_at(STDOUT_ID, start) == 5.0  # "a\n": as first copied
    assert index.time_at(STDOUT_ID, start + 2) == 5.0  # "b\n..." from offset 2: still 5.0
    assert index.time_at(STDERR_ID, 0) == 6.0
    assert index.covered(STDOUT_ID) == len(_read(directory, "stdout.log"))
    assert index.covered(COMBINED_ID) == len(_read(directory, "combined.log"))
    # The next attempt's mark ends the old times: its output keeps its own.
    sink.mark_attempt(log)
    sink.write(log, "stdout", b"next\n", 200.0)
    await sink.flush()
    index = TimestampIndex.load(directory / INDEX_NAME)
    assert index.time_at(STDOUT_ID, index.covered(STDOUT_ID) - 1) == 200.0


@pytest.mark.anyio
async def test_rewind_without_a_mark_is_reported(sink: LogSink, tmp_path: Path) -> None:
    log = sink.open(tmp_path / "r0")
    sink.write(log, "stdout", b"x\n", 1.0)
    sink.rewind(log)
    with pytest.raises(BackendError, match="no attempt was marked"):
        await sink.flush(log)
    assert _read(tmp_path / "r0", "stdout.log") == b"x\n"


@pytest.mark.anyio
async def test_a_mark_taken_by_another_process_is_rewound_to(tmp_path: Path) -> None:
    """``attempt_marks`` read before an attempt (by the process that launched it); another
    process's sink rewinds to them."""
    from supervisor.logs.sink import attempt_marks

    directory = tmp_path / "r0"
    async with LogSink() as first:
        log = first.open(directory)
        first.write(log, "stdout", b"before\n", 1.0)
        await first.flush()
        marks = attempt_marks(directory)
        first.write(log, "stdout", b"wrong\n", 2.0)
        first.write(log, "stderr", b"e\n", 2.0)
    async with LogSink() as second:
        log = second.open(directory)
        second.mark_attempt(log, at=marks)
        second.rewind(log)
        second.write(log, "stdout", b"right\n", 3.0)
        await second.flush(log)
    assert _read(directory, "stdout.log") == b"before\nright\n"
    assert _read(directory, "stderr.log") == b""
    assert _read(directory, "combined.log") == b"before\nright\n"
    index = TimestampIndex.load(directory / INDEX_NAME)
    assert index.time_at(STDOUT_ID, len(b"before\n")) == 2.0  # when "wrong\n" first came


@pytest.mark.anyio
async def test_a_replica_flush_waits_for_its_open_line_to_be_ended(
    sink: LogSink, tmp_path: Path
) -> None:
    """Its stream's end completes a line left open: a flush of that replica waits for it."""
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"done\nno newline", 1.0)
    sink.end_stream(log, "stdout")
    await sink.flush(log)
    assert _read(tmp_path, "combined.log") == b"done\nno newline"


@pytest.mark.anyio
async def test_a_replica_flush_needs_no_round_trip_once_its_output_is_written(
    sink: LogSink, tmp_path: Path
) -> None:
    """Every line ended and written: the ends of its streams (closing files) are not waited for.

    Taken on the way to ``wait``: a round trip to the writer thread per exit. The
    thread is held here so the test sees which flush waits for it.
    """
    log = sink.open(tmp_path)
    sink.write(log, "stdout", b"all\n", 1.0)
    sink.write(log, "stderr", b"lines ended\n", 1.0)
    await sink.flush(log)
    assert _read(tmp_path, "combined.log") == b"all\nlines ended\n"
    held = threading.Event()
    original = sink._writer._handle  # the writer thread, held at its next item

    def handle(item: object) -> None:
        held.wait(10)
        original(item)  # type: ignore[arg-type]

    sink._writer._handle = handle  # type: ignore[method-assign]
    try:
        sink.end_stream(log, "stdout")
        sink.end_stream(log, "stderr")
        with anyio.fail_after(1):
            await sink.flush(log)  # returns while the thread is held
        with anyio.move_on_after(0.3) as waited:
            await sink.flush()  # everything: waits for the held thread
        assert waited.cancelled_caught
    finally:
        held.set()
    await sink.flush()
    assert _read(tmp_path, "combined.log") == b"all\nlines ended\n"


def test_a_sink_left_open_is_written_out_and_does_not_hold_the_exit(tmp_path: Path) -> None:
    """A sink never closed, still referenced at exit: its output lands, the process ends.

    Its writer thread was a non-daemon one, which ``threading`` joins at exit
    before anything could tell it to stop: the interpreter hung there.
    """
    code = (
        "import asyncio, sys, time\n"
        "from pathlib import Path\n"
        "from supervisor.logs import LogSink\n"
        "kept = []\n"
        "async def main():\n"
        "    sink = LogSink()\n"
        "    kept.append(sink)\n"
        "    log = sink.open(Path(sys.argv[1]))\n"
        "    sink.write(log, 'stdout', b'last words\\n', time.time())\n"
        "    sink.write(log, 'stderr', b'no newline', time.time())\n"
        "asyncio.run(main())\n"
    )
    directory = tmp_path / "r0"
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert _read(directory, "stdout.log") == b"last words\n"
    assert _read(directory, "stderr.log") == b"no newline"
    assert sorted(_read(directory, "combined.log").splitlines()) == [b"last words", b"no newline"]


def test_a_chunk_lost_to_a_write_failure_leaves_no_line_start_for_the_streams_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start of a line, then a chunk with its end that could not be written (a full
    disk): at the stream's end the start is not written to combined.log on its own. On a
    full disk that write failed again, after the replica's exit was told, and the error
    reached nobody's app but the Supervisor's close. The failure is made by hand: the
    disk cannot be filled between two chunks on demand."""
    files = ReplicaFiles(tmp_path)
    files.record("stdout", b"the start of a line", 1.0)

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_files, "write_all", full)
    with pytest.raises(OSError, match="No space left"):
        files.record("stdout", b" and its end\n", 2.0)
    monkeypatch.undo()
    files.flush_partial("stdout")
    files.close_files()
    assert _read(tmp_path, "stdout.log") == b"the start of a line"
    assert not (tmp_path / "combined.log").exists()
