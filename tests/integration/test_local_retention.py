"""Issue 16 item 2: a service that runs for weeks keeps bounded memory and disk.

Ended apps leave the Supervisor's memory (their records answer from then on),
``gc`` and ``Supervisor(retention=...)`` remove the records and logs of settled
apps only, and ``list`` answers from the index, newest first, with filters.
Real local apps throughout.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import supervisor.finished as finished_module
from supervisor import AppState, Retention, SpecError, Supervisor, UnknownAppError
from supervisor.backends.store import Index
from supervisor.specs import parse_handle

from .helpers import app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli.main"]
SHORT = py_role("a", "print('out')")
LONG = py_role("a", "import time; print('up', flush=True); time.sleep(60)")


def _app_dir(state_dir: Path, handle: str) -> Path:
    parsed = parse_handle(handle)
    found = Index(state_dir, "local").lookup(parsed.session, parsed.app_id)
    assert found is not None
    return found


def _indexed(state_dir: Path, session: str) -> set[str]:
    return {
        f"local://{e.session}/{e.app_id}"
        for e in Index(state_dir, "local").entries()
        if e.session == session
    }


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _cli_json(state_dir: Path, *args: str) -> Any:
    done = _cli(state_dir, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_an_ended_app_leaves_memory_and_still_answers_from_its_records(
    state_dir: Path,
) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(SHORT, name="short"), "local")
        long = await sv.submit(app(LONG, name="long"), "local")
        assert set(sv.followed()) >= {long}
        # Waiters that came before the end are served by the actor they hold.
        async with anyio.create_task_group() as tg:
            seen: list[str] = []
            waited: list[AppState] = []

            async def watch() -> None:
                async for t in sv.watch(long):
                    if t.role is None:
                        seen.append(t.dest)

            async def wait() -> None:
                waited.append((await sv.wait(long, timeout=30)).state)

            tg.start_soon(watch)
            tg.start_soon(wait)
            with anyio.fail_after(30):
                async for line in sv.log_iter(long, "a", should_tail=True):
                    assert line == "up\n"
                    break
            await sv.cancel(long)
        assert waited == [AppState.CANCELLED] and seen[-1] == "CANCELLED"
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert sv.followed() == []  # each left as it ended, before its waiter resumed

        # status: from the bounded cache of final statuses, no I/O.
        status = sv.status(handle)
        assert status is not None and status.state is AppState.SUCCEEDED
        # Everything else: from the records, as for an app of another process.
        with anyio.fail_after(30):
            described = await sv.describe(handle)
            assert described is not None and described.state is AppState.SUCCEEDED
            assert described.times.ended is not None
            assert (await sv.wait(handle)).state is AppState.SUCCEEDED
            replayed = [t.dest async for t in sv.watch(handle) if t.role is None]
            assert replayed[-1] == "SUCCEEDED"
            assert replayed == [t.dest for t in described.transitions if t.role is None]
            assert [x async for x in sv.log_iter(handle, "a")] == ["out\n"]
            assert [x async for x in sv.log_iter(handle, "a", should_tail=True)] == ["out\n"]
            await sv.cancel(handle)  # a finished app: fine, nothing to stop
            assert (await sv.wait(long)).state is AppState.CANCELLED
        assert sv.followed() == []


async def test_the_cache_of_final_statuses_is_bounded(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finished_module, "MAX_APPS", 2)
    async with Supervisor(session="svc") as sv:
        handles = []
        for _ in range(3):
            handles.append(await sv.submit(app(SHORT), "local"))
            await sv.wait(handles[-1], timeout=30)
        assert sv.followed() == []  # each left as it ended, before its waiter resumed
        assert sv.status(handles[0]) is None  # left the cache: describe reads the records
        assert [sv.status(h) is not None for h in handles[1:]] == [True, True]
        described = await sv.describe(handles[0])
        assert described is not None and described.state is AppState.SUCCEEDED


async def test_the_cache_of_final_statuses_is_bounded_by_replicas(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big apps leave the cache sooner: their statuses are what a full GC pass walks."""
    monkeypatch.setattr(finished_module, "MAX_REPLICAS", 5)
    pair = py_role("a", "print('out')", num_replicas=2)
    async with Supervisor(session="svc") as sv:
        handles = []
        for _ in range(3):
            handles.append(await sv.submit(app(pair), "local"))
            await sv.wait(handles[-1], timeout=30)
        # 6 replica statuses for 5: the oldest app left, well below the count of apps.
        assert [sv.status(h) is not None for h in handles] == [False, True, True]
        big = await sv.submit(app(py_role("a", "print('out')", num_replicas=6)), "local")
        await sv.wait(big, timeout=30)
        # Bigger than the bound by itself: the latest app stays, alone.
        assert [sv.status(h) is not None for h in [*handles, big]] == [False, False, False, True]
        status = sv.status(big)
        assert status is not None and status.state is AppState.SUCCEEDED
        assert len(status.roles[0].replicas) == 6
        described = await sv.describe(handles[1])
        assert described is not None and described.state is AppState.SUCCEEDED


async def test_gc_removes_only_settled_apps_by_count_and_by_age(state_dir: Path) -> None:
    async with Supervisor(session="svc") as owner:
        ended = []
        for name in ("first", "second", "third"):
            ended.append(await owner.submit(app(SHORT, name=name), "local"))
            await owner.wait(ended[-1], timeout=30)
        running = await owner.submit(app(LONG, name="running"), "local")
        damaged = await owner.submit(app(SHORT, name="damaged"), "local")
        await owner.wait(damaged, timeout=30)
        # Its final record damaged while its owner lives: its end is not known, it stays.
        (_app_dir(state_dir, damaged) / "state.json").write_text("")
        dirs = {h: _app_dir(state_dir, h) for h in [*ended, running, damaged]}
        assert owner.followed() == [running]

        # Another Supervisor of the session: the running app is not in its memory.
        async with Supervisor(session="svc") as other, Supervisor(session="else") as stranger:
            assert await stranger.gc("local", keep=0) == []  # another session's apps stay
            would = await other.gc("local", keep=1, dry_run=True)
            assert would == [ended[1], ended[0]]
            assert all(d.exists() for d in dirs.values())

            assert await other.gc("local", keep=1) == [ended[1], ended[0]]
            for gone in ended[:2]:
                assert not dirs[gone].exists()
                assert await other.describe(gone) is None
            assert _indexed(state_dir, "svc") == {ended[2], running, damaged}

            assert await other.gc("local", older_than=0) == [ended[2]]
            assert not dirs[ended[2]].exists()
            assert _indexed(state_dir, "svc") == {running, damaged}
            assert dirs[running].exists() and dirs[damaged].exists()
            status = await other.describe(running)
            assert status is not None and status.state is AppState.RUNNING

            with pytest.raises(SpecError) as caught:  # named as the caller spelled them
                await other.gc("local", older_than=-1, keep=-2)
            assert {p.field for p in caught.value.problems} == {"older_than", "keep"}
            for older_than in (math.nan, "1d"):  # NaN removed nothing, silently
                with pytest.raises(SpecError) as caught:
                    await other.gc("local", older_than=older_than)  # type: ignore[arg-type]
                assert caught.value.fields == ("older_than",)
            with pytest.raises(SpecError, match="give older_than, keep or both"):
                await other.gc("local")
        await owner.cancel(running)
        assert (await owner.wait(running, timeout=30)).state is AppState.CANCELLED
        assert owner.followed() == []
        # Ended and recorded: now it may go too.
        assert running in await owner.gc("local", keep=0)
        assert not dirs[running].exists()


async def test_retention_option_sweeps_the_settled_apps_periodically(state_dir: Path) -> None:
    retention = Retention(max_count=1, interval=0.1)
    async with Supervisor(session="svc", retention=retention) as sv:
        handles = []
        for _ in range(3):
            handles.append(await sv.submit(app(SHORT), "local"))
            await sv.wait(handles[-1], timeout=30)
        with anyio.fail_after(30):
            # The sweep runs every 0.1 s and tells nobody: its result is looked at as often.
            while await anyio.to_thread.run_sync(_indexed, state_dir, "svc") != {handles[-1]}:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        described = await sv.describe(handles[-1])
        assert described is not None and described.state is AppState.SUCCEEDED


async def test_retention_sweeps_the_apps_of_a_backend_this_process_has_not_used(
    state_dir: Path,
) -> None:
    """A restarted service that only waits for requests: the apps its last run left are
    swept too. Only the backends used by this very Supervisor were before."""
    async with Supervisor(session="svc") as first:
        handles = []
        for _ in range(3):  # one after the other: the last one ended last
            handles.append(await first.submit(app(SHORT), "local"))
            assert (await first.wait(handles[-1], timeout=30)).state is AppState.SUCCEEDED
    async with Supervisor(session="svc", retention=Retention(max_count=1, interval=0.1)):
        with anyio.fail_after(30):
            while await anyio.to_thread.run_sync(_indexed, state_dir, "svc") != {handles[-1]}:  # noqa: ASYNC110
                await anyio.sleep(0.05)


async def test_gcs_at_once_report_each_app_once(state_dir: Path) -> None:
    """Four at once over the same apps said they removed 198 of 80: each reported every
    app it found, also those another had removed first."""
    async with Supervisor(session="svc") as sv:
        handles = [await sv.submit(app(SHORT), "local") for _ in range(12)]
        for handle in handles:
            assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    removed: list[list[str]] = []

    async def collect() -> None:
        async with Supervisor(session="svc") as other:
            removed.append(await other.gc("local", keep=0))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(collect)
    everything = [h for each in removed for h in each]
    assert sorted(everything) == sorted(handles)
    assert await anyio.to_thread.run_sync(_indexed, state_dir, "svc") == set()


async def test_retention_is_checked_naming_every_field() -> None:
    with pytest.raises(SpecError) as caught:
        Retention(max_age=-1, max_count=True, interval=0)
    assert {p.field for p in caught.value.problems} == {
        "retention.max_age",
        "retention.max_count",
        "retention.interval",
    }
    with pytest.raises(SpecError) as caught:  # NaN compares false with every age
        Retention(max_age=math.nan, interval=math.nan)
    assert {p.field for p in caught.value.problems} == {"retention.max_age", "retention.interval"}
    with pytest.raises(SpecError, match="retention: give max_age, max_count or both"):
        Retention()
    with pytest.raises(SpecError, match="retention: must be a Retention"):
        Supervisor(retention=5)  # type: ignore[arg-type]


async def test_gc_cli_removes_by_count_and_dry_run_removes_nothing(state_dir: Path) -> None:
    async with Supervisor(session="svc") as sv:
        handles = []
        for _ in range(3):
            handles.append(await sv.submit(app(SHORT), "local"))
            await sv.wait(handles[-1], timeout=30)
        assert sv.followed() == []  # each left as it ended, before its waiter resumed
    dry = await anyio.to_thread.run_sync(
        lambda: _cli_json(state_dir, "--session", "svc", "gc", "--keep", "1", "--dry-run")
    )
    assert dry == {"dry_run": True, "removed": [handles[1], handles[0]]}
    assert _indexed(state_dir, "svc") == set(handles)
    done = await anyio.to_thread.run_sync(
        lambda: _cli(state_dir, "--session", "svc", "gc", "--keep", "1")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"removed: {handles[1]}", f"removed: {handles[0]}"]
    assert _indexed(state_dir, "svc") == {handles[2]}
    aged = await anyio.to_thread.run_sync(
        lambda: _cli_json(state_dir, "--session", "svc", "gc", "--older-than", "1h")
    )
    assert aged == {"dry_run": False, "removed": []}  # it ended seconds ago
    usage = await anyio.to_thread.run_sync(lambda: _cli(state_dir, "gc"))
    assert usage.returncode == 2 and "--older-than" in usage.stderr


async def test_list_is_newest_first_with_filters_in_python_and_the_cli(state_dir: Path) -> None:
    fail = py_role("a", "raise SystemExit(3)")
    async with Supervisor(session="svc") as sv:
        handles: dict[str, str] = {}
        for name, role in (("alpha", SHORT), ("beta", SHORT), ("bfail", fail), ("gamma", SHORT)):
            handles[name] = await sv.submit(app(role, name=name), "local")
            await sv.wait(handles[name], timeout=30)
        running = await sv.submit(app(LONG, name="running"), "local")
        beta = await sv.describe(handles["beta"])
        assert beta is not None and beta.times.submitted is not None
        since = beta.times.submitted

        async with Supervisor(session="reader") as reader:
            listed = await reader.list("local")
            newest_first = [running, *(handles[n] for n in ("gamma", "bfail", "beta", "alpha"))]
            assert [a.app_handle for a in listed] == newest_first
            times = [a.times for a in listed]
            assert all(t.submitted is not None for t in times)
            assert all(t.ended is not None for t in times[1:]) and times[0].ended is None
            assert listed[0].state is AppState.RUNNING
            assert {a.app_handle: a.state for a in listed}[handles["bfail"]] is AppState.FAILED

            def ids(apps: list[Any]) -> list[str]:
                return [a.app_handle for a in apps]

            failed = await reader.list("local", state=AppState.FAILED)
            assert ids(failed) == [handles["bfail"]]
            several = await reader.list("local", state=["failed", "RUNNING"])
            assert ids(several) == [running, handles["bfail"]]
            assert ids(await reader.list("local", name="b*")) == [
                handles["bfail"],
                handles["beta"],
            ]
            recent = await reader.list("local", since=since, state="SUCCEEDED")
            assert ids(recent) == [handles["gamma"], handles["beta"]]
            assert ids(await reader.list("local", limit=2)) == newest_first[:2]
            assert await reader.list("local", limit=0) == []
            with pytest.raises(SpecError) as caught:
                await reader.list("local", state="DONE", limit=-1, since="x")  # type: ignore[arg-type]
            assert {p.field for p in caught.value.problems} == {"state", "limit", "since"}

        args = ("list", "--state", "succeeded", "--since", str(since), "--limit", "1")
        found = await anyio.to_thread.run_sync(lambda: _cli_json(state_dir, *args))
        assert [a["handle"] for a in found] == [handles["gamma"]]
        assert found[0]["submitted"] and found[0]["started"] and found[0]["ended"]
        named = await anyio.to_thread.run_sync(lambda: _cli_json(state_dir, "list", "--name", "b*"))
        assert [a["handle"] for a in named] == [handles["bfail"], handles["beta"]]
        everything = await anyio.to_thread.run_sync(lambda: _cli_json(state_dir, "list"))
        assert [a["handle"] for a in everything] == newest_first
        bad = await anyio.to_thread.run_sync(lambda: _cli(state_dir, "list", "--state", "DONE"))
        assert bad.returncode == 2
        await sv.cancel(running)


async def test_list_answers_a_settled_app_from_its_index_entry(state_dir: Path) -> None:
    """Its records are not read while a stat shows them as they were when it ended."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(SHORT, name="short"), "local")
        await sv.wait(handle, timeout=30)
        assert sv.followed() == []  # each left as it ended, before its waiter resumed
    entries = [e for e in Index(state_dir, "local").entries() if e.session == "svc"]
    assert len(entries) == 1 and entries[0].summary is not None
    assert entries[0].summary.state is AppState.SUCCEEDED and entries[0].summary.name == "short"
    # Rewritten since (same content, a new file): the entry's summary no longer stands for it,
    # and list reads the record itself.
    state = _app_dir(state_dir, handle) / "state.json"
    content = state.read_bytes()
    state.unlink()
    state.write_bytes(content)
    again = [e for e in Index(state_dir, "local").entries() if e.session == "svc"]
    assert again[0].summary is None
    async with Supervisor(session="reader") as reader:
        listed = await reader.list("local")
    assert [(a.app_handle, a.state, a.name) for a in listed] == [
        (handle, AppState.SUCCEEDED, "short")
    ]
    assert listed[0].times.ended is not None and listed[0].times.ended <= time.time()


async def test_gc_removes_the_idempotency_keys_of_the_apps_it_removes(state_dir: Path) -> None:
    """A key whose app ``gc`` removed would stay on disk for ever: it goes with the app;
    the keys of apps that stay are kept, and a submit under a removed key starts afresh."""
    keys = state_dir / "idempotency" / "local" / "svc"
    async with Supervisor(session="svc") as sv:
        old = await sv.submit(app(SHORT, name="old"), "local", idempotency_key="job-old")
        await sv.wait(old, timeout=30)
        new = await sv.submit(app(SHORT, name="new"), "local", idempotency_key="job-new")
        await sv.wait(new, timeout=30)
        assert len(list(keys.glob("*.json"))) == 2

        assert await sv.gc("local", keep=1) == [old]
        left = [json.loads(p.read_text())["handle"] for p in keys.glob("*.json")]
        assert left == [new]
        # The kept key still answers its app; the removed one launches a new run.
        assert await sv.submit(app(SHORT, name="new"), "local", idempotency_key="job-new") == new
        again = await sv.submit(app(SHORT, name="old"), "local", idempotency_key="job-old")
        assert again != old
        await sv.wait(again, timeout=30)


async def test_an_app_gc_removed_is_unknown_to_status_and_wait_as_to_describe(
    state_dir: Path,
) -> None:
    """``status`` and ``wait`` answered a removed app from the cache of final statuses
    while ``describe`` said None: the three now agree that it is gone."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(SHORT), "local")
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert sv.status(handle) is not None  # from the cache, before the gc

        assert await sv.gc("local", keep=0) == [handle]
        assert await sv.describe(handle) is None
        assert sv.status(handle) is None
        for timeout in (None, 0):
            with pytest.raises(UnknownAppError):
                await sv.wait(handle, timeout=timeout)


def _key_files(state_dir: Path, session: str) -> list[str]:
    root = state_dir / "idempotency" / "local" / session
    return sorted(p.name for p in root.iterdir())


def _key_base(state_dir: Path, session: str, key: str) -> Path:
    return state_dir / "idempotency" / "local" / session / hashlib.sha256(key.encode()).hexdigest()


def _lock(path: Path, *, create: bool = False) -> int:
    """``path`` locked as a submit under its key locks it (another open file, so it is
    held against this process's own submits and gc too)."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_gc_removes_the_lock_files_of_the_keys_it_removes_and_idle_ones(
    state_dir: Path,
) -> None:
    """Each key left its lock file for ever, one per key ever used. gc removes it with the
    key's record, and the lock files no record stands beside (a submit that died before
    it recorded its key: made here by another process that takes a lock and exits)."""
    async with Supervisor(session="svc") as sv:
        handles = []
        for k in range(3):
            handles.append(await sv.submit(app(SHORT), "local", idempotency_key=f"k{k}"))
            assert (await sv.wait(handles[-1], timeout=30)).state is AppState.SUCCEEDED
        died = _key_base(state_dir, "svc", "died").with_suffix(".lock")
        with anyio.fail_after(60):
            await anyio.run_process([sys.executable, "-c", TAKE_LOCK, str(died)])
        assert len(_key_files(state_dir, "svc")) == 7

        assert await sv.gc("local", keep=1) == handles[1::-1]
        kept = _key_base(state_dir, "svc", "k2")
        assert _key_files(state_dir, "svc") == sorted(
            [kept.with_suffix(".json").name, kept.with_suffix(".lock").name]
        )
        assert await sv.submit(app(SHORT), "local", idempotency_key="k2") == handles[2]
        assert await sv.gc("local", keep=0) == [handles[2]]
        assert _key_files(state_dir, "svc") == []
        # A removed key starts afresh, its lock file made again.
        again = await sv.submit(app(SHORT), "local", idempotency_key="k0")
        assert again not in handles
        assert (await sv.wait(again, timeout=30)).state is AppState.SUCCEEDED


TAKE_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
"""


async def test_gc_leaves_an_app_whose_key_a_submit_holds(state_dir: Path) -> None:
    """gc removed the app first and looked at its key's lock after: a submit under the
    key, holding its lock, could have found the app there and returned its handle as gc
    removed it, and the key's record was left naming a removed app. The app now stays
    while its key is held (held here as a submit holds it), and goes at the next gc."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(SHORT), "local", idempotency_key="busy")
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        base = _key_base(state_dir, "svc", "busy")
        fd = _lock(base.with_suffix(".lock"))
        try:
            assert await sv.gc("local", keep=0) == []
            described = await sv.describe(handle)
            assert described is not None and described.state is AppState.SUCCEEDED
            assert json.loads(base.with_suffix(".json").read_text())["handle"] == handle
            assert base.with_suffix(".lock").exists()
        finally:
            os.close(fd)
        assert await sv.gc("local", keep=0) == [handle]
        assert _key_files(state_dir, "svc") == []


def _lock_waiters(path: Path) -> int:
    """How many flock waits for the file now at ``path`` /proc/locks shows."""
    there = path.stat()
    file = f"{os.major(there.st_dev):02x}:{os.minor(there.st_dev):02x}:{there.st_ino}"
    return sum(
        1
        for line in Path("/proc/locks").read_text().splitlines()
        if line.split()[1:3] == ["->", "FLOCK"] and line.split()[-3] == file
    )


async def test_a_submit_waiting_on_a_lock_file_gc_removed_takes_the_new_one(
    state_dir: Path,
) -> None:
    """gc removes a key's lock file while it holds it. A submit that had opened the file
    before, and waited for its lock, then held a file nobody else opens: a submit of
    another process, opening the key's file anew, held "the" lock at the same time.
    It now sees the file is not the key's any more and waits for the one there. gc
    holds the lock too briefly to catch a submit waiting on it, so this test does its
    steps by hand: hold the file, remove it, let go, while a new holder has the new one."""
    async with Supervisor(session="svc") as sv:
        await sv.submit(app(SHORT), "local", idempotency_key="warm")  # the key directory
        lock = _key_base(state_dir, "svc", "raced").with_suffix(".lock")
        first = _lock(lock, create=True)
        done = anyio.Event()
        handles: list[str] = []

        async def submit() -> None:
            handles.append(await sv.submit(app(SHORT), "local", idempotency_key="raced"))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit)
            with anyio.fail_after(30):
                while _lock_waiters(lock) == 0:  # noqa: ASYNC110 (no event says it waits)
                    await anyio.sleep(0.01)
            lock.unlink()  # as gc does, holding it
            second = _lock(lock, create=True)  # another process's submit, on the new file
            os.close(first)
            try:
                with anyio.fail_after(30):
                    while _lock_waiters(lock) == 0:
                        assert not done.is_set(), "the submit held a lock file gc removed"
                        await anyio.sleep(0.01)
                assert not done.is_set()
            finally:
                os.close(second)
        assert (await sv.wait(handles[0], timeout=30)).state is AppState.SUCCEEDED
