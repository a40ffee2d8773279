"""LineSplitter must not depend on how the kernel happened to chunk a pipe."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from supervisor.logs import LineSplitter, decode_line
from supervisor.logs.lines import split_decoded, split_lines

# Bytes rich in separators and look-alikes, so short examples hit the edge cases.
_log_bytes = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b"a", b"xyz", b"\xe2\x82\xac", b"\xff", b"\x0b"]),
    max_size=60,
).map(b"".join) | st.binary(max_size=300)


def _split_whole(data: bytes) -> list[bytes]:
    """The reference: cut after every b"\\n" of the complete input."""
    lines = [part + b"\n" for part in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return [line for line in lines if line]


@st.composite
def _chunked(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    data = draw(_log_bytes)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return data, [data[a:b] for a, b in pairwise(bounds)]


def _feed_all(chunks: list[bytes]) -> list[bytes]:
    splitter = LineSplitter()
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(splitter.feed(chunk))
    rest = splitter.flush()
    if rest is not None:
        lines.append(rest)
    return lines


@given(_chunked())
def test_chunking_never_changes_the_lines(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    lines = _feed_all(chunks)
    assert lines == _split_whole(data)
    assert b"".join(lines) == data
    assert all(line.endswith(b"\n") for line in lines[:-1])
    assert all(line.count(b"\n") == 1 for line in lines if line.endswith(b"\n"))


@given(_chunked())
def test_carriage_return_never_splits(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    lines = _feed_all(chunks)
    unterminated = 1 if data and not data.endswith(b"\n") else 0
    assert len(lines) == data.count(b"\n") + unterminated
    assert sum(line.count(b"\r") for line in lines) == data.count(b"\r")


@given(_chunked())
def test_feed_block_is_the_concatenated_lines(case: tuple[bytes, list[bytes]]) -> None:
    _, chunks = case
    by_line, by_block = LineSplitter(), LineSplitter()
    for chunk in chunks:
        assert by_block.feed_block(chunk) == b"".join(by_line.feed(chunk))
        assert by_block.pending_size == by_line.pending_size
    assert by_block.flush() == by_line.flush()


@given(_log_bytes)
def test_decoding_a_run_equals_decoding_each_line(data: bytes) -> None:
    # The reader decodes whole runs of lines at once; that must not differ
    # from decoding (and replacing errors in) each line on its own.
    per_line = [decode_line(line) for line in split_lines(data)]
    assert split_decoded(decode_line(data)) == per_line


def test_flush_resets() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"a\nb") == [b"a\n"]
    assert splitter.flush() == b"b"
    assert splitter.flush() is None
    assert splitter.feed(b"c\n") == [b"c\n"]


def test_a_megabyte_line_in_small_chunks_is_one_line() -> None:
    line = b"x" * 1_000_000 + b"\n"
    splitter = LineSplitter()
    lines: list[bytes] = []
    for start in range(0, len(line), 4096):
        lines.extend(splitter.feed(line[start : start + 4096]))
    assert lines == [line]
    assert splitter.flush() is None


@given(_chunked(), st.integers(4, 40))
def test_runs_bound_the_line_and_lose_nothing(case: tuple[bytes, list[bytes]], limit: int) -> None:
    data, chunks = case
    splitter = LineSplitter(limit)
    runs: list[bytes] = []
    for chunk in chunks:
        fed = splitter.feed_runs(chunk)
        # Whole lines in a row come as one run (one decode), never line by line.
        assert not any(a.endswith(b"\n") and b.endswith(b"\n") for a, b in pairwise(fed))
        runs.extend(fed)
        assert splitter.pending_size <= limit
    rest = splitter.flush()
    assert b"".join(runs) + (rest or b"") == data
    for run in runs:
        if run.endswith(b"\n"):
            assert all(len(line) <= limit + 1 for line in split_lines(run))
        else:  # a piece of an over-long line
            assert b"\n" not in run
            assert 0 < len(run) <= limit
            assert len(run) >= limit - 3  # backed off at most a UTF-8 sequence


@given(st.text(max_size=200), st.integers(4, 12))
def test_pieces_never_split_a_utf8_sequence(text: str, limit: int) -> None:
    splitter = LineSplitter(limit)
    runs = splitter.feed_runs(text.encode())
    rest = splitter.flush()
    for run in [*runs, *([rest] if rest else [])]:
        run.decode()  # raises if a sequence was cut


def test_without_a_limit_runs_are_the_blocks() -> None:
    splitter = LineSplitter()
    assert splitter.feed_runs(b"x" * 100) == []
    assert splitter.feed_runs(b"y\nz") == [b"x" * 100 + b"y\n"]
