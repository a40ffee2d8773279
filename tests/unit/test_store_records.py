"""Reading app records that are damaged: each is reported as damaged, none blocks or lies.

Issue 19: one damaged record (an unknown state, wrong types, a directory or FIFO
under the record's name, a stray file in the index) made every ``list`` raise or
hang, and a state.json cut short read as "no state recorded yet" (SUBMITTED).
The files here are real files, FIFOs and directories in a temporary directory.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor import AppDef, AppState, DamagedRecordError, ReplicaState, Role
from supervisor.backends.store import (
    RECORD_FORMAT,
    AppRecord,
    AppStore,
    Index,
    Owner,
    append_bytes,
    damaged_status,
    read_record,
    write_json_atomic,
)
from supervisor.status import AppStatus, ReplicaStatus, RoleStatus, Transition

OWNER = Owner.current()
APP = AppDef(name="n", roles=[Role(name="r", entrypoint="true", num_replicas=2)])
STATUS = AppStatus(
    AppState.SUCCEEDED,
    roles=(
        RoleStatus(
            "r",
            (
                ReplicaStatus(0, ReplicaState.SUCCEEDED, "r", exit_code=0),
                ReplicaStatus(1, ReplicaState.SUCCEEDED, "r", exit_code=0),
            ),
        ),
    ),
)


def _store(tmp_path: Path) -> AppStore:
    store = AppStore(tmp_path / "app")
    store.create([], AppRecord(handle="local://s/a-1", app=APP, owner=OWNER))
    store.write_state(STATUS, [], True, OWNER)
    return store


def _state(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"status": STATUS.to_json(), "final": True, "owner": OWNER.to_json()}
    record.update(changes)
    return record


def _replica_field(name: str, value: object) -> dict[str, Any]:
    record = _state()
    record["status"]["roles"][0]["replicas"][1][name] = value
    return record


def _read_in_a_thread(read: Any) -> Any:
    """``read()``, failing the test (instead of hanging it) if it blocks for 10 s."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as e:  # handed to the test below
            out.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "reading the record blocked"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_an_intact_record_reads_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.read_state() == (STATUS, OWNER)
    assert store.read_final_status() == STATUS
    app = store.read_app()
    assert app is not None and app.app == APP


def test_no_record_yet_is_none_not_damage(tmp_path: Path) -> None:
    store = AppStore(tmp_path / "app")
    assert store.read_app() is None
    assert store.read_state() is None
    assert store.read_final_status() is None
    store.create([], AppRecord(handle="local://s/a-1", app=APP, owner=OWNER))
    assert store.read_state() is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "empty"),
        ("\n", "empty"),
        ("cut", "not JSON"),
        (None, "not JSON"),  # the intact record cut short after 40 bytes
        (b"\xff\xfe", "not JSON"),
        ("[]", "the record is [], not dict"),
        (_state(status={**STATUS.to_json(), "state": "FINISHED"}), "unknown state"),
        (_state(status={**STATUS.to_json(), "state": ["RUNNING"]}), "state"),
        (_state(status={**STATUS.to_json(), "num_restarts": "2"}), "num_restarts is '2'"),
        (_state(status={**STATUS.to_json(), "num_restarts": True}), "num_restarts is True"),
        (_state(status={**STATUS.to_json(), "msg": 5}), "msg is 5, not str"),
        (_state(status={**STATUS.to_json(), "roles": "r"}), "roles is 'r', not list"),
        (_state(status={**STATUS.to_json(), "roles": [{"role": "r"}]}), "roles[0].replicas"),
        (_state(status={**STATUS.to_json(), "roles": [5]}), "roles[0] is 5"),
        (_state(status={**STATUS.to_json(), "ui_url": 1}), "ui_url is 1, not str or null"),
        (_state(status={**STATUS.to_json(), "metadata": [1]}), "metadata is [1], not dict"),
        (_replica_field("state", "DONE"), "unknown state"),
        (_replica_field("id", "1"), "roles[0].replicas[1].id is '1'"),
        (_replica_field("exit_code", "0"), "roles[0].replicas[1].exit_code is '0'"),
        (_replica_field("signal", 9), "roles[0].replicas[1].signal is 9"),
        (_state(status=None), "status is None"),
        (_state(owner={"pid": "me"}), "owner.pid is 'me'"),
        (_state(owner=None), "owner is None"),
        (_state(final="yes"), "final is 'yes'"),
    ],
)
def test_a_damaged_state_record_is_damage_never_an_older_state(
    tmp_path: Path, content: object, why: str
) -> None:
    store = _store(tmp_path)
    path = store.app_dir / "state.json"
    if content is None:
        path.write_bytes(path.read_bytes()[:40])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    for read in (store.read_state, store.read_final_status):
        with pytest.raises(DamagedRecordError) as err:
            read()
        assert err.value.path == str(path)
        assert str(err.value).startswith(f"damaged record: {path}: ")
        assert why in str(err.value)
        assert not err.value.transient


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("fifo", "not a regular file (a FIFO)"),
        ("directory", "not a regular file (a directory)"),
        ("socket", "cannot be read (No such device or address)"),  # open() says ENXIO
    ],
)
def test_what_only_carries_the_name_is_damage_and_never_blocks(
    tmp_path: Path, kind: str, why: str
) -> None:
    store = _store(tmp_path)
    for name in ("state.json", "app.json"):
        path = store.app_dir / name
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        else:
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            sock.close()
        read = store.read_state if name == "state.json" else store.read_app
        with pytest.raises(DamagedRecordError) as err:
            _read_in_a_thread(read)
        assert str(err.value).endswith(f"{path}: {why}")
        # Not blocked later either: a FIFO is opened without waiting for its writer.
        with pytest.raises(DamagedRecordError):
            _read_in_a_thread(lambda p=path: read_record(p))


def test_an_unreadable_record_is_damage(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.app_dir / "state.json"
    path.unlink()
    path.symlink_to(path)  # a loop: ELOOP on open
    with pytest.raises(DamagedRecordError, match="cannot be read"):
        store.read_state()


def test_a_record_far_larger_than_any_real_one_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(_state()) + " " * 100)
    with pytest.raises(DamagedRecordError, match="more than 64"):
        read_record(path, limit=64)


def _grow_after_fstat(
    monkeypatch: pytest.MonkeyPatch, path: Path, extra: bytes
) -> Callable[[], int]:
    """A writer appends ``extra`` to ``path`` right after the reader's fstat.

    The timing is forced by wrapping the real ``os.fstat`` (the only way to land
    a write in that gap on demand); the file and its growth are real. Returns
    how many times it appended.
    """
    real_fstat = os.fstat
    grown = 0

    def fstat_then_grow(fd: int) -> os.stat_result:
        nonlocal grown
        info = real_fstat(fd)
        with open(path, "ab") as f:
            f.write(extra)
        grown += 1
        return info

    monkeypatch.setattr(os, "fstat", fstat_then_grow)
    return lambda: grown


def test_a_record_that_grows_after_its_size_was_seen_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read asks for the size fstat saw plus one byte: that byte shows it grew."""
    path = tmp_path / "state.json"
    path.write_bytes(b'{"a": [0')
    grown = _grow_after_fstat(monkeypatch, path, b", 1" * 1000 + b"]}")
    assert read_record(path) == {"a": [0] + [1] * 1000}
    assert grown() == 1


@pytest.mark.parametrize("growth", [100, 1], ids=["far-past", "one-byte-past"])
def test_a_record_that_grows_past_the_limit_after_its_size_was_seen_is_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, growth: int
) -> None:
    """``one-byte-past``: exactly at the limit when seen, one byte over when read."""
    path = tmp_path / "state.json"
    path.write_bytes(b'{"a": 1}' + b" " * 56)  # 64 bytes: the limit
    _grow_after_fstat(monkeypatch, path, b" " * growth)
    with pytest.raises(DamagedRecordError, match="more than 64"):
        read_record(path, limit=64)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ({"owner": OWNER.to_json()}, "app is None, not dict"),
        ({"app": {"roles": []}, "owner": OWNER.to_json()}, "app.name is None, not str"),
        (
            {"app": {"name": "n", "roles": [{"name": "r", "num_replicas": "2"}]}, "owner": {}},
            "app.roles[0].num_replicas is '2', not int",
        ),
        ({"app": {"name": "n", "roles": [{"name": 1}]}}, "app.roles[0].name is 1"),
        ({"app": {"name": "n", "roles": [{"name": "r", "mounts": [{}]}]}}, "'kind'"),
        ({"app": APP.to_json(), "owner": "me"}, "owner is 'me'"),
        ({"app": APP.to_json()}, "owner is None"),
        ("[1]", "the record is [1]"),
    ],
)
def test_a_damaged_app_record_is_damage(tmp_path: Path, content: object, why: str) -> None:
    store = _store(tmp_path)
    path = store.app_dir / "app.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DamagedRecordError) as err:
        store.read_app()
    assert why in str(err.value) and err.value.path == str(path)


def test_damaged_index_entries_are_listed_as_such_between_the_intact_ones(
    tmp_path: Path,
) -> None:
    index = Index(tmp_path, "local")
    index.add("s", "a-1", tmp_path / "a-1")
    index.add("s", "x/2", tmp_path / "x-2")
    session = index.root / "s"
    (session / "b-junk.json").write_text('{"app_dir": 5}')
    (session / "c-dir.json").mkdir()
    os.mkfifo(session / "d-fifo.json")
    (session / "e-empty.json").write_text("")
    write_json_atomic(session / "f-moved.json", {"app_dir": "/x", "app_id": "a-1", "session": "s"})
    (session / "notes.txt").write_text("not an entry")  # passed over: no .json ending
    (session / ".a-1.json.tmp123").write_text("{")  # a write in progress: passed over too
    (index.root / "stray-file").write_text("not a session")

    entries = _read_in_a_thread(lambda: list(index.entries()))
    assert [(e.session, e.app_id) for e in entries] == [
        ("s", "a-1"),
        ("s", "b-junk"),
        ("s", "c-dir"),
        ("s", "d-fifo"),
        ("s", "e-empty"),
        ("s", "f-moved"),
        ("s", "x/2"),
    ]
    intact = {e.app_id: e.app_dir for e in entries if e.damage is None}
    assert intact == {"a-1": tmp_path / "a-1", "x/2": tmp_path / "x-2"}
    damage = {e.app_id: str(e.damage) for e in entries if e.damage is not None}
    assert "app_dir is 5, not str" in damage["b-junk"]
    assert "not a regular file (a directory)" in damage["c-dir"]
    assert "not a regular file (a FIFO)" in damage["d-fifo"]
    assert damage["e-empty"].endswith(": empty")
    assert "it names app s/a-1, its place s/f-moved" in damage["f-moved"]
    assert all(e.app_dir is None for e in entries if e.damage is not None)

    assert index.lookup("s", "x/2") == tmp_path / "x-2"
    assert index.lookup("s", "never") is None
    with pytest.raises(DamagedRecordError, match="a FIFO"):
        _read_in_a_thread(lambda: index.lookup("s", "d-fifo"))


def test_a_damaged_status_says_so_for_the_app_and_each_replica() -> None:
    error = DamagedRecordError("/x/state.json", "empty")
    status = damaged_status(error, APP.roles)
    assert status.state is AppState.UNKNOWN
    assert status.msg == "damaged record: /x/state.json: empty"
    assert [(r.role, r.id, r.state) for rs in status.roles for r in rs.replicas] == [
        ("r", 0, ReplicaState.UNKNOWN),
        ("r", 1, ReplicaState.UNKNOWN),
    ]
    assert status.is_settled and not status.is_terminal
    assert damaged_status(error).roles == ()


def test_an_error_file_that_is_a_fifo_reads_as_none_without_blocking(tmp_path: Path) -> None:
    store = AppStore(tmp_path)
    os.mkfifo(tmp_path / "error.json")
    assert _read_in_a_thread(lambda: store.read_error_file(tmp_path / "error.json")) == ""
    (tmp_path / "e2.json").write_text("é" * 10)
    assert store.read_error_file(tmp_path / "e2.json", limit=4) == "éééé"


def test_every_record_says_its_format_and_one_without_it_is_the_first(tmp_path: Path) -> None:
    """Records written before the ``format`` field existed have format 1's layout."""
    store = _store(tmp_path)
    index = Index(tmp_path, "local")
    index.add("s", "a-1", store.app_dir)
    paths = [store.app_dir / "app.json", store.app_dir / "state.json", index.entry_path("s", "a-1")]
    for path in paths:
        record = json.loads(path.read_text())
        assert record["format"] == RECORD_FORMAT == 1
        del record["format"]
        path.write_text(json.dumps(record))
    assert store.read_state() == (STATUS, OWNER)
    app = store.read_app()
    assert app is not None and app.app == APP
    assert index.lookup("s", "a-1") == store.app_dir


@pytest.mark.parametrize("name", ["app.json", "state.json", "index"])
def test_a_record_of_a_newer_format_is_refused_saying_so_never_misread(
    tmp_path: Path, name: str
) -> None:
    store = _store(tmp_path)
    index = Index(tmp_path, "local")
    index.add("s", "a-1", store.app_dir)
    path = index.entry_path("s", "a-1") if name == "index" else store.app_dir / name
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "format": RECORD_FORMAT + 1}))
    readers: dict[str, Callable[[], object]] = {
        "app.json": store.read_app,
        "state.json": store.read_state,
        "index": lambda: index.lookup("s", "a-1"),
    }
    read = readers[name]
    with pytest.raises(DamagedRecordError) as err:
        read()
    assert err.value.path == str(path)
    assert f"written by a newer asupervisor (record format {RECORD_FORMAT + 1}" in str(err.value)
    if name == "index":
        (entry,) = index.entries()
        assert entry.damage is not None and "newer asupervisor" in str(entry.damage)
    for bad, why in (("2", "format is '2', not int"), (0, "format is 0, not a record format")):
        path.write_text(json.dumps({**record, "format": bad}))
        with pytest.raises(DamagedRecordError, match=why):
            read()


def test_the_app_record_is_typed_and_keeps_what_a_backend_adds(tmp_path: Path) -> None:
    store = AppStore(tmp_path / "app")
    record = AppRecord(
        handle="slurm://s/a-1",
        app=APP,
        owner=OWNER,
        request={"app_dir": str(store.app_dir)},
        extra={"job_id": 42, "identity": {"comment": "c"}},
    )
    store.create([], record)
    assert store.read_app() == record
    on_disk = json.loads((store.app_dir / "app.json").read_text())
    assert on_disk["format"] == RECORD_FORMAT and on_disk["job_id"] == 42
    # The record's own fields are its own: ``extra`` cannot pass for them.
    clash = AppRecord(handle="local://s/a-1", app=APP, owner=OWNER, extra={"owner": "x"})
    store.write_app(clash)
    found = store.read_app()
    assert found is not None and found.owner == OWNER and "owner" not in found.extra


def _steps(*seqs: int) -> list[Transition]:
    return [Transition(seq, float(seq), "A", "B", "go") for seq in seqs]


def test_a_journal_append_cut_short_is_left_out_and_the_next_append_cuts_it_off(
    tmp_path: Path,
) -> None:
    """An append its writer died in (no newline) is left out by readers, the rest kept;
    the next writer (one that attached) cuts it off before its own lines, which would
    otherwise join it into a line that is no record. Any other bad line is damage."""
    store = AppStore(tmp_path)
    journal = tmp_path / "transitions.jsonl"
    lines = "".join(t.to_json_line() + "\n" for t in _steps(0, 1))
    journal.write_text(lines + '{"seq": 2, "at": 17')
    assert store.read_transitions() == _steps(0, 1)
    append_bytes(journal, "".join(t.to_json_line() + "\n" for t in _steps(2)).encode())
    assert store.read_transitions() == _steps(0, 1, 2)
    journal.write_text(lines + "not json\n" + lines)
    with pytest.raises(DamagedRecordError, match="no transition"):
        store.read_transitions()
    assert store.read_transitions_or_none() == []
