"""Listing a backend's apps from its index: a damaged record is one app's problem.

Every backend lists the apps of its index the same way; what differs is how
one app's status is found. A damaged index entry, ``app.json`` or
``state.json`` is listed as that app, UNKNOWN, saying which file and why;
every other app is listed as if it were not there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from supervisor.backends.store import Index, IndexEntry
from supervisor.errors import DamagedRecordError
from supervisor.specs import make_handle
from supervisor.states import AppState
from supervisor.status import ListAppResponse

__all__ = ["list_indexed"]


async def list_indexed(
    index: Index,
    backend: str,
    one: Callable[[IndexEntry], Awaitable[ListAppResponse | None]],
) -> list[ListAppResponse]:
    """``one(entry)`` for each intact entry (None: gone meanwhile), in the index's order.

    ``one`` raises ``DamagedRecordError`` for a damaged record of its app.
    """
    entries = await anyio.to_thread.run_sync(lambda: list(index.entries()))
    out = []
    for entry in entries:
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
        handle = make_handle(backend, entry.session, entry.app_id)
        out.append(ListAppResponse(entry.app_id, AppState.UNKNOWN, handle, msg=str(damage)))
    return out
