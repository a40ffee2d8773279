"""The cross-run test lock (tests/host_lock.py) with real processes contending for it.

Each holder is a ``python -m tests.host_lock MODE PATH`` process: it prints ``queued``
when it has to wait, ``acquired`` once it holds the lock, and releases it when its
stdin closes. Nothing here is timed: a check that a holder did *not* get the lock
can only pass wrongly (on a slow machine), never fail wrongly.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.host_lock import (
    PATH_ENV,
    WAIT_ENV,
    HostLock,
    HostLockError,
    HostLockTimeout,
    host_lock,
    lock_wait,
)
from tests.integration.slurm_cluster import SKIP_ENV

ROOT = Path(__file__).resolve().parents[2]


class Holder:
    """One process taking the lock; its output lines are read as they come."""

    def __init__(self, mode: str, path: Path, wait: float = 60) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.host_lock", mode, str(path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, WAIT_ENV: str(wait)},
        )
        self.lines: list[str] = []

    def _read(self, timeout: float) -> bool:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return False
        line = self.proc.stdout.readline()
        if not line:
            return False
        self.lines.append(line.strip())
        return True

    def expect(self, word: str, timeout: float = 60) -> None:
        """Wait (bounded, generously) until the holder says ``word``."""
        deadline = time.monotonic() + timeout
        while not any(line.startswith(word) for line in self.lines):
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(left) and self.proc.poll() is not None):
                pytest.fail(f"the holder never said {word!r}: {self.lines}")

    def says(self, word: str, within: float = 1.0) -> bool:
        """Whether it said ``word`` (looking for ``within`` s more)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self._read(max(0.0, deadline - time.monotonic()))
        return any(line.startswith(word) for line in self.lines)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.expect("released")
        assert self.proc.wait(30) == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "cluster.lock"


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.stop()


def test_readers_share_and_a_writer_waits_for_all_of_them(
    path: Path, holders: list[Holder]
) -> None:
    a, b = Holder("shared", path), Holder("shared", path)
    holders += [a, b]
    a.expect("acquired")
    b.expect("acquired")  # beside a
    writer = Holder("exclusive", path)
    holders.append(writer)
    writer.expect("queued")
    a.release()
    assert not writer.says("acquired")  # b still reads
    b.release()
    writer.expect("acquired")
    late = Holder("shared", path)
    holders.append(late)
    late.expect("queued")
    assert not late.says("acquired")
    writer.release()
    late.expect("acquired")
    late.release()


def test_a_waiting_writer_is_not_overtaken_by_new_readers(
    path: Path, holders: list[Holder]
) -> None:
    """The gate: without it ``late`` would share with ``first`` and the writer could
    wait for ever behind a stream of readers."""
    first = Holder("shared", path)
    holders.append(first)
    first.expect("acquired")
    writer = Holder("exclusive", path)
    holders.append(writer)
    writer.expect("queued")
    late = Holder("shared", path)
    holders.append(late)
    late.expect("queued")
    assert not late.says("acquired")
    first.release()
    writer.expect("acquired")
    assert not late.says("acquired")
    writer.release()
    late.expect("acquired")
    late.release()


def test_two_writers_take_turns(path: Path, holders: list[Holder]) -> None:
    one = Holder("exclusive", path)
    holders.append(one)
    one.expect("acquired")
    two = Holder("exclusive", path)
    holders.append(two)
    two.expect("queued")
    assert not two.says("acquired")
    one.release()
    two.expect("acquired")
    two.release()


def test_the_wait_is_bounded_and_says_who_holds_the_lock(
    path: Path, holders: list[Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Holder("exclusive", path)
    holders.append(writer)
    writer.expect("acquired")
    monkeypatch.setenv(WAIT_ENV, "0.5")
    lock = HostLock(path)
    with pytest.raises(HostLockTimeout) as caught:
        lock.acquire(exclusive=False, what="tests/x.py::test_y")
    message = str(caught.value)
    assert str(path) in message and WAIT_ENV in message, message
    assert f"exclusive pid {writer.proc.pid}" in message and "tests.host_lock" in message
    assert lock.held is None
    # A reader that gave up left nothing behind: the writer's turn ends, a reader comes in.
    writer.release()
    with lock.shared():
        assert lock.held == "shared"


def test_a_killed_holder_leaves_the_lock_free(path: Path, holders: list[Holder]) -> None:
    dead = Holder("exclusive", path)
    holders.append(dead)
    dead.expect("acquired")
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait(30)
    with HostLock(path).exclusive(wait=30):
        pass


def test_children_of_the_holder_do_not_inherit_the_lock(path: Path) -> None:
    """A test that starts a daemon (slurmctld, dockerd) must not lend it the lock."""
    lock = HostLock(path)
    with lock.exclusive():
        child = subprocess.Popen(["sleep", "600"])
    try:
        with HostLock(path).exclusive(wait=30):
            pass
    finally:
        child.kill()
        child.wait(30)


def test_reentrant_within_one_process(path: Path, holders: list[Holder]) -> None:
    lock = host_lock(path)
    assert host_lock(path) is lock
    with lock.exclusive():
        with lock.shared(), lock.exclusive():
            assert lock.held == "exclusive"
        assert lock.held == "exclusive"
    assert lock.held is None
    with lock.shared():
        with lock.shared():
            pass
        assert lock.held == "shared"
        # Still held after the inner release: another process's writer waits.
        writer = Holder("exclusive", path)
        holders.append(writer)
        writer.expect("queued")
        with pytest.raises(HostLockError, match="upgrade"):
            lock.acquire(exclusive=True)
        assert lock.held == "shared"
    writer.expect("acquired")
    writer.release()
    with pytest.raises(HostLockError, match="released more often"):
        lock.release()


def test_the_wait_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAIT_ENV, raising=False)
    assert lock_wait() == 1800
    monkeypatch.setenv(WAIT_ENV, "12.5")
    assert lock_wait() == 12.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(WAIT_ENV, bad)
        with pytest.raises(HostLockError, match=WAIT_ENV):
            lock_wait()


@pytest.mark.slurm
def test_a_slurm_test_holds_the_cluster_lock_shared() -> None:
    """tests/conftest.py takes it around every Slurm test (skipped, as they all are,
    under ASUPERVISOR_SLURM_CLUSTER=skip)."""
    assert host_lock().held == "shared"


def test_a_slurm_test_that_waits_too_long_fails_in_its_setup_saying_why(
    path: Path, holders: list[Holder]
) -> None:
    """Through pytest itself: the hook's bounded wait is a setup error of that test (not
    an internal error, nor pytest-timeout's), naming the lock and the setting."""
    probe = "tests/unit/test_host_lock.py::test_a_slurm_test_holds_the_cluster_lock_shared"
    env = {k: v for k, v in os.environ.items() if k != SKIP_ENV}
    env.update({PATH_ENV: str(path), WAIT_ENV: "1"})

    def pytest_run() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", probe]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    writer = Holder("exclusive", path)
    holders.append(writer)
    writer.expect("acquired")
    done = pytest_run()
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "ERROR at setup" in out and f"waited 1 s for the shared test lock {path}" in out, out
    assert WAIT_ENV in out and "INTERNALERROR" not in out, out
    writer.release()
    done = pytest_run()
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
