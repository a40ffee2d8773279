"""Run a command and keep its output in a replica log directory, on a node without the package.

Used where the supervising process cannot read a replica's pipes itself (a
Slurm node): ``python3 pump.py LOG_DIR -- COMMAND [ARGS...]``. It starts
the command with its output on two pipes and writes them, as they arrive,
through the same ``ReplicaFiles`` the local backend's writer thread uses, so
``log_iter`` reads Slurm replicas exactly like local ones (streams, combined,
since/until). This is a program of its own, not the library: it may block and
it passes on to the command the signals sent to it alone (Slurm's own reach
the command directly), whose exit status (or death by signal) it then reproduces, and
records in ``exit.json``: Slurm reports a heterogeneous job's exit code on
every component, so only this record says which replica failed, and when.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from supervisor.logs.files import ReplicaFiles, StreamName

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)


INHERITED_FD_VARS = ("PMI_FD",)
"""Variables naming a descriptor the command must inherit: Slurm's ``--mpi=pmi2`` gives each
task its PMI connection as ``PMI_FD``, which a rank behind the pump must still have open."""


def inherited_fds() -> tuple[int, ...]:
    """The open descriptors named by :data:`INHERITED_FD_VARS` (kept open in the command)."""
    out = []
    for name in INHERITED_FD_VARS:
        try:
            fd = int(os.environ.get(name, ""))
            os.fstat(fd)
        except (ValueError, OSError):
            continue
        out.append(fd)
    return tuple(out)


def run(log_dir: Path, argv: list[str]) -> int:
    """Returns the command's wait status as Popen gives it (negative: killed by that signal)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    files = ReplicaFiles(log_dir)
    started = time.time()
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=inherited_fds(),
        )
    except OSError as e:
        files.record(
            "stderr", f"asupervisor: cannot start {argv[0]!r}: {e}\n".encode(), time.time()
        )
        files.flush_partial("stderr")
        files.close_files()
        _record_exit(log_dir, 127, started)
        return 127

    # From here the forwarded signals wait for the forwarding thread (sigwaitinfo), which
    # learns who sent each one. Blocked only now: the command was started with none blocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    threading.Thread(target=_forward, args=(child,), name="forward", daemon=True).start()
    # Only now: a signal the step gets while this is written must not end the pump first.
    _record(log_dir, START_FILE, {"attempt": _attempt(), "started": started})
    selector = selectors.DefaultSelector()
    assert child.stdout is not None
    assert child.stderr is not None
    streams: dict[int, StreamName] = {
        child.stdout.fileno(): "stdout",
        child.stderr.fileno(): "stderr",
    }
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    while streams:
        for key, _ in selector.select():
            fd = int(key.fd)
            data = os.read(fd, 1 << 16)
            if data:
                files.record(streams[fd], data, time.time())
            else:
                selector.unregister(fd)
                files.flush_partial(streams.pop(fd))
    selector.close()
    child.stdout.close()
    child.stderr.close()
    code = child.wait()
    files.close_files()
    _record_exit(log_dir, code, started)
    return code


def _forward(child: subprocess.Popen[bytes]) -> None:
    """Pass each forwarded signal on to the command, unless our parent sent it.

    Our parent is Slurm's step daemon, and it signals every process of the step
    (the whole tree, the cgroup or the process group, whichever tracking the
    cluster uses): the command got that signal already, and a second one could run
    its handler twice (a TERM trap that prints would print twice). Anyone else who
    signals this process (``kill PID``) reaches the command through here.
    """
    parent = os.getppid()
    while True:
        info = signal.sigwaitinfo(FORWARDED)
        if info.si_pid != parent and child.poll() is None:
            child.send_signal(info.si_signo)


EXIT_FILE = "exit.json"
"""The pump's record of how its command ended: the launcher sees only a whole job's end."""
START_FILE = "start.json"
"""The pump's record of when it started its command: a poll sees a start up to its interval
late (longer after a long wait in the queue)."""


def _attempt() -> int:
    return int(os.environ.get("ASUPERVISOR_ATTEMPT") or 0)


def _record(log_dir: Path, name: str, record: dict[str, object]) -> None:
    """Written atomically (a reader never sees half of it)."""
    temp = log_dir / f".{name}.{os.getpid()}"
    temp.write_text(json.dumps(record))
    os.replace(temp, log_dir / name)


def _record_exit(log_dir: Path, code: int, started: float) -> None:
    """How this attempt ended (its start again, for a reader that never saw it start)."""
    record: dict[str, object] = {
        "attempt": _attempt(),
        "returncode": code,
        "started": started,
        "ended": time.time(),
        # Where it ran, for a reader that never saw it running (a step that started and
        # ended between two looks of the poller): Slurm's node name, else the host's.
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
    }
    _record(log_dir, EXIT_FILE, record)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: pump.py LOG_DIR -- COMMAND [ARGS...]")
    code = run(Path(args[0]), args[2:])
    if code < 0:
        # Die the way the command died, so the launcher reports the same signal: sent to
        # this thread, with that signal's default action and no longer blocked here.
        sig = signal.Signals(-code)
        if sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        signal.pthread_kill(threading.get_ident(), sig)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
