"""CopyCheck: the engine's whole log, read after a container's exit, against what its
follow stream copied (per stream: byte count and SHA-256). Only a copy that is the
start of the log lets the rest be appended; anything else rewrites the attempt."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest

from supervisor.backends.docker.runtime import CopyCheck

Frames = Sequence[tuple[str, bytes]]
LOG: Frames = [
    ("stdout", b"line 0\nline 1\n"),
    ("stderr", b"warn\n"),
    ("stdout", b"line 2\nline"),
    ("stdout", b" 3\n"),
    ("stderr", b"done\n"),
]


def copied(frames: Frames) -> CopyCheck:
    received = {"stdout": 0, "stderr": 0}
    digests = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}
    for stream, data in frames:
        received[stream] += len(data)
        digests[stream].update(data)
    return CopyCheck(received, digests)


def appended(check: CopyCheck, frames: Frames) -> dict[str, bytes] | None:
    """What the check lets through past the copied bytes; None once it found them wrong."""
    out = {"stdout": b"", "stderr": b""}
    for stream, data in frames:
        rest = check.rest(stream, data)
        if rest is None:
            return None
        out[stream] += rest
    return out if check.whole() else None


def rechunked(frames: Frames, size: int) -> list[tuple[str, bytes]]:
    """The same bytes per stream in other frames (engines frame as they like)."""
    out = []
    for stream, data in frames:
        out += [(stream, data[i : i + size]) for i in range(0, len(data), size)]
    return out


@pytest.mark.parametrize("cut", range(len(LOG) + 1))
@pytest.mark.parametrize("size", [1, 3, 64])
def test_a_copy_that_is_the_start_of_the_log_lets_only_the_rest_through(
    cut: int, size: int
) -> None:
    check = copied(rechunked(LOG[:cut], 2))
    rest = appended(check, rechunked(LOG, size))
    assert rest is not None
    for stream in ("stdout", "stderr"):
        assert rest[stream] == b"".join(d for s, d in LOG[cut:] if s == stream)


def test_a_copy_that_lost_bytes_is_found_wrong() -> None:
    lost = [("stdout", b"line 0\n"), ("stdout", b"line 2\n")]  # "line 1" never came
    assert appended(copied(lost), LOG) is None


def test_a_copy_with_pieces_reordered_is_found_wrong() -> None:
    swapped = [("stdout", b"line 2\nline"), ("stdout", b"line 0\nline 1\n")]
    assert appended(copied(swapped), LOG) is None


def test_a_copy_longer_than_the_log_is_found_wrong() -> None:
    more = [*LOG, ("stdout", b"line 4\n")]
    assert appended(copied(more), LOG) is None


def test_a_wrong_copy_of_one_stream_is_found_even_without_a_rest() -> None:
    """Every byte copied, but stderr's in the wrong order: nothing is past the copied
    bytes, so the answer comes at the end of the log."""
    wrong = [LOG[0], LOG[2], LOG[3], ("stderr", b"done\n"), ("stderr", b"warn\n")]
    check = copied(wrong)
    for stream, data in LOG:
        assert check.rest(stream, data) == b""
    assert not check.whole()
