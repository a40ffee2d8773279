"""One inotify instance shared by many log followers.

Linux allows a user 128 inotify instances by default, so one instance per
follower runs out as soon as someone follows a few hundred replicas (the CLI's
``--log`` follows every replica at once). ``WatchHub`` owns a single instance:
followers subscribe to paths (the file they read, or a directory it is still
to appear in), the hub keeps the subscribers of each path (inotify gives one
watch descriptor per path, whoever asks; the last to leave removes it) and
fans each event out to them.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path

import anyio
from anyio.abc import TaskGroup
from asyncinotify import Event, Inotify, Mask, Watch

from supervisor.logs.inotify_close import close_inotify

__all__ = ["FILE_WATCH_MASK", "WATCH_MASK", "EndSignal", "WatchHub"]

WATCH_MASK = (
    Mask.MODIFY
    | Mask.CLOSE_WRITE
    | Mask.CREATE
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)

FILE_WATCH_MASK = Mask.MODIFY | Mask.CLOSE_WRITE | Mask.DELETE_SELF | Mask.MOVE_SELF
"""For a watch of one file a follower reads: its writes, and its going away."""

Listener = Callable[[Event | None], None]
"""Called on the loop with an event of a subscribed directory, or None when events were lost."""


_TOKENS = itertools.count()  # subscriber identities; only ever increases


class EndSignal:
    """The end of a follow, which a follower waits for without a task of its own.

    A follower waits for two things at once, its file changing and its end,
    and waits again after every chunk a replica writes. Waiting for two anyio
    events takes a task group and a task for each (about 170 us a wait, where
    one event takes 26): with a hundred followers of talkative replicas that
    was half a core of the host's loop. An ``EndSignal`` calls back the
    followers that listen instead, so each waits for one event, its own.
    Otherwise used as an ``anyio.Event``.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._listeners: set[Callable[[], None]] = set()

    def set(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        listeners, self._listeners = self._listeners, set()
        for listener in listeners:
            listener()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the loop) when the end comes; at once if it came already."""
        if self._event.is_set():
            listener()
        else:
            self._listeners.add(listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        self._listeners.discard(listener)


class WatchHub:
    @staticmethod
    def new_token() -> int:
        """A subscriber identity no other subscriber of any hub has."""
        return next(_TOKENS)

    def __init__(self, task_group: TaskGroup) -> None:
        self._task_group = task_group
        self._inotify: Inotify | None = None
        self._failed = False
        self._listeners: dict[int, dict[int, Listener]] = {}
        # Asyncinotify lists its watches by copying them all: with a thousand
        # followers ending together, each unsubscribe copied a thousand.
        self._watches: dict[int, Watch] = {}

    def _instance(self) -> Inotify | None:
        if self._inotify is None and not self._failed:
            try:
                self._inotify = Inotify()
            except OSError:
                self._failed = True  # followers fall back to their slow re-check
                return None
            self._task_group.start_soon(self._dispatch, self._inotify)
        return self._inotify

    def subscribe(
        self, path: Path, token: int, listener: Listener, mask: Mask = WATCH_MASK
    ) -> int | None:
        """Watch ``path`` for ``token``'s listener; returns the watch descriptor, None if not.

        ``mask``: ``WATCH_MASK`` for a directory, ``FILE_WATCH_MASK`` for a file (a
        path is one or the other, so every subscriber of it asks the same).
        """
        inotify = self._instance()
        if inotify is None:
            return None
        try:
            watch = inotify.add_watch(path, mask)
        except OSError:
            return None
        wd = watch.wd
        self._watches[wd] = watch
        self._listeners.setdefault(wd, {})[token] = listener
        return wd

    def unsubscribe(self, wd: int, token: int) -> None:
        listeners = self._listeners.get(wd)
        if listeners is None or listeners.pop(token, None) is None:
            return
        if not listeners:  # the last subscriber of the path
            del self._listeners[wd]
            watch = self._watches.pop(wd, None)
            inotify = self._inotify
            if inotify is not None and watch is not None:
                with contextlib.suppress(OSError):
                    inotify.rm_watch(watch)

    async def _dispatch(self, inotify: Inotify) -> None:
        try:
            async for event in inotify:
                watch = event.watch
                if watch is None:
                    for listeners in list(self._listeners.values()):
                        for listener in list(listeners.values()):
                            listener(None)
                    continue
                for listener in list(self._listeners.get(watch.wd, {}).values()):
                    listener(event)
                if Mask.IGNORED in event.mask:
                    # The directory went away: the kernel dropped the watch.
                    self._listeners.pop(watch.wd, None)
                    self._watches.pop(watch.wd, None)
        finally:
            self._inotify = None
            await close_inotify(inotify)
