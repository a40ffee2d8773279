"""Run a command and keep its output in a replica log directory, on a node without the package.

Used where the supervising process cannot read a replica's pipes itself (a
Slurm node): ``python3 pump.py LOG_DIR -- COMMAND [ARGS...]``. It starts
the command with its output on two pipes and writes them, as they arrive,
through the same ``ReplicaFiles`` the local backend's writer thread uses, so
``log_iter`` reads Slurm replicas exactly like local ones (streams, combined,
since/until). This is a program of its own, not the library: it may block and
it handles the signals the job's launcher sends, passing them on to the
command, whose exit status (or death by signal) it then reproduces, and
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
        return 127

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
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
    _record_exit(log_dir, code)
    return code


EXIT_FILE = "exit.json"
"""The pump's record of how its command ended: the launcher sees only a whole job's end."""


def _record_exit(log_dir: Path, code: int) -> None:
    """Written atomically (a reader never sees half of it), for this attempt."""
    record = {
        "attempt": int(os.environ.get("ASUPERVISOR_ATTEMPT") or 0),
        "returncode": code,
        "ended": time.time(),
        # Where it ran, for a reader that never saw it running (a step that started and
        # ended between two looks of the poller): Slurm's node name, else the host's.
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
    }
    temp = log_dir / f".{EXIT_FILE}.{os.getpid()}"
    temp.write_text(json.dumps(record))
    os.replace(temp, log_dir / EXIT_FILE)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: pump.py LOG_DIR -- COMMAND [ARGS...]")
    code = run(Path(args[0]), args[2:])
    if code < 0:
        # Die the way the command died, so the launcher reports the same signal.
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)  # undo our forwarding handler first
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
