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
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import DuplicateAppError
from supervisor.status import AppStatus, Transition

__all__ = ["AppStore", "Index", "Owner", "write_json_atomic"]

CANCEL_REQUEST = "cancel.request"


def write_json_atomic(path: Path, data: Any, *, durable: bool = False) -> None:
    """Readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> Any:
    """The file's JSON, or None when there is none to read (a name too long cannot exist)."""
    try:
        with path.open() as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return None
        raise


def _start_time(pid: int, *, running: bool = False) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity.

    ``running``: None for a process that already exited (a zombie its parent
    has not reaped yet): it supervises nothing any more.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
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

    def release(self) -> None:
        """Remove the app directory of a launch that started nothing, so its id is free again."""
        shutil.rmtree(self.app_dir, ignore_errors=True)

    def write_app(self, app_record: Mapping[str, Any]) -> None:
        write_json_atomic(self.app_dir / "app.json", app_record)

    def write_state(
        self, status: AppStatus, transitions: Sequence[Transition], final: bool, owner: Owner
    ) -> None:
        if transitions:
            with (self.app_dir / "transitions.jsonl").open("a") as f:
                f.writelines(json.dumps(t.to_json()) + "\n" for t in transitions)
        record = {"status": status.to_json(), "final": final, "owner": owner.to_json()}
        write_json_atomic(self.app_dir / "state.json", record)

    def read_app(self) -> dict[str, Any] | None:
        data = _read_json(self.app_dir / "app.json")
        return data if isinstance(data, dict) else None

    def read_state(self) -> tuple[AppStatus, Owner] | None:
        data = _read_json(self.app_dir / "state.json")
        if not isinstance(data, dict):
            return None
        return AppStatus.from_json(data["status"]), Owner.from_json(data["owner"])

    def read_final_status(self) -> AppStatus | None:
        """The status recorded when the app ended, or None while it runs (or never recorded)."""
        data = _read_json(self.app_dir / "state.json")
        if not isinstance(data, dict) or data.get("final") is not True:
            return None
        return AppStatus.from_json(data["status"])

    def read_transitions(self) -> list[Transition]:
        try:
            text = (self.app_dir / "transitions.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [Transition.from_json(json.loads(line)) for line in text.splitlines() if line]

    def request_cancel(self) -> None:
        write_json_atomic(self.cancel_path, {"requested_by": Owner.current().to_json()})

    def read_error_file(self, path: Path, limit: int = 65536) -> str:
        """A replica's structured error (``TORCHELASTIC_ERROR_FILE``), "" when it wrote none."""
        try:
            with path.open(errors="replace") as f:
                return f.read(limit)
        except OSError:
            return ""


class Index:
    """Maps handles to app directories, wherever each app's log_dir put them."""

    def __init__(self, state_dir: Path, backend: str) -> None:
        self.root = state_dir / "index" / backend

    def add(self, session: str, app_id: str, app_dir: Path) -> None:
        path = self.root / session / f"{_escape(app_id)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"app_dir": str(app_dir), "app_id": app_id, "session": session})

    def lookup(self, session: str, app_id: str) -> Path | None:
        data = _read_json(self.root / session / f"{_escape(app_id)}.json")
        return Path(data["app_dir"]) if isinstance(data, dict) else None

    def entries(self) -> Iterator[tuple[str, str, Path]]:
        if not self.root.is_dir():
            return
        for session_dir in sorted(self.root.iterdir()):
            for entry in sorted(session_dir.glob("*.json")):
                data = _read_json(entry)
                if isinstance(data, dict):
                    yield data["session"], data["app_id"], Path(data["app_dir"])


def _escape(app_id: str) -> str:
    """App ids may contain '/'; index file names may not."""
    return app_id.replace("%", "%25").replace("/", "%2F")
