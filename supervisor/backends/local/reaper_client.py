"""The supervisor's side of the reaper in ``reaper.py``: spawns, exits, kills over one socket.

Started lazily with the first replica, so a Supervisor that never launches
locally costs nothing. One task reads the reaper's messages: spawn replies
resolve the caller's wait, exit reports fill the replica's ``ExitReport``.
Sending never blocks the event loop. The socket is a SOCK_SEQPACKET pair, and
the kernel lets only a few datagrams queue on it (``net.unix.max_dgram_qlen``,
10 by default): a blocking ``sendmsg`` of 1,000 spawns would stall the host's
loop for as long as the reaper takes to fork them. So every message goes out
with ``MSG_DONTWAIT``; once the socket is full, later messages wait in an
ordered outbox that one writer task drains whenever the loop reports the socket
writable. A spawner awaits its reply anyway, so the outbox never holds more
than one spawn per spawner (the backpressure), and order is kept: a message is
never sent ahead of one posted before it. The output pipes travel with their
spawn as SCM_RIGHTS and stay open, owned by the spawner, until it is answered.

If the reaper itself dies (killed from outside), the replicas it had are
killed from here (a pidfd per replica tells which still run) and reported
with an unknown exit status; the next spawn starts a new reaper.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from supervisor.backends.local.flag import Flag
from supervisor.backends.local.reaper import MORE, PART
from supervisor.errors import BackendError

__all__ = ["ExitReport", "NotPrepared", "Reaper"]

_SCRIPT = Path(__file__).with_name("reaper.py")
_MAX_MESSAGE = 1 << 16
_READ_BATCH = 32
"""Messages read per wake-up before other tasks run: each reply to a spawn wakes its
spawner, and every task woken in one turn of the loop runs before the host gets its
next turn (256 at once held the host's loop for tens of milliseconds)."""


@dataclass
class ExitReport:
    """How one replica ended: ``status`` is the raw wait status, None when it is unknown.

    One per running replica, for its whole life: ``done`` is a ``Flag`` (one object
    the garbage collector walks, not an event's three until someone waits).
    """

    done: Flag = field(default_factory=Flag)
    status: int | None = None
    reason: str = ""
    pid: int = 0
    pidfd: int | None = None  # kept until the exit, to stop the replica should the reaper die
    on_settle: Callable[[], None] | None = None
    """Called once the exit is known: for whoever follows the replica (``ReplicaProcess``)."""
    started_at: float = field(kw_only=True)
    """Wall-clock time the reaper saw the replica start; ``ended_at``: saw it end (or, for
    an unknown status, when that became known). The replica's own times: this process hears
    of them later, the later the busier its loop (an app's times come from these)."""
    ended_at: float | None = None

    def settle(self, status: int | None, reason: str = "", at: float | None = None) -> None:
        self.status, self.reason = status, reason
        self.ended_at = time.time() if at is None else at
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        self.done.set()
        if self.on_settle is not None:
            self.on_settle()

    @property
    def returncode(self) -> int | None:
        """As ``Popen.returncode``: the exit code, or minus the signal; None if unknown."""
        return None if self.status is None else os.waitstatus_to_exitcode(self.status)


class NotPrepared(Exception):
    """The claim a spawn carried failed (see ``Reaper.spawn``): nothing was started.

    ``claimed``: the app directory was made (and is the caller's to release);
    ``error``: why the claim, or what followed it, failed.
    """

    def __init__(self, *, claimed: bool, error: OSError) -> None:
        super().__init__(str(error))
        self.claimed = claimed
        self.error = error


@dataclass
class _Outgoing:
    """One message, or one part of a long one, waiting for room on the socket, with its
    fds and the spawn it belongs to (both on the message's last part)."""

    data: bytes
    ancillary: list[tuple[int, int, array.array[int]]]
    ident: int | None
    last: bool = True


def _parts(data: bytes) -> list[bytes]:
    """``data`` as the records the socket carries: one, or parts for a long message.

    A record of a ``SOCK_SEQPACKET`` socket cannot exceed its send buffer (208
    KiB by default, less than one replica's legal arguments and environment,
    which ``execve`` takes up to 2 MiB, JSON escapes aside). Every part but
    the last starts with ``MORE`` (a JSON text never holds that byte), and the
    reaper joins them.
    """
    if len(data) <= PART:
        return [data]
    cut = range(0, len(data), PART)
    return [(b"" if at + PART >= len(data) else MORE) + data[at : at + PART] for at in cut]


def _cspawn_path() -> str:
    """The reaper's spawn into a cgroup in C (``_cspawn.c``) as built, "" where it was not:
    it is loaded by path, since the reaper imports nothing of the package."""
    spec = importlib.util.find_spec(f"{__package__}._cspawn")
    return spec.origin if spec is not None and spec.origin is not None else ""


def _start_reaper() -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """Blocking (a fork and an exec, a few milliseconds): called in a worker thread.

    The reaper's end of the socket is its stdin; ours is returned with it.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # -I -S: no site-packages, no user paths: a start in milliseconds.
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_SCRIPT), str(os.getpid()), _cspawn_path()],
            stdin=theirs.fileno(),
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return ours, popen


def _kill_cgroup(cgroup: str) -> None:
    """Blocking: every process left in a dead reaper's cgroup killed (gone already: nothing)."""
    with contextlib.suppress(OSError), open(f"{cgroup}/cgroup.kill", "w") as f:
        f.write("1")


class _Connection:
    """One running reaper process and its socket."""

    def __init__(
        self, task_group: TaskGroup, sock: socket.socket, popen: subprocess.Popen[bytes]
    ) -> None:
        self.popen = popen
        self.sock = sock
        self.waiting: dict[int, anyio.Event] = {}
        # Told when the reaper made a spawn's claim, before its reply (``Reaper.spawn``).
        self.claims: dict[int, Callable[[], None]] = {}
        self.replies: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, ExitReport] = {}
        self.containment = "starting"
        self.cgroup: str | None = None  # the reaper's cgroup directory, if it made one
        self.dead = False
        self.outbox: deque[_Outgoing] = deque()
        self.writable_wanted = anyio.Event()
        self.queued = 0  # messages that had to wait for room (for tests and statistics)
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self._woken: asyncio.Future[None] | None = None  # what ``_read`` waits for
        task_group.start_soon(self._run)

    def send(
        self, msg: Mapping[str, object], fds: Sequence[int] = (), *, ident: int | None = None
    ) -> None:
        """Send ``msg`` now if the socket takes it, else queue it behind what waits already.

        Never blocks. A message that cannot be sent (the reaper gone, a message
        too large) answers the spawn ``ident`` with an ``unsent`` reply.
        """
        if self.dead:
            raise BackendError("the local reaper process has ended", transient=True)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        *more, last = _parts(json.dumps(msg).encode())
        self.outbox.extend(_Outgoing(part, [], ident, last=False) for part in more)
        self.outbox.append(_Outgoing(last, ancillary, ident))
        self._flush()
        if self.outbox:
            self.queued += 1
            self.writable_wanted.set()

    def _flush(self) -> None:
        """Send queued messages in order until the socket is full (never waits)."""
        while self.outbox:
            out = self.outbox[0]
            try:
                self.sock.sendmsg([out.data], out.ancillary, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as e:
                self.outbox.popleft()
                while not out.last:  # the rest of its parts would be taken for a message
                    out = self.outbox.popleft()
                self._unsent(out, e)
                continue
            self.outbox.popleft()

    def _unsent(self, out: _Outgoing, error: OSError) -> None:
        if out.ident is None:
            return  # a kill or release: the reaper is gone or going, see _end
        self.replies[out.ident] = {"op": "unsent", "error": str(error)}
        event = self.waiting.pop(out.ident, None)
        if event is not None:
            event.set()

    async def _write(self) -> None:
        """Drain the outbox whenever the loop says the socket is writable again."""
        while True:
            await self.writable_wanted.wait()
            self.writable_wanted = anyio.Event()
            while self.outbox:
                await anyio.wait_writable(self.sock.fileno())
                self._flush()

    async def _run(self) -> None:
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._write)
                    await self._read()
                    tg.cancel_scope.cancel()
        finally:
            self._end()
            if self.cgroup is not None:
                # Its cgroup still holds whatever the replicas left behind: killed at once,
                # by a write to the cgroup's file, in a thread like every file write.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_kill_cgroup, self.cgroup)
            self.stopped.set()

    async def _read(self) -> None:
        """Read and dispatch messages, in this task, whenever the socket is readable.

        The socket stays registered with the loop while the reaper lives: its
        callback only wakes this task. ``anyio.wait_readable`` per wake-up
        registered and unregistered the socket each time (two ``epoll_ctl``) and
        found its backend and event loop anew, 50-70 us of every exit report
        and spawn reply on the way to ``wait`` and ``submit``. The dispatch stays
        in this task, not in the callback: a replica's exit may start its
        follower task, which anyio does only from a task.
        """
        loop = asyncio.get_running_loop()
        fd = self.sock.fileno()
        loop.add_reader(fd, self._readable)
        try:
            while True:
                woken = self._woken = loop.create_future()
                await woken
                # Everything already queued, in one wake-up: a burst of 1,000 replies
                # costs one turn of this task, not 1,000.
                for _ in range(_READ_BATCH):
                    try:
                        data = self.sock.recv(_MAX_MESSAGE, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
                    except OSError:
                        data = b""
                    if not data:
                        return
                    self._dispatch(json.loads(data))
                else:
                    await anyio.lowlevel.checkpoint()  # more left: others run first
        finally:
            # Before the socket is closed (``Reaper._close``): its number is soon reused.
            loop.remove_reader(fd)

    def _readable(self) -> None:
        """The loop's callback for the socket: wake ``_read`` (until it reads, the socket
        stays readable, and the loop calls this again: then there is nothing to do)."""
        woken = self._woken
        if woken is not None and not woken.done():
            woken.set_result(None)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "hello":
            self.cgroup = msg["cgroup"]
            self.containment = "cgroup+subreaper" if msg["cgroup"] else "subreaper"
            if not msg["subreaper"]:
                self.containment = "cgroup" if msg["cgroup"] else "process-group"
        elif op in ("spawned", "failed"):
            if op == "spawned":
                # Registered before the spawner resumes: its exit may be the very next message.
                pid = msg["pid"]
                report = self.exits[pid] = msg["report"] = ExitReport(pid=pid, started_at=msg["at"])
                with contextlib.suppress(OSError):
                    report.pidfd = os.pidfd_open(pid)
            self.replies[msg["id"]] = msg
            event = self.waiting.pop(msg["id"], None)
            if event is not None:
                event.set()
        elif op == "claimed":
            told = self.claims.pop(msg["id"], None)
            if told is not None:
                told()
        elif op == "exit":
            ended = self.exits.pop(msg["pid"], None)
            if ended is not None:
                ended.settle(msg["status"], at=msg["at"])

    def _end(self) -> None:
        """The reaper is gone: whatever waits on it is answered, nothing hangs (its cgroup
        is killed after, then ``stopped`` set: see ``_run``)."""
        self.dead = True
        self.outbox.clear()  # the pipes in it belong to their spawners, answered below
        for event in self.waiting.values():
            event.set()
        self.waiting.clear()
        self.claims.clear()
        for report in self.exits.values():
            if report.pidfd is not None and not select.select([report.pidfd], [], [], 0)[0]:
                # Still running (so its pid, and group id, are still its own): stopped here.
                with contextlib.suppress(OSError):
                    os.killpg(report.pid, signal.SIGKILL)
            report.settle(None, "the local reaper process ended, so the exit status is unknown")
        self.exits.clear()


class Reaper:
    """Spawns replicas through the reaper process, which is their parent."""

    def __init__(self, task_group: TaskGroup) -> None:
        self._task_group = task_group
        self._conn: _Connection | None = None
        self._ended: list[_Connection] = []  # reapers that died; cleaned up at close
        self._next_id = 0
        self._starting = anyio.Lock()  # one reaper started at a time, by whoever needs it first
        self._closed = False  # no reaper is started after ``aclose``

    @property
    def containment(self) -> str:
        """How replicas are contained: ``cgroup+subreaper``, ``subreaper``, ... (for statistics)."""
        return "not started" if self._conn is None else self._conn.containment

    @property
    def running(self) -> bool:
        """A reaper process runs now (a spawn needs no start first)."""
        return self._live() is not None

    @property
    def spawning(self) -> bool:
        """A spawn sent to the reaper has not been answered yet."""
        conn = self._live()
        return conn is not None and bool(conn.waiting)

    def _live(self) -> _Connection | None:
        """The reaper running now; None when none was started or it died."""
        conn = self._conn
        return conn if conn is not None and not conn.dead else None

    async def _connection(self) -> _Connection:
        """The running reaper, started first if there is none (or it died).

        Started in a worker thread: a fork and exec on the event loop would hold
        it (and every other app of the host) for milliseconds. Shielded, so a
        caller cancelled meanwhile leaves no reaper process nobody knows of.
        """
        conn = self._live()
        if conn is not None:
            return conn
        async with self._starting:
            if self._closed:
                raise BackendError("the local backend is closed", transient=False)
            if self._conn is not None and self._conn.dead:
                self._ended.append(self._conn)
                self._conn = None
            if self._conn is None:
                with anyio.CancelScope(shield=True):
                    sock, popen = await anyio.to_thread.run_sync(_start_reaper)
                self._conn = _Connection(self._task_group, sock, popen)
            return self._conn

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        group: str,
        stdout: int,
        stderr: int,
        alone: bool = False,
        prepare: Mapping[str, Any] | None = None,
        on_claim: Callable[[], None] | None = None,
    ) -> tuple[int, ExitReport]:
        """Start ``argv`` in its own session; the pid and where its exit will be reported.

        ``alone``: the caller starts no other replica with this one, so the reaper
        may take the way that is cheaper for a single spawn (see ``reaper.py``).
        ``prepare``: an app's claim (``AppStore.claim_plan``), carried out by the
        reaper first, in the same round trip; ``NotPrepared`` if it failed (then
        nothing was started). ``on_claim``: the reaper is asked to say when that
        claim is made, before the spawn (which may still fail), and this is called
        on the loop then; it must not raise.
        Raises OSError when it cannot be started (not found, bad cwd), BackendError
        when the reaper cannot be reached.
        """
        try:
            conn = await self._connection()
        except OSError as e:
            raise BackendError(f"cannot start the local reaper: {e}", transient=True) from e
        self._next_id += 1
        ident = self._next_id
        answered = conn.waiting[ident] = anyio.Event()
        msg = {
            "op": "spawn",
            "id": ident,
            "argv": list(argv),
            "cwd": cwd,
            "env": dict(env),
            "group": group,
            "alone": alone,
        }
        if prepare is not None:
            msg["prepare"] = dict(prepare)
            if on_claim is not None:
                msg["tell_claim"] = True
                conn.claims[ident] = on_claim
        try:
            conn.send(msg, (stdout, stderr), ident=ident)
        except BackendError:
            conn.waiting.pop(ident, None)
            conn.claims.pop(ident, None)
            raise
        # Shielded: a spawn under way must be answered, or its replica would be unknown.
        # (The pipes it carries stay open meanwhile: they are the caller's until then.)
        with anyio.CancelScope(shield=True):
            await answered.wait()
        conn.claims.pop(ident, None)  # (none came: the claim failed, or was never sent)
        reply = conn.replies.pop(ident, None)
        if reply is None:
            raise BackendError("the local reaper ended during a spawn", transient=True)
        if reply["op"] == "unsent":
            raise BackendError(f"cannot reach the local reaper: {reply['error']}", transient=True)
        if reply["op"] == "failed":
            code = int(reply["errno"]) or errno.EIO
            if "step" in reply:  # the claim it carried, not the spawn
                error = OSError(code, str(reply["error"]), reply.get("filename"))
                raise NotPrepared(claimed=reply["step"] != "claim", error=error)
            # The reaper's text already starts with strerror when it had an errno.
            detail = str(reply["error"])
            text = (
                detail
                if detail.startswith(os.strerror(code))
                else f"{os.strerror(code)} ({detail})"
            )
            raise OSError(code, text)
        report: ExitReport = reply["report"]  # already settled if it exited meanwhile
        return report.pid, report

    def warm_up(self) -> None:
        """Spawns of several replicas follow soon: the reaper (started now if need be,
        in a task of its own) takes the kernel's slow first step now, while they are
        being prepared, where it has one to take (see ``Reaper.warm`` in ``reaper.py``)."""
        conn = self._live()
        if conn is not None:
            with contextlib.suppress(BackendError):
                conn.send({"op": "warm"})
        else:
            self._task_group.start_soon(self._start_warm)

    async def _start_warm(self) -> None:
        # Only an advance: a reaper that cannot be started or reached is reported by
        # the spawns that follow, which try again and raise what they find.
        with contextlib.suppress(OSError, BackendError):
            (await self._connection()).send({"op": "warm"})

    def kill(self, pids: Sequence[int], sig: int) -> None:
        """Signal the process groups of replicas not yet reaped; others are left alone."""
        conn = self._live()
        if conn is not None and pids:
            # A reaper gone meanwhile: _end already killed what it had left.
            with contextlib.suppress(BackendError):
                conn.send({"op": "kill", "pids": list(pids), "sig": int(sig)})

    def release(self, group: str) -> None:
        """An app ended: the reaper kills whatever its replicas left behind."""
        conn = self._live()
        if conn is not None:
            # A reaper gone meanwhile: its adopted orphans are beyond reach (see README).
            with contextlib.suppress(BackendError):
                conn.send({"op": "release", "group": group})

    async def aclose(self) -> None:
        """Ask the reaper to stop everything left, wait for it to exit, then close the socket."""
        # A reaper being started is one to close too (a start takes milliseconds).
        with anyio.CancelScope(shield=True):
            async with self._starting:
                conns, self._ended = [*self._ended, self._conn], []
                self._conn = None
                self._closed = True
        for conn in conns:
            if conn is not None:
                await self._close(conn)

    @staticmethod
    async def _close(conn: _Connection) -> None:
        with anyio.CancelScope(shield=True):
            if not conn.dead:
                # A reaper that cannot be reached is exiting already: it is waited for below.
                with contextlib.suppress(BackendError):
                    conn.send({"op": "shutdown"})
            try:
                pidfd = os.pidfd_open(conn.popen.pid)
            except ProcessLookupError:
                pidfd = None
            if pidfd is not None:
                try:
                    await anyio.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
            # The reader unregisters its fd before the fd is closed (a number soon reused).
            conn.scope.cancel()
            await conn.stopped.wait()
            conn.sock.close()
            conn.popen.wait()  # at once: it has exited (0 if the host reaped it first)
            if conn.cgroup is not None:
                await anyio.to_thread.run_sync(_remove_cgroup, conn.cgroup)


def _remove_cgroup(path: str) -> None:
    """Remove what a reaper that was killed could not: its (now empty) cgroup directories."""
    if not os.path.isdir(path):
        return  # the reaper removed it itself
    for entry in os.scandir(path):
        if entry.is_dir():
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)
    with contextlib.suppress(OSError):
        os.rmdir(path)
