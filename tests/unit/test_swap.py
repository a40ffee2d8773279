"""Replacing a record's file: readers see the old or the new, never half; nothing left over."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from supervisor import AppState
from supervisor.backends import swap
from supervisor.backends.store import AppStore, Owner, write_json_atomic
from supervisor.status import AppStatus


@pytest.fixture(params=["exchange", "replace"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways: this machine has the exchange; a filesystem without one is made by hand
    (no such filesystem can be mounted here on demand), so the fallback is tested too."""
    if request.param == "replace":
        monkeypatch.setattr(swap, "_exchange", None)
    else:
        assert swap._exchange is not None, "renameat2 is expected on Debian 12's glibc"
    return str(request.param)


def _leftovers(directory: Path, name: str) -> list[str]:
    return [entry for entry in os.listdir(directory) if entry.startswith(f".{name}.")]


def test_a_new_file_takes_the_place_of_the_old_and_nothing_is_left(
    how: str, tmp_path: Path
) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"v": 1})  # nothing there yet: a plain rename
    write_json_atomic(path, {"v": 2})
    write_json_atomic(path, {"v": 3})
    assert json.loads(path.read_text()) == {"v": 3}
    assert _leftovers(tmp_path, "state.json") == []


def test_a_file_said_new_is_put_in_place_even_where_one_is_after_all(
    how: str, tmp_path: Path
) -> None:
    """``new`` only spares the exchange's failing try: a file that is there (an entry left
    by an earlier launch of the same id) is replaced as by any write, atomically."""
    path = tmp_path / "app.json"
    write_json_atomic(path, {"v": 1}, new=True)
    assert json.loads(path.read_text()) == {"v": 1}
    write_json_atomic(path, {"v": 2}, new=True)
    assert json.loads(path.read_text()) == {"v": 2}
    assert _leftovers(tmp_path, "app.json") == []


def test_a_file_said_new_tries_no_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no file is yet, the exchange only fails (ENOENT) before the rename: a file
    said ``new`` goes without that try (three per one-replica app: its first app.json,
    index entry and state.json)."""
    real = swap._exchange
    assert real is not None, "renameat2 is expected on Debian 12's glibc"
    tries: list[bytes] = []

    def counted(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int) -> int:
        tries.append(new)
        return real(old_dir, old, new_dir, new, flags)

    monkeypatch.setattr(swap, "_exchange", counted)
    write_json_atomic(tmp_path / "new.json", {"v": 1}, new=True)
    assert tries == []
    write_json_atomic(tmp_path / "other.json", {"v": 1})  # not said new: tried, and failed
    write_json_atomic(tmp_path / "other.json", {"v": 2})  # over a file: the exchange
    assert len(tries) == 2
    assert json.loads((tmp_path / "other.json").read_text()) == {"v": 2}


def test_only_over_writes_nothing_where_no_file_is(how: str, tmp_path: Path) -> None:
    """A settle after a ``gc`` removed the entry must not write the entry back."""
    path = tmp_path / "entry.json"
    write_json_atomic(path, {"v": 1}, only_over=True)
    assert not path.exists()
    path.write_text("{}")
    write_json_atomic(path, {"v": 2}, only_over=True)
    assert json.loads(path.read_text()) == {"v": 2}
    assert _leftovers(tmp_path, "entry.json") == []


def test_swap_into_place_says_whether_it_wrote(how: str, tmp_path: Path) -> None:
    path = tmp_path / "target"
    fd, tmp = swap.create_beside(path)
    os.close(fd)
    assert swap.swap_into_place(tmp, path, only_over=True) is False
    assert not tmp.exists() and not path.exists()
    fd, tmp = swap.create_beside(path)
    os.close(fd)
    assert swap.swap_into_place(tmp, path) is True
    assert path.exists() and not tmp.exists()


def test_a_reader_never_sees_half_a_record(how: str, tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"v": 0, "pad": "x" * 20_000})
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def read() -> None:
        while not stop.is_set():
            text = path.read_text()
            try:
                seen.append(json.loads(text)["v"])
            except ValueError:
                failures.append(text[:80])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for v in range(1, 300):
            write_json_atomic(path, {"v": v, "pad": "x" * 20_000})
    finally:
        stop.set()
        reader.join()
    assert failures == []
    assert seen == sorted(seen) and seen[-1] <= 299
    assert _leftovers(tmp_path, "state.json") == []


def test_a_name_left_by_a_dead_writer_is_stepped_over(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    fd, first = swap.create_beside(path)
    os.close(fd)
    fd, second = swap.create_beside(path)
    os.close(fd)
    assert first != second and first.exists() and second.exists()
    assert first.name.startswith(f".state.json.{os.getpid()}.")


def test_a_failed_write_removes_its_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A full disk at exactly this step cannot be had on demand: the step is made to fail.)"""
    path = tmp_path / "state.json"

    def refuse(tmp: Path, target: Path, **how: bool) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("supervisor.backends.store.swap_into_place", refuse)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(path, {"v": 1})
    assert os.listdir(tmp_path) == []


def test_a_state_write_makes_the_next_ones_file_only_when_asked(how: str, tmp_path: Path) -> None:
    """``ready_next`` with ``ready_spare`` after a non-final state write: the file the next
    write goes into is made (the final one, on the path of ``wait``, then creates none;
    the writer asks for it apart, off the path of whoever waits for the non-final
    one); the final write leaves
    the old state under its temporary name, and ``discard_spare`` removes it (an unlink
    off the path of ``wait``); a writer that will not write the final record asks for
    none (an app that outlives its Supervisor gets that record from another process);
    one that stops before its final write removes it (``discard_spare``)."""
    owner = Owner.current()
    store = AppStore(tmp_path / "app")
    store.app_dir.mkdir()
    running, ended = AppStatus(AppState.RUNNING), AppStatus(AppState.SUCCEEDED)

    store.write_state(running, [], False, owner)
    assert _leftovers(store.app_dir, "state.json") == []
    store.write_state(running, [], False, owner, ready_next=True)
    assert _leftovers(store.app_dir, "state.json") == []  # (not in the write itself)
    store.ready_spare()
    [made] = _leftovers(store.app_dir, "state.json")
    assert (store.app_dir / made).stat().st_size == 0
    store.write_state(ended, [], True, owner, ready_next=True)
    if how == "exchange":
        [old] = _leftovers(store.app_dir, "state.json")
        assert old == made  # the spare's name, now the replaced state's
        assert json.loads((store.app_dir / old).read_text())["final"] is False
    else:  # a rename leaves no old file
        assert _leftovers(store.app_dir, "state.json") == []
    assert json.loads((store.app_dir / "state.json").read_text())["final"] is True
    store.discard_spare()
    assert _leftovers(store.app_dir, "state.json") == []

    store.write_state(running, [], False, owner, ready_next=True)
    store.ready_spare()
    store.ready_spare()  # (one is enough: a second call makes none)
    assert len(_leftovers(store.app_dir, "state.json")) == 1
    store.discard_spare()
    assert _leftovers(store.app_dir, "state.json") == []


def test_the_first_records_files_made_ahead_are_the_ones_it_goes_into(tmp_path: Path) -> None:
    """``make_first_files``: the journal (empty, read as none) and the file the first
    state.json goes into, made before that record; the record then creates no file:
    its state.json is that very file, and nothing is left beside it."""
    owner = Owner.current()
    store = AppStore(tmp_path / "app")
    store.app_dir.mkdir()
    store.make_first_files()
    journal = store.app_dir / "transitions.jsonl"
    assert journal.stat().st_size == 0 and store.read_transitions() == []
    [made] = _leftovers(store.app_dir, "state.json")
    spare_inode = (store.app_dir / made).stat().st_ino
    assert store.read_state() is None  # nothing is recorded yet

    store.write_state(AppStatus(AppState.RUNNING), [], False, owner, ready_next=True)
    assert (store.app_dir / "state.json").stat().st_ino == spare_inode
    assert _leftovers(store.app_dir, "state.json") == []
    read = store.read_state()
    assert read is not None and read[0].state is AppState.RUNNING

    store.make_first_files()  # after the first record: nothing more is made
    assert _leftovers(store.app_dir, "state.json") == []
