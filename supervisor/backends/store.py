"""On-disk records of apps, so other processes can find and follow them.

Layout, for an app with handle ``{backend}://{session}/{app_id}``::

    {state_dir}/index/{backend}/{session}/{app_id}.json   -> {"app_dir": ...}
    {app_dir}/app.json           the AppDef, the request, the owner process
    {app_dir}/state.json         latest AppStatus, replaced atomically
    {app_dir}/transitions.jsonl  every transition, appended
    {app_dir}/cancel.request     created by another process to ask for a cancel
    {app_dir}/{role}/{k}/        the replica's logs

Every function here blocks (file I/O) and is meant to run in a worker thread.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import BackendError, DamagedRecordError, DuplicateAppError
from supervisor.specs import AppDef, Role
from supervisor.states import AppState, ReplicaState
from supervisor.status import AppStatus, AppTimes, ReplicaStatus, RoleStatus, Transition

__all__ = [
    "AppStore",
    "Index",
    "IndexEntry",
    "Owner",
    "damaged_status",
    "read_json_or_none",
    "read_record",
    "unknown_status",
    "write_json_atomic",
]

CANCEL_REQUEST = "cancel.request"
RESERVE = ".final-record.reserve"

RECORD_LIMIT = 64 * 1024 * 1024
"""Bytes a record may have: far above any real one (500 replicas' state is ~100 kB),
far below what would exhaust memory when something else took a record's name."""

# Not the record's fault: the same read may succeed later.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN})
# There is no record under that name (a name too long cannot exist either).
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG})


def write_json_atomic(path: Path, data: Any, *, durable: bool = False) -> None:
    """Readers see the old file or the new one, never half of one.

    One ``json.dumps`` and one write: ``json.dump`` to a file runs the
    pure-Python encoder and writes each fragment (11 ms against 2 ms for the
    state of a 1,000-replica app).
    """
    encoded = json.dumps(data).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encoded)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        # The rename itself lives in the directory: without this a crash may undo it.
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read_regular(path: Path, limit: int) -> bytes | None:
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
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise DamagedRecordError(str(path), f"more than {limit} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise _unreadable(path, e) from e
    finally:
        os.close(fd)


def _unreadable(path: Path, e: OSError) -> BackendError:
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


def read_record(path: Path, *, limit: int = RECORD_LIMIT) -> Any:
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


def _parse(path: Path, parse: Any, data: Any) -> Any:
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


class AppStore:
    def __init__(self, app_dir: Path) -> None:
        self.app_dir = app_dir

    @property
    def cancel_path(self) -> Path:
        return self.app_dir / CANCEL_REQUEST

    def create(self, replica_dirs: Sequence[Path], app_record: Mapping[str, Any]) -> None:
        """Claim the app directory, then make the replica directories and write app.json.

        The app directory itself is made with one ``mkdir`` (never ``exist_ok``):
        of two processes scheduling the same app id, exactly one gets it and the
        other gets ``DuplicateAppError`` before anything runs or is written.
        """
        self.app_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.app_dir)
        except FileExistsError:
            raise DuplicateAppError(
                f"app id {self.app_dir.name!r} is already taken ({self.app_dir} exists): "
                "it was submitted before, here or by another process; submit it again "
                "under a new app id, or pass idempotency_key= to submit to get its handle"
            ) from None
        made: set[Path] = set()
        for d in replica_dirs:
            if d.parent not in made:  # one role directory serves all its replicas
                os.makedirs(d.parent, exist_ok=True)
                made.add(d.parent)
            os.mkdir(d)
        self.write_app(app_record)

    def reserve(self, size: int) -> bool:
        """Set ``size`` bytes of the app's file system aside for its final record.

        The replicas' output shares that file system: once it is full, the
        record that says how the app ended could not be written, and other
        processes would see it running for ever. Best effort: False when the
        space could not be set aside (the app then runs without a reserve).
        """
        path = self.app_dir / RESERVE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError:
            path.unlink(missing_ok=True)
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

    def write_app(self, app_record: Mapping[str, Any]) -> None:
        write_json_atomic(self.app_dir / "app.json", app_record)

    def write_state(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool, owner: Owner
    ) -> None:
        """Append the new transitions to the journal (O(what changed)), replace state.json."""
        if transitions:
            lines = "".join(json.dumps(t.to_json()) + "\n" for t in transitions)
            with (self.app_dir / "transitions.jsonl").open("a") as f:
                f.write(lines)
        record = {"status": status.to_json(), "final": final, "owner": owner.to_json()}
        write_json_atomic(self.app_dir / "state.json", record)

    def read_app(self) -> dict[str, Any] | None:
        """``app.json``, None when there is none; its ``app`` and ``owner`` are checked.

        Raises ``DamagedRecordError`` for a record that cannot be one. What each
        backend adds (a job id, a request) it checks itself.
        """
        path = self.app_dir / "app.json"
        data = read_record(path)
        if data is None:
            return None

        def check(d: Any) -> dict[str, Any]:
            _typed(d, dict, "the record")
            _parse_app(d.get("app"))
            _parse_owner(d.get("owner"))
            return dict(d)

        result: dict[str, Any] = _parse(path, check, data)
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
            _typed(d.get("final", False), bool, "final")
            final = d.get("final") is True
            return _parse_status(d.get("status")), _parse_owner(d.get("owner")), final

        result: tuple[AppStatus, Owner, bool] = _parse(path, parse, data)
        return result

    def read_transitions(self) -> list[Transition]:
        try:
            text = (self.app_dir / "transitions.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [Transition.from_json(json.loads(line)) for line in text.splitlines() if line]

    def read_transitions_or_none(self) -> list[Transition]:
        """The journal, or none of it when it is damaged: the times and history it gives
        are extras of a status whose own record says whether it is damaged."""
        try:
            return self.read_transitions()
        except (OSError, ValueError, KeyError, TypeError):
            return []

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
class IndexEntry:
    """One app of the index: where its records are, or why its entry is damaged."""

    session: str
    app_id: str
    app_dir: Path | None
    damage: DamagedRecordError | None = None


class Index:
    """Maps handles to app directories, wherever each app's log_dir put them."""

    def __init__(self, state_dir: Path, backend: str) -> None:
        self.root = state_dir / "index" / backend

    def add(self, session: str, app_id: str, app_dir: Path) -> None:
        path = self.root / session / f"{_escape(app_id)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"app_dir": str(app_dir), "app_id": app_id, "session": session})

    def lookup(self, session: str, app_id: str) -> Path | None:
        """The app's directory; None for an app never indexed here.

        Raises ``DamagedRecordError`` when its entry is damaged.
        """
        return self._read(self.root / session / f"{_escape(app_id)}.json", session, app_id)

    def entries(self) -> Iterator[IndexEntry]:
        """Every app indexed here, in order; a damaged entry is one too, with its damage.

        Names that are not entries (no ``.json`` ending: a write in progress,
        or anything else left beside them) are passed over.
        """
        if not self.root.is_dir():
            return
        for session_dir in sorted(self.root.iterdir()):
            if not session_dir.is_dir():
                continue
            session = session_dir.name
            for entry in sorted(session_dir.glob("*.json")):
                app_id = _unescape(entry.name.removesuffix(".json"))
                try:
                    app_dir = self._read(entry, session, app_id)
                except DamagedRecordError as e:
                    yield IndexEntry(session, app_id, None, e)
                    continue
                if app_dir is not None:  # removed since the listing
                    yield IndexEntry(session, app_id, app_dir)

    @staticmethod
    def _read(path: Path, session: str, app_id: str) -> Path | None:
        data = read_record(path)
        if data is None:
            return None

        def parse(d: Any) -> Path:
            _typed(d, dict, "the entry")
            _typed(d.get("app_dir"), str, "app_dir")
            _typed(d.get("session"), str, "session")
            _typed(d.get("app_id"), str, "app_id")
            if (d["session"], d["app_id"]) != (session, app_id):
                raise ValueError(
                    f"it names app {d['session']}/{d['app_id']}, its place {session}/{app_id}"
                )
            if not d["app_dir"]:
                raise ValueError("app_dir is empty")
            return Path(d["app_dir"])

        result: Path = _parse(path, parse, data)
        return result


def _escape(app_id: str) -> str:
    """App ids may contain '/'; index file names may not."""
    return app_id.replace("%", "%25").replace("/", "%2F")


def _unescape(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")
