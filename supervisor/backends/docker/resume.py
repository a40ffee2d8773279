"""Copying the output of containers that nobody follows any more into their log files.

The launching process copies a replica's output while it follows the app.
After it released the app (or died), a process that reads the logs, or
finishes the app, copies the rest from the engine: the attempt file
(``.docker-attempt.json``, written before each container starts) says where
that container's output begins in the files, so bytes already there are
skipped rather than written twice, and a per-replica flock keeps a second
process from copying the same bytes at the same time. Once the container
ended, the bytes already there are first checked against the engine's log
(length and SHA-256 per stream; the launcher's live copy may have lost or
reordered pieces on Podman) and the attempt is written again when they differ.
A copy of a container still running trusts their length.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from supervisor.backends.docker.runtime import (
    ATTEMPT_FILE,
    COPY_LOCK,
    CopyCheck,
    attempt_starts,
    digests_since,
    log_sizes,
    sha256s,
)
from supervisor.backends.docker.services import BackendServices
from supervisor.backends.store import AppRecord, AppStore, lock_file, read_json_or_none

__all__ = ["LogResumer"]


_NOTHING = {"stdout": 0, "stderr": 0}


class LogResumer:
    def __init__(self, backend: BackendServices) -> None:
        self._backend = backend
        self._copies: dict[str, tuple[anyio.CancelScope, anyio.Event]] = {}

    async def resume(
        self, store: AppStore, app: AppRecord, role: str, replica_id: int, final: bool = False
    ) -> None:
        """Nobody copies this replica's output any more: copy the rest of it from the engine.

        The attempt file says where the current container's output starts in the
        files, so the bytes already there are skipped rather than written twice.
        """
        directory = store.app_dir / role / str(replica_id)

        def read_marks() -> tuple[dict[str, Any], dict[str, int]] | None:
            # Tolerant, and never blocking on a FIFO: without a mark nothing is copied.
            mark = read_json_or_none(directory / ATTEMPT_FILE)
            if not isinstance(mark, dict):
                return None
            return mark, log_sizes(directory)

        sink = self._backend.log_sink
        if final:
            # A copy that follows this replica may never see its stream end (Podman): stop
            # it, and count what it wrote from the files once they hold all of it.
            for name, (running_scope, running_done) in list(self._copies.items()):
                if name.startswith(f"{directory}:"):
                    running_scope.cancel()
                    await running_done.wait()
            await sink.flush()
        marks = await anyio.to_thread.run_sync(read_marks)
        if marks is None:
            return
        mark, sizes = marks
        cid = str(mark.get("container") or "")
        if not cid or (not final and f"{directory}:{cid}" in self._copies):
            return
        engine = self._backend.engine_for(str(app.request.get("host") or self._backend.host))
        info = await engine.inspect(cid)
        if info is None:
            return
        running = not final and bool((info.get("State") or {}).get("Running"))
        # One copier per replica across processes: another holding it copies these bytes.
        held = await anyio.to_thread.run_sync(lock_file, directory / COPY_LOCK, False)
        if held is None:
            return
        if final:
            # Sizes again, now that no other process can be writing to the files.
            marks = await anyio.to_thread.run_sync(read_marks)
            if marks is None:
                os.close(held)
                return
            mark, sizes = marks
        seen = {s: max(0, sizes[s] - int(mark.get(s, 0))) for s in ("stdout", "stderr")}
        check: CopyCheck | None = None
        starts = attempt_starts(mark)
        if not running and starts is not None:
            # The container ended: what its copy wrote since the mark is checked against
            # the engine's log (Podman's follow stream can lose and reorder pieces).
            digests = await anyio.to_thread.run_sync(digests_since, directory, starts, sizes)
            check = CopyCheck(seen, digests)
        log = sink.open(directory)
        scope, done = anyio.CancelScope(), anyio.Event()
        self._copies[f"{directory}:{cid}"] = (scope, done)

        async def copy() -> None:
            got = {"stdout": 0, "stderr": 0}
            try:
                async with self._backend.tracked():
                    await copy_with(got)
            finally:
                os.close(held)
                self._copies.pop(f"{directory}:{cid}", None)
                done.set()

        async def copy_with(got: dict[str, int]) -> None:
            with scope:
                if check is not None:
                    if not await checked_copy(check):
                        assert starts is not None
                        sink.mark_attempt(log, at=starts)
                        sink.rewind(log)
                        await checked_copy(CopyCheck(_NOTHING, sha256s()))
                else:
                    async for stream, data in engine.log_frames(cid, follow=running):
                        skip = max(0, min(len(data), seen[stream] - got[stream]))
                        got[stream] += len(data)
                        if skip < len(data):
                            sink.write(log, stream, data[skip:], time.time())
                sink.end_stream(log, "stdout")
                sink.end_stream(log, "stderr")

        async def checked_copy(check: CopyCheck) -> bool:
            async for stream, data in engine.log_frames(cid, follow=False):
                rest = check.rest(stream, data)
                if rest is None:
                    return False
                if rest:
                    sink.write(log, stream, rest, time.time())
            return check.whole()

        if running:
            self._backend.task_group.start_soon(copy)
        else:
            await copy()
            await sink.flush()

    async def aclose(self) -> None:
        for scope, _ in self._copies.values():
            scope.cancel()
