"""Replica output on every target: streams, regex, time windows, following to the end."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, Supervisor, UnknownAppError

from .helpers import app, lines
from .target import Target

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

# Two bursts 3 s apart, on both streams; the last line has no newline.
SCRIPT = (
    "echo out1; echo err1 >&2; sleep 3; echo out2; echo err2 >&2; printf 'out3 without newline'"
)
PARTIAL = "out3 without newline"
# The second burst in the combined view: stdout's last line as written, or ended by the
# separator that a stderr line coming after it in combined.log needs.
_LAST_BURST = [sorted(["err2\n", "out2\n", PARTIAL]), sorted(["err2\n", "out2\n", PARTIAL + "\n"])]


async def test_logs_by_stream_regex_and_time_followed_until_the_replica_ends(
    target: Target, sv: Supervisor, cfg: dict[str, object], exchange: Path
) -> None:
    handle = await sv.submit(app(target.role("t", SCRIPT, exchange=exchange)), target.backend, cfg)
    seen: list[tuple[str, float, AppState | None]] = []
    with anyio.fail_after(target.timeout):
        async for line in sv.log_iter(handle, "t", 0, should_tail=True):
            status = sv.status(handle)
            seen.append((line, time.time(), status.state if status else None))
    final = sv.status(handle)
    assert final is not None and final.state is AppState.SUCCEEDED, final
    followed = [line for line, _, _ in seen]
    assert sorted(followed[:2]) == ["err1\n", "out1\n"], followed
    # Two pipes reach the log writer in either order. combined.log keeps lines whole,
    # so stdout's unterminated last line is ended there by the one separator a stderr
    # line written after it needs (the stdout file itself keeps it unterminated).
    tail = sorted(followed[2:])
    assert tail in _LAST_BURST, followed
    if PARTIAL + "\n" in followed:
        assert followed[-1] != PARTIAL + "\n", followed  # ended only by a line after it
    # The first lines came while the replica still ran: the follower waited for the rest.
    assert seen[0][2] in (AppState.PENDING, AppState.RUNNING), seen

    stdout = await lines(sv, handle, "t", 0, streams="stdout")
    assert stdout == ["out1\n", "out2\n", "out3 without newline"]
    assert await lines(sv, handle, "t", 0, streams="stderr") == ["err1\n", "err2\n"]
    combined = await lines(sv, handle, "t", 0)
    assert sorted(combined) == sorted(followed)
    assert await lines(sv, handle, "t", 0, streams="combined") == combined

    assert await lines(sv, handle, "t", 0, regex=r"^out\d$") == ["out1\n", "out2\n"]
    assert await lines(sv, handle, "t", 0, regex="2", streams="stderr") == ["err2\n"]

    between = max(t for line, t, _ in seen if line in ("out1\n", "err1\n")) + 1.0
    late = await lines(sv, handle, "t", 0, since=between)
    assert sorted(late) == tail
    early = await lines(sv, handle, "t", 0, until=between, streams="stdout")
    assert early == ["out1\n"]
    assert await lines(sv, handle, "t", 0, since=between, until=between) == []

    # A follower that starts after the end gets everything, then stops by itself.
    with anyio.fail_after(10):
        again = [line async for line in sv.log_iter(handle, "t", 0, should_tail=True)]
    assert again == combined

    with pytest.raises(UnknownAppError):
        await lines(sv, handle, "t", 1)
    with pytest.raises(UnknownAppError):
        await lines(sv, handle, "nope", 0)
    with pytest.raises(ValueError, match=r"stdin|stream"):
        await lines(sv, handle, "t", 0, streams="stdin")
