"""Faults injected for real: a full file system, a removed app directory, huge lines.

The full disk is a real 2 MB tmpfs mounted by the test (it needs root: the
test says why it skips otherwise); the removed directory is really removed
while the replica runs; the huge line is really written by a replica. In
every case the faulty app hears of it and every other app is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from supervisor import AppState, SubmitError, Supervisor
from supervisor.backends.base import AppTasks, EventSink, Request
from supervisor.backends.local.backend import LocalBackend, LocalRuntime
from supervisor.backends.local.process import ReplicaProcess
from supervisor.backends.store import AppStore, Owner
from supervisor.events import ReplicaKey
from supervisor.logs.lines import MAX_LINE_BYTES
from supervisor.status import AppStatus, Transition

from .helpers import app, py_role, running_with, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.faults]

WRITE_20MB = "import sys\nfor _ in range(20):\n    sys.stdout.write('x' * (1 << 20) + '\\n')\n"
SLOW_OK = "import time; time.sleep(1); print('fine', flush=True)"


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "small-tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; this test runs as a normal user")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def _stdout(sv: Supervisor, handle: str, role: str) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, 0, streams="stdout")]


async def test_a_full_disk_is_its_apps_problem_only(small_tmpfs: Path, tmp_path: Path) -> None:
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        full = await sv.submit(
            app(py_role("w", WRITE_20MB), name="full"), "local", cfg={"log_dir": str(small_tmpfs)}
        )
        other = await sv.submit(
            app(py_role("ok", SLOW_OK), name="other"), "local", cfg={"log_dir": str(tmp_path)}
        )
        with anyio.fail_after(60):
            other_status = await sv.wait(other)
            full_status = await sv.wait(full)
        assert other_status.state is AppState.SUCCEEDED, other_status
        assert "No space left on device" not in other_status.msg
        assert await _stdout(sv, other, "ok") == ["fine\n"]
        # The full-disk app ran to its end and says what went wrong.
        assert full_status.is_terminal, full_status
        assert "No space left on device" in full_status.msg, full_status
        # The Supervisor keeps working: a new app runs to the end.
        later = await sv.submit(
            app(py_role("ok", SLOW_OK)), "local", cfg={"log_dir": str(tmp_path / "later")}
        )
        with anyio.fail_after(60):
            assert (await sv.wait(later)).state is AppState.SUCCEEDED


async def test_output_lost_on_a_full_disk_is_told_and_the_app_ends_recorded(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """Issue 19 item 15: 19 of 20 MB of output were lost with no word on the replica, and
    state.json stayed RUNNING and not final, once the app's output filled its disk."""
    code = WRITE_20MB + "print('the end', file=sys.stderr)\n"
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        handle = await sv.submit(
            app(py_role("w", code), name="full"), "local", cfg={"log_dir": str(small_tmpfs)}
        )
        with anyio.fail_after(60):
            status = await sv.wait(handle)
        # The true final state: the replica wrote everything and exited 0.
        assert status.state is AppState.SUCCEEDED, status
        replica = status.replica("w", 0)
        assert replica is not None and replica.exit_code == 0, status
        app_dir = small_tmpfs / "svc" / handle.rpartition("/")[2]
        kept = (app_dir / "w" / "0" / "stdout.log").stat().st_size
        assert 0 < kept < 2 << 20
        match = re.fullmatch(
            r"about (\d+) bytes of output lost: the disk is full \(writing logs to "
            + re.escape(str(app_dir / "w" / "0"))
            + r" failed: \[Errno 28\] No space left on device\)",
            replica.msg,
        )
        assert match is not None, replica.msg
        # Every byte not kept is counted (more by at most the one chunk that half landed).
        lost = int(match.group(1))
        written = 20 * ((1 << 20) + 1) + len("the end\n")
        assert written - kept <= lost <= written - kept + (1 << 20), (lost, kept)
        assert f"w/0: {replica.msg}" in status.msg
        assert sv.status(handle) == status
    # The final record was written, in the space set aside for it at the start.
    record = json.loads((app_dir / "state.json").read_text())
    assert record["final"] is True and record["status"]["state"] == "SUCCEEDED", record
    assert record["status"]["roles"][0]["replicas"][0]["msg"] == replica.msg
    assert not (app_dir / ".final-record.reserve").exists()
    async with Supervisor(session="other", state_dir=tmp_path / "state") as other:
        listed = {a.app_handle: a for a in await other.list("local")}
        with anyio.fail_after(10):
            seen = await other.wait(handle)
    assert listed[handle].state is AppState.SUCCEEDED and seen.state is AppState.SUCCEEDED
    assert "bytes of output lost: the disk is full" in listed[handle].msg


async def test_a_final_record_that_cannot_be_written_is_said_and_nothing_hangs(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """When even the final record cannot be written (here the disk is filled from outside,
    after the reserve was given up), the status and ``wait`` say so, and close returns."""
    gate = tmp_path / "go"
    code = (
        "import os, time\n"
        "print('up', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    )
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        handle = await sv.submit(
            app(py_role("w", code), name="full"), "local", cfg={"log_dir": str(small_tmpfs)}
        )
        with anyio.fail_after(30):
            async for _ in sv.log_iter(handle, "w", 0, should_tail=True):
                break
        app_dir = small_tmpfs / "svc" / handle.rpartition("/")[2]
        # Someone else takes the reserve's space, and every other byte of the disk.
        (app_dir / ".final-record.reserve").unlink()
        with (small_tmpfs / "filler").open("wb") as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"x" * 65536)
                filler.flush()
        gate.touch()
        with anyio.fail_after(30):
            status = await sv.wait(handle)
        assert status.state is AppState.SUCCEEDED, status
        assert "recording the app's state for other processes failed" in status.msg, status
        assert "No space left on device" in status.msg
    record = json.loads((app_dir / "state.json").read_text())
    assert record["final"] is False  # the older record stayed whole, not half a new one


def _fill(mount: Path, leave: int) -> Path:
    """Fill ``mount`` up, then give back ``leave`` bytes; the filler file, to remove."""
    filler = mount / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):  # ENOSPC: full
        while True:
            f.write(b"\0" * 65536)
    size = filler.stat().st_size
    os.truncate(filler, max(size - leave, 0))
    return filler


@pytest.mark.parametrize("leave", [0, 16 << 10])
@pytest.mark.parametrize("reaper_running", [False, True], ids=["first-app", "reaper-running"])
async def test_a_submit_with_no_room_gives_its_app_id_back(
    small_tmpfs: Path, tmp_path: Path, leave: int, reaper_running: bool
) -> None:
    """A full disk: the directory it had claimed stayed, so the same id was "already taken"
    for good (after gc too). Nearly full (no room for the final record's reserve): it
    launched an app that could not record even its start, UNKNOWN to every other process.
    Once the reaper runs, a lone replica's claim goes with its spawn (the reaper makes
    the directories and the reserve): the same holds there."""
    cfg = {"log_dir": str(small_tmpfs)}
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        others = []
        if reaper_running:
            warm = await sv.submit(app(py_role("w", "pass")), "local", {"log_dir": str(tmp_path)})
            assert (await sv.wait(warm, timeout=60)).state is AppState.SUCCEEDED
            others.append(warm.rpartition("/")[2])
        filler = _fill(small_tmpfs, leave)
        spec = app(py_role("r", "print('ran')"))
        with pytest.raises(SubmitError, match="No space left on device") as err:
            await sv.schedule(sv.dryrun(spec, "local", cfg, app_id="nightly-42"))
        # Where the reaper claimed, it says which file found no room: the reserve.
        assert (".final-record.reserve" in str(err.value)) is reaper_running, err.value
        assert not (small_tmpfs / "svc" / "nightly-42").exists()
        assert [a.app_id for a in await sv.list("local")] == others
        filler.unlink()
        handle = await sv.schedule(sv.dryrun(spec, "local", cfg, app_id="nightly-42"))
        assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED


async def test_a_keyed_submit_with_no_room_for_its_key_is_a_submit_error(
    small_tmpfs: Path,
) -> None:
    """The key's record is the first thing written: its OSError came out bare."""
    filler = _fill(small_tmpfs, 0)
    async with Supervisor(session="svc", state_dir=small_tmpfs / "state") as sv:
        spec = app(py_role("r", "pass"))
        with pytest.raises(SubmitError, match="idempotency key 'k'") as err:
            await sv.submit(spec, "local", idempotency_key="k")
        assert err.value.transient
        filler.unlink()
        handle = await sv.submit(spec, "local", idempotency_key="k")
        assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED


def test_a_write_whose_state_failed_journals_its_transitions_once(small_tmpfs: Path) -> None:
    """The journal took the transitions, then state.json found the disk full; the same
    write once there was room (the final record's, with its reserve given back) appended
    them again: seq 0 1 2 0 1 2 3, and a watch from another process gave each twice."""
    store = AppStore(small_tmpfs / "app")
    store.app_dir.mkdir()
    owner = Owner.current()
    status = AppStatus(AppState.RUNNING)
    steps = [Transition(n, 0.0, "A", "B", "go") for n in range(4)]
    store.write_state(status, steps[:2], False, owner, ready_next=True)
    filler = _fill(small_tmpfs, 0)
    with pytest.raises(OSError, match="No space left on device"):
        store.write_state(status, steps[2:], True, owner)
    filler.unlink()
    store.write_state(status, steps[2:], True, owner)
    assert [t.seq for t in store.read_transitions()] == [0, 1, 2, 3]


async def test_a_removed_app_directory_is_its_apps_problem_only(tmp_path: Path) -> None:
    doomed_dir = tmp_path / "doomed"
    code = (
        "import os, sys, time\n"
        "print('before', flush=True)\n"
        f"while os.path.exists({str(doomed_dir)!r}): time.sleep(0.05)\n"
        "print('after', flush=True)\n"
    )
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        doomed = await sv.submit(
            app(py_role("w", code), name="doomed"), "local", cfg={"log_dir": str(doomed_dir)}
        )
        other = await sv.submit(
            app(py_role("ok", "import time; time.sleep(2); print('fine', flush=True)")),
            "local",
            cfg={"log_dir": str(tmp_path / "kept")},
        )
        with anyio.fail_after(30):
            async for _ in sv.log_iter(doomed, "w", 0, should_tail=True):
                break  # 'before' was written: the directory is in use
        await anyio.to_thread.run_sync(shutil.rmtree, doomed_dir)
        with anyio.fail_after(60):
            other_status = await sv.wait(other)
            doomed_status = await sv.wait(doomed)
        assert other_status.state is AppState.SUCCEEDED, other_status
        assert other_status.msg == ""
        assert doomed_status.is_terminal, doomed_status
        assert "No such file or directory" in doomed_status.msg, doomed_status
        later = await sv.submit(
            app(py_role("ok", SLOW_OK)), "local", cfg={"log_dir": str(tmp_path / "later")}
        )
        with anyio.fail_after(60):
            assert (await sv.wait(later)).state is AppState.SUCCEEDED


class _RestartBug(LocalBackend):
    """The local backend with a bug injected into restarts.

    A fake on purpose: no real fault makes ``restart`` raise an unexpected
    error on demand, and the point is what such a bug does to the other apps.
    """

    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> LocalRuntime:
        runtime = await super().launch(request, sink, tasks)

        async def restart(attempts: Sequence[tuple[ReplicaKey, int]], reason: str) -> None:
            raise RuntimeError("injected restart bug")

        runtime.restart = restart  # type: ignore[method-assign]
        return runtime


async def test_an_unexpected_error_ends_its_app_only(tmp_path: Path) -> None:
    token = f"asv-abandoned-{uuid.uuid4().hex}"
    crash = py_role("crash", "import sys; sys.exit(1)", max_retries=1)
    sleeper = py_role("sleeper", "import time; time.sleep(600)", args=[token])
    async with Supervisor(
        session="svc", state_dir=tmp_path / "state", backends={"buggy": _RestartBug}
    ) as sv:
        broken = await sv.submit(app(crash, sleeper, name="broken"), "buggy")
        other = await sv.submit(app(py_role("ok", SLOW_OK)), "local")
        with anyio.fail_after(60):
            broken_status = await sv.wait(broken)
            other_status = await sv.wait(other)
        assert broken_status.state is AppState.UNKNOWN, broken_status
        assert "injected restart bug" in broken_status.msg
        # Its replicas were stopped, not left running unsupervised.
        assert running_with(token) == []
        assert other_status.state is AppState.SUCCEEDED, other_status
        later = await sv.submit(app(py_role("ok", SLOW_OK)), "local")
        with anyio.fail_after(60):
            assert (await sv.wait(later)).state is AppState.SUCCEEDED
    # Other processes read the same end.
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as reader:
        described = await reader.describe(broken.replace("buggy://", "local://"))
    assert described is not None and described.state is AppState.UNKNOWN


class _FollowBug(LocalBackend):
    """The local backend with a bug injected into the tasks that follow its replicas.

    A fake on purpose: no real fault makes following a process raise an
    unexpected error on demand. The tasks are the backend's own, started in
    the app's task group as always; only the process's ``follow`` they call
    raises, a moment after the replica started. A running replica gets its
    follower task at its first wake (``ReplicaProcess.watch``): here each one
    is handed over at once, so that the task runs while the replica does.
    """

    async def launch(self, request: Request, sink: EventSink, tasks: AppTasks) -> LocalRuntime:
        runtime = await super().launch(request, sink, cast(AppTasks, _BreakFollows(tasks)))
        for replica in runtime.request.replicas:
            proc = runtime.replica_slot((replica.role, replica.replica_id)).proc
            assert proc is not None and proc.watched
            proc.hand_over()
        return runtime


class _BreakFollows:
    def __init__(self, tasks: AppTasks) -> None:
        self._tasks = tasks

    def start_soon(self, func: Callable[..., Awaitable[object]], *args: Any) -> None:
        if getattr(func, "__name__", "") == "_follow":
            proc: Any = next(arg for arg in args if isinstance(arg, ReplicaProcess))

            async def broken() -> int | None:
                await anyio.sleep(0.2)
                raise RuntimeError("injected follow bug")

            proc.follow = broken
        self._tasks.start_soon(func, *args)


async def test_a_broken_task_of_an_app_ends_that_app_only(tmp_path: Path) -> None:
    """An unexpected error in a task the backend started for an app (in the app's own
    task group) ends that app as UNKNOWN with the reason, its replicas stopped; the
    Supervisor's other apps go on and new ones start."""
    token = f"asv-follow-bug-{uuid.uuid4().hex}"
    sleeper = py_role("sleeper", "import time; time.sleep(600)", args=[token], num_replicas=2)
    async with Supervisor(
        session="svc", state_dir=tmp_path / "state", backends={"buggy": _FollowBug}
    ) as sv:
        other = await sv.submit(app(py_role("ok", SLOW_OK)), "local")
        broken = await sv.submit(app(sleeper, name="broken"), "buggy")
        with anyio.fail_after(60):
            broken_status = await sv.wait(broken)
            other_status = await sv.wait(other)
        assert broken_status.state is AppState.UNKNOWN, broken_status
        assert "injected follow bug" in broken_status.msg, broken_status
        assert "_follow" in broken_status.msg, broken_status  # which task broke
        # Killed by the task that broke, not left running unsupervised.
        await until(lambda: not running_with(token), 10)
        assert other_status.state is AppState.SUCCEEDED, other_status
        later = await sv.submit(app(py_role("ok", SLOW_OK)), "local")
        with anyio.fail_after(60):
            assert (await sv.wait(later)).state is AppState.SUCCEEDED


def _peak_rss_reset() -> None:
    """Start a new peak-RSS measurement for this process (Linux: clear_refs value 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_an_endless_line_keeps_the_supervisors_memory_bounded(tmp_path: Path) -> None:
    size = 64 * MAX_LINE_BYTES  # 64 MiB without a single newline
    code = (
        "import sys\n"
        "block = b'0123456789abcdef' * 65536\n"
        f"for _ in range({size} // len(block)):\n"
        "    sys.stdout.buffer.write(block)\n"
        "sys.stdout.flush()\n"
    )
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        _peak_rss_reset()
        before = _peak_rss_bytes()
        handle = await sv.submit(app(py_role("w", code)), "local", cfg={"log_dir": str(tmp_path)})
        with anyio.fail_after(120):
            status = await sv.wait(handle)
        grown = _peak_rss_bytes() - before
        assert status.state is AppState.SUCCEEDED, status
        # Holding the line whole would cost the line at least once (64 MiB).
        assert grown < size // 2, f"peak RSS grew by {grown} bytes"
        app_dir = tmp_path / "svc" / handle.rpartition("/")[2] / "w" / "0"
        assert (await anyio.Path(app_dir / "stdout.log").stat()).st_size == size
        # Read back in pieces, each bounded, nothing lost.
        total = 0
        async for piece in sv.log_iter(handle, "w", 0, streams="stdout"):
            assert len(piece) <= MAX_LINE_BYTES
            assert piece.strip("0123456789abcdef") == ""
            total += len(piece)
        assert total == size
    combined = (await anyio.Path(app_dir / "combined.log").stat()).st_size
    assert combined == size + size // MAX_LINE_BYTES - 1  # a newline after every cut piece


async def test_an_attempts_last_line_stays_apart_from_the_next(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "if os.environ['ASUPERVISOR_ATTEMPT'] == '0':\n"
        "    sys.stdout.write('first attempt, no newline'); sys.stdout.flush()\n"
        "    sys.stderr.write('dying'); sys.stderr.flush()\n"
        "    sys.exit(1)\n"
        "print('second attempt')\n"
        "print('oops', file=sys.stderr)\n"
    )
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        handle = await sv.submit(
            app(py_role("w", code, max_retries=1)), "local", cfg={"log_dir": str(tmp_path)}
        )
        with anyio.fail_after(60):
            assert (await sv.wait(handle)).state is AppState.SUCCEEDED
        out = [line async for line in sv.log_iter(handle, "w", 0, streams="stdout")]
        err = [line async for line in sv.log_iter(handle, "w", 0, streams="stderr")]
        combined = [line async for line in sv.log_iter(handle, "w", 0)]
    assert out == ["first attempt, no newline\n", "second attempt\n"]
    assert err == ["dying\n", "oops\n"]
    assert sorted(combined) == sorted(out + err)


async def test_running_out_of_descriptors_is_its_apps_problem_only(tmp_path: Path) -> None:
    token = f"asv-no-fds-{uuid.uuid4().hex}"
    async with Supervisor(session="svc", state_dir=tmp_path / "state") as sv:
        other = await sv.submit(
            app(py_role("ok", "import time; time.sleep(3); print('fine', flush=True)")),
            "local",
            cfg={"log_dir": str(tmp_path / "other")},
        )
        # Descriptors are per process: leave this one 40 more than it holds now, so
        # the next app (30 replicas of 3+ descriptors each) runs out while launching.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 40, hard))
        try:
            hog = await sv.submit(
                app(py_role("w", "import time; time.sleep(600)", args=[token], num_replicas=30)),
                "local",
                cfg={"log_dir": str(tmp_path / "hog")},
            )
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        with anyio.fail_after(60):
            hog_status = await sv.wait(hog)
            other_status = await sv.wait(other)
        assert hog_status.state is AppState.FAILED, hog_status
        replica_msgs = " ".join(r.msg for role in hog_status.roles for r in role.replicas)
        assert "Too many open files" in replica_msgs, hog_status
        assert running_with(token) == []  # nothing it started was left running
        assert other_status.state is AppState.SUCCEEDED, other_status
        assert other_status.msg == ""
        assert await _stdout(sv, other, "ok") == ["fine\n"]
    # Closing raised nothing: the hog's log failures were its own notice, not the close's.
