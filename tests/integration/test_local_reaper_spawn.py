"""The reaper's ways of starting a replica inside its app's cgroup agree.

Where ``_cspawn.c`` was built, every spawn is cloned straight into the cgroup
(clone3 with CLONE_INTO_CGROUP), the child sharing the reaper's memory until
the exec ("vfork"). Without it, a spawn that comes alone is cloned by a fork of
the reaper from Python ("clone"), and one of a burst, or one shortly after
another, steps the reaper into the cgroup for ``posix_spawn`` ("move"). Which
one runs is a cost decision (see ``Reaper.spawn``), so all must give the same
result: the replica inside the app's cgroup, in a session of its own, with the
given cwd, environment, output and no other descriptor, and the same words
when it cannot start.

The reaper's code runs in a child interpreter (``python -I -S``, as the real
reaper does) because it sets signal dispositions of the process it runs in.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from supervisor.backends.local.reaper_client import _cspawn_path

pytestmark = pytest.mark.integration

REAPER = Path(__file__).resolve().parents[2] / "supervisor/backends/local/reaper.py"

# The real reaper's code, loaded from its file as the reaper script is, with a socket
# pair for the supervisor's side (the probes below answer its sends themselves).
REAPER_HERE = r"""
import importlib.util, json, os, socket, sys
spec = importlib.util.spec_from_file_location("reaper", sys.argv[1])
reaper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reaper)
# A descriptor the reaper's process was started with, open across exec: no replica gets it.
leaky = os.open(os.devnull, os.O_RDONLY)
os.set_inheritable(leaky, True)
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
r = reaper.Reaper(ours, None, os.environ["CSPAWN"])
# Which way started each replica: "vfork" (clone3 into the cgroup from C), "clone"
# (the same from Python) or "move" (posix_spawn).
taken = []
_into, _inside = r._spawn_into, r._spawn_inside
def _spy_into(*args):
    pid = _into(*args)
    if pid is not None:
        taken.append("clone" if r.cspawn is None else "vfork")
    return pid
def _spy_inside(*args):
    taken.append("move")
    return _inside(*args)
r._spawn_into, r._spawn_inside = _spy_into, _spy_inside
"""

# For probes that speak the supervisor's side of the socket themselves: ``queue`` a
# message (with a pipe's write end as both output descriptors), and the name of the
# cgroup a process is in.
SUPERVISOR_SIDE = r"""
import array
def queue(msg):
    read_end, write_end = os.pipe()
    theirs.sendmsg([json.dumps(msg).encode()],
                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end] * 2))])
    os.close(read_end)
    os.close(write_end)
def cgroup(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read().strip().rsplit("/", 1)[-1]
"""

# Spawns replicas through the real reaper code, one way forced each time, and prints
# what each replica (or the failure) looked like.
PROBE = (
    REAPER_HERE
    + r"""
sent = []
r.send = lambda **msg: sent.append(msg)
out = {"cgroup": r.cgroup, "runs": []}
SHOW = ("echo $$ $(cut -d: -f3 /proc/self/cgroup | tail -n1) $(cut -d' ' -f6 /proc/$$/stat)"
        " $PWD $PROBE_VAR $(grep -E '^Sig(Blk|Ign)' /proc/$$/status | cut -f2); ls /proc/$$/fd")
plain = sys.argv[2]
here = os.path.dirname(plain)
cases = [
    ("ok", ["sh", "-c", SHOW], "/tmp", os.defpath),
    ("missing", ["no-such-program-here"], "/tmp", os.defpath),
    ("bad-cwd", ["sh", "-c", "true"], "/no/such/dir", os.defpath),
    ("not-executable", [plain], "/tmp", os.defpath),
    # A bad cwd is said before a command that is nowhere (the child's chdir comes first).
    ("missing-and-bad-cwd", ["no-such-program-here"], "/no/such/dir", os.defpath),
    # Not executable where PATH finds it first: the next place's runs.
    ("found-later", ["plain-file", "-c", "echo $PROBE_VAR"], "/tmp", f"{here}:{sys.argv[3]}"),
    # Nowhere, the last place not a directory: its error, "not a directory", is said.
    ("nowhere-last-not-a-dir", ["no-such-program-here"], "/tmp", f"/nonexistent:{plain}"),
]
built = r.cspawn
for way in ("vfork", "clone", "move"):
    for i, (name, argv, cwd, path) in enumerate(cases):
        r.cspawn = built if way == "vfork" else None
        r.clone_into = way != "move"
        r.last_move = float("-inf")  # a quiet while since the last move
        read_end, write_end = os.pipe()
        sent.clear()
        msg = {"id": i, "argv": argv, "cwd": cwd, "group": f"{way}-{i}", "alone": True,
               "env": {"PATH": path, "PROBE_VAR": f"{way}-{name}"}}
        given = [write_end, os.dup(write_end)]
        r.spawn(msg, given)
        for fd in given:
            os.close(fd)
        reply = sent[-1]
        line = ""
        if reply["op"] == "spawned":
            line = b"".join(iter(lambda: os.read(read_end, 4096), b"")).decode().strip()
            os.waitpid(reply["pid"], 0)
            r.live.discard(reply["pid"])
        os.close(read_end)
        out["runs"].append({"way": way, "case": name, "reply": reply, "line": line,
                            "group": r.groups.get(f"{way}-{i}"),
                            "taken": taken[-1] if taken else ""})
        taken.clear()
        r.leave()  # as at the end of a batch
r.stop_everything()
print(json.dumps(out))
"""
)


def _probe(tmp_path: Path) -> dict[str, object]:
    plain = tmp_path / "plain-file"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    later = tmp_path / "later"  # a program of the same name, further along a PATH
    later.mkdir()
    (later / "plain-file").symlink_to("/bin/sh")
    result: dict[str, object] = _run_probe(PROBE, str(plain), str(later))
    return result


def _run_probe(probe: str, *args: str) -> Any:
    """Run ``probe`` in a child interpreter as the reaper runs (``-I -S``), with the reaper's
    file as its first argument; what it printed, as JSON."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(REAPER), *args],
        env={**os.environ, "CSPAWN": _cspawn_path()},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def _run_cgroup_probe(probe: str) -> Any:
    """``_run_probe`` for a probe of the reaper's cgroups (its output has ``cgroup``):
    skipped where the reaper has none."""
    out = _run_probe(probe)
    if out["cgroup"] is None:
        pytest.skip("no writable cgroup v2 here (needs root): the reaper spawns without one")
    return out


WAYS = ("vfork", "clone", "move")


def test_the_spawn_in_c_was_built() -> None:
    """The install builds ``_cspawn.c`` where it can (x86-64 Linux with a C compiler),
    and the vfork way below needs it: without it the tests of that way would pass on
    the fork from Python instead."""
    if platform.machine() != "x86_64":
        pytest.skip(f"_cspawn.c has no clone3 for {platform.machine()}: the fork from Python")
    assert _cspawn_path(), "supervisor/backends/local/_cspawn.c was not built (a C compiler?)"


def test_every_way_starts_the_replica_inside_its_cgroup_and_fails_alike(tmp_path: Path) -> None:
    out = _probe(tmp_path)
    if out["cgroup"] is None:
        pytest.skip("no writable cgroup v2 here (needs root): the reaper spawns without one")
    runs = {(r["way"], r["case"]): r for r in out["runs"]}  # type: ignore[attr-defined]
    for way in WAYS:
        ok = runs[way, "ok"]
        assert ok["reply"]["op"] == "spawned", ok
        shown, *fds = ok["line"].splitlines()
        pid, cgroup, sid, cwd, var, blocked, ignored = shown.split()
        # Its own session, its app's cgroup, the cwd and environment it was given.
        assert int(pid) == ok["reply"]["pid"] and int(sid) == int(pid)
        assert ok["group"].endswith(cgroup), (ok["group"], cgroup)
        assert (cwd, var) == ("/tmp", f"{way}-ok")
        # No signal blocked, none of the standard ones ignored: not SIGPIPE or SIGXFSZ,
        # which Python ignores. (glibc's posix_spawn leaves its own two internal
        # signals, 32 and 33, ignored; a program's C library sets them up again.)
        assert int(blocked, 16) == 0, (way, blocked)
        assert int(ignored, 16) & ((1 << 31) - 1) == 0, (way, ignored)
        # Its stdio and nothing else: not the reaper's socket, pipes or inherited ones.
        assert fds == ["0", "1", "2"], (way, fds)
    # Past a place where it cannot run, the next place's program runs, either way.
    for way in WAYS:
        later = runs[way, "found-later"]
        assert later["reply"]["op"] == "spawned", later
        assert later["line"] == f"{way}-found-later"
    # Which way ran.
    for way in WAYS:
        assert runs[way, "ok"]["taken"] == way
    # The same failures, in the same words, whichever way was taken.
    for case, errno_, words in [
        ("missing", 2, "No such file or directory"),
        ("bad-cwd", 2, "No such file or directory: /no/such/dir"),
        ("not-executable", 13, "Permission denied"),
        ("missing-and-bad-cwd", 2, "No such file or directory: /no/such/dir"),
        ("nowhere-last-not-a-dir", 20, "Not a directory"),
    ]:
        replies = [runs[way, case]["reply"] for way in WAYS]
        assert replies[0] == replies[1] == replies[2], replies
        assert replies[0]["op"] == "failed"
        assert (replies[0]["errno"], replies[0]["error"]) == (errno_, words)


# The same spawns, asked the way the supervisor asks them, and which way each took.
SPAWN_SEQUENCE = r"""
r.send = lambda **msg: None
ways = []
def spawn(i, alone=True):
    read_end, write_end = os.pipe()
    r.spawn({"id": i, "argv": ["true"], "cwd": "/", "group": f"g{i}", "alone": alone,
             "env": {"PATH": os.defpath}}, [write_end, os.dup(write_end)])
    r.leave()  # as at the end of a batch
    os.close(read_end)
    ways.append(taken.pop())
# The quiet while is set, not slept: a loaded machine must not decide the way taken.
spawn(0)                        # alone, after a quiet while
theirs.send(b"{}")              # another message waits: a burst
spawn(1)
ours.recv(16)
quiet = reaper.MOVES_STAY_CHEAP_S
reaper.MOVES_STAY_CHEAP_S = 3600.0
spawn(2)                        # a move happened just now (spawn 1's, if it moved)
reaper.MOVES_STAY_CHEAP_S = quiet
r.last_move = float("-inf")
spawn(3)                        # quiet again
r.last_move = float("-inf")
spawn(4, alone=False)           # the supervisor starts others with it
r.last_move = float("-inf")
reaper.MOVES_STAY_CHEAP_S = 3600.0  # however long the machine keeps this process waiting
r.warm()                        # a burst was announced
warm_moved = r.last_move != float("-inf")
spawn(5)
reaper.MOVES_STAY_CHEAP_S = quiet
print(json.dumps({"cgroup": r.cgroup, "ways": ways, "warm_moved": warm_moved}))
r.stop_everything()
"""


def test_with_the_spawn_in_c_every_spawn_is_cloned_into_its_cgroup_and_nothing_moves() -> None:
    """Where ``_cspawn.c`` was built, a burst's spawns are cloned into their cgroup too
    (0.3 ms each, against 0.35 ms for ``posix_spawn`` after a move), and the reaper
    never moves: not for a spawn, not to ``warm`` (the first move after a quiet while
    waits 5-15 ms for the kernel, and held back the first spawn of every burst)."""
    if not _cspawn_path():
        pytest.skip("_cspawn.c was not built here (see test_the_spawn_in_c_was_built)")
    out = _run_probe(REAPER_HERE + SPAWN_SEQUENCE)
    if out["cgroup"] is None:
        pytest.skip("no writable cgroup v2 here (needs root): the reaper spawns without one")
    assert out["ways"] == ["vfork"] * 6
    assert out["warm_moved"] is False


def test_without_the_spawn_in_c_a_spawn_of_a_burst_moves_instead_of_forking_the_reaper() -> None:
    """Without ``_cspawn.c`` a clone is a fork of the whole reaper from Python (2.4-2.8
    ms): only a spawn that comes alone after a quiet while takes it. With other replicas
    starting, another message queued, or a move moments ago (a spawn's, or the ``warm``
    that announces a burst), the reaper moves into the cgroup for a vfork instead (one
    move pays for the burst)."""
    out = _run_probe(REAPER_HERE + "r.cspawn = None\n" + SPAWN_SEQUENCE)
    if out["cgroup"] is None:
        pytest.skip("no writable cgroup v2 here (needs root): the reaper spawns without one")
    assert out["ways"] == ["clone", "move", "move", "clone", "move", "move"]
    assert out["warm_moved"] is True


def test_the_replies_to_a_burst_go_out_together_after_its_spawns() -> None:
    """Spawns queued together are answered together, after the last of them is started:
    one wake-up of the supervisor per burst rather than one per replica. Every reply
    still names its own replica, and a lone spawn is answered as soon as it is done."""
    probe = (
        REAPER_HERE
        + r"""
import array
sent_at = []  # replicas started when each datagram went out
class Counted:
    # The reaper's socket, counting what it has started whenever it sends.
    def __init__(self, sock):
        self.sock = sock
    def send(self, data, flags=0):
        sent_at.append(len(r.live))
        return self.sock.send(data, flags)
    def __getattr__(self, name):
        return getattr(self.sock, name)
r.sock = Counted(ours)
def queue(i):
    read_end, write_end = os.pipe()
    theirs.sendmsg([json.dumps({"op": "spawn", "id": i, "argv": ["true"], "cwd": "/",
                                "env": {"PATH": os.defpath}}).encode()],
                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end] * 2))])
    os.close(read_end)
    os.close(write_end)
for i in range(5):
    queue(i)
r.receive_batch()
burst = list(sent_at)
replies = [json.loads(theirs.recv(4096)) for _ in range(5)]
sent_at.clear()
queue(5)
r.receive_batch()
lone = list(sent_at)
replies.append(json.loads(theirs.recv(4096)))
print(json.dumps({"burst": burst, "lone": lone, "replies": replies}))
r.stop_everything()
"""
    )
    out = _run_probe(probe)
    # Without holding them, the first reply left with one replica started: [1, 2, 3, 4, 5].
    assert out["burst"] == [5, 5, 5, 5, 5]
    assert out["lone"] == [6]
    assert [(m["op"], m["id"]) for m in out["replies"]] == [("spawned", i) for i in range(6)]
    assert len({m["pid"] for m in out["replies"]}) == 6


@pytest.mark.parametrize("spawn_in_c", [False, True], ids=["moves", "clones"])
def test_the_spawns_of_a_batch_share_one_move_into_their_cgroup(spawn_in_c: bool) -> None:
    """Without ``_cspawn.c``, the reaper steps into an app's cgroup once for the spawns
    of one batch, not twice per replica, and is back in its own before anything else:
    another app's spawn, a kill, the batch's end. With it, the reaper never moves.
    Either way every replica is born in its own app's cgroup."""
    if spawn_in_c and not _cspawn_path():
        pytest.skip("_cspawn.c was not built here (see test_the_spawn_in_c_was_built)")
    probe = (
        REAPER_HERE
        + ("" if spawn_in_c else "r.cspawn = None\n")
        + SUPERVISOR_SIDE
        + r"""
moves = []
enter, go_home = r._enter, r._go_home
r._enter = lambda group: (moves.append("enter " + os.path.basename(group)), enter(group))[1]
r._go_home = lambda: (moves.append("home"), go_home())[1]
def spawn(i, group):
    queue({"op": "spawn", "id": i, "argv": ["sleep", "30"], "cwd": "/", "group": group,
           "env": {"PATH": os.defpath}})
spawn(0, "g")
spawn(1, "g")
spawn(2, "h")
queue({"op": "kill", "pids": [], "sig": 0})
spawn(3, "g")
r.receive_batch()
replies = [json.loads(theirs.recv(4096)) for _ in range(4)]
print(json.dumps({"cgroup": r.cgroup, "moves": moves, "replies": replies,
                  "in": [cgroup(m["pid"]) for m in replies if m["op"] == "spawned"],
                  "reaper_in": cgroup("self")}))
r.stop_everything()
"""
    )
    out = _run_cgroup_probe(probe)
    assert [m["op"] for m in out["replies"]] == ["spawned"] * 4, out["replies"]
    assert out["in"] == ["app-g", "app-g", "app-h", "app-g"]
    if spawn_in_c:
        assert out["moves"] == []
    else:
        assert out["moves"] == ["enter app-g", "home", "enter app-h", "home", "enter app-g", "home"]
    assert out["reaper_in"] == "reaper"


@pytest.mark.parametrize("spawn_in_c", [False, True], ids=["moves", "clones"])
def test_an_app_under_the_id_of_an_ended_one_gets_a_cgroup_nobody_killed(spawn_in_c: bool) -> None:
    """An app submitted again under an ended app's id, while what the ended one left
    behind is still dying, gets a cgroup of its own: the old one had ``cgroup.kill``
    written, and a process cloned into a cgroup once killed is SIGKILLed at birth
    (Linux 6.18). Once the old cgroup is empty it is removed, and the name is free.

    Leftovers die within milliseconds of the kill, too soon to submit again in
    between on demand; a process moved into the killed cgroup by the test (moving
    in kills nothing) keeps it busy as long as the test needs instead."""
    if spawn_in_c and not _cspawn_path():
        pytest.skip("_cspawn.c was not built here (see test_the_spawn_in_c_was_built)")
    probe = (
        REAPER_HERE
        + ("" if spawn_in_c else "r.cspawn = None\n")
        + SUPERVISOR_SIDE
        + r"""
import subprocess, time
def spawn(i, argv, group="g"):
    queue({"op": "spawn", "id": i, "argv": argv, "cwd": "/", "group": group,
           "env": {"PATH": os.defpath}})
    r.receive_batch()
    return json.loads(theirs.recv(4096))
def alive_after(pid, seconds):
    time.sleep(seconds)
    return os.waitpid(pid, os.WNOHANG) == (0, 0)
out = {"cgroup": r.cgroup}
straggler = None
try:  # the reaper stops what it started, and its cgroups go, even if a step fails
    if r.cgroup is not None:
        ended = spawn(0, ["sleep", "30"])
        old = r.groups["g"]
        out["ended_in"] = cgroup(ended["pid"])
        r.release("g")  # the app ended: its cgroup killed
        os.waitpid(ended["pid"], 0)
        if not os.path.isdir(old):  # it emptied at once: made again, and killed as ``release`` did
            os.mkdir(old)
            with open(os.path.join(old, "cgroup.kill"), "w") as f:
                f.write("1")
        straggler = subprocess.Popen(["sleep", "30"])
        with open(os.path.join(old, "cgroup.procs"), "w") as f:
            f.write(str(straggler.pid))
        if old not in r.emptying:
            r.emptying.append(old)  # as ``release`` leaves a cgroup whose leftovers were dying
        again = spawn(1, ["sleep", "30"])
        out["again_in"] = cgroup(again["pid"])
        out["again_alive"] = alive_after(again["pid"], 0.3)
        straggler.kill()
        straggler.wait()
        straggler = None
        other = spawn(3, ["sleep", "30"], group="g.1")  # an app whose id takes that name
        out["other_in"] = cgroup(other["pid"])
        r.release("g.1")
        os.waitpid(other["pid"], 0)
        r.release("g")
        os.waitpid(again["pid"], 0)
        third = spawn(2, ["sleep", "30"])
        out["third_in"] = cgroup(third["pid"])
        out["third_alive"] = alive_after(third["pid"], 0.3)
        out["left_after"] = [os.path.basename(p) for p in r.emptying]
finally:
    if straggler is not None:
        straggler.kill()
        straggler.wait()
    r.stop_everything()
print(json.dumps(out))
"""
    )
    out = _run_cgroup_probe(probe)
    assert out["ended_in"] == "app-g"
    assert out["again_in"] == "app-g.1"
    assert out["again_alive"], "the replica of the app submitted again was killed at birth"
    assert out["other_in"] == "app-g.1.1"
    # Both emptied meanwhile: removed as the next app's cgroup was made, the name free.
    assert out["third_in"] == "app-g"
    assert out["third_alive"]
    assert out["left_after"] == []


def test_a_new_cgroup_is_populated_once_before_its_first_replica_and_nothing_stays() -> None:
    """Where ``_cspawn.c`` was built, the reaper has each new app's cgroup populated
    once, by a child of its own that exits at once, before the app's first replica is
    cloned into it: that replica's spawn no longer waits behind the kernel worker the
    first process of a cgroup wakes (see ``Reaper._populate``; the time saved is in
    docs/benchmarks.md, not asserted here). The child is reaped before the spawn: the
    reaper keeps no child of it, not even a zombie, and the cgroup holds the replicas
    alone. An app's later replicas, and a later batch of the same app, make none."""
    if not _cspawn_path():
        pytest.skip("_cspawn.c was not built here (see test_the_spawn_in_c_was_built)")
    probe = (
        REAPER_HERE
        + SUPERVISOR_SIDE
        + r"""
def children():
    mine = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == mine:
                found.add((int(entry), fields[0]))
    return found
def procs(path):
    with open(os.path.join(path, "cgroup.procs")) as f:
        return f.read().split()
calls = []
populate = r.cspawn.populate
def spy(fd):
    path = os.readlink(f"/proc/self/fd/{fd}")
    before = (procs(path), {pid for pid, state in children()})
    result = populate(fd)
    calls.append({"group": os.path.basename(path), "result": result,
                  "procs_before": before[0], "procs_after": procs(path),
                  "children_kept": before[1] == {pid for pid, state in children()}})
    return result
r.cspawn = r.cspawn._replace(populate=spy)
def spawn(i, group):
    queue({"op": "spawn", "id": i, "argv": ["sleep", "30"], "cwd": "/", "group": group,
           "env": {"PATH": os.defpath}})
out = {"cgroup": r.cgroup}
try:
    if r.cgroup is not None:
        spawn(0, "g")
        spawn(1, "g")
        spawn(2, "h")
        r.receive_batch()
        spawn(3, "g")  # a later batch of an app whose cgroup is made
        r.receive_batch()
        replies = [json.loads(theirs.recv(4096)) for _ in range(4)]
        out["replies"] = [m["op"] for m in replies]
        pids = [m["pid"] for m in replies if m["op"] == "spawned"]
        out["in"] = [cgroup(pid) for pid in pids]
        out["g"] = sorted(int(p) for p in procs(r.groups["g"]))
        out["h"] = sorted(int(p) for p in procs(r.groups["h"]))
        out["pids"] = pids
        out["children"] = sorted(pid for pid, state in children())
        out["zombies"] = [pid for pid, state in children() if state == "Z"]
        out["calls"] = calls
finally:
    r.stop_everything()
print(json.dumps(out))
"""
    )
    out = _run_cgroup_probe(probe)
    assert out["replies"] == ["spawned"] * 4
    assert out["in"] == ["app-g", "app-g", "app-h", "app-g"]
    # Once per new cgroup, while it was still empty, and empty again at its return.
    assert [c["group"] for c in out["calls"]] == ["app-g", "app-h"]
    for call in out["calls"]:
        assert call["result"] == 0, call
        assert call["procs_before"] == [] and call["procs_after"] == [], call
        assert call["children_kept"], call
    # The cgroups hold the replicas alone; the reaper's children are the replicas alone.
    pids = out["pids"]
    assert out["g"] == sorted([pids[0], pids[1], pids[3]])
    assert out["h"] == [pids[2]]
    assert out["children"] == sorted(pids)
    assert out["zombies"] == []


def test_a_cgroup_directory_is_opened_once_for_the_spawns_into_it_and_not_kept_for_long() -> None:
    """The reaper keeps the cgroup directory it last cloned into open for the next spawn
    into it (an app's replicas come one after another; a lone replica's populate and
    spawn share it): opened once per run of spawns into one app's cgroup, never more
    than one held, and none once the app is released, however many apps run."""
    if not _cspawn_path():
        pytest.skip("_cspawn.c was not built here (see test_the_spawn_in_c_was_built)")
    probe = (
        REAPER_HERE
        + SUPERVISOR_SIDE
        + r"""
opened = []
real_open = os.open
def counting_open(path, flags, *args):
    fd = real_open(path, flags, *args)
    if flags & os.O_DIRECTORY and r.cgroup and str(path).startswith(r.cgroup):
        opened.append(os.path.basename(path))
    return fd
os.open = counting_open
def held():
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if r.cgroup and target.startswith(r.cgroup + "/app-"):
            found.append(os.path.basename(target))
    return sorted(found)
def spawn(i, group):
    queue({"op": "spawn", "id": i, "argv": ["sleep", "30"], "cwd": "/", "group": group,
           "env": {"PATH": os.defpath}})
    r.receive_batch()
    return json.loads(theirs.recv(4096))
out = {"cgroup": r.cgroup}
try:
    if r.cgroup is not None:
        pids = [spawn(0, "g")["pid"], spawn(1, "g")["pid"]]
        out["held_g"] = held()
        pids += [spawn(2, "h")["pid"], spawn(3, "g")["pid"]]
        out["opened"] = opened
        out["held"] = held()
        r.release("g")
        out["held_after_g"] = held()
        r.release("h")
        out["held_after_h"] = held()
        for pid in pids:
            os.waitpid(pid, 0)
finally:
    r.stop_everything()
print(json.dumps(out))
"""
    )
    out = _run_cgroup_probe(probe)
    assert out["opened"] == ["app-g", "app-h", "app-g"]
    assert out["held_g"] == ["app-g"]
    assert out["held"] == ["app-g"]
    assert out["held_after_g"] == []
    assert out["held_after_h"] == []


@pytest.mark.anyio
async def test_an_app_of_several_replicas_announces_its_burst_before_the_spawns(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor asks the reaper to ``warm`` before an app of several replicas is
    spawned (once as it begins, once its records are written), never for a lone replica,
    whose spawn takes the clone3 way instead."""
    from supervisor import AppDef, Role, Supervisor
    from supervisor.backends.local import reaper_client

    ops: list[str] = []
    send = reaper_client._Connection.send

    def spy(self: Any, msg: Mapping[str, object], *args: Any, **kwargs: Any) -> None:
        ops.append(str(msg["op"]))
        send(self, msg, *args, **kwargs)

    monkeypatch.setattr(reaper_client._Connection, "send", spy)

    def app(replicas: int) -> AppDef:
        return AppDef(name="a", roles=[Role(name="r", entrypoint="true", num_replicas=replicas)])

    async with Supervisor(session="warm") as sv:
        lone = await sv.submit(app(1), "local")
        await sv.wait(lone)
        lone_ops = [op for op in ops if op in ("warm", "spawn")]
        ops.clear()
        several = await sv.submit(app(3), "local")
        await sv.wait(several)
    assert lone_ops == ["spawn"]
    assert [op for op in ops if op in ("warm", "spawn")] == ["warm", "warm", *["spawn"] * 3]
