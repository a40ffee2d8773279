"""A reader/writer lock between test runs on one machine, on files under /run.

Two runs of the test suite on one machine share the local Slurm cluster. Most
Slurm tests only use it (submit their own jobs, cancel only those) and may run
beside the other run's tests: they take the lock *shared*. A few disturb every
user of the cluster (a node set DOWN, slurmctld restarted, accounting switched
off, every node taken): they take it *exclusive*, so they wait until the other
run's Slurm tests are done, and no new one starts until they are.

The lock is ``flock(2)`` on two files: the lock itself and a *gate*. A writer
takes the gate first and keeps it while it waits; a reader passes the gate
(shared) before it takes the lock, so once a writer waits, new readers wait
behind it instead of overtaking it for ever (no writer starvation). The kernel
drops a dead process's locks: a killed run never leaves the cluster locked. The
descriptors are close-on-exec, so daemons a test starts never inherit them.

Within one process the lock is re-entrant: nested takes only count, and the
files are unlocked when the outermost one is released. A shared holder asking
for the exclusive lock is refused (two such runs would wait on each other).

Every wait is bounded: ``ASUPERVISOR_TEST_LOCK_WAIT`` seconds (default 1800),
then :class:`HostLockTimeout` says which lock, for how long, and who holds it.
``ASUPERVISOR_TEST_LOCK`` names another lock file than
/run/asupervisor-tests/slurm-cluster.lock (the lock's own tests use it).

``python -m tests.host_lock shared|exclusive PATH`` takes the lock, prints
``acquired``, holds it until its stdin ends, then prints ``released`` (used by
tests/unit/test_host_lock.py with real processes).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "CLUSTER_LOCK",
    "LOCK_DIR",
    "PATH_ENV",
    "WAIT_ENV",
    "HostLock",
    "HostLockError",
    "HostLockTimeout",
    "host_lock",
    "lock_wait",
]


def _lock_dir() -> Path:
    """/run/asupervisor-tests (root, where the cluster is); a temp directory otherwise."""
    run = Path("/run")
    if os.access(run, os.W_OK) or os.access(run / "asupervisor-tests", os.W_OK):
        return run / "asupervisor-tests"
    return Path(tempfile.gettempdir()) / f"asupervisor-tests-{os.getuid()}"


LOCK_DIR = _lock_dir()
PATH_ENV = "ASUPERVISOR_TEST_LOCK"
CLUSTER_LOCK = Path(os.environ.get(PATH_ENV) or LOCK_DIR / "slurm-cluster.lock")
"""The cluster's lock; ``ASUPERVISOR_TEST_LOCK`` names another file (tests of the lock)."""
WAIT_ENV = "ASUPERVISOR_TEST_LOCK_WAIT"
DEFAULT_WAIT = 1800.0
"""Long enough for the other run's slowest Slurm test (900 s) and a writer before it."""
POLL = 0.1


class HostLockError(RuntimeError):
    """The lock cannot be taken as asked (an upgrade, a bad setting)."""


class HostLockTimeout(HostLockError):
    """The lock was not free within the bounded wait."""


def lock_wait() -> float:
    """Seconds a take may wait, from ``ASUPERVISOR_TEST_LOCK_WAIT`` (default 1800)."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not wait >= 0:  # also NaN
        raise HostLockError(f"{WAIT_ENV}={raw!r}: not a number of seconds >= 0")
    return wait


def _open(path: Path) -> int:
    # os.open's descriptors are close-on-exec (PEP 446): no child process inherits a lock.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


class HostLock:
    """The reader/writer lock on ``path`` (with ``path.gate`` and ``path.holders/``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gate = path.with_name(path.name + ".gate")
        self.holders = path.with_name(path.name + ".holders")
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._exclusive = False
        self._depth = 0

    @property
    def held(self) -> str | None:
        """``"shared"``, ``"exclusive"`` or None: what this process holds."""
        if self._depth == 0:
            return None
        return "exclusive" if self._exclusive else "shared"

    @contextmanager
    def shared(self, what: str = "", wait: float | None = None) -> Iterator[None]:
        self.acquire(exclusive=False, what=what, wait=wait)
        try:
            yield
        finally:
            self.release()

    @contextmanager
    def exclusive(self, what: str = "", wait: float | None = None) -> Iterator[None]:
        self.acquire(exclusive=True, what=what, wait=wait)
        try:
            yield
        finally:
            self.release()

    def acquire(
        self,
        exclusive: bool,
        what: str = "",
        wait: float | None = None,
        on_queued: Callable[[], None] | None = None,
    ) -> None:
        """Take the lock, waiting at most ``wait`` s (default: ``lock_wait()``).

        ``what`` (a test id) is shown to a run that waits for this one; ``on_queued`` is
        called once if the take has to wait (a writer then already holds the gate)."""
        with self._mutex:
            if self._depth:
                if exclusive and not self._exclusive:
                    raise HostLockError(
                        f"{self.path}: this process holds the lock shared and asks for it "
                        "exclusive; release it first (an upgrade could wait on another run "
                        "that does the same)"
                    )
                self._depth += 1
                return
            timeout = lock_wait() if wait is None else wait
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = self._take(exclusive, time.monotonic() + timeout, timeout, on_queued)
            self._exclusive = exclusive
            self._depth = 1
            self._note(what)

    def release(self) -> None:
        with self._mutex:
            if self._depth == 0:
                raise HostLockError(f"{self.path}: released more often than taken")
            self._depth -= 1
            if self._depth:
                return
            (self.holders / str(os.getpid())).unlink(missing_ok=True)
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)  # drops the flock

    # ----------------------------------------------------------------- inside
    def _take(
        self,
        exclusive: bool,
        deadline: float,
        timeout: float,
        on_queued: Callable[[], None] | None,
    ) -> int:
        main = _open(self.path)
        gate = _open(self.gate)
        queued = False

        def until(fd: int, operation: int, which: str) -> None:
            nonlocal queued
            while not _try(fd, operation):
                if not queued:
                    queued = True
                    if on_queued is not None:
                        on_queued()
                if time.monotonic() >= deadline:
                    mode = "exclusive" if exclusive else "shared"
                    raise HostLockTimeout(
                        f"waited {timeout:.0f} s for the {mode} test lock {self.path} ({which}) "
                        f"and gave up: another test run on this machine uses the Slurm cluster "
                        f"({self._holders_text()}). Let it finish, or set {WAIT_ENV} "
                        "(seconds) to wait longer."
                    )
                time.sleep(POLL)

        try:
            try:
                if exclusive:
                    # Hold the gate while waiting: readers that come now queue behind us.
                    until(gate, fcntl.LOCK_EX, "its gate, held by another waiting writer")
                    until(main, fcntl.LOCK_EX, "held by its readers or a writer")
                else:
                    until(gate, fcntl.LOCK_SH, "its gate: a writer waits or holds it")
                    until(main, fcntl.LOCK_SH, "held by a writer")
            finally:
                os.close(gate)  # drops the gate either way
        except BaseException:
            os.close(main)
            raise
        return main

    def _note(self, what: str) -> None:
        """Who holds it, for the message of a run that waits (best effort)."""
        try:
            self.holders.mkdir(exist_ok=True)
            mode = "exclusive" if self._exclusive else "shared"
            text = f"{mode} pid {os.getpid()} cwd {os.getcwd()} {what}".rstrip()
            (self.holders / str(os.getpid())).write_text(text + "\n")
        except OSError:
            pass

    def _holders_text(self) -> str:
        found = []
        try:
            for entry in sorted(self.holders.iterdir()):
                if entry.name.isdigit() and Path(f"/proc/{entry.name}").exists():
                    found.append(entry.read_text().strip())
        except OSError:
            pass
        return "holders: " + "; ".join(found) if found else "no holder recorded"


_LOCKS: dict[Path, HostLock] = {}
_LOCKS_MUTEX = threading.Lock()


def host_lock(path: Path = CLUSTER_LOCK) -> HostLock:
    """The one HostLock of this process for ``path`` (so nested takes are re-entrant)."""
    key = Path(os.path.abspath(path))
    with _LOCKS_MUTEX:
        found = _LOCKS.get(key)
        if found is None:
            found = _LOCKS[key] = HostLock(key)
        return found


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("shared", "exclusive"):
        print("usage: python -m tests.host_lock shared|exclusive PATH", file=sys.stderr)
        return 2
    lock = host_lock(Path(argv[1]))

    def queued() -> None:
        print("queued", flush=True)

    try:
        lock.acquire(exclusive=argv[0] == "exclusive", what="tests.host_lock", on_queued=queued)
    except HostLockTimeout as e:
        print(f"timeout {e}", flush=True)
        return 1
    print("acquired", flush=True)
    sys.stdin.read()
    lock.release()
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
