"""A lone replica's app claimed with its spawn, in one round trip to the reaper.

Once the reaper runs, an app of one replica does not first go to the records'
thread: the reaper makes the app directory (the claim, one ``mkdir``), the
replica's and the final record's reserve, says so, then spawns; ``app.json``
and the index entry are written while the replica starts, in the records'
thread, and the first record finds them there. What the records-first launch promised
holds on this way too, and these tests check it with real processes: an id
already taken starts nothing and touches nothing of the app that holds it, a
replica that cannot start is recorded and listed, and a reaper that cannot
answer leaves a recorded failure, not a lost app. (A full disk on both ways:
``test_faults_logs.test_a_submit_with_no_room_gives_its_app_id_back``.)
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, DuplicateAppError, Role, Supervisor
from supervisor.backends.local.backend import LocalBackend, LocalRuntime
from supervisor.backends.local.process import ReplicaProcess

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

RESERVE = ".final-record.reserve"


async def _reaper_running(sv: Supervisor, log_dir: Path) -> LocalBackend:
    """One app run to its end: this Supervisor's reaper runs from now on."""
    warm = await sv.submit(app(py_role("w", "pass")), "local", {"log_dir": str(log_dir)})
    assert (await sv.wait(warm, timeout=60)).state is AppState.SUCCEEDED
    backend = sv.backend("local")
    assert isinstance(backend, LocalBackend) and backend.reaper.running
    return backend


def _reaper_pid(backend: LocalBackend) -> int:
    conn = backend.reaper._conn
    assert conn is not None
    return conn.popen.pid


async def _listed(state_dir: Path) -> dict[str, AppState]:
    """Each app's state as another process lists it."""
    async with Supervisor(session="svc", state_dir=state_dir) as other:
        return {a.app_handle: a.state for a in await other.list("local")}


@pytest.mark.parametrize("replicas", [1, 2], ids=["lone", "several"])
async def test_a_taken_id_starts_nothing_and_leaves_the_holders_files(
    tmp_path: Path, replicas: int
) -> None:
    """Another Supervisor schedules an app id a running app holds: refused, its replicas
    never start, and the holder keeps its reserve, its state and its cancel requests
    (the refused launch's clean-up used to give the holder's reserve back)."""
    logs = tmp_path / "logs"
    cfg = {"log_dir": str(logs)}
    marker = tmp_path / "second-ran"
    async with Supervisor(session="svc", state_dir=tmp_path / "state-a") as first:
        holder = await first.schedule(
            first.dryrun(
                app(py_role("r", "import time; time.sleep(60)")), "local", cfg, app_id="dup-1"
            )
        )
        app_dir = logs / "svc" / "dup-1"
        held = {RESERVE, "app.json", "state.json", "transitions.jsonl"}
        assert held <= {p.name for p in app_dir.iterdir()}
        async with Supervisor(session="svc", state_dir=tmp_path / "state-b") as second:
            await _reaper_running(second, tmp_path / "warm")
            spec = app(py_role("r", f"open({str(marker)!r}, 'w')", num_replicas=replicas))
            with pytest.raises(DuplicateAppError, match="'dup-1' is already taken"):
                await second.schedule(second.dryrun(spec, "local", cfg, app_id="dup-1"))
        assert held <= {p.name for p in app_dir.iterdir()}
        status = first.status(holder)
        assert status is not None and status.state is AppState.RUNNING
        await first.cancel(holder)
        assert (await first.wait(holder, timeout=30)).state is AppState.CANCELLED
    assert not marker.exists()


async def test_a_lone_replica_that_cannot_start_is_recorded_and_listed(tmp_path: Path) -> None:
    """The claim was made, the spawn failed (no such program): the app is recorded
    (``app.json``, the index entry) and ends FAILED with 127, for every process."""
    cfg = {"log_dir": str(tmp_path / "logs")}
    state_dir = tmp_path / "state"
    async with Supervisor(session="svc", state_dir=state_dir) as sv:
        await _reaper_running(sv, tmp_path / "warm")
        spec = app(Role(name="r", entrypoint="/nonexistent/asv-no-such-program"))
        handle = await sv.submit(spec, "local", cfg)
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.FAILED
        assert status.roles[0].replicas[0].exit_code == 127
        app_id = handle.rpartition("/")[2]
        assert (tmp_path / "logs" / "svc" / app_id / "app.json").is_file()
    async with Supervisor(session="svc", state_dir=state_dir) as other:
        listed = {a.app_handle: a.state for a in await other.list("local")}
        assert listed[handle] is AppState.FAILED
        described = await other.describe(handle)
        # (``roles`` come from ``app.json``, the first record's.)
        assert described is not None and [r.entrypoint for r in described.roles] == [
            "/nonexistent/asv-no-such-program"
        ]


async def test_a_lone_spawn_the_reaper_cannot_answer_is_recorded_as_a_failure(
    tmp_path: Path,
) -> None:
    """The reaper is killed just before a lone replica's spawn (this process has not
    heard of it yet): the claim cannot have been made, so the records are made here, and
    the app fails saying why; the next submit starts a new reaper."""
    cfg = {"log_dir": str(tmp_path / "logs")}
    state_dir = tmp_path / "state"
    async with Supervisor(session="svc", state_dir=state_dir) as sv:
        backend = await _reaper_running(sv, tmp_path / "warm")
        reaper_pid = _reaper_pid(backend)
        os.kill(reaper_pid, signal.SIGKILL)  # no await before the submit: unheard of
        handle = await sv.submit(app(py_role("r", "pass")), "local", cfg)
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.FAILED, status
        assert "reaper" in status.msg, status.msg
        again = await sv.submit(app(py_role("r", "pass")), "local", cfg)
        assert (await sv.wait(again, timeout=60)).state is AppState.SUCCEEDED
    listed = await _listed(state_dir)
    assert listed[handle] is AppState.FAILED
    assert listed[again] is AppState.SUCCEEDED


async def test_a_lone_replicas_first_records_are_written_while_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper tells of the claim before it answers the spawn, and ``app.json`` and the
    index entry are written then, once: the first record, on the way to ``submit``'s
    return, does not write them again."""
    seen: list[str] = []
    claim_made, fill_store, start = (
        LocalRuntime._claim_made,
        LocalRuntime._fill_store,
        ReplicaProcess.start.__func__,  # type: ignore[attr-defined]
    )

    def told(self: LocalRuntime) -> None:
        seen.append("claim told")
        claim_made(self)

    def filled(self: LocalRuntime) -> None:
        seen.append("filled")
        fill_store(self)

    async def started(cls: type[ReplicaProcess], /, *args: object, **kwargs: object) -> object:
        proc = await start(cls, *args, **kwargs)
        seen.append("spawn answered")
        return proc

    cfg = {"log_dir": str(tmp_path / "logs")}
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        backend = await _reaper_running(sv, tmp_path / "warm")
        await backend.records.run(lambda: None)  # what the warm app left is done
        monkeypatch.setattr(LocalRuntime, "_claim_made", told)
        monkeypatch.setattr(LocalRuntime, "_fill_store", filled)
        monkeypatch.setattr(ReplicaProcess, "start", classmethod(started))
        handle = await sv.submit(app(py_role("r", "pass")), "local", cfg)
        app_dir = tmp_path / "logs" / "svc" / handle.rpartition("/")[2]
        assert {"app.json", "state.json"} <= {p.name for p in app_dir.iterdir()}
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    assert seen.index("claim told") < seen.index("spawn answered")
    assert seen.count("filled") == 1


async def test_a_host_busy_with_records_is_not_told_and_the_first_record_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With calls queued in the records' thread (a burst of small apps), the reaper is not
    asked to tell of its claim (``LocalRuntime._fill_pays``): writing the records
    beside the spawn would only cost the host CPU there. The first record then writes
    ``app.json`` and the index entry, and the app is recorded and listed all the same."""
    seen: list[str] = []
    fill_store = LocalRuntime._fill_store

    def told(self: LocalRuntime) -> None:
        seen.append("claim told")

    def filled(self: LocalRuntime) -> None:
        seen.append("filled")
        fill_store(self)

    spawned = anyio.Event()
    spawn_lone = LocalRuntime._spawn_lone

    async def lone(self: LocalRuntime) -> None:
        await spawn_lone(self)
        spawned.set()

    release = threading.Event()
    handles: list[str] = []
    cfg = {"log_dir": str(tmp_path / "logs")}
    state_dir = tmp_path / "state"
    async with Supervisor(session="svc", state_dir=state_dir) as sv:
        backend = await _reaper_running(sv, tmp_path / "warm")
        monkeypatch.setattr(LocalRuntime, "_claim_made", told)
        monkeypatch.setattr(LocalRuntime, "_fill_store", filled)
        monkeypatch.setattr(LocalRuntime, "_spawn_lone", lone)

        async def submit() -> None:
            handles.append(await sv.submit(app(py_role("r", "pass")), "local", cfg))

        try:
            # Two calls ahead in the records' thread, held there until the spawn is done.
            assert backend.records.post(release.wait, 30)
            assert backend.records.post(release.wait, 30)
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                with anyio.fail_after(30):
                    await spawned.wait()
                release.set()
        finally:
            release.set()
        (handle,) = handles
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    assert seen == ["filled"]
    listed = await _listed(state_dir)
    assert listed[handle] is AppState.SUCCEEDED


async def test_a_reaper_that_dies_after_telling_of_its_claim_leaves_a_recorded_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper is killed as soon as it said it made the claim (its spawn then under way,
    or answered in the socket): the directory is known to be this launch's, so the app
    is recorded, listed and ends saying the reaper ended, and its id is not read as
    taken by someone else (a submit that raised and left the directory, before)."""
    claim_made = LocalRuntime._claim_made
    cfg = {"log_dir": str(tmp_path / "logs")}
    state_dir = tmp_path / "state"
    async with Supervisor(session="svc", state_dir=state_dir) as sv:
        backend = await _reaper_running(sv, tmp_path / "warm")
        reaper_pid = _reaper_pid(backend)

        def told_then_killed(self: LocalRuntime) -> None:
            os.kill(reaper_pid, signal.SIGKILL)
            claim_made(self)

        monkeypatch.setattr(LocalRuntime, "_claim_made", told_then_killed)
        await backend.records.run(lambda: None)  # what the warm app left is done
        token = f"lone-claim-{os.getpid()}-{tmp_path.name}"
        handle = await sv.submit(
            app(py_role("r", f"import time; time.sleep(30)  # {token}")), "local", cfg
        )
        monkeypatch.undo()
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.FAILED, status
        assert "reaper" in status.msg, status.msg
        app_dir = tmp_path / "logs" / "svc" / handle.rpartition("/")[2]
        assert (app_dir / "app.json").is_file()
        again = await sv.submit(app(py_role("r", "pass")), "local", cfg)
        assert (await sv.wait(again, timeout=60)).state is AppState.SUCCEEDED
    listed = await _listed(state_dir)
    assert listed[handle] is AppState.FAILED
    assert listed[again] is AppState.SUCCEEDED
    assert not _running_with(token)  # (were it spawned, it went with the reaper's cgroup)


async def test_first_records_that_cannot_be_written_ahead_are_tried_again_and_said(
    tmp_path: Path,
) -> None:
    """``app.json`` and the index entry written as the claim is told fail (the entry's
    place is taken by a directory here): the first record tries them again and the
    app's status says its records failed; once the place is free, a later record
    writes them, the notice goes, and another process lists the app."""
    gate = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    cfg = {"log_dir": str(tmp_path / "logs")}
    state_dir = tmp_path / "state"
    async with Supervisor(session="svc", state_dir=state_dir) as sv:
        await _reaper_running(sv, tmp_path / "warm")
        blocker = state_dir / "index" / "local" / "svc" / "blocked-1.json"
        (blocker / "inside").mkdir(parents=True)
        handle = await sv.schedule(
            sv.dryrun(app(py_role("r", code)), "local", cfg, app_id="blocked-1")
        )
        status = sv.status(handle)
        assert status is not None and status.state is AppState.RUNNING
        assert "recording the app's state for other processes failed" in status.msg, status
        shutil.rmtree(blocker)
        gate.touch()
        status = await sv.wait(handle, timeout=30)
        assert status.state is AppState.SUCCEEDED, status
        assert "recording" not in status.msg, status
    listed = await _listed(state_dir)
    assert listed[handle] is AppState.SUCCEEDED


def _running_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # ended meanwhile
    return found
