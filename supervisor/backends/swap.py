"""Put a new file in place of an old one, so readers see the old or the new, never half.

Why not ``os.replace`` alone: on ext4 a rename over an existing file starts the
write-out of the new file's data before it returns (``auto_da_alloc``, a guard
for programs that never fsync), about 170 us where the rename itself takes 12.
The final record of an app, on the path of every ``wait``, replaces two files.
``renameat2(RENAME_EXCHANGE)`` swaps the two names atomically without that
write-out (readers see the same thing), and the old file, now under the
temporary name, is unlinked after. Where the kernel, the filesystem or the C
library has no exchange, or the target does not exist yet, it is a plain
``os.replace``.

Nothing here is durable by itself: a caller that needs the data on disk
fsyncs before (and then the write-out has happened anyway).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["create_beside", "open_beside", "swap_into_place"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# The exchange cannot be had here: use os.replace from now on, without asking again.
_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EXDEV})

_Exchange = Callable[[int, bytes, int, bytes, int], int]


def _load_exchange() -> _Exchange | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library older than glibc 2.28, or none
        return None
    c_int, c_path = ctypes.c_int, ctypes.c_char_p
    function.argtypes = [c_int, c_path, c_int, c_path, ctypes.c_uint]
    function.restype = ctypes.c_int
    exchange: _Exchange = function
    return exchange


_exchange: _Exchange | None = _load_exchange()
_names = itertools.count()


def create_beside(path: Path) -> tuple[int, Path]:
    """A new, empty file in ``path``'s directory for its next content: (fd, its path).

    Named ``.{name}.{pid}.{n}``, created exclusively (a name left by a dead
    writer of the same pid is skipped), without ``tempfile``'s random names.
    """
    prefix = f".{path.name}.{os.getpid()}."
    while True:
        tmp = path.with_name(f"{prefix}{next(_names)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        return fd, tmp


def open_beside(path: Path, spare: Path | None) -> tuple[int, Path]:
    """``create_beside``, or ``spare`` opened when it is still there: (fd, its path).

    ``spare`` is an empty file ``create_beside`` made earlier, when nobody
    waited: on ext4 here creating a file costs 0.15-0.5 ms, opening one a
    tenth of that, and an app's final record is on the path of every ``wait``.
    Only a file nobody else has ever opened may be a spare: an old content's
    file (the one a swap leaves under the temporary name) may still be read.
    """
    if spare is not None:
        try:
            return os.open(spare, os.O_WRONLY | os.O_CLOEXEC), spare
        except FileNotFoundError:
            pass
    return create_beside(path)


def swap_into_place(
    tmp: Path, path: Path, *, only_over: bool = False, keep_old: bool = False, new: bool = False
) -> bool:
    """Make ``tmp``'s file the one at ``path``; ``tmp``'s name is gone once this returns.

    ``only_over``: only if a file is at ``path`` already; False (and ``tmp``
    removed) when none is. With the exchange this is atomic: a file removed
    meanwhile by another process is never written back. Without it, the check
    and the rename are two steps. ``keep_old``: after an exchange, ``tmp`` is
    left naming the old file, for the caller to unlink later, off a path
    somebody waits on (unlinking a written file costs about as much as the swap).
    ``new``: the caller made the file's directory or name itself and nothing is at
    ``path`` yet: a plain ``os.replace``, not an exchange that would fail first
    (should a file be there after all, it is replaced just the same, atomically).
    """
    global _exchange
    exchange = None if new else _exchange
    if exchange is not None:
        source, target = os.fsencode(tmp), os.fsencode(path)
        if exchange(_AT_FDCWD, source, _AT_FDCWD, target, _RENAME_EXCHANGE) == 0:
            # ``tmp`` now names the old file: nobody reads it under that name.
            if not keep_old:
                os.unlink(tmp)
            return True
        code = ctypes.get_errno()
        if code in _UNSUPPORTED:
            _exchange = None
        elif code != errno.ENOENT:  # ENOENT: nothing at ``path`` yet (or no ``tmp``)
            raise OSError(code, os.strerror(code), str(path))
    if only_over and not os.path.lexists(path):
        os.unlink(tmp)
        return False
    os.replace(tmp, path)
    return True
