"""The bench's rounds: a row's repetitions split over children, the rows of one N together.

The figures of a ratio target must come from children run close together in
time; these tests pin how ``bench.util.run_rows`` splits and orders them.
"""

from __future__ import annotations

from typing import Any

from bench.util import interleaved, rounds_of, run_rows


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
