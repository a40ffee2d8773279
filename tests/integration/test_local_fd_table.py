"""A big submit grows the host's descriptor table before the replicas' pipes, off the loop.

Linux grows a multi-threaded process's table of descriptors inside the call that
opens the first descriptor that does not fit, after an RCU grace period (8-15 ms
here); the replicas' ``pipe`` calls run on the event loop's thread, so each doubling
there was a stall of the loop. Each probe runs in a fresh interpreter, whose table
starts small and holds no descriptors from other tests. The table's size is the
kernel's own (``FDSize`` in ``/proc/self/status``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# What both probes start with: every descriptor the hard limit allows, and the table's size.
PRELUDE = r"""
import resource

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as a service starting many would

def fd_table_size():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("FDSize:")).split()[1])
"""

# Submits APPS apps of N replicas (`sleep 30`) one after another, all left running
# until the last is up, with every os.pipe call of the host wrapped: a call after
# which the table is bigger than before it is one that grew it.
SUBMIT = r"""
import json, os, sys, tempfile
from pathlib import Path
import anyio
from supervisor import AppDef, Role, Supervisor

grown_in_pipe = []
real_pipe = os.pipe
def pipe():
    before = fd_table_size()
    ends = real_pipe()
    after = fd_table_size()
    if after != before:
        grown_in_pipe.append([before, after])
    return ends
os.pipe = pipe

async def main(n, apps, state_dir):
    async with Supervisor(session="fdtable", state_dir=state_dir) as sv:
        before = fd_table_size()
        role = Role(name="r", entrypoint="sleep", args=["30"], num_replicas=n)
        app = AppDef(name="many", roles=[role])
        handles = [await sv.submit(app, "local") for _ in range(apps)]
        after = fd_table_size()
        running = len(os.listdir("/proc/self/fd"))
        for handle in handles:
            await sv.cancel(handle)
        states = sorted({(await sv.wait(handle)).state.name for handle in handles})
        return {"before": before, "after": after, "running_fds": running,
                "states": states, "grown_in_pipe": grown_in_pipe}

with tempfile.TemporaryDirectory() as tmp:
    print(json.dumps(anyio.run(main, int(sys.argv[1]), int(sys.argv[2]), Path(tmp))))
"""

# make_room itself, with a second thread running (the kernel's multi-threaded case).
MAKE_ROOM = r"""
import json, os, threading
from supervisor.backends.local.fdtable import make_room

stop = threading.Event()
waiter = threading.Thread(target=stop.wait)
waiter.start()
low = os.open("/", os.O_RDONLY)
os.close(low)
out = {"low": low, "hard": hard, "size_before": fd_table_size()}
make_room(1000)
out["size_after"] = fd_table_size()
make_room(10)
out["size_after_small"] = fd_table_size()
# A descriptor in use exactly where make_room(2000) asks for one.
held = os.dup2(0, low + 2000, inheritable=False)
held_id = os.fstat(held)[:2]
open_before = sorted(os.listdir("/proc/self/fd"))
make_room(2000)
out["held_unchanged"] = os.fstat(held)[:2] == held_id
out["same_open"] = sorted(os.listdir("/proc/self/fd")) == open_before
# No descriptor left under the limit: nothing to grow, and nothing raised.
free = os.open("/", os.O_RDONLY)
os.close(free)
resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))
try:
    make_room(10)
    out["full_quiet"] = True
except OSError:
    out["full_quiet"] = False
# Room again before the thread ends: its exit loads a library (pthread_exit's unwinder).
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
stop.set()
waiter.join()
print(json.dumps(out))
"""


def _run(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_big_submit_grows_the_table_before_any_pipe_would() -> None:
    replicas = 300
    out = _run(SUBMIT, str(replicas), "1")
    assert out["states"] == ["CANCELLED"]
    assert out["grown_in_pipe"] == [], "a pipe on the event loop's thread grew the table"
    # It did have to grow: the replicas held more descriptors than the table had at first.
    assert isinstance(out["running_fds"], int) and out["running_fds"] > 2 * replicas
    assert isinstance(out["before"], int) and isinstance(out["after"], int)
    assert out["before"] < out["running_fds"] <= out["after"]


def test_small_apps_one_after_another_grow_the_table_before_any_pipe_would() -> None:
    """Ten-replica apps while the earlier ones run: the table has holes (ended pipes' write
    ends), and the room counted from the lowest free descriptor alone fell short: the
    table grew inside a pipe at 256 and at 512 descriptors."""
    replicas, apps = 10, 30
    out = _run(SUBMIT, str(replicas), str(apps))
    assert out["states"] == ["CANCELLED"]
    assert out["grown_in_pipe"] == [], "a pipe on the event loop's thread grew the table"
    # Two doublings at least happened while the apps started (the table starts at 256 or less).
    assert isinstance(out["running_fds"], int) and out["running_fds"] > 2 * replicas * apps > 512
    assert isinstance(out["after"], int) and out["after"] >= 1024


def test_make_room_grows_once_touches_no_descriptor_in_use_and_never_raises() -> None:
    out = _run(MAKE_ROOM)
    low, before, after = out["low"], out["size_before"], out["size_after"]
    assert isinstance(low, int) and isinstance(before, int) and isinstance(after, int)
    assert isinstance(out["hard"], int) and out["hard"] > low + 2000, "too few descriptors allowed"
    assert before <= 1000 < after
    assert after > low + 1000
    assert out["held_unchanged"] is True, "the descriptor at the asked-for slot was replaced"
    assert out["same_open"] is True, "a descriptor was left open (or closed)"
    assert out["size_after_small"] == after, "room that was there already grew the table"
    assert out["full_quiet"] is True, "with no descriptor left, make_room raised"
