"""Cutting byte streams into lines, the one rule shared by writer and readers.

Only ``\\n`` ends a line. Programs draw progress bars with ``\\r`` and expect
the terminal to overwrite in place; treating ``\\r`` as a break would turn one
bar into thousands of lines and make ``combined.log`` interleave mid-bar.
Everything here is pure so it can be tested exhaustively with hypothesis.
"""

from __future__ import annotations

__all__ = ["LineSplitter", "decode_line", "split_decoded", "split_lines"]

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

    __slots__ = ("_pending",)

    def __init__(self) -> None:
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
