"""The owner's journal: kept open from its first append to its final record.

A writer of every record of an app (``write_state(..., ready_next=True)``, the
local backend's) appends to ``transitions.jsonl`` through one descriptor kept
open, so the final record's append is one ``write``. What a reader sees must be
what it saw when each append opened the file: every line once, in order, after
whatever the journal held before, no torn line, and no descriptor left open.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from supervisor.backends import store as store_module
from supervisor.backends.store import AppStore, Owner
from supervisor.logs.timestamps import write_all
from supervisor.states import AppState
from supervisor.status import AppStatus, Transition

RUNNING, ENDED = AppStatus(AppState.RUNNING), AppStatus(AppState.SUCCEEDED)


def _steps(first: int, count: int) -> list[Transition]:
    return [Transition(seq, 10.0 + seq, "A", "B", "t") for seq in range(first, first + count)]


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _new_store(tmp_path: Path) -> AppStore:
    store = AppStore(tmp_path / "app")
    store.app_dir.mkdir()
    return store


def test_the_journal_takes_every_write_in_order_and_closes_at_the_final_record(
    tmp_path: Path,
) -> None:
    owner = Owner.current()
    store = _new_store(tmp_path)
    before = _open_descriptors()
    history = _steps(0, 6)
    store.write_state(RUNNING, history[:2], False, owner, ready_next=True)
    assert len(_open_descriptors() - before) == 1, "the journal is not kept open"
    # Transitions already journaled come again with the next write: appended once.
    store.write_state(RUNNING, history[:4], False, owner, ready_next=True)
    store.write_state(ENDED, history[3:], True, owner, ready_next=True)
    assert _open_descriptors() == before, "the final record left the journal open"
    assert store.read_transitions() == history
    store.end_writing()
    assert _open_descriptors() == before


def test_a_writer_that_never_writes_the_final_record_closes_the_journal_at_the_end(
    tmp_path: Path,
) -> None:
    owner = Owner.current()
    store = _new_store(tmp_path)
    before = _open_descriptors()
    store.write_state(RUNNING, _steps(0, 2), False, owner, ready_next=True)
    store.end_writing()
    assert _open_descriptors() == before
    assert store.read_transitions() == _steps(0, 2)


def test_the_kept_journal_appends_after_what_the_file_held(tmp_path: Path) -> None:
    """A journal begun by another writer (another process, a record of before) is added to,
    never overwritten from its start."""
    owner = Owner.current()
    store = _new_store(tmp_path)
    store.write_state(RUNNING, _steps(0, 3), False, owner)  # no kept descriptor
    later = AppStore(store.app_dir)
    later.write_state(RUNNING, _steps(3, 2), False, owner, ready_next=True)
    later.write_state(ENDED, _steps(3, 4), True, owner, ready_next=True)
    later.end_writing()
    assert store.read_transitions() == _steps(0, 7)


def test_an_append_cut_short_leaves_no_torn_line_and_is_made_again_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A disk that fills in the middle of one write cannot be had on demand: the write is
    made to stop half way with ENOSPC, as the kernel's would.)"""
    owner = Owner.current()
    store = _new_store(tmp_path)
    store.write_state(RUNNING, _steps(0, 2), False, owner, ready_next=True)

    def half_then_full(fd: int, data: bytes) -> None:
        write_all(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module, "write_all", half_then_full)
    with pytest.raises(OSError, match="No space"):
        store.write_state(RUNNING, _steps(0, 4), False, owner, ready_next=True)
    assert store.read_transitions() == _steps(0, 2), "a torn line was left for readers"
    monkeypatch.undo()
    store.write_state(ENDED, _steps(0, 5), True, owner, ready_next=True)
    store.end_writing()
    assert store.read_transitions() == _steps(0, 5)
