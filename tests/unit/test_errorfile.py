"""Structured errors as people read them; whatever a replica wrote, nothing raises."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from supervisor.errorfile import ErrorReport, parse_error_file


def test_torchelastic_format_gives_headline_code_time_and_traceback() -> None:
    raw = json.dumps(
        {
            "message": {
                "message": "ValueError: bad batch\nmore detail",
                "errorCode": 3,
                "extraInfo": {"py_callstack": "Traceback ...\n  line\n", "timestamp": "0"},
            }
        }
    )
    assert parse_error_file(raw) == ErrorReport(
        headline="ValueError: bad batch",
        error_code="3",
        when="1970-01-01T00:00:00+00:00",
        traceback="Traceback ...\n  line",
    )


def test_older_and_foreign_formats_give_their_first_line() -> None:
    assert parse_error_file('{"message": "OOM on rank 2"}').headline == "OOM on rank 2"
    assert parse_error_file("\n  disk full\nsecond").headline == "disk full"
    assert parse_error_file('{"other": 1}').headline == '{"other": 1}'
    bad_time = {"message": {"message": "x", "extraInfo": {"timestamp": "soon"}}}
    assert parse_error_file(json.dumps(bad_time)) == ErrorReport(headline="x")


@given(st.text() | st.recursive(st.none() | st.integers() | st.text(), st.lists))
def test_any_content_is_read_without_raising(content: object) -> None:
    raw = content if isinstance(content, str) else json.dumps({"message": content})
    report = parse_error_file(raw)
    assert "\n" not in report.headline
