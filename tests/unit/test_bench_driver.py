"""The bench's driver: how its children are ordered and what they leave for the next one.

The figures of a ratio target must come from children run close together in
time (``bench.util.run_rows``'s rounds), and no child's figures may pay for
the files the one before it removed (``kept_scratch``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.util import KEPT_SCRATCH_ENV, interleaved, kept_scratch, rounds_of, run_rows, scratch


def test_repetitions_split_over_rounds_first_rounds_take_the_rest() -> None:
    assert rounds_of(15, 3) == [5, 5, 5]
    assert rounds_of(5, 3) == [2, 2, 1]
    assert rounds_of(1, 3) == [1, 0, 0]
    assert rounds_of(4, 1) == [4]


def test_rows_of_one_n_run_side_by_side_in_the_plans_order() -> None:
    runs = [("popen", 1, 5), ("popen", 10, 5), ("ours", 1, 5), ("ours", 10, 5), ("tx", 1, 5)]
    assert [runs[at][:2] for at in interleaved(runs)] == [
        ("popen", 1),
        ("ours", 1),
        ("tx", 1),
        ("popen", 10),
        ("ours", 10),
    ]


def test_a_rows_children_are_gathered_into_one_result() -> None:
    """Real children (``bench.case_submit``'s Popen loop): every repetition is kept."""
    filled: list[tuple[str, int, int]] = []

    def fill(row: dict[str, Any], result: dict[str, Any], n: int) -> None:
        filled.append((row["impl"], n, len(result["samples"])))
        row["samples"] = result["samples"]

    plan = {"rounds": 2, "runs": [("popen", 2, 3), ("popen", 1, 1)], "timeout_s": 60}
    rows = run_rows("case_submit", plan, fill)

    assert filled == [("popen", 2, 3), ("popen", 1, 1)]
    assert [(r["reps"], r["children"]) for r in rows] == [(3, 2), (1, 1)]
    assert all("error" not in r for r in rows)
    assert all(isinstance(s, float) and s > 0 for r in rows for s in r["samples"])


def test_children_scratch_stays_until_the_run_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(KEPT_SCRATCH_ENV, raising=False)
    with kept_scratch() as root:
        assert os.environ[KEPT_SCRATCH_ENV] == str(root)
        with scratch() as first:
            (first / "record").write_text("x")
        with scratch() as second:
            pass
        assert first.parent == root and (first / "record").exists()
        assert second.parent == root and second != first
    assert not root.exists()
    assert KEPT_SCRATCH_ENV not in os.environ


def test_a_child_alone_removes_its_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(KEPT_SCRATCH_ENV, raising=False)
    with scratch() as alone:
        (alone / "record").write_text("x")
    assert not alone.exists()
