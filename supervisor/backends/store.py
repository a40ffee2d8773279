"""On-disk records of apps, so other processes can find and follow them.

Layout, for an app with handle ``{backend}://{session}/{app_id}``::

    {state_dir}/index/{backend}/{session}/{app_id}.json   -> {"app_dir": ..., "name": ...}
    {app_dir}/app.json           the AppDef, the request, the owner process
    {app_dir}/state.json         latest AppStatus, replaced atomically
    {app_dir}/transitions.jsonl  every transition, appended
    {app_dir}/cancel.request     created by another process to ask for a cancel
    {app_dir}/{role}/{k}/        the replica's logs
    {state_dir}/cancel-requests/{backend}/{session}%2F{app_id}   the same request, for an
                                 owner that watches one directory for all its apps (local)

Once the app's final record is written, its index entry also carries what
``list`` shows of it (state, msg, times) and the identity (inode, size, times)
of its ``app.json`` and ``state.json`` then: ``list`` answers a settled app
from its entry alone, after a ``stat`` of each record shows it untouched since
(a record changed or damaged later is read, and reported, as before).

Each of ``app.json``, ``state.json`` and the index entries carries its ``format``
(``RECORD_FORMAT``): a record written by a newer version is refused as damaged, with
that reason, rather than misread.

Every function here blocks (file I/O) and is meant to run in a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from supervisor.backends.swap import create_beside, open_beside, swap_into_place
from supervisor.errors import BackendError, DamagedRecordError, DuplicateAppError
from supervisor.fsm.ingest import closing_steps
from supervisor.logs.timestamps import write_all
from supervisor.specs import AppDef, Role
from supervisor.states import AppState, ReplicaState
from supervisor.status import AppStatus, AppTimes, ReplicaStatus, RoleStatus, Transition

__all__ = [
    "FINALIZE_LOCK",
    "RELEASED",
    "AppRecord",
    "AppStore",
    "CancelRequests",
    "Index",
    "IndexEntry",
    "IndexSummary",
    "Owner",
    "damaged_status",
    "end_is_known",
    "lock_file",
    "read_json_or_none",
    "read_record",
    "record_identities",
    "remove_app",
    "unknown_status",
    "write_json_atomic",
]

RECORD_FORMAT = 1
"""The layout of ``app.json``, ``state.json`` and index entries that this version writes
(their ``format`` field) and reads. Records from before the field existed have this
layout: a missing ``format`` is 1. A newer format is refused with that reason, never
read as if it were this one: a later version may change what a field means."""

CANCEL_REQUEST = "cancel.request"
FINALIZE_LOCK = ".finalize.lock"
"""Held by the one process that records the end of an app nobody follows."""
RELEASED = "owner.released"
"""Written when the owner's Supervisor closed while the app ran on (a durable backend)."""
RESERVE = ".final-record.reserve"

RECORD_LIMIT = 64 * 1024 * 1024
"""Bytes a record may have: far above any real one (500 replicas' state is ~100 kB),
far below what would exhaust memory when something else took a record's name."""

# Not the record's fault: the same read may succeed later.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN})
# There is no record under that name (a name too long cannot exist either).
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG})


def lock_file(path: Path, wait: bool) -> int | None:
    """Blocking: an fd holding an exclusive flock on ``path`` (None if busy and not ``wait``).

    flock, because the kernel releases it when its holder dies, however it dies.
    """
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


DISK_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a file system with no room left (for everyone, or for this user)."""


def _cut_torn_line(fd: int, size: int) -> int:
    """Cut a line its writer died in (no newline ends the file) off the file; its new size.

    A reader leaves such a line out (``AppStore.read_transitions``); a line appended
    after it would join it, and the two make a line that is no record at all.
    """
    end = size
    while end > 0:
        start = max(0, end - 65536)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    return end


def append_bytes(path: Path, data: bytes) -> None:
    """``data`` at the end of the file at ``path`` (made if missing), with no file object.

    A file object (``open``, ``os.fdopen``) is a FileIO, a buffer and, for text,
    a codec, built and torn down for one write: 70-100 us of the final record,
    which every ``wait`` waits for, where the write itself takes 10.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        if start and os.pread(fd, 1, start - 1) != b"\n":
            start = _cut_torn_line(fd, start)
        try:
            write_all(fd, data)
        except OSError:
            # Part of it written before the disk filled: no reader may take a torn line,
            # and the caller writes all of it again.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def write_json_atomic(
    path: Path,
    data: Any,
    *,
    durable: bool = False,
    only_over: bool = False,
    spare: Path | None = None,
    keep_old: bool = False,
    new: bool = False,
) -> Path:
    """Readers see the old file or the new one, never half of one.

    One ``json.dumps`` and one write: ``json.dump`` to a file runs the
    pure-Python encoder and writes each fragment (11 ms against 2 ms for the
    state of a 1,000-replica app), and with no file object (see ``append_bytes``).
    The new file takes the old one's place by
    ``swap_into_place`` (see ``swap``: a third of ``os.replace``'s cost on ext4);
    ``only_over``: only where a file is already (none is created). ``spare``: an
    empty file made beforehand by ``create_beside`` for this content (``open_beside``).
    Returns the temporary name, which ``keep_old`` leaves to the old file (see
    ``swap_into_place``) for the caller to unlink; without it, nothing is there.
    ``new``: nothing is at ``path`` yet (``swap_into_place``).
    """
    encoded = json.dumps(data).encode()
    fd, tmp = open_beside(path, spare)
    try:
        try:
            write_all(fd, encoded)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        swap_into_place(tmp, path, only_over=only_over, keep_old=keep_old, new=new)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        # The rename itself lives in the directory: without this a crash may undo it.
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return tmp


def _read_regular(path: str | Path, limit: int) -> bytes | None:
    """The bytes of the regular file at ``path``; None when there is no file there.

    Never blocks on what only carries a record's name: the open does not wait
    for a FIFO's writer (``O_NONBLOCK``), and nothing but a regular file is
    read. Anything else there, or a file that cannot be read, is a
    ``DamagedRecordError``; a shortage of descriptors or memory is a transient
    ``BackendError``, since the same read may work in a moment.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if e.errno in _ABSENT:
            return None
        raise _unreadable(path, e) from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DamagedRecordError(str(path), f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > limit:
            raise DamagedRecordError(str(path), f"{info.st_size} bytes, more than {limit}")
        # One read for a file as fstat saw it: asking one byte more shows whether it
        # grew since (then read on). Records are replaced whole, so that is rare, and
        # a second read of every record was a tenth of what ``list`` costs.
        chunk = os.read(fd, info.st_size + 1)
        if len(chunk) <= info.st_size:
            return chunk
        chunks = []
        size = 0
        while chunk:  # every chunk counted against the limit, the first one too
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise DamagedRecordError(str(path), f"more than {limit} bytes")
            chunk = os.read(fd, 1 << 20)
        return b"".join(chunks)
    except OSError as e:
        raise _unreadable(path, e) from e
    finally:
        os.close(fd)


def _unreadable(path: str | Path, e: OSError) -> BackendError:
    if e.errno in _TRANSIENT:
        return BackendError(f"cannot read {path} now: {e.strerror}", transient=True)
    return DamagedRecordError(str(path), f"cannot be read ({e.strerror or e})")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return f"mode {mode:o}"


def read_record(path: str | Path, *, limit: int = RECORD_LIMIT) -> Any:
    """The JSON in the record at ``path``; None when there is no record there (yet).

    An empty file, a file cut short, or one that is not JSON is damaged
    (``DamagedRecordError``), never "not written yet": records are replaced
    atomically, so a missing file is the only way to say nothing was written.
    """
    raw = _read_regular(path, limit)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        why = "empty" if not raw.strip() else f"not JSON ({e})"
        raise DamagedRecordError(str(path), why) from e


def read_json_or_none(path: Path) -> Any:
    """The file's JSON, or None when there is none or it cannot be read as JSON.

    For files whose damage is no app's business (an idempotency key's record,
    an exit file): the caller treats both alike.
    """
    try:
        return read_record(path)
    except DamagedRecordError:
        return None


def _typed(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """``value`` must be a ``kind``; a bool is no int here (JSON true is not a count)."""
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TypeError(f"{what} is {value!r}, not {_names(kind)}")
    if not isinstance(value, kind):
        raise TypeError(f"{what} is {value!r}, not {_names(kind)}")


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def _check_format(record: Mapping[str, Any]) -> None:
    """A record of a format this version reads (see ``RECORD_FORMAT``)."""
    found = record.get("format", 1)
    _typed(found, int, "format")
    if found > RECORD_FORMAT:
        raise ValueError(
            f"it was written by a newer asupervisor (record format {found}; this version "
            f"reads formats up to {RECORD_FORMAT}): read it with that version or a later one"
        )
    if found < 1:
        raise ValueError(f"format is {found}, not a record format")


_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))


def _check_replica(r: ReplicaStatus, where: str) -> None:
    _typed(r.id, int, f"{where}.id")
    _typed(r.state, ReplicaState, f"{where}.state")
    for name in ("role", "hostname", "structured_error_msg", "msg"):
        _typed(getattr(r, name), str, f"{where}.{name}")
    _typed(r.exit_code, _OPT_INT, f"{where}.exit_code")
    _typed(r.signal, _OPT_STR, f"{where}.signal")
    _typed(r.restarts, int, f"{where}.restarts")


def _check_status(status: AppStatus) -> None:
    _typed(status.state, AppState, "state")
    _typed(status.num_restarts, int, "num_restarts")
    _typed(status.msg, str, "msg")
    _typed(status.structured_error_msg, str, "structured_error_msg")
    _typed(status.ui_url, _OPT_STR, "ui_url")
    for i, role in enumerate(status.roles):
        _typed(role.role, str, f"roles[{i}].role")
        _typed(role.restarts, int, f"roles[{i}].restarts")
        for j, replica in enumerate(role.replicas):
            _check_replica(replica, f"roles[{i}].replicas[{j}]")


def _parse_status(data: Any) -> AppStatus:
    """An ``AppStatus`` from its JSON, every field of the type it must have."""
    _typed(data, dict, "status")
    _typed(data.get("roles", []), list, "roles")
    for i, role in enumerate(data.get("roles", [])):
        _typed(role, dict, f"roles[{i}]")
        _typed(role.get("replicas"), list, f"roles[{i}].replicas")
        for j, replica in enumerate(role["replicas"]):
            _typed(replica, dict, f"roles[{i}].replicas[{j}]")
    _typed(data.get("metadata") or {}, dict, "metadata")
    try:
        status = AppStatus.from_json(data)
    except KeyError as e:
        # An enum lookup by name, or a field that must be there.
        raise ValueError(f"no {e} (an unknown state, or a missing field)") from e
    _check_status(status)
    return status


def _parse_app(data: Any) -> AppDef:
    """The AppDef of an ``app.json``, with the types every reader relies on checked."""
    _typed(data, dict, "app")
    _typed(data.get("name"), str, "app.name")
    _typed(data.get("roles", []), list, "app.roles")
    for i, role in enumerate(data.get("roles", [])):
        _typed(role, dict, f"app.roles[{i}]")
        _typed(role.get("name"), str, f"app.roles[{i}].name")
        _typed(role.get("num_replicas", 1), int, f"app.roles[{i}].num_replicas")
        if role.get("num_replicas", 1) < 0:
            raise ValueError(f"app.roles[{i}].num_replicas is {role['num_replicas']}")
    return AppDef.from_json(data)


def _parse_owner(data: Any) -> Owner:
    _typed(data, dict, "owner")
    _typed(data.get("pid"), int, "owner.pid")
    _typed(data.get("start"), _OPT_STR, "owner.start")
    _typed(data.get("host", ""), str, "owner.host")
    return Owner.from_json(data)


def _parse(path: str | Path, parse: Any, data: Any) -> Any:
    """``parse(data)``; what it finds wrong is the record's damage, named by its path."""
    try:
        return parse(data)
    except (LookupError, TypeError, ValueError, AttributeError) as e:
        raise DamagedRecordError(str(path), str(e) or type(e).__name__) from e


def unknown_status(msg: str, roles: Sequence[Role] = ()) -> AppStatus:
    """UNKNOWN for the app and, from ``roles``, each of its replicas; ``msg`` says why.

    Each replica's entry lets its logs, which are not in doubt, still be read.
    """
    return AppStatus(
        state=AppState.UNKNOWN,
        msg=msg,
        roles=tuple(
            RoleStatus(
                role.name,
                tuple(
                    ReplicaStatus(id=k, state=ReplicaState.UNKNOWN, role=role.name)
                    for k in range(role.num_replicas)
                ),
            )
            for role in roles
        ),
    )


def damaged_status(error: DamagedRecordError, roles: Sequence[Role] = ()) -> AppStatus:
    """What an app whose record is damaged reports: UNKNOWN, saying which record and why.

    ``roles`` come from an intact ``app.json`` (none when that is the damaged one).
    """
    return unknown_status(str(error), roles)


def _start_time(pid: int, *, running: bool = False) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity.

    ``running``: None for a process that already exited (a zombie its parent
    has not reaped yet): it supervises nothing any more.
    """
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = line.rpartition(")")[2].split()
    if running and fields[0] in ("Z", "X"):
        return None
    return fields[19]


@dataclass(frozen=True)
class Owner:
    """The supervising process of an app; pid plus start time survives pid reuse."""

    pid: int
    start: str | None
    host: str

    @classmethod
    def current(cls) -> Owner:
        return cls(os.getpid(), _start_time(os.getpid()), socket.gethostname())

    def alive(self) -> bool:
        if self.host != socket.gethostname():
            return True  # cannot tell from here; assume the best
        return self.start is not None and _start_time(self.pid, running=True) == self.start

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "host": self.host}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Owner:
        return cls(int(d["pid"]), d.get("start"), str(d.get("host", "")))


_RECORD_FIELDS = frozenset({"format", "handle", "app", "owner", "request"})


@dataclass(frozen=True)
class AppRecord:
    """An app's ``app.json``: one typed, versioned record, the same for every backend.

    ``request`` is the backend's request as it recorded it (``Request.to_json``),
    ``extra`` what else the backend keeps (Slurm: its job id and identity). Its
    state and transitions are the other two records (``read_state``,
    ``read_transitions``), written by the app's owner as it goes.
    """

    handle: str
    app: AppDef
    owner: Owner
    request: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "format": RECORD_FORMAT,
            "handle": self.handle,
            "app": self.app.to_json(),
            "request": dict(self.request),
            "owner": self.owner.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> AppRecord:
        """Checked: ``ValueError`` (or ``LookupError``, ``TypeError``) for what is not one."""
        _typed(data, dict, "the record")
        _check_format(data)
        _typed(data.get("handle", ""), str, "handle")
        _typed(data.get("request", {}), dict, "request")
        return cls(
            handle=data.get("handle", ""),
            app=_parse_app(data.get("app")),
            owner=_parse_owner(data.get("owner")),
            request=dict(data.get("request") or {}),
            extra={k: v for k, v in data.items() if k not in _RECORD_FIELDS},
        )


class AppStore:
    def __init__(self, app_dir: Path) -> None:
        self.app_dir = app_dir
        # The file the next state.json goes into, made after the write before it.
        self._spare_state: Path | None = None
        # The old state.json, under the name the final write gave it (``discard_spare``).
        self._replaced: Path | None = None
        # The seq after the last transition this object appended to the journal: a write
        # whose state.json failed (a full disk) is tried again with the same transitions.
        self._journaled = 0
        self._state_written = False  # by this object (``write_state``)

    @property
    def cancel_path(self) -> Path:
        return self.app_dir / CANCEL_REQUEST

    def create(self, replica_dirs: Sequence[Path], app_record: AppRecord) -> None:
        """Claim the app directory, then make the replica directories and write app.json.

        The app directory itself is made with one ``mkdir`` (never ``exist_ok``):
        of two processes scheduling the same app id, exactly one gets it and the
        other gets ``DuplicateAppError`` before anything runs or is written.
        """
        self.app_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.app_dir)
        except FileExistsError:
            raise self.taken() from None
        try:
            self.make_replica_dirs(replica_dirs)
            self.write_app(app_record, new=True)
        except OSError:
            self.release()  # claimed, and nothing will run in it (a full disk): given back
            raise

    def taken(self) -> DuplicateAppError:
        """The error of a claim that found the app directory there already."""
        return DuplicateAppError(
            f"app id {self.app_dir.name!r} is already taken ({self.app_dir} exists): "
            "it was submitted before, here or by another process; submit it again "
            "under a new app id, or pass idempotency_key= to submit to get its handle"
        )

    def claim_plan(self, replica_dirs: Sequence[Path], reserve: int) -> dict[str, Any]:
        """``create``'s first steps, as data, for another process to carry out: the claim
        of the app directory (one ``mkdir``, never ``exist_ok``, as ``create``), the
        replica directories, the final record's reserve (``reserve`` bytes, as
        ``reserve``; a file system that cannot set space aside leaves none, one that is
        full (``full``) fails). The local backend's reaper does them with a lone
        replica's spawn (see ``LocalRuntime.start``); ``app.json`` and the index entry
        follow, and ``taken`` is the error of a claim refused."""
        return {
            "claim": str(self.app_dir),
            "dirs": [str(d) for d in replica_dirs],
            "reserve": [str(self.app_dir / RESERVE), reserve],
            "full": sorted(DISK_FULL),
        }

    @staticmethod
    def make_replica_dirs(replica_dirs: Sequence[Path]) -> None:
        """Make replica directories (and their roles') inside the claimed app directory.

        A backend may make some with ``create`` and the rest later, while the first
        replicas start (see the local backend's ``LocalRuntime.start``).
        """
        made: set[Path] = set()
        for d in replica_dirs:
            if d.parent not in made:  # one role directory serves all its replicas
                os.makedirs(d.parent, exist_ok=True)
                made.add(d.parent)
            os.mkdir(d)

    def reserve(self, size: int) -> bool:
        """Set ``size`` bytes of the app's file system aside for its final record.

        The replicas' output shares that file system: once it is full, the
        record that says how the app ended could not be written, and other
        processes would see it running for ever. False when the file system
        cannot set space aside (the app then runs without a reserve); OSError
        (ENOSPC, EDQUOT) when it is full already: an app launched then could
        not record even its start, and other processes would call it UNKNOWN.
        """
        path = self.app_dir / RESERVE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError as e:
            path.unlink(missing_ok=True)
            if e.errno in DISK_FULL:
                raise
            return False
        return True

    def release_reserve(self) -> bool:
        """Give the reserved space back; False when there was none to give."""
        try:
            (self.app_dir / RESERVE).unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def release(self) -> None:
        """Remove the app directory of a launch that started nothing, so its id is free again."""
        shutil.rmtree(self.app_dir, ignore_errors=True)

    def write_app(self, app_record: AppRecord, *, new: bool = False) -> None:
        """``new``: the first app.json of the directory this process claimed."""
        write_json_atomic(self.app_dir / "app.json", app_record.to_json(), new=new)

    def write_state(
        self,
        status: AppStatus,
        transitions: Sequence[Transition],
        final: bool,
        owner: Owner,
        *,
        ready_next: bool = False,
    ) -> None:
        """Append the new transitions to the journal (O(what changed)), replace state.json.

        ``ready_next``: for a writer that also writes the final record, makes the
        file the next one goes into after each write (``ready_spare``, called
        apart, off the path of whoever waits for this one) and then calls
        ``discard_spare`` (the final write leaves it the old file to remove, off the
        path of ``wait``). Apps that outlive their Supervisor get their final record
        from another process, which would leave that file behind. Such a writer's
        first state.json goes where none is yet (``new``, see ``swap_into_place``).
        """
        # Those journaled by a write that failed after its append are not appended again.
        new = [t for t in transitions if t.seq >= self._journaled]
        if new:
            lines = "".join(t.to_json_line() + "\n" for t in new)
            append_bytes(self.app_dir / "transitions.jsonl", lines.encode())
            self._journaled = new[-1].seq + 1
        record = {
            "format": RECORD_FORMAT,
            "status": status.to_json(),
            "final": final,
            "owner": owner.to_json(),
        }
        path = self.app_dir / "state.json"
        spare, self._spare_state = self._spare_state, None
        # The owner's first record (``ready_next``): its app directory has no state.json yet.
        first = ready_next and not self._state_written
        replaced = write_json_atomic(
            path, record, spare=spare, keep_old=ready_next and final, new=first
        )
        self._state_written = True
        if ready_next and final:
            self._replaced = replaced

    def ready_spare(self) -> None:
        """Blocking: make the file the next state.json goes into, while nobody waits.

        The next write may be the final one, which every ``wait`` waits for; the
        final one leaves none behind (the writer does not call this after it).
        Without one (no room for a file), the next write makes its own, or says
        why not.
        """
        if self._spare_state is None:
            with contextlib.suppress(OSError):
                fd, self._spare_state = create_beside(self.app_dir / "state.json")
                os.close(fd)

    def make_first_files(self) -> None:
        """Blocking: the journal and the file the first state.json goes into, made ahead.

        For a writer that knows a while when nobody waits before its first record
        (a lone replica's spawn): that record, on the way to ``submit``'s return,
        then creates no file (0.15-0.5 ms each on an ext4 with no journal after
        many deletes, against a tenth of that to open one). An empty journal reads
        as none. Without room for them, the first record makes its own, or says
        why not.
        """
        if self._state_written:
            return
        self.ready_spare()
        with contextlib.suppress(OSError):
            journal = self.app_dir / "transitions.jsonl"
            os.close(os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

    def discard_spare(self) -> None:
        """Remove the file ``write_state`` made for a next write that will not come, and
        the old state the final write left behind."""
        for leftover in (self._spare_state, self._replaced):
            if leftover is not None:
                leftover.unlink(missing_ok=True)
        self._spare_state = self._replaced = None

    def read_app(self) -> AppRecord | None:
        """``app.json``, None when there is none.

        Raises ``DamagedRecordError`` for a record that cannot be one, or one of a
        newer format. What each backend adds (a job id, a request) it checks itself.
        """
        path = self.app_dir / "app.json"
        data = read_record(path)
        if data is None:
            return None
        result: AppRecord = _parse(path, AppRecord.from_json, data)
        return result

    def read_state(self) -> tuple[AppStatus, Owner] | None:
        """The latest recorded status and its writer; None before the first record.

        Raises ``DamagedRecordError`` for a record that cannot be one: a status
        read from half a file would be an older or invented one.
        """
        found = self._read_state_record()
        return None if found is None else (found[0], found[1])

    def read_final_status(self) -> AppStatus | None:
        """The status recorded when the app ended, or None while it runs (or never recorded).

        Raises ``DamagedRecordError`` like ``read_state``.
        """
        found = self._read_state_record()
        return found[0] if found is not None and found[2] else None

    def _read_state_record(self) -> tuple[AppStatus, Owner, bool] | None:
        path = self.app_dir / "state.json"
        data = read_record(path)
        if data is None:
            return None

        def parse(d: Any) -> tuple[AppStatus, Owner, bool]:
            _typed(d, dict, "the record")
            _check_format(d)
            _typed(d.get("final", False), bool, "final")
            final = d.get("final") is True
            return _parse_status(d.get("status")), _parse_owner(d.get("owner")), final

        result: tuple[AppStatus, Owner, bool] = _parse(path, parse, data)
        return result

    def read_transitions(self) -> list[Transition]:
        """The journal: every transition appended, in order.

        Read as every record is (``_read_regular``: a FIFO under its name hung the
        reader for good). An append cut short (no newline: its writer died in it)
        is left out, the rest kept: it emptied the whole history, and a ``watch``
        then gave transitions again. Any other line that is no transition is
        damage (``DamagedRecordError``).
        """
        path = self.app_dir / "transitions.jsonl"
        raw = _read_regular(path, RECORD_LIMIT)
        if raw is None:
            return []
        whole, _, _torn = raw.rpartition(b"\n")
        try:
            return [Transition.from_json(json.loads(line)) for line in whole.splitlines() if line]
        except (ValueError, KeyError, TypeError) as e:
            raise DamagedRecordError(str(path), f"a line that is no transition ({e})") from e

    def read_transitions_or_none(self) -> list[Transition]:
        """The journal, or none of it when it is damaged: the times and history it gives
        are extras of a status whose own record says whether it is damaged."""
        try:
            return self.read_transitions()
        except (OSError, BackendError):  # damaged (or unreadable), as said above
            return []

    def followed(self, app: AppRecord) -> bool:
        """Blocking: the supervising process recorded in ``app`` (this store's app record)
        lives and still follows it.

        Its records are then the truth, and it records the end itself. An owner
        whose Supervisor closed while the app ran on released it (``RELEASED``).
        """
        if (self.app_dir / RELEASED).exists():
            return False
        return app.owner.alive()

    def take_over(self, owner: Owner) -> AppRecord | None:
        """Blocking: make ``owner`` the owner of an app nobody follows that has not ended.

        Returns its app record, rewritten to name ``owner``; None when the app has
        no record, ended, or is followed (its owner lives and did not release it).
        The owner's life is the lease: others see the app followed until it dies or
        releases it. Under the finalize lock, like recording an unfollowed app's end,
        so of two processes attaching (or one attaching while another records the
        end) one wins and the other then sees the app as the winner left it.
        """
        fd = lock_file(self.app_dir / FINALIZE_LOCK, True)
        assert fd is not None  # a waiting lock is always taken
        try:
            app = self.read_app()
            if app is None or self.followed(app) or self.read_final_status() is not None:
                return None
            app = dataclasses.replace(app, owner=owner)
            self.write_app(app)
            (self.app_dir / RELEASED).unlink(missing_ok=True)
            return app
        finally:
            os.close(fd)

    def mark_released(self) -> None:
        """Blocking: the owner stops following an app that runs on (its Supervisor closed);
        whoever reads the app next judges it from the scheduler and records its end."""
        try:
            state = self.read_state()
        except DamagedRecordError:
            state = None  # not known to have ended: whoever comes next judges it
        if state is None or not state[0].is_terminal:
            write_json_atomic(self.app_dir / RELEASED, {"by": Owner.current().to_json()})

    def record_observed_end(
        self, status: AppStatus, started: float | None, ended: float, owner: Owner
    ) -> AppStatus:
        """Blocking: the final record of an app nobody followed to its end, written once.

        The reader that saw the end (another process, its owner gone) writes it, so
        the end, its times and the replicas' exit codes outlive what the scheduler
        keeps. The journal gets the app's steps it lacks, as the state table takes
        them: RUNNING at ``started`` when the app ran and that was never recorded,
        then the end at ``ended``. Under ``FINALIZE_LOCK``: a record already final
        (another reader's, or the owner's) is returned instead, unchanged, and an
        app some process took over meanwhile is left to that owner to record.
        """
        fd = lock_file(self.app_dir / FINALIZE_LOCK, True)
        assert fd is not None  # a waiting lock is always taken
        try:
            try:
                final = self.read_final_status()
            except DamagedRecordError:
                final = None  # what was observed replaces it
            if final is not None:
                return final
            app = self.read_app()
            if app is not None and self.followed(app):
                return status  # taken over meanwhile (``take_over``): its owner records it
            self.write_state(status, self.observed_steps(status, started, ended), True, owner)
            return status
        finally:
            os.close(fd)

    def observed_steps(
        self, status: AppStatus, started: float | None, ended: float
    ) -> list[Transition]:
        """Blocking: the app-level transitions the journal lacks to reach ``status``."""
        return closing_steps(self.read_transitions_or_none(), status, started, ended)

    def read_times(self) -> AppTimes:
        """When the app was submitted, started and ended, from its journal."""
        return AppTimes.from_transitions(self.read_transitions_or_none())

    def request_cancel(self) -> None:
        write_json_atomic(self.cancel_path, {"requested_by": Owner.current().to_json()})

    def read_error_file(self, path: Path, limit: int = 65536) -> str:
        """A replica's structured error (``TORCHELASTIC_ERROR_FILE``), "" when it wrote none.

        The replica chose what to leave under that name: only a regular file is
        read, and a FIFO's open does not wait for a writer.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            return ""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            return os.read(fd, limit * 4).decode(errors="replace")[:limit]
        except OSError:
            return ""
        finally:
            os.close(fd)


@dataclass(frozen=True)
class IndexSummary:
    """What ``list`` shows of a settled app, kept in its index entry (see the docstring)."""

    state: AppState
    name: str
    msg: str
    times: AppTimes


@dataclass(frozen=True)
class IndexEntry:
    """One app of the index: where its records are, or why its entry is damaged.

    ``summary``: the app's final state and times, when its entry holds them and
    its records are as they were when it ended; None otherwise (read them).
    ``path``: the entry's own file.
    """

    session: str
    app_id: str
    directory: str | None
    damage: DamagedRecordError | None = None
    summary: IndexSummary | None = None
    path: str | None = None

    @property
    def app_dir(self) -> Path | None:
        """The app's directory; a Path made on demand (1,000 of them cost 30 ms)."""
        return None if self.directory is None else Path(self.directory)


_SUMMARIZED = ("app.json", "state.json")


def _identity(path: str | Path) -> list[int] | None:
    """What changes when the file is replaced or written: inode, size, mtime, ctime."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def record_identities(app_dir: Path) -> list[list[int] | None]:
    """The identities of the records an index entry's summary stands for, as they are now.

    Taken right after the final record is written, for a ``settle`` that may come
    later: a record changed in between then makes ``list`` read it, as it must.
    """
    return [_identity(app_dir / name) for name in _SUMMARIZED]


def _is_time(value: object) -> bool:
    """None (not yet) or epoch seconds; JSON true is no time."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _summary(data: dict[str, Any], app_dir: str) -> IndexSummary | None:
    """The entry's summary when it is well formed and the records it stands for are unchanged.

    Run for every entry of every ``list``: plain string paths and no generator
    (a third of its cost before, besides its two ``stat``s).
    """
    final = data.get("final")
    if not isinstance(final, dict):
        return None
    records = final.get("records")
    if not isinstance(records, list) or len(records) != len(_SUMMARIZED):
        return None
    for name, seen in zip(_SUMMARIZED, records, strict=True):
        if seen is None or _identity(f"{app_dir}/{name}") != seen:
            return None
    submitted, started, ended = final.get("submitted"), final.get("started"), final.get("ended")
    if not (_is_time(submitted) and _is_time(started) and _is_time(ended)):
        return None
    name = data.get("name", "")
    msg = final.get("msg", "")
    state_name = final.get("state")
    state = AppState.__members__.get(state_name) if isinstance(state_name, str) else None
    if state is None or not isinstance(name, str) or not isinstance(msg, str):
        return None
    return IndexSummary(state, name, msg, AppTimes(submitted, started, ended))


class Index:
    """Maps handles to app directories, wherever each app's log_dir put them."""

    def __init__(self, state_dir: Path, backend: str) -> None:
        self.root = state_dir / "index" / backend

    def add(self, session: str, app_id: str, app_dir: Path, name: str = "") -> None:
        path = self.entry_path(session, app_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"app_dir": str(app_dir), "app_id": app_id, "session": session, "name": name}
        # New: the entry of an app whose directory this process just claimed.
        write_json_atomic(path, {"format": RECORD_FORMAT, **entry}, new=True)

    def entry_path(self, session: str, app_id: str) -> Path:
        return self.root / session / f"{_escape(app_id)}.json"

    def settle(
        self,
        session: str,
        app_id: str,
        app_dir: Path,
        status: AppStatus,
        times: AppTimes | None = None,
        records: list[list[int] | None] | None = None,
    ) -> None:
        """Keep the app's final status and times in its entry, once its final record is written.

        ``records``: ``record_identities`` taken when the final record was written
        (else they are taken now).

        ``times``, when the caller kept them as it recorded the app, spares reading
        the whole journal back. Best
        effort: an entry that cannot be rewritten only makes ``list`` read the app's
        records, as it does for apps still running.
        """
        path = self.entry_path(session, app_id)
        try:
            data = read_record(path)
        except DamagedRecordError:
            return
        if not isinstance(data, dict) or data.get("app_dir") != str(app_dir):
            return
        if times is None:
            times = AppStore(app_dir).read_times()
        data["final"] = {
            "state": status.state.name,
            "msg": status.msg,
            "submitted": times.submitted,
            "started": times.started,
            "ended": times.ended,
            "records": record_identities(app_dir) if records is None else records,
        }
        with contextlib.suppress(OSError):
            # Over the entry read above only: one removed meanwhile (a ``gc`` of the
            # ended app, in another process) is not written back.
            write_json_atomic(path, data, only_over=True)

    def remove(self, session: str, app_id: str) -> bool:
        """Drop the app's entry (its records go separately, after it); False if none."""
        try:
            self.entry_path(session, app_id).unlink()
        except FileNotFoundError:
            return False
        return True

    def lookup(self, session: str, app_id: str) -> Path | None:
        """The app's directory; None for an app never indexed here.

        Raises ``DamagedRecordError`` when its entry is damaged.
        """
        found = self._read_entry(self.entry_path(session, app_id), session, app_id)
        return None if found is None else Path(found["app_dir"])

    def entries(self) -> Iterator[IndexEntry]:
        """Every app indexed here, in order; a damaged entry is one too, with its damage.

        Names that are not entries (no ``.json`` ending: a write in progress,
        or anything else left beside them) are passed over.
        """
        # os.scandir and plain strings: pathlib's parsing and ordering cost more than
        # the reads themselves (1,000 entries: 100 ms against 30 ms).
        root = str(self.root)
        try:
            with os.scandir(root) as found:
                sessions = sorted(e.name for e in found if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return
        for session in sessions:
            session_dir = f"{root}/{session}"
            try:
                with os.scandir(session_dir) as found:
                    names = sorted(
                        e.name for e in found if e.name.endswith(".json") and e.name[0] != "."
                    )
            except OSError:
                continue
            for name in names:
                entry = f"{session_dir}/{name}"
                app_id = _unescape(name.removesuffix(".json"))
                try:
                    data = self._read_entry(entry, session, app_id)
                except DamagedRecordError as e:
                    yield IndexEntry(session, app_id, None, e, path=entry)
                    continue
                if data is not None:  # removed since the listing
                    app_dir = data["app_dir"]
                    summary = _summary(data, app_dir)
                    yield IndexEntry(session, app_id, app_dir, summary=summary, path=entry)

    @staticmethod
    def _read_entry(path: str | Path, session: str, app_id: str) -> dict[str, Any] | None:
        """The entry's JSON, checked; None when there is none."""
        data = read_record(path)
        if data is None:
            return None

        def parse(d: Any) -> dict[str, Any]:
            _typed(d, dict, "the entry")
            _check_format(d)
            _typed(d.get("app_dir"), str, "app_dir")
            _typed(d.get("session"), str, "session")
            _typed(d.get("app_id"), str, "app_id")
            if (d["session"], d["app_id"]) != (session, app_id):
                raise ValueError(
                    f"it names app {d['session']}/{d['app_id']}, its place {session}/{app_id}"
                )
            if not d["app_dir"]:
                raise ValueError("app_dir is empty")
            entry: dict[str, Any] = d  # a dict of its own: json.loads made it
            return entry

        result: dict[str, Any] = _parse(path, parse, data)
        return result


def end_is_known(app_dir: Path) -> bool:
    """The app's final record is there, or its supervising process is gone for good.

    What ``gc`` requires before removing a settled app: nobody will write to
    it any more. A damaged record whose owner cannot be read tells nothing: False.
    """
    store = AppStore(app_dir)
    try:
        if store.read_final_status() is not None:
            return True
    except DamagedRecordError:
        pass
    try:
        app = store.read_app()
    except DamagedRecordError:
        return False
    return app is not None and not app.owner.alive()


def remove_app(index: Index, session: str, app_id: str, app_dir: Path | None) -> bool:
    """The app's index entry, then its directory: records and logs. False when its entry
    was gone already (another ``gc`` removed it first, and goes on to its directory).

    The directory goes only when it is one of an app (named by its app id):
    an entry that names another place loses only itself.
    """
    if not index.remove(session, app_id):
        return False
    if (
        app_dir is not None
        and app_dir.as_posix().endswith("/" + app_id)
        and app_dir.is_dir()
        and not app_dir.is_symlink()
    ):
        shutil.rmtree(app_dir, ignore_errors=True)
    return True


class CancelRequests:
    """Where another process asks the owner of an app to cancel it: one directory per backend.

    One file per request, named after the app, so that an owner watches one
    directory for all its apps. A watch of each app's own directory cost two
    inotify calls per app on the owner's event loop (removing a watch waits for
    an RCU grace period) and woke the owner for every record it wrote there.
    The request is also kept in the app's directory (``CANCEL_REQUEST``), as
    every backend records it.
    """

    def __init__(self, state_dir: Path, backend: str) -> None:
        self.directory = state_dir / "cancel-requests" / backend

    @staticmethod
    def name(session: str, app_id: str) -> str:
        """The request's file name: unique per app, and a plain file name."""
        return _escape(f"{session}/{app_id}")

    def prepare(self) -> None:
        """Blocking: make the directory, for the owner to watch before any app of it exists."""
        self.directory.mkdir(parents=True, exist_ok=True)

    def request(self, session: str, app_id: str) -> None:
        """Blocking: ask the owner (it sees the file appear)."""
        self.prepare()
        body = {"requested_by": Owner.current().to_json()}
        write_json_atomic(self.directory / self.name(session, app_id), body)

    def withdraw(self, session: str, app_id: str) -> None:
        """Blocking: the app ended; its request has nobody left to ask."""
        (self.directory / self.name(session, app_id)).unlink(missing_ok=True)


def _escape(app_id: str) -> str:
    """App ids may contain '/'; index file names may not."""
    return app_id.replace("%", "%25").replace("/", "%2F")


def _unescape(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")
