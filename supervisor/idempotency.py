"""Idempotency keys for ``submit``: a retried submit gets the first one's handle.

A service that submits, crashes before it stored the handle, and submits
again must not start a second run. ``submit(..., idempotency_key=k)`` keeps a
durable record, one file per key::

    {state_dir}/idempotency/{backend}/{session}/{sha256(k)}.json  -> {"key", "handle"}

Each key has a lock file beside its record, held with ``flock`` from the
moment the record is read until the app is launched and recorded. ``flock``
is released by the kernel when its holder dies, so a crash never leaves a
key stuck, and a second process (or task) submitting under the same key
waits for the first and then finds its handle.

The record is written before the launch. A retry that finds a record whose
app exists returns that handle; one whose app never came to exist (the
launch failed, or the process died before launching) launches afresh under
a new app id and replaces the record.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from supervisor.backends.store import _read_json, write_json_atomic

__all__ = ["IdempotencyKeys", "submit_once"]


@dataclass
class _Pending:
    """Shared with the thread that waits for a lock, so a cancelled wait never leaks it."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    fd: int | None = None

    def acquire(self, path: Path) -> int | None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
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


class IdempotencyKeys:
    """The key records of one backend and session."""

    def __init__(self, state_dir: Path, backend: str, session: str) -> None:
        self.root = state_dir / "idempotency" / backend / session

    def _base(self, key: str) -> Path:
        # Keys are arbitrary text; their hash makes a safe, fixed-length file name.
        return self.root / hashlib.sha256(key.encode()).hexdigest()

    @asynccontextmanager
    async def locked(self, key: str) -> AsyncIterator[_Entry]:
        """Hold the key's lock (waiting for another holder) and give its record."""
        base = self._base(key)
        pending = _Pending()
        try:
            fd = await anyio.to_thread.run_sync(
                pending.acquire, base.with_suffix(".lock"), abandon_on_cancel=True
            )
        except BaseException:
            pending.abandon()
            raise
        if fd is None:  # pragma: no cover - only after a cancel, which raised above
            raise RuntimeError("idempotency lock abandoned")
        try:
            record = await anyio.to_thread.run_sync(_read_json, base.with_suffix(".json"))
            handle = record.get("handle") if isinstance(record, dict) else None
            known = handle if isinstance(handle, str) else None
            yield _Entry(key, base.with_suffix(".json"), known)
        finally:
            pending.abandon()  # closes the descriptor: releases the lock


@dataclass
class _Entry:
    key: str
    path: Path
    handle: str | None

    async def record(self, handle: str) -> None:
        """Durably map the key to ``handle`` (replaced atomically: never half a record)."""
        data = {"key": self.key, "handle": handle}
        await anyio.to_thread.run_sync(lambda: write_json_atomic(self.path, data, durable=True))
        self.handle = handle

    async def forget(self) -> None:
        await anyio.to_thread.run_sync(lambda: self.path.unlink(missing_ok=True))
        self.handle = None


async def submit_once(
    keys: IdempotencyKeys,
    key: str,
    *,
    exists: Callable[[str], Awaitable[bool]],
    prepare: Callable[[], str],
    launch: Callable[[], Awaitable[str]],
) -> str:
    """The handle recorded under ``key`` if its app exists; else launch and record.

    ``prepare`` does the dry run and returns the handle the launch will have;
    ``launch`` schedules that dry run. A launch that fails leaves no record
    behind unless its app came to exist anyway, so a retry can try again.
    """
    async with keys.locked(key) as entry:
        if entry.handle is not None and await exists(entry.handle):
            return entry.handle
        handle = prepare()
        await entry.record(handle)
        try:
            return await launch()
        except BaseException:
            with anyio.CancelScope(shield=True):
                if not await exists(handle):
                    await entry.forget()
            raise
