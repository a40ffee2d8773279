"""The index entry of a settled app carries what ``list`` shows (issue 16 item 2).

Real files in a temporary directory: the summary stands for the records only
while a ``stat`` shows them as they were when the app ended; a summary that is
not well formed is no summary (the records are read), never damage.
"""

from __future__ import annotations

import json
from pathlib import Path

from supervisor import AppDef, AppState, Role
from supervisor.backends.store import AppRecord, AppStore, Index, Owner, end_is_known, remove_app
from supervisor.status import AppStatus, Transition

APP = AppDef(name="named", roles=[Role(name="r", entrypoint="true")])
ENDED = AppStatus(AppState.FAILED, msg="r/0 exited with code 3")
JOURNAL = [
    Transition(0, 10.0, "UNSUBMITTED", "SUBMITTED", "submit"),
    Transition(1, 11.0, "SUBMITTED", "RUNNING", "started"),
    Transition(2, 12.5, "RUNNING", "FAILED", "exited"),
]


def _ended_app(tmp_path: Path, final: bool = True) -> tuple[Index, Path]:
    index = Index(tmp_path / "state", "local")
    app_dir = tmp_path / "logs" / "s" / "named-1"
    store = AppStore(app_dir)
    store.create([], AppRecord(handle="local://s/named-1", app=APP, owner=Owner.current()))
    store.write_state(ENDED, JOURNAL, final, Owner.current())
    index.add("s", "named-1", app_dir, "named")
    return index, app_dir


def test_a_settled_entry_carries_state_name_msg_and_times(tmp_path: Path) -> None:
    index, app_dir = _ended_app(tmp_path)
    assert [e.summary for e in index.entries()] == [None]  # not settled in the index yet
    index.settle("s", "named-1", app_dir, ENDED)
    (entry,) = index.entries()
    assert entry.summary is not None and entry.damage is None
    assert (entry.summary.state, entry.summary.name, entry.summary.msg) == (
        AppState.FAILED,
        "named",
        ENDED.msg,
    )
    times = entry.summary.times
    assert (times.submitted, times.started, times.ended) == (10.0, 11.0, 12.5)
    assert entry.app_dir == app_dir and index.lookup("s", "named-1") == app_dir


def test_a_record_changed_since_makes_the_summary_stand_for_nothing(tmp_path: Path) -> None:
    index, app_dir = _ended_app(tmp_path)
    index.settle("s", "named-1", app_dir, ENDED)
    app_json = app_dir / "app.json"
    app_json.write_text(app_json.read_text() + " ")
    (entry,) = index.entries()
    assert entry.summary is None and entry.damage is None


def test_a_malformed_summary_is_no_summary_and_no_damage(tmp_path: Path) -> None:
    index, app_dir = _ended_app(tmp_path)
    index.settle("s", "named-1", app_dir, ENDED)
    path = index.entry_path("s", "named-1")
    good = json.loads(path.read_text())
    for bad in ("x", {"state": "DONE"}, {"state": "FAILED", "records": "all"}, None):
        data = json.loads(path.read_text())
        data["final"] = bad
        path.write_text(json.dumps(data))
        (entry,) = index.entries()
        assert entry.summary is None and entry.damage is None, bad
    # One field wrong in an otherwise good summary whose records are untouched.
    for field, bad in [
        ("state", "DONE"),
        ("state", ["SUCCEEDED"]),
        ("state", None),
        ("records", good["final"]["records"][:1]),
        ("records", None),
        ("submitted", True),
        ("ended", "yesterday"),
        ("msg", 7),
    ]:
        data = json.loads(json.dumps(good))
        data["final"][field] = bad
        path.write_text(json.dumps(data))
        (entry,) = index.entries()
        assert entry.summary is None and entry.damage is None, (field, bad)
    data = json.loads(json.dumps(good))
    data["name"] = ["named"]
    path.write_text(json.dumps(data))
    (entry,) = index.entries()
    assert entry.summary is None and entry.damage is None
    path.write_text(json.dumps(good))
    (entry,) = index.entries()
    assert entry.summary is not None  # the good one still stands: the records are as they were


def test_end_is_known_from_the_final_record_or_the_owner_gone(tmp_path: Path) -> None:
    _, ended = _ended_app(tmp_path)
    assert end_is_known(ended)
    _, running = _ended_app(tmp_path / "other", final=False)
    assert not end_is_known(running)  # its owner (this process) lives
    record = json.loads((running / "app.json").read_text())
    record["owner"] = {"pid": 1, "start": "0", "host": record["owner"]["host"]}
    (running / "app.json").write_text(json.dumps(record))
    assert end_is_known(running)  # that owner is gone: nobody will write to it again


def test_remove_app_takes_the_entry_then_the_directory_of_an_app_only(tmp_path: Path) -> None:
    index, app_dir = _ended_app(tmp_path)
    remove_app(index, "s", "named-1", app_dir)
    assert list(index.entries()) == [] and not app_dir.exists()
    elsewhere = tmp_path / "not-an-app-dir"
    elsewhere.mkdir()
    index.add("s", "named-2", elsewhere)
    remove_app(index, "s", "named-2", elsewhere)
    assert list(index.entries()) == [] and elsewhere.exists()
