"""Damaged records of local apps: each is reported as damaged, every other app still listed.

Issue 19: one damaged record (an unknown state, wrong types, a directory or a
FIFO named state.json, a stray file in the index) made ``list`` raise, or hang
on the FIFO, for every app; a state.json cut short showed a SUCCEEDED app as
SUBMITTED. The apps here ran for real; their records are then damaged on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, ReplicaState, Supervisor, UnknownAppError
from supervisor.backends.store import Index
from supervisor.specs import parse_handle

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def _app_dir(state_dir: Path, handle: str) -> Path:
    parsed = parse_handle(handle)
    found = Index(state_dir, "local").lookup(parsed.session, parsed.app_id)
    assert found is not None
    return found


def _cli_list(state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_damaged_records_are_listed_as_damaged_and_hide_no_other_app(
    state_dir: Path,
) -> None:
    role = py_role("a", "print('out')")
    async with Supervisor(session="svc") as sv:
        handles = {
            name: await sv.submit(app(role, name=name), "local")
            for name in ("good", "cut", "fifo", "dir", "unknown", "types", "badapp")
        }
        for handle in handles.values():
            assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED

    dirs = {name: _app_dir(state_dir, h) for name, h in handles.items()}
    state = (dirs["cut"] / "state.json").read_bytes()
    (dirs["cut"] / "state.json").write_bytes(state[: len(state) // 2])
    (dirs["fifo"] / "state.json").unlink()
    os.mkfifo(dirs["fifo"] / "state.json")
    (dirs["dir"] / "state.json").unlink()
    (dirs["dir"] / "state.json").mkdir()
    record = json.loads(state)
    record["status"]["state"] = "FINISHED"
    (dirs["unknown"] / "state.json").write_text(json.dumps(record))
    record = json.loads(state)
    record["status"]["roles"][0]["replicas"] = "all of them"
    (dirs["types"] / "state.json").write_text(json.dumps(record))
    described_app = json.loads((dirs["badapp"] / "app.json").read_text())
    described_app["app"]["roles"] = {"a": 1}
    (dirs["badapp"] / "app.json").write_text(json.dumps(described_app))
    session = state_dir / "index" / "local" / "svc"
    (session / "stray.json").write_text("not json")
    os.mkfifo(session / "stray-fifo.json")

    async with Supervisor(session="reader") as reader:
        with anyio.fail_after(30):
            listed = {a.app_id: a for a in await reader.list("local")}
        ids = {name: parse_handle(h).app_id for name, h in handles.items()}
        assert set(listed) == {*ids.values(), "stray", "stray-fifo"}
        good = listed[ids["good"]]
        assert (good.state, good.name, good.msg) == (AppState.SUCCEEDED, "good", "")
        why = {
            "cut": "state.json: not JSON",
            "fifo": "state.json: not a regular file (a FIFO)",
            "dir": "state.json: not a regular file (a directory)",
            "unknown": "state.json: no 'FINISHED' (an unknown state, or a missing field)",
            "types": "state.json: roles[0].replicas is 'all of them', not list",
            "badapp": "app.json: app.roles is {'a': 1}, not list",
        }
        for name, end in why.items():
            entry = listed[ids[name]]
            assert entry.state is AppState.UNKNOWN, entry
            assert entry.msg.startswith(f"damaged record: {dirs[name]}/"), entry
            assert end in entry.msg, entry
            assert entry.name == ("" if name == "badapp" else name), entry
            assert entry.app_handle == handles[name]
        for stray in ("stray", "stray-fifo"):
            entry = listed[stray]
            assert entry.state is AppState.UNKNOWN and entry.app_handle == f"local://svc/{stray}"
            assert entry.msg.startswith(f"damaged record: {session / stray}.json: "), entry

        # Cut short, the record says it is damaged: never the older "SUBMITTED".
        with anyio.fail_after(30):
            described = await reader.describe(handles["cut"])
            waited = await reader.wait(handles["cut"])
            assert await reader.describe(handles["fifo"]) is not None
            assert (await reader.wait(handles["fifo"])).state is AppState.UNKNOWN
            lines = [x async for x in reader.log_iter(handles["cut"], "a")]
            followed = [x async for x in reader.log_iter(handles["fifo"], "a", should_tail=True)]
        assert described is not None and described.state is AppState.UNKNOWN
        assert described.msg == listed[ids["cut"]].msg
        assert [r.name for r in described.roles] == ["a"]
        replica = described.to_status().replica("a", 0)
        assert replica is not None and replica.state is ReplicaState.UNKNOWN
        assert waited.state is AppState.UNKNOWN and waited.msg == described.msg
        # The logs were not damaged: they still read.
        assert lines == followed == ["out\n"]

        bad = await reader.describe(handles["badapp"])
        assert bad is not None and bad.state is AppState.UNKNOWN and bad.roles == ()
        assert bad.msg == listed[ids["badapp"]].msg
        assert (await reader.wait(handles["badapp"], timeout=10)).msg == bad.msg
        with pytest.raises(UnknownAppError, match="has no replica a/0: damaged record: "):
            [x async for x in reader.log_iter(handles["badapp"], "a")]
        entry_only = await reader.describe("local://svc/stray")
        assert entry_only is not None and entry_only.state is AppState.UNKNOWN
        assert entry_only.msg == listed["stray"].msg
        # A cancel of an app that ended in truth but whose record is damaged still answers.
        await reader.cancel(handles["cut"])

    done = await anyio.to_thread.run_sync(_cli_list, state_dir)
    assert done.returncode == 0, done.stderr
    by_id = {a["app_id"]: a for a in json.loads(done.stdout)}
    assert by_id[ids["good"]]["state"] == "SUCCEEDED"
    assert by_id[ids["fifo"]]["state"] == "UNKNOWN"
    assert by_id[ids["fifo"]]["msg"] == listed[ids["fifo"]].msg


async def test_a_damaged_record_of_a_running_app_is_still_cancelled_by_its_owner(
    state_dir: Path,
) -> None:
    """The owner lives and reads the cancel request, whatever became of its state record."""
    role = py_role("a", "import time; print('up', flush=True); time.sleep(60)")
    async with Supervisor(session="owner") as owner, Supervisor(session="other") as other:
        handle = await owner.submit(app(role), "local")
        with anyio.fail_after(30):
            async for line in owner.log_iter(handle, "a", should_tail=True):
                assert line == "up\n"
                break
        state = _app_dir(state_dir, handle) / "state.json"
        state.write_text("")
        listed = {a.app_handle: a for a in await other.list("local")}
        assert listed[handle].state is AppState.UNKNOWN
        assert listed[handle].msg == f"damaged record: {state}: empty"
        await other.cancel(handle)
        with anyio.fail_after(30):
            assert (await owner.wait(handle)).state is AppState.CANCELLED
        # The owner's final record replaced the damaged one.
        listed = {a.app_handle: a for a in await other.list("local")}
        assert listed[handle].state is AppState.CANCELLED, listed[handle]
        assert "damaged" not in listed[handle].msg


async def test_a_journal_cut_short_keeps_what_it_holds_and_a_fifo_in_its_place_hangs_nothing(
    state_dir: Path,
) -> None:
    """An append cut short (its writer died in it) emptied the whole history: ``describe``
    showed no transitions, and a ``watch`` gave steps numbered from 0 again. A FIFO named
    like the journal hung ``describe`` for good, in a thread nothing could cancel."""
    async with Supervisor(session="svc") as sv:
        torn = await sv.submit(app(py_role("a", "pass"), name="torn"), "local")
        fifo = await sv.submit(app(py_role("a", "pass"), name="fifo"), "local")
        for handle in (torn, fifo):
            await sv.wait(handle, timeout=30)
    async with Supervisor(session="reader") as reader:
        described = await reader.describe(torn)
        assert described is not None
        recorded = list(described.transitions)
        assert recorded and [t.seq for t in recorded] == list(range(len(recorded)))
        with (_app_dir(state_dir, torn) / "transitions.jsonl").open("a") as journal:
            journal.write(f'{{"seq": {len(recorded)}, "at": 17')  # no newline: cut short
        with anyio.fail_after(30):
            again = await reader.describe(torn)
            watched = [t async for t in reader.watch(torn)]
        assert again is not None and list(again.transitions) == recorded
        assert again.state is AppState.SUCCEEDED
        assert watched == recorded
        journal_path = _app_dir(state_dir, fifo) / "transitions.jsonl"
        journal_path.unlink()
        os.mkfifo(journal_path)
        with anyio.fail_after(10):
            described = await reader.describe(fifo)
        assert described is not None and described.state is AppState.SUCCEEDED
        assert list(described.transitions) == []  # the history is lost: not made up
