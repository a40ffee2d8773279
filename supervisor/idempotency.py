"""Idempotency keys for ``submit``: a retried submit gets the first one's handle.

A service that submits, crashes before it stored the handle, and submits
again must not start a second run. ``submit(..., idempotency_key=k)`` keeps a
durable record, one file per key::

    {state_dir}/idempotency/{backend}/{session}/{sha256(k)}.json  -> {"key", "handle", "submitted"}

Each key has a lock file beside its record, held with ``flock`` from the
moment the record is read until the app is launched and recorded. ``flock``
is released by the kernel when its holder dies, so a crash never leaves a
key stuck, and a second process (or task) submitting under the same key
waits for the first and then finds its handle. ``gc`` removes a key's record
and lock file with its app, holding that lock: whoever had opened the file
meanwhile finds, once it holds the lock, that it is no longer the key's file,
and takes the one there now (``_Pending.acquire``).

The record is written before the launch, with a fingerprint of what was
submitted (backend, app, run options): a key reused for a different submit is
refused rather than answered with an unrelated app's handle. A retry that
finds a record whose app exists returns that handle; one whose app never came to exist (the
launch failed, or the process died before launching) launches afresh under
a new app id and replaces the record.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from supervisor.backends.store import DISK_FULL, read_json_or_none, write_json_atomic
from supervisor.errors import Problem, ShuttingDown, SpecError, SubmitError
from supervisor.specs import AppDef

__all__ = ["IdempotencyKeys", "KeyQueues", "fingerprint", "submit_once"]


@dataclass
class _Pending:
    """Shared with the thread that waits for a lock, so a cancelled wait never leaks it."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    fd: int | None = None

    def acquire(self, path: Path) -> int | None:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = _is_current(fd, path)
            except BaseException:
                os.close(fd)
                raise
            if current:
                break
            os.close(fd)  # ``gc`` removed it while this waited: lock the key's file now
        with self.mutex:
            if self.abandoned:  # the waiter was cancelled meanwhile: let go at once
                os.close(fd)
                return None
            self.fd = fd
        return fd

    def abandon(self) -> None:
        with self.mutex:
            self.abandoned = True
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


def _is_current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path``: a lock held on a file ``gc`` removed
    meanwhile locks out nobody, as the next submit under the key opens a new one."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _try_lock(path: Path) -> int | None:
    """The lock file at ``path``, locked without waiting; None while a submit under its
    key holds it (or another gc removed it meanwhile). Blocking, briefly. Read-only: a
    read-only state directory is then said by the removal of the app's records."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _is_current(fd, path):
            return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _handle_of(record: Path) -> str | None:
    data = read_json_or_none(record)
    handle = data.get("handle") if isinstance(data, dict) else None
    return handle if isinstance(handle, str) else None


class KeyQueues:
    """One in-process queue per key lock: the submits of one process under one key
    take turns here, and only the one whose turn it is takes a thread to wait for the
    lock file.

    Without it every waiter under a busy key held one of the few lock-waiting
    threads: eight retries of one key (a client retrying a slow submit) made
    every submit under any other key wait for that key's holder.
    """

    def __init__(self) -> None:
        self._queues: dict[Path, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, lock_path: Path) -> AsyncIterator[None]:
        lock, users = self._queues.get(lock_path) or (anyio.Lock(), 0)
        self._queues[lock_path] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._queues[lock_path]
            if users == 1:
                del self._queues[lock_path]  # no key is kept once nobody waits for it
            else:
                self._queues[lock_path] = (lock, users - 1)


def fingerprint(backend: str, app: AppDef, cfg: Mapping[str, object] | None) -> str:
    """What a submit asked for, as a digest: equal for equal submits, in any process."""
    text = json.dumps(
        {"backend": backend, "app": app.to_json(), "cfg": dict(cfg or {})},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


class IdempotencyKeys:
    """The key records of one backend and session."""

    def __init__(
        self,
        state_dir: Path,
        backend: str,
        session: str,
        lock_waiters: anyio.CapacityLimiter | None = None,
        queues: KeyQueues | None = None,
    ) -> None:
        self.root = state_dir / "idempotency" / backend / session
        self._queues = queues if queues is not None else KeyQueues()
        self._lock_waiters = lock_waiters
        """Threads for the waits for a key's lock, apart from anyio's default ones: the
        holder needs those to read and record the key, and a retry storm of submits under
        one key (40, anyio's limit) would otherwise take them all while they wait."""

    def _base(self, key: str) -> Path:
        # Keys are arbitrary text; their hash makes a safe, fixed-length file name.
        return self.root / hashlib.sha256(key.encode()).hexdigest()

    def remove_apps(self, handles: Sequence[str], remove: Callable[[str], bool]) -> list[str]:
        """``remove(handle)`` (``gc``'s removal of one app; True if it removed it) for each
        of ``handles``, holding the locks of the keys that name it, then those keys'
        records and lock files: the handles removed. Blocking: for a worker thread.

        The locks come first. A submit under way under such a key holds its lock from
        reading the record until it returns, and may return this very handle: its app
        stays, for a later gc. Once gc holds the lock, a submit under the key waits for
        it, then finds no record and starts a new run. The lock files that no record
        stands beside (a submit that failed before its app existed, earlier gcs) go too,
        each removed while held, as these are.
        """
        naming: dict[str, list[Path]] = {handle: [] for handle in handles}
        for record in self._files("*.json"):
            found = naming.get(_handle_of(record) or "")
            if found is not None:
                found.append(record)
        removed: list[str] = []
        for handle in handles:
            held: list[tuple[Path, int]] = []
            try:
                for record in naming[handle]:
                    fd = _try_lock(record.with_suffix(".lock"))
                    if fd is None:
                        break  # a submit under this key is under way: the app stays
                    held.append((record, fd))
                else:
                    if remove(handle):
                        removed.append(handle)
                        for record, _ in held:
                            if _handle_of(record) == handle:  # (not replaced meanwhile)
                                record.unlink(missing_ok=True)
                                record.with_suffix(".lock").unlink(missing_ok=True)
            finally:
                for _, fd in held:
                    os.close(fd)
        self._remove_idle_locks()
        return removed

    def _files(self, pattern: str) -> list[Path]:
        try:
            return sorted(self.root.glob(pattern))
        except OSError:
            return []

    def _remove_idle_locks(self) -> None:
        """Remove the lock files that have no record beside them and no holder."""
        for lock in self._files("*.lock"):
            if lock.with_suffix(".json").exists():
                continue
            fd = _try_lock(lock)
            if fd is None:
                continue
            try:
                # Looked at again, held: a submit may have recorded its key meanwhile.
                if not lock.with_suffix(".json").exists():
                    lock.unlink(missing_ok=True)
            finally:
                os.close(fd)

    @asynccontextmanager
    async def locked(self, key: str) -> AsyncIterator[_Entry]:
        """Hold the key's lock (waiting for another holder) and give its record."""
        base = self._base(key)
        async with (
            self._queues.turn(base.with_suffix(".lock")),
            self._lock_file(key, base) as entry,
        ):
            yield entry

    @asynccontextmanager
    async def _lock_file(self, key: str, base: Path) -> AsyncIterator[_Entry]:
        pending = _Pending()
        try:
            fd = await anyio.to_thread.run_sync(
                pending.acquire,
                base.with_suffix(".lock"),
                abandon_on_cancel=True,
                limiter=self._lock_waiters,
            )
        except OSError as e:
            pending.abandon()
            raise _not_kept(key, "take", e) from e
        except BaseException:
            pending.abandon()
            raise
        if fd is None:  # pragma: no cover - only after a cancel, which raised above
            raise RuntimeError("idempotency lock abandoned")
        try:
            record = await anyio.to_thread.run_sync(read_json_or_none, base.with_suffix(".json"))
            record = record if isinstance(record, dict) else {}
            handle, submitted = record.get("handle"), record.get("submitted")
            yield _Entry(
                key,
                base.with_suffix(".json"),
                handle if isinstance(handle, str) else None,
                submitted if isinstance(submitted, str) else "",
            )
        finally:
            pending.abandon()  # closes the descriptor: releases the lock


@dataclass
class _Entry:
    key: str
    path: Path
    handle: str | None
    submitted: str  # the fingerprint of what the recorded handle was submitted for

    async def record(self, handle: str, submitted: str) -> None:
        """Durably map the key to ``handle`` (replaced atomically: never half a record)."""
        data = {"key": self.key, "handle": handle, "submitted": submitted}
        try:
            await anyio.to_thread.run_sync(lambda: write_json_atomic(self.path, data, durable=True))
        except OSError as e:
            raise _not_kept(self.key, "record", e) from e
        self.handle = handle

    async def forget(self) -> None:
        await anyio.to_thread.run_sync(lambda: self.path.unlink(missing_ok=True))
        self.handle = None


def _not_kept(key: str, doing: str, error: OSError) -> SubmitError:
    """The key's file work failed (a full disk, a state directory not writable): nothing
    was launched, and a full disk may have room again for a retry."""
    return SubmitError(
        f"cannot {doing} idempotency key {key!r}: {error}", transient=error.errno in DISK_FULL
    )


async def submit_once(
    keys: IdempotencyKeys,
    key: str,
    *,
    submitted: str,
    exists: Callable[[str], Awaitable[bool]],
    prepare: Callable[[], str],
    launch: Callable[[], Awaitable[str]],
) -> str:
    """The handle recorded under ``key`` if its app exists; else launch and record.

    ``prepare`` returns the handle the launch will have (its dry run done
    already: bad input is refused before any key is taken); ``launch``
    schedules that dry run. A launch that fails leaves no record
    behind unless its app came to exist anyway, so a retry can try again.
    ``submitted`` fingerprints the submit (``fingerprint``): the same key with
    a different one is a SpecError naming ``idempotency_key``.
    """
    async with keys.locked(key) as entry:
        if entry.handle is not None and await exists(entry.handle):
            if entry.submitted and entry.submitted != submitted:
                problem = Problem(
                    "idempotency_key",
                    f"was already used for a different submit ({entry.handle}); "
                    "a changed app or run options needs a new key",
                )
                raise SpecError([problem], context="invalid submit")
            return entry.handle
        handle = prepare()
        await entry.record(handle, submitted)
        try:
            return await launch()
        except BaseException as e:
            # A launch cut short by the caller's cancel or by the Supervisor's shutdown
            # stopped its app (``Supervisor.schedule``): the caller never got the handle,
            # and a retry must run the work, not be given a stopped app.
            stopped = isinstance(e, anyio.get_cancelled_exc_class() | ShuttingDown)
            with anyio.CancelScope(shield=True):
                if stopped or not await exists(handle):
                    await entry.forget()
            raise
