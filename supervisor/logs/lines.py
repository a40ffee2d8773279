"""Cutting byte streams into lines, the one rule shared by writer and readers.

Only ``\\n`` ends a line. Programs draw progress bars with ``\\r`` and expect
the terminal to overwrite in place; treating ``\\r`` as a break would turn one
bar into thousands of lines and make ``combined.log`` interleave mid-bar.
Everything here is pure so it can be tested exhaustively with hypothesis.

A line is never held whole in memory past ``MAX_LINE_BYTES``: a program
printing 500 MB without a newline must not make its supervisor (or a log
reader) hold 500 MB. Such a line is cut into pieces of at most that many
bytes, never inside a UTF-8 sequence, and nothing is dropped: the pieces
joined are the line. ``stdout.log``/``stderr.log`` keep the bytes as they
came; ``combined.log``, which holds whole lines, gets each piece as a line of
its own (a newline is added after each cut); readers yield the pieces one by
one, without a newline but for the last.
"""

from __future__ import annotations

__all__ = [
    "MAX_LINE_BYTES",
    "LineSplitter",
    "decode_line",
    "split_decoded",
    "split_lines",
]

MAX_LINE_BYTES = 1 << 20
"""Longest line (without its newline) kept whole; longer ones are cut into pieces this long."""

# str.splitlines breaks on these as well as on "\n"; their presence forces the
# slower exact split (the common case is checked in a few memchr-speed scans).
_OTHER_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


class LineSplitter:
    """Turns arbitrarily chunked bytes into complete lines.

    Pipes deliver whatever the kernel had buffered, so a line may arrive in
    many pieces; the unterminated tail is kept until its ``\\n`` shows up. The
    tail grows in a ``bytearray`` so a 1 MB line fed in 4 KiB pieces costs
    linear, not quadratic, copying.
    """

    __slots__ = ("_max", "_pending")

    def __init__(self, max_line: int | None = None) -> None:
        """``max_line``: the cut length for ``feed_runs`` (None: lines are never cut)."""
        if max_line is not None and max_line < 4:
            raise ValueError("max_line must leave room for a UTF-8 sequence (at least 4)")
        self._max = max_line
        self._pending = bytearray()

    def feed_block(self, data: bytes) -> bytes:
        """Every line completed by ``data``, concatenated (``b""`` if none).

        Writers and readers act on whole runs of lines (one ``write``, one
        ``decode``) rather than line by line; that is where the speed is.
        """
        last = data.rfind(b"\n")
        if last < 0:
            self._pending += data
            return b""
        if self._pending:
            self._pending += data[: last + 1]
            block = bytes(self._pending)
        else:
            # A full slice of bytes is the object itself: no copy in the
            # common case of a chunk that ends on a line boundary.
            block = data[: last + 1]
        self._pending = bytearray(data[last + 1 :])
        return block

    def feed_runs(self, data: bytes) -> list[bytes]:
        """What ``data`` completes, as runs: blocks of whole lines, and cut pieces.

        A run ending in ``b"\\n"`` is a block of complete lines; any other run
        is one piece of a line longer than ``max_line``. The runs joined are
        the input consumed, so file offsets stay exact. The bytes held back
        never exceed ``max_line``.
        """
        limit = self._max
        if limit is None or len(self._pending) + len(data) <= limit:
            # No line can be too long: the fast path, one search for the last newline.
            block = self.feed_block(data)
            return [block] if block else []
        # Whole lines are found a window at a time (the last newline within
        # max_line + 1 bytes ends a stretch of lines that are all short enough)
        # and joined once per run: per line work here made reading a big log
        # quadratic, as every chunk with a partial line before it comes this way.
        runs: list[bytes] = []
        whole: list[bytes] = []
        pending = self._pending
        pos, size = 0, len(data)
        while pos < size:
            room = limit - len(pending)
            if pending:
                newline = data.find(b"\n", pos, pos + room + 1)
                if newline >= 0:
                    pending += data[pos : newline + 1]
                    pos = newline + 1
                    whole.append(bytes(pending))
                    pending.clear()
                    continue
            else:
                newline = data.rfind(b"\n", pos, pos + room + 1)
                if newline >= 0:
                    whole.append(data[pos : newline + 1])
                    pos = newline + 1
                    continue
            if size - pos <= room:
                pending += data[pos:]
                pos = size
            else:
                pending += data[pos : pos + room]
                pos += room
                cut = _utf8_cut(pending)
                if whole:
                    runs.append(b"".join(whole))
                    whole.clear()
                runs.append(bytes(pending[:cut]))
                del pending[:cut]
        if whole:
            runs.append(b"".join(whole))
        return runs

    def feed(self, data: bytes) -> list[bytes]:
        """The complete lines (each ending in ``b"\\n"``) finished by ``data``."""
        return split_lines(self.feed_block(data))

    def flush(self) -> bytes | None:
        """The unterminated remainder, or None when there is none; resets."""
        if not self._pending:
            return None
        rest = bytes(self._pending)
        self._pending = bytearray()
        return rest

    @property
    def pending_size(self) -> int:
        """Bytes held back waiting for their ``\\n``."""
        return len(self._pending)


def _utf8_cut(buf: bytearray) -> int:
    """Where to cut ``buf`` so no UTF-8 sequence is split: before trailing continuation bytes.

    Backs off at most 3 bytes (the longest sequence is 4); bytes that are not
    UTF-8 at all are cut where they stand.
    """
    end = len(buf)
    cut = end
    while cut > end - 4 and cut > 0 and buf[cut - 1] & 0xC0 == 0x80:
        cut -= 1
    if cut > end - 4 and cut > 0 and buf[cut - 1] >= 0xC0:
        lead = buf[cut - 1]
        needed = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if end - (cut - 1) < needed:
            return cut - 1  # an incomplete sequence: it goes whole into the next piece
    return end


def split_lines(data: bytes) -> list[bytes]:
    """``data`` cut after every ``b"\\n"``; a final unterminated piece is kept as is."""
    if not data:
        return []
    if b"\r" not in data:
        # bytes.splitlines breaks on \n, \r and \r\n only; without \r it is exact.
        return data.splitlines(keepends=True)
    parts = data.split(b"\n")
    last = parts.pop()
    out = [part + b"\n" for part in parts]
    if last:
        out.append(last)
    return out


def split_decoded(text: str) -> list[str]:
    """Like ``split_lines`` for text: breaks after ``"\\n"`` only, keeping it."""
    if not text:
        return []
    if not any(sep in text for sep in _OTHER_BREAKS):
        return text.splitlines(keepends=True)
    parts = text.split("\n")
    last = parts.pop()
    out = [part + "\n" for part in parts]
    if last:
        out.append(last)
    return out


def decode_line(data: bytes) -> str:
    """Log bytes as text; a program printing invalid UTF-8 must not break reading."""
    return data.decode("utf-8", errors="replace")
