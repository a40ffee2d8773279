"""Bad input is refused up front, duplicate and retried submits run once, and the
replica environment follows TorchX (issue 8, items 5, 10, 12 and 14): real
processes, real files, and for the cross-process cases real second processes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    DuplicateAppError,
    InvalidHandleError,
    NotEnteredError,
    Role,
    ShuttingDown,
    SpecError,
    Supervisor,
    SupervisorError,
    UnknownAppError,
    UnsupportedAsyncLibraryError,
    WaitTimeout,
)
from supervisor.backends.local import LocalBackend
from supervisor.backends.slurm import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings

from .helpers import app, py_role

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli.main"]

# A second process: schedules a fixed app id ("dup"), or submits under an idempotency
# key ("key"; "crash" then dies by SIGKILL before it can close anything). Each run of
# the app appends its app id to the mark file, so the file counts the runs.
CHILD = """
import json, os, signal, sys
import anyio
from supervisor import AppDef, DuplicateAppError, Role, Supervisor

mode, mark, log_dir = sys.argv[1:4]
code = "import os; open(%r, 'a').write(os.environ['ASUPERVISOR_APP_ID'] + '\\\\n')" % mark
the_app = AppDef(name="once", roles=[Role(name="w", entrypoint=sys.executable, args=["-c", code])])

async def main():
    async with Supervisor(session="svc") as sv:
        cfg = {"log_dir": log_dir}
        try:
            if mode == "dup":
                handle = await sv.schedule(sv.dryrun(the_app, "local", cfg, app_id="fixed-1"))
            else:
                handle = await sv.submit(the_app, "local", cfg, idempotency_key="job-42")
        except DuplicateAppError as e:
            print(json.dumps({"duplicate": str(e)}), flush=True)
            return
        status = await sv.wait(handle, timeout=60)
        print(json.dumps({"handle": handle, "state": status.state.name}), flush=True)
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
"""


def _children(mode: str, tmp_path: Path, count: int) -> list[dict[str, Any]]:
    """Start ``count`` child processes at once; their JSON answers, in start order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, str(tmp_path / "runs.txt"), str(tmp_path / "l")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert out.strip(), f"child printed nothing (rc {proc.returncode}): {err[-2000:]}"
        answers.append(json.loads(out.strip().splitlines()[-1]))
    return answers


def _runs(tmp_path: Path) -> list[str]:
    mark = tmp_path / "runs.txt"
    return mark.read_text().splitlines() if mark.exists() else []


# ------------------------------------------------------------------ item 10


def test_the_same_app_id_from_two_processes_runs_once(state_dir: Path, tmp_path: Path) -> None:
    answers = _children("dup", tmp_path, 2)
    launched = [a for a in answers if "handle" in a]
    refused = [a for a in answers if "duplicate" in a]
    assert len(launched) == 1 and len(refused) == 1, answers
    assert launched[0] == {"handle": "local://svc/fixed-1", "state": "SUCCEEDED"}
    assert "'fixed-1' is already taken" in refused[0]["duplicate"]
    assert _runs(tmp_path) == ["fixed-1"]


def test_concurrent_submits_with_one_key_share_one_run(state_dir: Path, tmp_path: Path) -> None:
    answers = _children("key", tmp_path, 2)
    assert answers[0]["handle"] == answers[1]["handle"], answers
    assert {a["state"] for a in answers} == {"SUCCEEDED"}
    app_id = answers[0]["handle"].rpartition("/")[2]
    assert _runs(tmp_path) == [app_id]


def test_a_retry_after_a_crash_gets_the_same_handle(state_dir: Path, tmp_path: Path) -> None:
    (first,) = _children("crash", tmp_path, 1)  # submitted, waited, then SIGKILLed
    (again,) = _children("key", tmp_path, 1)
    assert again["handle"] == first["handle"]
    assert again["state"] == first["state"] == "SUCCEEDED"
    assert len(_runs(tmp_path)) == 1  # no second run
    records = list((state_dir / "idempotency" / "local" / "svc").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["key"] == "job-42"


@pytest.mark.anyio
async def test_a_failed_submit_leaves_the_key_free(state_dir: Path, tmp_path: Path) -> None:
    good = app(py_role("a", "pass"))
    async with Supervisor(session="svc") as sv:
        with pytest.raises(SpecError):
            await sv.submit(good, "local", {"stop_grace": -1}, idempotency_key="k")
        handle = await sv.submit(good, "local", idempotency_key="k")
        assert await sv.submit(good, "local", idempotency_key="k") == handle
        assert await sv.submit(good, "local", idempotency_key="other") != handle
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        with pytest.raises(SpecError) as err:
            await sv.submit(good, "local", idempotency_key="")
        assert err.value.fields == ("idempotency_key",)
        bad = app(Role(name="r", entrypoint=""))
        with pytest.raises(SpecError) as err:  # a bad key hid the app's and options' problems
            await sv.submit(bad, "local", {"stop_grace": -1}, idempotency_key=5)  # type: ignore[arg-type]
        assert set(err.value.fields) == {"idempotency_key", "roles[0].entrypoint", "cfg.stop_grace"}


@pytest.mark.anyio
async def test_a_key_reused_for_a_different_submit_is_refused(state_dir: Path) -> None:
    first = app(py_role("a", "pass"))
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(first, "local", idempotency_key="k")
        with pytest.raises(SpecError, match="different submit") as err:
            await sv.submit(app(py_role("a", "pass", num_replicas=2)), "local", idempotency_key="k")
        assert err.value.fields == ("idempotency_key",)
        with pytest.raises(SpecError, match="different submit"):
            await sv.submit(first, "local", {"stop_grace": 3}, idempotency_key="k")
        assert await sv.submit(first, "local", idempotency_key="k") == handle
        # The options as they resolve: an int for a float, or a default given, is the same.
        assert await sv.submit(first, "local", {"stop_grace": 5.0}, idempotency_key="k") == handle
        assert await sv.submit(first, "local", {"stop_grace": 5}, idempotency_key="k") == handle
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED


@pytest.mark.anyio
@pytest.mark.parametrize("key", [None, "k"])
async def test_a_submit_of_no_app_is_a_spec_error_with_or_without_a_key(
    state_dir: Path, key: str | None
) -> None:
    """dryrun named these; submit raised AttributeError/TypeError counting replicas (and,
    with a key, fingerprinting the app), before any validation."""
    role = py_role("a", "pass")
    cases: list[tuple[Any, tuple[str, ...]]] = [
        (None, ("app",)),
        (AppDef(name="x", roles=None), ("roles",)),  # type: ignore[arg-type]
        (AppDef(name="x", roles=["r", None]), ("roles[0]", "roles[1]")),  # type: ignore[list-item]
        (AppDef(name="x", roles={"r": role}), ("roles",)),  # type: ignore[arg-type]
    ]
    async with Supervisor(session="svc") as sv:
        for bad, fields in cases:
            with pytest.raises(SpecError) as err:
                await sv.submit(bad, "local", idempotency_key=key)
            assert err.value.fields == fields, bad
        assert await sv.list("local") == []


@pytest.mark.anyio
async def test_many_submits_under_one_key_at_once_leave_its_holder_threads(
    state_dir: Path,
) -> None:
    """A client retrying one request many times at once: every submit under the key waits
    for the key's lock, and the one holding it needs worker threads to read and record the
    key. The waiters must not take them all: with the default limiter at 2 (a service may
    lower it; anyio's 40 is reached the same way by 40 retries), 12 submits at once all
    get the one handle, and one app runs."""
    the_app = app(py_role("a", "pass"))
    anyio.to_thread.current_default_thread_limiter().total_tokens = 2
    handles: list[str] = []
    async with Supervisor(session="svc") as sv:

        async def submit() -> None:
            handles.append(await sv.submit(the_app, "local", idempotency_key="retried"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(submit)
        assert len(handles) == 12 and len(set(handles)) == 1, handles
        assert (await sv.wait(handles[0], timeout=30)).state is AppState.SUCCEEDED
        assert [a.app_handle for a in await sv.list("local")] == handles[:1]


@pytest.mark.anyio
async def test_a_key_held_elsewhere_holds_up_only_its_own_submits(state_dir: Path) -> None:
    """Another process holds one key's lock (its submit hangs): retries under that key
    wait, each in its turn, and submits under other keys go on. Every waiter took one
    of the eight lock-waiting threads, so eight retries stopped every keyed submit."""
    small = app(py_role("a", "pass"))
    async with Supervisor(session="svc") as sv:
        await sv.submit(small, "local", idempotency_key="warm")  # the key directory exists
        lock = sv.state_dir / "idempotency" / "local" / "svc"
        lock /= hashlib.sha256(b"stuck").hexdigest() + ".lock"
        holder = await anyio.to_thread.run_sync(_hold_lock, lock)
        try:
            async with anyio.create_task_group() as retries:
                for _ in range(12):
                    retries.start_soon(partial(sv.submit, small, "local", idempotency_key="stuck"))
                await anyio.sleep(0.3)  # all of them waiting for the key
                with anyio.fail_after(10):
                    other = await sv.submit(small, "local", idempotency_key="fresh")
                assert (await sv.wait(other, timeout=30)).state is AppState.SUCCEEDED
                holder.kill()  # the kernel lets its lock go: the retries go on
        finally:
            holder.kill()
            await anyio.to_thread.run_sync(holder.wait)
            assert holder.stdout is not None
            holder.stdout.close()
        handles = {a.app_handle for a in await sv.list("local")}
        assert len(handles) == 3  # warm, fresh, and one run for the twelve retries


def _hold_lock(lock: Path) -> subprocess.Popen[str]:
    """Another process holding ``lock`` (as a submit that hangs under its key would)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    return holder


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.anyio
async def test_a_keyed_submit_cut_short_leaves_the_key_to_its_retry(state_dir: Path) -> None:
    """A request timeout around submit, then the client's retry under the same key: the
    first submit stopped its app (nobody got its handle), so the retry must run afresh."""
    sleeper = app(py_role("a", "import time; time.sleep(30)", num_replicas=20))
    async with Supervisor(session="svc") as sv:
        for delay in (0.01, 0.03, 0.06):
            key = f"timed-out-{delay}"
            with anyio.move_on_after(delay) as timer:
                await sv.submit(sleeper, "local", idempotency_key=key)
            if not timer.cancelled_caught:
                continue  # this machine was faster than the timeout: nothing cut short
            again = await sv.submit(sleeper, "local", idempotency_key=key)
            status = sv.status(again)
            assert status is not None and status.state is AppState.RUNNING, (delay, status)
            await sv.cancel(again)


@pytest.mark.anyio
async def test_scheduling_one_dry_run_twice_is_refused(state_dir: Path) -> None:
    async with Supervisor(session="svc") as sv:
        info = sv.dryrun(app(py_role("a", "pass")), "local")
        handle = await sv.schedule(info)
        with pytest.raises(DuplicateAppError, match="already scheduled"):
            await sv.schedule(info)
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    async with Supervisor(session="svc") as other:  # a new Supervisor: the directory says so
        with pytest.raises(DuplicateAppError) as err:
            await other.schedule(info)
        assert err.value.transient is False


# ------------------------------------------------------------------- item 5


@pytest.mark.parametrize("session", ["..", ".", "s" * 300, "a/b"])
def test_bad_sessions_are_spec_errors(state_dir: Path, session: str) -> None:
    with pytest.raises(SpecError) as err:
        Supervisor(session=session)
    assert err.value.fields == ("session",)


@pytest.mark.anyio
async def test_bad_values_are_refused_and_the_supervisor_goes_on(
    state_dir: Path, tmp_path: Path
) -> None:
    good = app(py_role("a", "import time; time.sleep(30)"))
    async with Supervisor(session="svc") as sv:
        for grace in (math.nan, math.inf, -1.0):
            with pytest.raises(SpecError) as err:
                await sv.submit(good, "local", {"stop_grace": grace})
            assert err.value.fields == ("cfg.stop_grace",)
        with pytest.raises(SpecError) as err:
            await sv.submit(app(Role(name="r" * 300, entrypoint="true")), "local")
        assert err.value.fields == ("roles[0].name",)
        many = app(Role(name="r", entrypoint="true", num_replicas=10**6))
        with pytest.raises(SpecError) as err:
            sv.dryrun(many, "local")
        assert err.value.fields == ("roles[0].num_replicas",)
        assert "max_replicas_per_role" in str(err.value)
        raised = sv.dryrun(
            app(Role(name="r", entrypoint="true", num_replicas=1500)),
            "local",
            {"max_replicas_per_role": 1500},
        )
        assert len(raised.request.replicas) == 1500  # type: ignore[attr-defined]
        for app_id in ("..", "x" * 300):
            with pytest.raises(SpecError) as err:
                sv.dryrun(good, "local", app_id=app_id)
            assert err.value.fields == ("app_id",)
        with pytest.raises(SpecError) as err:  # options, app and id: one error lists them all
            sv.dryrun(
                app(Role(name="r", entrypoint="", num_replicas=10**6)),
                "local",
                {"stop_grace": math.nan},
                app_id="..",
            )
        assert set(err.value.fields) == {
            "cfg.stop_grace",
            "roles[0].entrypoint",
            "roles[0].num_replicas",
            "app_id",
        }
        with pytest.raises(InvalidHandleError):
            await sv.describe("local://svc/" + "x" * 300)
        # An id whose index file name would be too long (each '/' is escaped) names no app.
        assert await sv.describe("local://svc/" + "/" * 150) is None
        assert not (state_dir / "logs").exists()  # nothing was launched or written

        # Still works: a zero grace period kills at once.
        handle = await sv.submit(good, "local", {"stop_grace": 0})
        await sv.cancel(handle)
        assert (await sv.wait(handle, timeout=30)).state is AppState.CANCELLED


@pytest.mark.anyio
async def test_a_wait_timeout_that_is_no_duration_is_a_spec_error(state_dir: Path) -> None:
    """anyio raised its own ValueError for NaN ("deadline must not be NaN"), and a
    negative timeout read "not terminal after -1 s"."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("a", "import time; time.sleep(0.5)")), "local")
        for timeout in (math.nan, -1, "5", True):
            with pytest.raises(SpecError) as err:
                await sv.wait(handle, timeout=timeout)  # type: ignore[arg-type]
            assert err.value.fields == ("timeout",), timeout
        with pytest.raises(WaitTimeout):
            await sv.wait(handle, timeout=0)  # 0 only looks
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
    # Another Supervisor (as another process) reads the records before 0 counts: the
    # look was cut short before, and every app followed elsewhere read "not terminal".
    async with Supervisor(session="svc") as other:
        assert (await other.wait(handle, timeout=0)).state is AppState.SUCCEEDED
        with pytest.raises(UnknownAppError):
            await other.wait("local://svc/no-such-app", timeout=0)


def test_a_supervisor_is_entered_once(state_dir: Path) -> None:
    """A second ``async with`` of a closed Supervisor ran with every verb refusing
    (shutting down); a nested one would have shared the first's apps and close."""
    sv = Supervisor(session="svc")

    async def twice() -> None:
        async with sv:
            with pytest.raises(NotEnteredError, match="entered once"):
                async with sv:
                    pass
            assert sv.status("local://svc/x") is None  # the first goes on
        with pytest.raises(NotEnteredError, match="entered once"):
            async with sv:
                pass

    anyio.run(twice)


@pytest.mark.anyio
async def test_a_supervisor_used_outside_its_block_says_so(state_dir: Path) -> None:
    """Before the block: ``events()`` waited for ever for a close that never came, and the
    other verbs raised a bare RuntimeError. After ``close`` inside the block, a read
    needing a backend it never used said "use it inside `async with`", as it was."""
    sv = Supervisor(session="svc")
    with pytest.raises(NotEnteredError):
        sv.events()
    with pytest.raises(NotEnteredError):
        await sv.describe("local://svc/x")
    with pytest.raises(SupervisorError):  # one tree for every error raised on purpose
        await sv.submit(app(py_role("a", "pass")), "local")
    async with Supervisor(session="svc") as closed:
        await closed.close()
        with pytest.raises(ShuttingDown, match="closed"):
            await closed.describe("local://svc/x")
        assert [e async for e in closed.events()] == []


@pytest.mark.anyio
async def test_a_supervisor_used_from_another_threads_loop_says_so(state_dir: Path) -> None:
    """Its tasks and events are its own loop's: a submit from another thread's loop hung
    for good, or returned a handle whose app was later recorded UNKNOWN."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("a", "pass")), "local")

        async def elsewhere() -> list[str]:
            refused = []
            for verb in (
                lambda: sv.submit(app(py_role("b", "pass")), "local"),
                lambda: sv.describe(handle),
                lambda: sv.wait(handle, timeout=5),
                lambda: sv.cancel(handle),
            ):
                try:
                    await asyncio.wait_for(verb(), 10)
                except NotEnteredError as e:
                    refused.append(str(e))
            return refused

        refused = await anyio.to_thread.run_sync(asyncio.run, elsewhere())
        assert len(refused) == 4 and all("another thread" in m for m in refused), refused
        assert (await sv.wait(handle, timeout=30)).state is AppState.SUCCEEDED
        assert [a.app_handle for a in await sv.list("local")] == [handle]


@pytest.mark.anyio
async def test_since_nan_is_a_spec_error(state_dir: Path) -> None:
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("a", "print('hello')")), "local")
        await sv.wait(handle, timeout=30)
        with pytest.raises(SpecError) as err:
            async for _ in sv.log_iter(handle, "a", since=math.nan):
                pass
        assert err.value.fields == ("since",)
        assert [line async for line in sv.log_iter(handle, "a", since=0)] == ["hello\n"]
        with pytest.raises(SpecError) as err:  # every bad part of a query at once
            async for _ in sv.log_iter(handle, "a", regex="(", streams="stdxx", until=math.nan):
                pass
        assert set(err.value.fields) == {"regex", "streams", "until"}
        with pytest.raises(SpecError) as err:  # before the lookup: no app needed to say so
            async for _ in sv.log_iter("local://svc/none-00000000", "a", streams="stdxx"):
                pass
        assert err.value.fields == ("streams",)
        with pytest.raises(SpecError) as err:  # list took NaN and matched nothing
            await sv.list("local", since=math.nan)
        assert err.value.fields == ("since",)


def test_a_relative_log_dir_is_found_from_another_directory(
    state_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()

    def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )

    done = cli(work, "run", "--wait", "--cfg", "log_dir=runs", "--", "echo", "from-relative")
    assert done.returncode == 0, done.stderr
    handle = done.stdout.splitlines()[0]
    app_id = handle.rpartition("/")[2]
    assert (work / "runs" / getpass_session(handle) / app_id / "app.json").exists()
    status = cli(elsewhere, "status", handle, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "SUCCEEDED"


def getpass_session(handle: str) -> str:
    return handle.partition("://")[2].partition("/")[0]


# ------------------------------------------------------------------ item 14


@pytest.mark.anyio
async def test_a_roles_error_file_and_log_dir_are_kept(state_dir: Path, tmp_path: Path) -> None:
    role = py_role(
        "w",
        "import json, os, sys;"
        "print(os.environ['PET_LOG_DIR']);"
        "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write("
        "json.dumps({'message': {'message': 'mine'}})); sys.exit(1)",
        env={
            "TORCHELASTIC_ERROR_FILE": str(tmp_path / "err-${replica_id}.json"),
            "PET_LOG_DIR": str(tmp_path / "pet"),
        },
    )
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(role), "local")
        status = await sv.wait(handle, timeout=30)
        lines = [line async for line in sv.log_iter(handle, "w")]
    assert status.state is AppState.FAILED
    assert "mine" in status.structured_error_msg  # read from the role's own file
    assert (tmp_path / "err-0.json").exists()
    assert lines == [f"{tmp_path / 'pet'}\n"]


@pytest.mark.anyio
async def test_a_roles_path_is_joined_with_the_inherited_one(
    state_dir: Path, tmp_path: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "robust-hello"
    tool.write_text("#!/bin/sh\necho hi-from-role-path\n")
    tool.chmod(0o755)
    script = 'robust-hello && command -v ls >/dev/null && echo inherited-ok && echo "$PATH"'
    roles = [
        Role(name="direct", entrypoint="robust-hello", env={"PATH": str(bindir)}),
        Role(name="shell", entrypoint="sh", args=["-c", script], env={"PATH": str(bindir)}),
    ]
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(*roles), "local")
        status = await sv.wait(handle, timeout=30)
        direct = [line async for line in sv.log_iter(handle, "direct")]
        shell = [line async for line in sv.log_iter(handle, "shell")]
    assert status.state is AppState.SUCCEEDED, status
    assert direct == ["hi-from-role-path\n"]
    assert shell[:2] == ["hi-from-role-path\n", "inherited-ok\n"]
    assert shell[2] == os.pathsep.join([str(bindir), os.environ["PATH"], os.getcwd()]) + "\n"


def test_run_opts_through_a_partial_or_a_plain_factory(state_dir: Path) -> None:
    sv = Supervisor(
        session="svc",
        backends={
            "slurm": partial(SlurmBackend, poller=PollerSettings(fast=0.5)),
            "mine": lambda ctx: LocalBackend(ctx),
        },
    )
    assert "partition" in sv.run_opts("slurm").names  # no backend started for it

    async def plain() -> list[str]:
        async with sv:
            return list(sv.run_opts("mine").names)

    assert "stop_grace" in anyio.run(plain)


# ------------------------------------------------------------------ item 12


def test_trio_is_refused_at_entry_with_a_clear_error(state_dir: Path) -> None:
    # trio comes with the test extra (pyproject.toml), so this runs everywhere the suite does.
    async def main() -> None:
        async with Supervisor(session="svc") as sv:
            await sv.submit(app(py_role("a", "pass")), "local")

    with pytest.raises(UnsupportedAsyncLibraryError, match="only on asyncio"):
        anyio.run(main, backend="trio")
    assert not (state_dir / "logs").exists()


@pytest.mark.anyio
async def test_matching_takes_one_state_or_several_by_name_or_member(state_dir: Path) -> None:
    """A lone "RUNNING" was taken letter by letter ("G, I, N, R, U: not app states"),
    an AppState member failed on ``.upper()``, and the valid names came in set order."""
    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app(py_role("a", "import time; time.sleep(30)")), "local")
        choices: list[AppState | str | list[AppState | str]] = [
            "running",
            AppState.RUNNING,
            ["RUNNING", AppState.PENDING],
        ]
        for states in choices:
            found = await sv.matching("local", states=states)
            assert [a.app_handle for a in found] == [handle], states
        assert await sv.matching("local", states=AppState.PENDING) == []
        with pytest.raises(SpecError) as err:
            await sv.matching("local", states=["RUNNIN", "running"])
        (problem,) = err.value.problems
        names = ", ".join(s.name for s in AppState)
        assert (problem.field, problem.message) == ("states", f"RUNNIN: not app states ({names})")
        assert await sv.cancel_matching("local", states="RUNNING") == [handle]
        assert (await sv.wait(handle, timeout=30)).state is AppState.CANCELLED
