"""Reading a replica's structured error (the file named by ``TORCHELASTIC_ERROR_FILE``).

torchelastic's ``@record`` writes ``{"message": {"message": ..., "extraInfo":
{"py_callstack": ..., "timestamp": ...}, "errorCode": ...}}``; older writers
put a plain string under ``message``, and a replica may write any text. The
raw text is kept in statuses (nothing is lost); this module turns it into what
a person reads: one headline for a table cell, and the details under it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["ErrorReport", "parse_error_file"]


@dataclass(frozen=True)
class ErrorReport:
    headline: str  # one line: "RuntimeError: boom"
    error_code: str = ""
    when: str = ""  # ISO 8601 (UTC), from the writer's timestamp
    traceback: str = ""


def parse_error_file(raw: str) -> ErrorReport:
    """Never raises: text that is not torchelastic's format comes back as its first line."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        data = None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return ErrorReport(headline=_first_line(message))
    if not isinstance(message, dict):
        return ErrorReport(headline=_first_line(raw))
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    code = message.get("errorCode")
    return ErrorReport(
        headline=_first_line(str(message.get("message", ""))) or _first_line(raw),
        error_code="" if code is None else str(code),
        when=_when(extra.get("timestamp")),
        traceback=str(extra.get("py_callstack") or "").rstrip(),
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _when(stamp: object) -> str:
    try:
        seconds = float(str(stamp))
        return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return ""
