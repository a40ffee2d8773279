"""The inotify watches this test process holds, as the kernel lists them.

Read from ``/proc/self/fdinfo``: one line per watch of each inotify instance,
with the watched inode. What a follower or a backend watches is kernel state
with no event to wait on, so tests poll this.
"""

from __future__ import annotations

import os


def watched_inodes() -> list[int]:
    """The inode of every watch of every inotify instance of this process (repeats kept)."""
    inodes: list[int] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "inotify" not in os.readlink(f"/proc/self/fd/{fd}"):
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                for line in info:
                    if line.startswith("inotify wd:"):
                        inodes.append(int(line.split("ino:")[1].split()[0], 16))
        except OSError:
            continue  # closed meanwhile
    return inodes
