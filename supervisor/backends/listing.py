"""Listing a backend's apps from its index: a damaged record is one app's problem.

Every backend lists the apps of its index the same way; what differs is how
one app's status is found. A settled app whose entry holds its summary (see
``store``) is listed from the entry alone; the others through ``one``. A
damaged index entry, ``app.json`` or ``state.json`` is listed as that app,
UNKNOWN, saying which file and why; every other app is listed as if it were
not there. Newest first (by submit time); entries with no time (damaged) last.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio

from supervisor.backends.store import Index, IndexEntry
from supervisor.errors import DamagedRecordError
from supervisor.specs import make_handle
from supervisor.states import AppState
from supervisor.status import ListAppResponse

__all__ = ["list_indexed", "newest_first"]


def newest_first(apps: Sequence[ListAppResponse]) -> list[ListAppResponse]:
    """Latest submitted first; apps with no submit time after, in their order."""
    timed = [a for a in apps if a.times.submitted is not None]
    untimed = [a for a in apps if a.times.submitted is None]
    timed.sort(key=lambda a: a.times.submitted or 0.0, reverse=True)
    return timed + untimed


async def list_indexed(
    index: Index,
    backend: str,
    one: Callable[[IndexEntry], Awaitable[ListAppResponse | None]],
) -> list[ListAppResponse]:
    """Each app of the index, newest first: from its summary, else ``one(entry)``.

    ``one`` is called for each intact entry with no summary (None: gone
    meanwhile); it raises ``DamagedRecordError`` for a damaged record of its app.
    """
    entries = await anyio.to_thread.run_sync(lambda: list(index.entries()))
    out = []
    for entry in entries:
        handle = make_handle(backend, entry.session, entry.app_id)
        summary = entry.summary
        if summary is not None:
            out.append(
                ListAppResponse(
                    entry.app_id, summary.state, handle, summary.name, summary.msg, summary.times
                )
            )
            continue
        damage = entry.damage
        if damage is None:
            try:
                found = await one(entry)
            except DamagedRecordError as e:
                damage = e
            else:
                if found is not None:
                    out.append(found)
                continue
        out.append(ListAppResponse(entry.app_id, AppState.UNKNOWN, handle, msg=str(damage)))
    return newest_first(out)
