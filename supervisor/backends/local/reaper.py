"""The reaper: parent of every local replica, and the guarantee that none outlives its supervisor.

Nothing inside a process survives SIGKILL, and the library may not install
signal handlers, so a separate process keeps three promises the supervising
process cannot keep alone:

* **Exit statuses nobody can steal.** Replicas are this process's children,
  so the host's own SIGCHLD disposition (``SIG_IGN``) or a ``waitpid(-1)``
  loop in the host cannot reap them first: the status reported is always
  the one the kernel gave.
* **Containment.** This process is a child subreaper
  (``PR_SET_CHILD_SUBREAPER``): whatever a replica starts and abandons
  (``setsid``, a double fork, ``bash`` job control) is re-parented here, not
  to init, so it can still be found and killed. Where the kernel lets it
  (cgroup v2 mounted and writable: root, or a delegated subtree) each app's
  replicas also go in a cgroup of their own, killed whole with
  ``cgroup.kill`` when the app ends.
* **Nothing outlives the supervisor.** It watches the supervisor with a
  pidfd (a forked child of the host that inherited the socket cannot keep
  it waiting) and the socket's end-of-file; either one stops everything
  registered (SIGTERM, then SIGKILL after a grace) and then kills every
  descendant it still has, until it has no child left.

Protocol: JSON, one message per SOCK_SEQPACKET datagram on fd 0 (a long one, a
spawn with megabytes of arguments, in parts: see ``MORE``). From the
supervisor: ``spawn`` (with the output pipes as SCM_RIGHTS, and whether it comes
``alone``: see ``Reaper.spawn``), ``warm`` (spawns of a burst are coming: see
``Reaper.warm``), ``kill``, ``release`` (an app ended), ``shutdown``. To it:
``hello``, ``spawned`` or ``failed`` per spawn (before it, ``claimed`` for a
spawn that carried an app's claim and asked for it, once that is made), ``exit`` per replica
(``spawned`` and ``exit`` with the wall-clock time this process saw it happen). Sends
never block this process: replies queue until the socket is writable, so it
always keeps reading, and it reads every queued message (up to a batch) per
wake-up, then sends their replies together. The supervisor's sends
never block either (see ``reaper_client.py``).

This file runs as a script with ``python -I -S`` and imports nothing from the
package, so it starts in milliseconds. Its arguments: the supervisor's pid, and
the path of the built ``_cspawn.c`` (empty or absent where there is none).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, TypeVar

GRACE_SECONDS = 1.0
PR_SET_CHILD_SUBREAPER = 36
MAX_MESSAGE = 1 << 20
PART = 1 << 16
"""The longest record the supervisor sends: well under a socket's default send buffer."""
MORE = b"\x01"
"""Starts each part of a long message but its last (a JSON text never holds this byte):
the parts are joined, and the fds come with the last."""
RECEIVE_BATCH = 64
_FD_ITEM = array.array("i").itemsize
_T = TypeVar("_T")


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


# clone3(2) with CLONE_INTO_CGROUP (Linux >= 5.7): a child born inside its app's cgroup.
_CLONE3_NUMBER = {"x86_64": 435, "aarch64": 435}.get(os.uname().machine)
_CLONE_INTO_CGROUP = 0x200000000
_CLONE_ARGS = struct.Struct("11Q")  # struct clone_args up to ``cgroup`` (CLONE_ARGS_SIZE_VER2)
# What says the kernel (or a seccomp filter, as in containers) offers no usable clone3 at all.
_CLONE3_REFUSED = frozenset(
    {errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.EOPNOTSUPP}
)
_SIGNALS_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)  # Python ignores them; children must not
MOVES_STAY_CHEAP_S = 0.02
"""How long after a move between cgroups the next one is still cheap (within one RCU grace
period the kernel keeps the lock's slow mode on); past that a move costs 5-15 ms here."""


_syscall: Any = None  # libc's syscall(2), through PyDLL, once the first clone needs it
_CSPAWN_STEPS = {1: "setup", 2: "chdir", 3: "exec"}
"""Where a child of ``_cspawn.c`` stopped, in the words of ``_exec_child``'s reports
(0: no child was made)."""
_CSPAWN_RESTORED = (ctypes.c_int * (len(_SIGNALS_RESTORED) + 1))(*_SIGNALS_RESTORED, 0)


class _CSpawn(NamedTuple):
    """What the reaper calls in the built ``_cspawn.c``."""

    spawn: Any  # asv_spawn_into_cgroup
    populate: Any  # asv_populate_cgroup


def _load_cspawn(path: str) -> _CSpawn | None:
    """The functions of the built ``_cspawn.c`` at ``path``; None where there is none
    (not built: no compiler at install) or it cannot be loaded."""
    if not path:
        return None
    try:
        library = ctypes.CDLL(path, use_errno=True)
        spawn, populate = library.asv_spawn_into_cgroup, library.asv_populate_cgroup
    except (OSError, AttributeError):
        return None
    strings = ctypes.POINTER(ctypes.c_char_p)
    ints = ctypes.POINTER(ctypes.c_int)
    spawn.restype = ctypes.c_long
    spawn.argtypes = [ctypes.c_int, strings, strings, strings, ctypes.c_char_p, ints, ints, ints]
    populate.restype = ctypes.c_long
    populate.argtypes = [ctypes.c_int]
    return _CSpawn(spawn, populate)


def _c_strings(items: list[bytes]) -> Any:
    """A NULL-terminated ``char *[]`` of ``items`` (which the array keeps alive)."""
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


class _SetupFailed(Exception):
    """A cloned child failed before its exec, with no errno to tell (``step`` in the message)."""


def _prepare(plan: dict[str, Any]) -> tuple[str, OSError] | None:
    """Carry out an app's claim (``AppStore.claim_plan``) before its lone replica's spawn.

    None when done; else the step that failed ("claim": the app directory was not
    made; "records": it was, and the rest was not) and why.
    """
    claim = plan["claim"]
    try:
        os.makedirs(os.path.dirname(claim), exist_ok=True)
        os.mkdir(claim)  # never exist_ok: of two claims of one id, one fails here
    except OSError as e:
        return "claim", e
    try:
        for directory in plan["dirs"]:
            os.makedirs(directory, exist_ok=True)  # (inside the directory just claimed)
        path, size = plan["reserve"]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            os.unlink(path)
            if e.errno in plan["full"]:
                raise OSError(e.errno, e.strerror, path) from e  # (which file: the reserve)
            # This file system sets no space aside: the app runs without a reserve.
        finally:
            os.close(fd)
    except OSError as e:
        return "records", e
    return None


class _NoClone(Exception):
    """clone3 into a cgroup did not happen: the caller spawns the other way."""

    def __init__(self, refused: bool) -> None:
        super().__init__()
        self.refused = refused  # for good: never try again


def _clone_into(cgroup_fd: int) -> int:
    """Fork this process, the child born inside the cgroup of ``cgroup_fd``; 0 in the child.

    Through ``PyDLL``: the GIL stays held across the call, so the child (a copy
    of this single-threaded process) returns holding it.
    """
    global _syscall
    if _CLONE3_NUMBER is None:
        raise _NoClone(refused=True)
    if _syscall is None:
        _syscall = ctypes.PyDLL(None, use_errno=True).syscall
        _syscall.restype = ctypes.c_long
    args = ctypes.create_string_buffer(
        _CLONE_ARGS.pack(_CLONE_INTO_CGROUP, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, cgroup_fd),
        _CLONE_ARGS.size,
    )
    pid = int(_syscall(ctypes.c_long(_CLONE3_NUMBER), args, ctypes.c_size_t(_CLONE_ARGS.size)))
    if pid < 0:
        raise _NoClone(refused=ctypes.get_errno() in _CLONE3_REFUSED)
    return pid


def _vfork_into(
    spawn: Any,
    cgroup_fd: int,
    stdio: tuple[int, ...],
    argv: list[str],
    places: list[str],
    cwd: str,
    env: dict[str, str],
) -> int:
    """``_clone_into`` and ``_exec_child`` in one, through ``_cspawn.c`` (``spawn``): the
    child shares this process's memory until its exec, so nothing of this process is
    copied (1.0-1.4 ms against 2.4-2.8 for the fork from Python, measured on 2026-12-05).

    The pid; raises ``_NoClone`` where no child was made, and the child's error as
    ``_exec_child`` reports it."""
    step = ctypes.c_int(0)
    result = spawn(
        cgroup_fd,
        _c_strings([os.fsencode(place) for place in places]),
        _c_strings([os.fsencode(arg) for arg in argv]),
        _c_strings([os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]),
        os.fsencode(cwd),
        (ctypes.c_int * 3)(*stdio),
        _CSPAWN_RESTORED,
        ctypes.byref(step),
    )
    if result > 0:
        return int(result)
    number = -int(result)
    if step.value not in _CSPAWN_STEPS:  # no child: the kernel refused the clone
        raise _NoClone(refused=number in _CLONE3_REFUSED)
    raise _spawn_error(number, _CSPAWN_STEPS[step.value], cwd, argv)


def _spawn_error(number: int, step: str, cwd: str, argv: list[str]) -> OSError:
    """A child's failure before its exec, in Popen's words: the cwd named for a chdir,
    the program else."""
    return OSError(number, os.strerror(number), cwd if step == "chdir" else argv[0])


_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR})
"""The errors of a place along PATH where the program is not: Popen goes on to the next."""


def _executables(file: str, env: dict[str, str], cwd: str) -> list[str]:
    """Where ``file`` may be, searched as Popen does (in the child's own PATH, from
    the child's ``cwd``), less the places where it is not.

    Run in the parent, before the fork: each ``execve`` that fails in the
    forked child costs a copy of the pages it touches on the way (eight such
    places before ``/usr/bin`` made a lone spawn 5.2-5.7 ms instead of
    4.5-5.1). Left out here is only what the child would skip too ("not
    there": ENOENT, ENOTDIR), and never the last place, whose error the child
    reports when the file is nowhere, as Popen does.
    """
    if os.path.dirname(file):
        return [file]
    places = [os.path.join(d, file) for d in os.get_exec_path(env)]
    kept = [place for place in places[:-1] if _may_be_there(os.path.join(cwd, place))]
    return kept + places[-1:]


def _may_be_there(path: str) -> bool:
    """False only where ``execve`` would fail with "not there" too.

    Any other error (EACCES, ELOOP) keeps the place: the child meets it and says so.
    """
    try:
        os.stat(path)
    except OSError as e:
        return e.errno not in _NOT_THERE
    return True


def _checked(argv: list[str], env: dict[str, str]) -> None:
    """Refuse in the parent what execve would refuse in the child, with Popen's words."""
    if not argv:
        raise ValueError("the command is empty")
    for text in (*argv, *env, *env.values()):
        if "\0" in text:
            raise ValueError("embedded null byte")
    if any("=" in name for name in env):
        raise ValueError("illegal environment variable name")


def _exec_child(
    argv: list[str],
    executables: list[str],
    cwd: str,
    env: dict[str, str],
    stdio: tuple[int, int, int],
    errpipe: int,
) -> NoReturn:
    """In the child: set up as Popen would (start_new_session, close_fds) and exec
    the first of ``executables`` (``_executables``) that will.

    What failed goes to ``errpipe`` as ``step:errno``; its close on a successful
    exec is the parent's sign that the command runs.
    """
    step = "setup"
    try:
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        step = "chdir"
        os.chdir(cwd)
        step = "setup"
        for sig in _SIGNALS_RESTORED:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        os.closerange(3, errpipe)
        os.closerange(errpipe + 1, 2**31 - 1)
        step = "exec"
        _first_that_starts(executables, lambda place: os.execve(place, argv, env))
    except BaseException as e:
        code = e.errno if isinstance(e, OSError) and e.errno else 0
        with contextlib.suppress(BaseException):
            os.write(errpipe, f"{step}:{code}".encode())
    finally:
        os._exit(255)


def _first_that_starts(places: list[str], start: Callable[[str], _T]) -> _T:
    """``start`` each place in turn until one does; else raise as Popen does: the first
    error that is not "not there", else the last one."""
    first: OSError | None = None
    last: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    for place in places:
        try:
            return start(place)
        except OSError as e:
            if first is None and e.errno not in _NOT_THERE:
                first = e
            last = e
    raise first or last


def _close_on_exec_above_stdio() -> None:
    """Mark every descriptor above 2 close-on-exec: ``posix_spawn`` closes none.

    Python opens its own that way; this covers any this process was started
    with, so a replica only ever gets the stdio it is given. (The supervisor
    starts it with none: this is the second guard, kept where ``/proc`` is
    mounted, as the reaper's other scans.)
    """
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
                os.set_inheritable(fd, False)


def _cgroup_base() -> str | None:
    """A fresh cgroup v2 directory below this process's own, or None where none can be made.

    ``ASUPERVISOR_CONTAINMENT=subreaper`` skips it: what an unprivileged process gets.
    """
    if os.environ.get("ASUPERVISOR_CONTAINMENT") == "subreaper":
        return None
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
        with open("/proc/self/cgroup") as f:
            own = next((x[3:].strip() for x in f if x.startswith("0::")), None)
        mount = next((m[4] for m in mounts if m[m.index("-") + 1] == "cgroup2"), None)
        if own is None or mount is None:
            return None
        base = os.path.join(mount + own.rstrip("/"), f"asupervisor-{os.getpid()}")
        os.mkdir(base)
        if not os.path.exists(os.path.join(base, "cgroup.kill")):
            os.rmdir(base)  # a kernel before 5.14: no way to kill a cgroup at once
            return None
        return base
    except (OSError, ValueError, IndexError):
        return None


def _descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, found from /proc (children before their children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            out.append(child)
            stack.append(child)
    return out


class Reaper:
    def __init__(self, sock: socket.socket, parent_fd: int | None, cspawn: str = "") -> None:
        self.sock = sock
        # The spawn into a cgroup in C (``_cspawn.c``) when it was built; see ``_spawn_into``.
        self.cspawn = _load_cspawn(cspawn)
        self.parent_fd = parent_fd
        self.me = os.getpid()
        self.live: set[int] = set()  # replica leaders not reaped yet (pid == pgid)
        self.outbox: list[bytes] = []
        self.holding_replies = False  # while one wake-up's messages are handled
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        # The app's cgroup this process stepped into for the spawns of one batch, if any.
        self.inside: str | None = None
        # Where each program was found along PATH, for the rest of one batch (its replicas
        # share their command): (program, PATH, cwd) -> the places to exec, in order.
        self.found: dict[tuple[str, str | None, str], list[str]] = {}
        self.cgroup = _cgroup_base()
        self.home: int | None = None  # cgroup.procs of this process's own leaf
        if self.cgroup is not None:
            self.home = _enter_home(self.cgroup)
            if self.home is None:
                with contextlib.suppress(OSError):
                    os.rmdir(self.cgroup)
                self.cgroup = None
        self.groups: dict[str, str] = {}  # app -> its cgroup directory
        # The cgroup directory last opened, kept open for the next spawn into it (see
        # ``_open_group``): (its path, its descriptor).
        self.group_fd: tuple[str, int] | None = None
        self.clone_into = True  # until the kernel refuses clone3(CLONE_INTO_CGROUP)
        self.last_move = -math.inf  # when this process last moved between cgroups (monotonic)
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        _close_on_exec_above_stdio()
        # No directory of the supervisor's is held busy (an unmount); spawns chdir and back.
        os.chdir("/")
        self.emptying: list[str] = []  # cgroups of ended apps, removed once empty
        self.closing = False
        self.parts: list[bytes] = []  # of a long message, until its last (``MORE``)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self.wake = wake_r
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # Inherited dispositions are not ours to pass on: replicas start with defaults.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)

    # ---------------------------------------------------------------- sending
    def send(self, **msg: Any) -> None:
        """Queue ``msg``; it goes out at once unless replies are being held (``receive_batch``)."""
        self.outbox.append(json.dumps(msg).encode())
        if not self.holding_replies:
            self.flush()

    def flush(self) -> None:
        while self.outbox:
            try:
                self.sock.send(self.outbox[0], socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                self.outbox.clear()  # the supervisor is gone
                return
            self.outbox.pop(0)

    # ---------------------------------------------------------------- serving
    def serve(self) -> None:
        self.send(op="hello", subreaper=self.subreaper, cgroup=self.cgroup)
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake, select.POLLIN)
        if self.parent_fd is not None:
            poller.register(self.parent_fd, select.POLLIN)
        try:
            while not self.closing:
                mask = select.POLLIN | (select.POLLOUT if self.outbox else 0)
                poller.modify(self.sock, mask)
                for fd, events in poller.poll():
                    if fd == self.wake:
                        self.drain_wake()
                        self.reap()
                    elif fd == self.parent_fd:
                        self.closing = True  # the supervisor exited, however it ended
                    elif events & select.POLLOUT:
                        self.flush()
                    if fd == self.sock.fileno() and events & (select.POLLIN | select.POLLHUP):
                        self.receive_batch()
        finally:
            # Even after a bug of its own (the traceback goes to the host's stderr).
            self.stop_everything()

    def receive_batch(self) -> None:
        """Every message already queued, up to a batch, in one wake-up; the replies after.

        A burst of spawns then costs one poll here, and its replies reach the
        supervisor together: each datagram sent on its own woke the supervisor's
        loop for one reply (1,000 wake-ups for a 1,000-replica app), which cost
        both processes CPU. Holding them costs no latency worth having: the
        supervisor keeps only a few spawns in flight, so a batch is a few
        spawns, and a lone spawn is answered as soon as it is done.
        """
        self.holding_replies = True
        try:
            for _ in range(RECEIVE_BATCH):
                if not self.receive() or self.closing:
                    break
        finally:
            self.holding_replies = False
            self.flush()
            self.leave()  # after the replies: the supervisor need not wait for this move
            self.found.clear()

    def drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake, 4096):
                pass

    def receive(self) -> bool:
        """Handle one message; False when there was none to read."""
        fds: list[int] = []
        try:
            data, ancdata, _, _ = self.sock.recvmsg(
                MAX_MESSAGE,
                socket.CMSG_SPACE(2 * _FD_ITEM),
                socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC,
            )
        except BlockingIOError:
            return False
        except OSError:
            data, ancdata = b"", []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % _FD_ITEM
                fds.extend(array.array("i", payload[:usable]))
        if not data:
            self.closing = True  # end-of-file: the supervisor closed or died
            return False
        if data.startswith(MORE):
            self.parts.append(data[len(MORE) :])
            for fd in fds:
                os.close(fd)
            return True
        if self.parts:
            data = b"".join((*self.parts, data))
            self.parts.clear()
        msg = json.loads(data)
        try:
            op = msg["op"]
            if op != "spawn":
                self.leave()  # a kill or release never runs from inside an app's cgroup
            if op == "spawn":
                self.spawn(msg, fds)
            elif op == "kill":
                for pid in msg["pids"]:
                    if pid in self.live:
                        with contextlib.suppress(OSError):
                            os.killpg(pid, msg["sig"])
            elif op == "warm":
                self.warm()
            elif op == "release":
                self.release(str(msg["group"]))
            elif op == "shutdown":
                self.closing = True
        finally:
            for fd in fds:
                os.close(fd)
        return True

    # --------------------------------------------------------------- spawning
    def _group_dir(self, group: str) -> str | None:
        """The app's cgroup directory (made on first use), or None where there is none."""
        if self.cgroup is None:
            return None
        path = self.groups.get(group)
        if path is None:
            path = self._new_group_dir(self.cgroup, "app-" + group.replace("/", "_"))
            if path is None:
                return None
            self.groups[group] = path
            self._populate(path)
        return path

    def _populate(self, path: str) -> None:
        """Have a new app's cgroup populated once before its first replica is cloned:
        the replica's spawn then no longer waits behind the kernel worker that the
        first process of a cgroup wakes (why and how much: ``asv_populate_cgroup``).
        Nothing to say where it cannot be done: the replica's own clone finds out why.
        """
        if not self._never_moves:
            return
        assert self.cspawn is not None  # (``_never_moves``)
        try:
            fd = self._open_group(path)
        except OSError:
            return
        self.cspawn.populate(fd)

    def _open_group(self, path: str) -> int:
        """A descriptor of the cgroup directory ``path``, for a clone into it.

        Kept open until another app's is needed or the app is released: an app's
        replicas are spawned one after another, and a lone replica's populate and
        spawn would each open it (an ``open`` and a ``close`` per spawn). One at a
        time, so an app that runs long holds none: the reaper's descriptors stay
        as few as its spawns in flight, whatever the number of apps.
        """
        kept = self.group_fd
        if kept is not None and kept[0] == path:
            return kept[1]
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._close_group(None)
        self.group_fd = (path, fd)
        return fd

    def _close_group(self, path: str | None) -> None:
        """Close the kept cgroup descriptor (``_open_group``): that of ``path``, or any."""
        kept = self.group_fd
        if kept is not None and (path is None or kept[0] == path):
            self.group_fd = None
            os.close(kept[1])

    def _new_group_dir(self, base: str, name: str) -> str | None:
        """A new cgroup directory for an app, never one an ended app left behind.

        An app submitted again under the id of one that ended finds that app's
        directory still there when what it left running was still dying as it
        was released (see ``release``). That directory is not this app's: its
        ``cgroup.kill`` was written, and Linux kills every process cloned into
        a cgroup once killed (SIGKILL at birth, seen on 6.18), so each replica
        of the new app would fail as it starts. It is removed if it has emptied
        since, and the new app's takes its name; otherwise the new app's gets
        a name of its own (``app-<id>.1``, ...).
        """
        self._remove_emptied()
        # Every directory there is an app's, live or ended: one more try finds a free name
        # (``app-<id>.1`` may be the directory of an app whose id is ``<id>.1``).
        for attempt in range(len(self.groups) + len(self.emptying) + 1):
            path = os.path.join(base, name + (f".{attempt}" if attempt else ""))
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            except OSError:
                return None
            return path
        return None

    def _remove_emptied(self) -> None:
        """Remove the cgroups of ended apps whose last process has gone (as an app ends,
        and before a new app's is made; ``stop_everything`` removes the rest)."""
        for path in list(self.emptying):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # still busy
            self.emptying.remove(path)

    def spawn(self, msg: dict[str, Any], fds: list[int]) -> None:
        """Start one replica in a session of its own, inside its app's cgroup if there is one.

        The child is born inside the cgroup, so nothing it forks can be missed.
        Where ``_cspawn.c`` was built, every such spawn is a clone3 straight into
        the cgroup, the child sharing this process's memory until its exec (0.3 ms
        a spawn in a burst, 0.4-0.7 ms the first into a new cgroup: 100 spawns of
        ``sleep``, 2026-12-05), and this process never moves. Without it the clone
        is a full fork of this process from Python (2.4-2.8 ms), so this process
        steps into the cgroup for a vfork (``posix_spawn``, 0.35 ms) instead, and
        only a spawn that comes alone (``alone``: the supervisor starts no other
        replica with it, and no other message waits) after a quiet while is
        cloned: the first move after a quiet while waits for an RCU grace period
        (5-15 ms, every exit report queued behind it), one within
        ``MOVES_STAY_CHEAP_S`` of the last does not. That wait is also why moving
        lost to the clone from C for bursts (ten replicas submitted by a service:
        16-19 ms against 11).
        """
        if len(fds) != 2:
            self.send(op="failed", id=msg["id"], errno=0, error="no output pipes were passed")
            return
        argv, cwd, env = msg["argv"], msg["cwd"], msg["env"]
        plan = msg.get("prepare")
        failed = _prepare(plan) if plan is not None else None
        if failed is not None:
            step, error = failed
            self.send(
                op="failed",
                id=msg["id"],
                step=step,
                errno=error.errno or 0,
                error=error.strerror or str(error),
                filename=error.filename,
            )
            return
        if plan is not None and msg.get("tell_claim"):
            # Said at once, even among held replies: the supervisor writes the app's first
            # records while the replica starts, not after.
            self.send(op="claimed", id=msg["id"])
            self.flush()
        group = self._group_dir(str(msg.get("group", "")))
        try:
            # Refused and searched here, once for either way (and for a fallback between).
            _checked(argv, env)
            places = self._places(argv[0], env, cwd)
            pid = None
            if group is not None and self._clones(msg):
                pid = self._spawn_into(group, argv, places, cwd, env, fds)
            if pid is None:
                pid = self._spawn_inside(group, argv, places, cwd, env, fds)
        except OSError as e:
            where = f": {e.filename}" if e.filename not in (None, argv[0]) else ""
            self.send(op="failed", id=msg["id"], errno=e.errno or 0, error=f"{e.strerror}{where}")
            return
        except (ValueError, _SetupFailed) as e:
            self.send(op="failed", id=msg["id"], errno=0, error=str(e))
            return
        self.live.add(pid)
        # Stamped here, as the replica runs: the supervisor hears of it later, more so
        # when its loop is busy, and the replica's recorded times are its own.
        self.send(op="spawned", id=msg["id"], pid=pid, at=time.time())

    @property
    def _never_moves(self) -> bool:
        """Every spawn is cloned into its cgroup: ``_cspawn.c`` was built and the kernel
        takes clone3 into a cgroup (see ``spawn``)."""
        return self.clone_into and self.cspawn is not None

    def _clones(self, msg: dict[str, Any]) -> bool:
        """This spawn is cloned straight into its cgroup, not made after a move."""
        if self._never_moves:
            return True
        return (
            self.clone_into
            and msg.get("alone") is True
            and not self._moves_are_cheap()
            and not self._more_waiting()
        )

    def warm(self) -> None:
        """Pay now the wait of the first move after a quiet while (5-15 ms, see ``spawn``).

        The supervisor says so when it begins to prepare an app of several
        replicas, so this wait overlaps its preparation (the app's records,
        O(replicas)) instead of delaying the first spawn; the burst's moves that
        follow within ``MOVES_STAY_CHEAP_S`` are cheap. A move into the cgroup
        this process is in already takes the same lock and changes nothing.
        Where nothing moves (``_never_moves``), the wait would only hold back this
        process's first spawn.
        """
        if self._never_moves or self.cgroup is None or self.home is None or self._moves_are_cheap():
            return
        try:
            os.write(self.home, b"0")
        except OSError:
            return  # the spawns find out for themselves, as without this
        self.last_move = time.monotonic()

    def _moves_are_cheap(self) -> bool:
        """A move happened lately, so the next one waits for no grace period."""
        return time.monotonic() - self.last_move <= MOVES_STAY_CHEAP_S

    def _more_waiting(self) -> bool:
        """Another message is queued already: this spawn is part of a burst."""
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:
            return False

    def _spawn_into(
        self,
        group: str,
        argv: list[str],
        places: list[str],
        cwd: str,
        env: dict[str, str],
        fds: list[int],
    ) -> int | None:
        """clone3 straight into the app's cgroup and exec; the pid, or None if not done.

        A move into the cgroup takes a lock that waits for an RCU grace period
        when no move happened lately, with every exit report queued behind it
        meanwhile (see ``spawn``). Errors are Popen's (OSError with the cwd as
        filename for a failed chdir, argv[0] else).
        """
        try:
            cgroup_fd = self._open_group(group)
        except OSError:
            return None
        if self.cspawn is not None:
            try:
                return _vfork_into(
                    self.cspawn.spawn, cgroup_fd, (self.devnull, *fds), argv, places, cwd, env
                )
            except _NoClone as no:
                self.clone_into = not no.refused
                return None
        errpipe_read, errpipe_write = os.pipe()
        try:
            try:
                pid = _clone_into(cgroup_fd)
            except _NoClone as no:
                self.clone_into = not no.refused
                return None
            if pid == 0:
                stdio = (self.devnull, fds[0], fds[1])
                _exec_child(argv, places, cwd, env, stdio, errpipe_write)
        finally:
            os.close(errpipe_write)
        try:
            report = b""
            while chunk := os.read(errpipe_read, 256):
                report += chunk
        finally:
            os.close(errpipe_read)
        if not report:
            return pid
        os.waitpid(pid, 0)  # it exited at once, and was never a replica
        step, _, code = report.decode().partition(":")
        number = int(code) if code.isdigit() else 0
        if number == 0:
            raise _SetupFailed(f"the child failed before exec ({step})")
        raise _spawn_error(number, step, cwd, argv)

    def _spawn_inside(
        self,
        group: str | None,
        argv: list[str],
        places: list[str],
        cwd: str,
        env: dict[str, str],
        fds: list[int],
    ) -> int:
        """``posix_spawn`` (a vfork), with this process inside the app's cgroup (no clone3).

        It stays inside for the rest of the batch (``leave`` at its end, or before
        anything else): a burst's replicas come together, and each move is a write
        to ``cgroup.procs`` (about 40 us here; two per replica cost the reaper a
        fifth of its CPU in a burst). A cgroup that refuses it (a pids limit) is
        done without: the subreaper still holds the replica.
        """
        if self.inside != group:
            self.leave()
            if group is not None:
                self._enter(group)
        return self._posix_spawn(argv, places, cwd, env, fds)

    def _enter(self, group: str) -> None:
        try:
            procs = os.open(os.path.join(group, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.write(procs, b"0")
        except OSError:
            return
        finally:
            os.close(procs)
        self.inside = group
        self.last_move = time.monotonic()

    def leave(self) -> None:
        """Back to this process's own cgroup, if spawns took it into an app's."""
        if self.inside is not None:
            self.inside = None
            self._go_home()

    def _posix_spawn(
        self, argv: list[str], places: list[str], cwd: str, env: dict[str, str], fds: list[int]
    ) -> int:
        """Start ``argv`` as ``Popen(start_new_session=True)`` would, by vfork, with less work.

        Popen's own setup (its file objects, the environment encoded each time,
        its errpipe) was most of this process's CPU per spawn after the moves.
        ``posix_spawn`` closes no descriptor: every one of this process above
        stdio is close-on-exec (``_close_on_exec_above_stdio``). It has no
        ``chdir`` either (not in Python's), so this process is in ``cwd`` for the
        moment of the spawn: a bad one fails here, in a child's words.
        """
        os.chdir(cwd)
        try:
            stdio = [(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate((self.devnull, *fds))]
            try:
                return _first_that_starts(
                    places,
                    lambda place: os.posix_spawn(
                        place,
                        argv,
                        env,
                        file_actions=stdio,
                        setsid=True,
                        setsigdef=_SIGNALS_RESTORED,
                    ),
                )
            except OSError as e:
                raise OSError(e.errno, e.strerror, argv[0]) from None  # Popen's filename
        finally:
            os.chdir("/")

    def _places(self, file: str, env: dict[str, str], cwd: str) -> list[str]:
        """``_executables``, searched once per batch: a burst's replicas share their command."""
        key = (file, env.get("PATH"), cwd)
        places = self.found.get(key)
        if places is None:
            places = self.found[key] = _executables(file, env, cwd)
        return places

    def _go_home(self) -> None:
        """Leave the app's cgroup after its spawns; if that fails, never kill a cgroup again.

        (This process would be inside the one it kills.)
        """
        try:
            if self.home is None:
                raise OSError("no home cgroup")
            os.write(self.home, b"0")
            self.last_move = time.monotonic()
        except OSError:
            self.cgroup = None
            self.groups.clear()
            self.emptying.clear()

    # ---------------------------------------------------------------- reaping
    def reap(self) -> None:
        """Collect every exited child: a replica is reported, then the rest of its group killed."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            if pid in self.live:
                # Told before the group is killed and the zombie reaped, which the
                # supervisor need not wait for: its pid and group id stay this replica's
                # until the reap below, whatever the supervisor asks meanwhile.
                self.live.discard(pid)
                self.send(op="exit", pid=pid, status=_wait_status(info), at=time.time())
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def release(self, group: str) -> None:
        """An app ended: kill whatever its replicas left behind."""
        path = self.groups.pop(group, None)
        if path is not None:
            self._close_group(path)
            _kill_cgroup(path)
            self.emptying.append(path)
            self._remove_emptied()  # busy until the kill completes: retried later
            return
        # No cgroup: adopted orphans that still carry the app's id in their environment.
        needle = f"ASUPERVISOR_APP_ID={group}".encode()
        for pid in _descendants(self.me):
            if pid in self.live:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    tagged = needle in f.read().split(b"\0")
            except OSError:
                continue
            if tagged:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.reap()

    # --------------------------------------------------------------- stopping
    def stop_everything(self) -> None:
        """SIGTERM every replica group, SIGKILL after the grace, then every descendant."""
        self.leave()  # never inside a cgroup it kills
        self.flush()
        if self.live:
            for pid in self.live:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_SECONDS
            poller = select.poll()
            poller.register(self.wake, select.POLLIN)
            while self.live and (left := deadline - time.monotonic()) > 0:
                poller.poll(left * 1000)
                self.drain_wake()
                self.reap()
        for pid in list(self.live):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        paths = [*self.groups.values(), *self.emptying]
        self._close_group(None)
        for path in paths:
            _kill_cgroup(path)
        _kill_descendants(self.me)
        for path in paths:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        if self.cgroup is not None:
            # Back to where it started, so its own leaf and the base can go too.
            with contextlib.suppress(OSError):
                with open(os.path.join(os.path.dirname(self.cgroup), "cgroup.procs"), "w") as f:
                    f.write("0")
                os.rmdir(os.path.join(self.cgroup, "reaper"))
                os.rmdir(self.cgroup)
        self.live.clear()


def _enter_home(base: str) -> int | None:
    """Move this process into a leaf of its own below ``base``; its ``cgroup.procs``, or None."""
    home = os.path.join(base, "reaper")
    try:
        os.mkdir(home)
        fd = os.open(os.path.join(home, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.write(fd, b"0")
    except OSError:
        os.close(fd)
        return None
    return fd


def _wait_status(info: os.waitid_result) -> int:
    """The wait status ``waitpid`` would return for the exit ``waitid`` saw."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    if info.si_code == os.CLD_DUMPED:
        return info.si_status | 0x80
    return info.si_status  # CLD_KILLED: the signal


def _kill_cgroup(path: str) -> None:
    """Kill every process of the cgroup at ``path`` (``cgroup.kill``), where the kernel can.

    By ``os`` calls: ``open`` built a text file object and asked whether the
    file is a terminal (one ``ioctl`` and two seeks more) each time an app ended.
    """
    try:
        fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return  # gone already, or a kernel before 5.14: nothing to kill it with
    try:
        with contextlib.suppress(OSError):
            os.write(fd, b"1")
    finally:
        os.close(fd)


def _kill_descendants(me: int) -> None:
    """SIGKILL every descendant and reap, until this process has no child at all.

    A subreaper inherits whatever a killed process leaves, so repeating the
    scan ends with nothing; without the subreaper bit the scan still finds
    every process that has not yet been orphaned.
    """
    while True:
        found = _descendants(me)
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0 if found else os.WNOHANG)
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            if not found:
                return


def main() -> int:
    sock = socket.socket(fileno=0)
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    parent_fd: int | None = None
    if parent:
        try:
            parent_fd = os.pidfd_open(parent)
        except OSError:
            return 0  # the supervisor is already gone: nothing was started
        if os.getppid() != parent:
            return 0
    Reaper(sock, parent_fd, sys.argv[2] if len(sys.argv) > 2 else "").serve()
    return 0


if __name__ == "__main__":
    # Started in a session of its own, so Ctrl-C in the supervisor's terminal
    # does not reach it; it stops when the supervisor does.
    sys.exit(main())
