"""The journal's hand-written encoder and the times kept as records are written.

Both exist only to make the final record cheaper (it is on the path of every
``wait``); these tests pin them to the slow reference they replace, so a reader
of the journal can never tell which one wrote a line.
"""

from __future__ import annotations

import json
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from supervisor.states import AppState
from supervisor.status import AppTimes, Transition

_state = st.sampled_from([s.name for s in AppState])
_text = st.text(max_size=30)  # quotes, backslashes, control and non-ASCII characters
_anything = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _text)


@st.composite
def _transitions(draw: st.DrawFn) -> Transition:
    app_level = draw(st.booleans())
    return Transition(
        seq=draw(st.integers(0, 2**40)),
        at=draw(st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, 2**33)),
        source=draw(_state | _text),
        dest=draw(_state | _text),
        trigger=draw(_text),
        role=None if app_level else draw(_text),
        replica_id=None if app_level else draw(st.integers(0, 10_000)),
        attempt=draw(st.integers(0, 100)),
        msg=draw(_text),
    )


@given(_transitions())
def test_a_journal_line_is_exactly_what_json_dumps_writes(t: Transition) -> None:
    assert t.to_json_line() == json.dumps(t.to_json())
    assert "\n" not in t.to_json_line()  # one transition, one line


@given(_anything, _anything, _anything)
def test_fields_of_unexpected_types_are_encoded_by_json_itself(
    seq: object, at: object, msg: object
) -> None:
    # A Transition built from a damaged or foreign record may hold anything JSON can.
    t = Transition(seq=seq, at=at, source="RUNNING", dest="FAILED", trigger="fail", msg=msg)  # type: ignore[arg-type]
    assert t.to_json_line() == json.dumps(t.to_json())


@st.composite
def _app_history(draw: st.DrawFn) -> list[Transition]:
    """App-level moves (with replica ones between) at increasing times."""
    dests = draw(st.lists(st.sampled_from([s.name for s in AppState]), max_size=12))
    out: list[Transition] = []
    at = 1000.0
    for seq, dest in enumerate(dests):
        at += draw(st.floats(0, 10))
        role = draw(st.sampled_from([None, None, "trainer"]))
        out.append(
            Transition(
                seq=seq,
                at=at,
                source="X",
                dest=dest,
                trigger="t",
                role=role,
                replica_id=None if role is None else 0,
            )
        )
    return out


@given(_app_history(), st.lists(st.integers(0, 12), max_size=4))
def test_times_kept_record_by_record_equal_the_times_read_from_the_whole_journal(
    history: list[Transition], cuts: list[int]
) -> None:
    kept = AppTimes()
    bounds = [0, *sorted(min(c, len(history)) for c in cuts), len(history)]
    for start, end in pairwise(bounds):
        kept = kept.after(history[start:end])
    assert kept == AppTimes.from_transitions(history)
