"""What reaches a docker replica: env and macros, peers by name, resources, mounts; and its logs.

Every test runs on dockerd and on Podman and fails if it leaves a container
or network behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import (
    AppDef,
    AppState,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    Supervisor,
    VolumeMount,
)

from .docker_engines import (
    IMAGE,
    EngineUnderTest,
    api,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]


def py(name: str, code: str, *args: str, **kw: Any) -> Role:
    return Role(name=name, image=IMAGE, entrypoint="python3", args=["-c", code, *args], **kw)


async def stdout(sv: Supervisor, handle: str, role: str, k: int = 0) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, streams="stdout")]


REPORT = (
    "import json, os, socket, sys;"
    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items()"
    " if k.startswith(('ASUPERVISOR_', 'TORCHX_', 'MY_', 'PET_', 'TORCHELASTIC'))},"
    " 'host': socket.gethostname()}))"
)


async def test_env_macros_and_args_reach_each_replica(engine: EngineUnderTest) -> None:
    hostile = "$(touch /tmp/pwned) `id`; 'q' \"d\" $HOME"
    role = py(
        "trainer",
        REPORT,
        "${app_id}",
        "${replica_id}",
        "${rank0_env}",
        hostile,
        env={"MY_VAR": "r${replica_id}", "MY_TRICKY": "a,b=c;$(id)"},
        num_replicas=2,
    )
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("env", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        app_id = handle.rsplit("/", 1)[1]
        rank0 = f"{app_id}-trainer-0"
        for k in (0, 1):
            (line,) = await stdout(sv, handle, "trainer", k)
            seen = json.loads(line)
            assert seen["argv"] == [app_id, str(k), "TORCHX_RANK0_HOST", hostile]
            env = seen["env"]
            assert env["MY_VAR"] == f"r{k}" and env["MY_TRICKY"] == "a,b=c;$(id)"
            assert env["ASUPERVISOR_REPLICA_ID"] == str(k)
            assert env["ASUPERVISOR_NUM_REPLICAS"] == "2"
            assert env["ASUPERVISOR_ROLE"] == "trainer"
            assert env["ASUPERVISOR_ATTEMPT"] == "0"
            assert env["TORCHX_RANK0_HOST"] == rank0 == env["ASUPERVISOR_RANK0_HOST"]
            assert seen["host"] == f"{app_id}-trainer-{k}"


RENDEZVOUS = """
import os, socket, sys, time
rank0 = os.environ["TORCHX_RANK0_HOST"]
if os.environ["ASUPERVISOR_REPLICA_ID"] == "0":
    srv = socket.create_server(("", 5000))
    conn, _ = srv.accept()
    print("rank0 got", conn.recv(100).decode(), flush=True)
    conn.sendall(b"welcome")
else:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((rank0, 5000), timeout=5)
            break
        except OSError:  # not listening yet, or a name lookup that failed once (EAI_AGAIN)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(b"hello from " + socket.gethostname().encode())
    print("rank1 got", conn.recv(100).decode(), flush=True)
"""


async def test_replicas_rendezvous_by_name_on_the_internal_network(
    engine: EngineUnderTest,
) -> None:
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(
            AppDef("dns", [py("w", RENDEZVOUS, num_replicas=2)]), "docker", engine.cfg
        )
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.SUCCEEDED, status
        app_id = handle.rsplit("/", 1)[1]
        assert await stdout(sv, handle, "w", 0) == [f"rank0 got hello from {app_id}-w-1\n"]
        assert await stdout(sv, handle, "w", 1) == ["rank1 got welcome\n"]


@pytest.mark.parametrize("app_id", ["nightly 42", "etl:2026-12-05"])
async def test_an_app_id_no_network_name_may_hold_still_runs(
    engine: EngineUnderTest, app_id: str
) -> None:
    """Its network was ``asupervisor-nightly 42``, which the engine refused."""
    async with Supervisor(session=engine.session) as sv:
        app = AppDef("dns", [py("w", RENDEZVOUS, num_replicas=2)])
        handle = await sv.schedule(sv.dryrun(app, "docker", engine.cfg, app_id=app_id))
        status = await sv.wait(handle, timeout=90)
        assert status.state is AppState.SUCCEEDED, status
        assert (await stdout(sv, handle, "w", 1)) == ["rank1 got welcome\n"]


OUTSIDE = (
    "import socket\ntry:\n    socket.create_connection(('10.255.255.1', 9), timeout=2)\n"
    "    print('reached outside')\nexcept OSError as e:\n    print('no route', e.errno)"
)


async def test_the_network_is_internal(engine: EngineUnderTest) -> None:
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("internal", [py("w", OUTSIDE)]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        (line,) = await stdout(sv, handle, "w")
        assert line.startswith("no route"), line


LIMITS = """
import os
def read(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().strip()
    return "?"
print("mem", read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"))
print("cpu", read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max").split()[0])
"""


async def test_memory_and_cpu_reach_the_container(engine: EngineUnderTest) -> None:
    role = py("w", LIMITS, resource=Resource(cpu=1, memMB=64))
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("limits", [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        lines = await stdout(sv, handle, "w")
        assert lines[0] == f"mem {64 * 1024 * 1024}\n"
        # One CPU: a CFS quota of one period (100 ms by default).
        assert lines[1] == "cpu 100000\n"


async def test_a_replica_killed_at_its_memory_limit_says_so(engine: EngineUnderTest) -> None:
    """The engine's OOM flag reaches the app's message, not only the replica's."""
    hog = py("w", "b = bytearray(512 * 1024 * 1024); print(len(b))", resource=Resource(memMB=64))
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("hog", [hog]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=60)
    assert status.state is AppState.FAILED, status
    replica = status.replica("w", 0)
    assert replica is not None and replica.exit_code == 137, status
    if engine.name == "podman":
        # Podman 4.3 leaves State.OOMKilled false and sends no oom event: a SIGKILL is all it says.
        assert status.msg == "w/0 killed by SIGKILL", status
        return
    assert replica.msg == "w/0: killed for exceeding its memory limit", status
    assert status.msg == "w/0 killed by SIGKILL: killed for exceeding its memory limit", status


MOUNTS = """
import os
print(open("/in/data.txt").read().strip())
try:
    open("/in/new.txt", "w")
    print("ro writable")
except OSError:
    print("ro refused")
open("/out/result.txt", "w").write("written inside")
open("/vol/v.txt", "w").write("in volume")
print("vol", sorted(os.listdir("/vol")))
print("dev", os.path.exists("/dev/asv-null"))
"""


async def test_bind_volume_and_device_mounts(engine: EngineUnderTest, tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "data.txt").write_text("from the host\n")
    volume = f"asv-test-{engine.session}"
    role = py(
        "w",
        MOUNTS,
        mounts=[
            BindMount(str(src), "/in", read_only=True),
            BindMount(str(out), "/out"),
            VolumeMount(volume, "/vol"),
            DeviceMount("/dev/null", "/dev/asv-null"),
        ],
    )
    try:
        async with Supervisor(session=engine.session) as sv:
            handle = await sv.submit(AppDef("mounts", [role]), "docker", engine.cfg)
            status = await sv.wait(handle, timeout=60)
            assert status.state is AppState.SUCCEEDED, status
            assert await stdout(sv, handle, "w") == [
                "from the host\n",
                "ro refused\n",
                "vol ['v.txt']\n",
                "dev True\n",
            ]
        assert (out / "result.txt").read_text() == "written inside"
    finally:
        api(engine.host, "DELETE", f"/volumes/{volume}?force=1")


CHATTY = """
import sys, time
for i in range(3):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.3)
sys.stdout.write("no newline")
"""


async def test_logs_streams_regex_since_until_and_tail(engine: EngineUnderTest) -> None:
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef("logs", [py("w", CHATTY)]), "docker", engine.cfg)
        followed = [line async for line in sv.log_iter(handle, "w", 0, should_tail=True)]
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status

        async def read(**kw: Any) -> list[str]:
            return [line async for line in sv.log_iter(handle, "w", 0, **kw)]

        out = ["out 0\n", "out 1\n", "out 2\n", "no newline"]
        err = ["err 0\n", "err 1\n", "err 2\n"]
        assert await read(streams="stdout") == out
        assert await read(streams="stderr") == err
        combined = await read(streams="combined")
        assert sorted(combined) == sorted(out + err)
        assert combined.index("out 0\n") < combined.index("out 1\n") < combined.index("out 2\n")
        assert followed == combined
        assert await read(regex=r"^err [12]") == ["err 1\n", "err 2\n"]
        assert await read(since=time.time() + 60) == []
        assert await read(until=time.time() - 3600) == []
        assert await read(since=time.time() - 3600, streams="stderr") == err


DDP_RANKS = """
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank}/{world} local_rank {os.environ['LOCAL_RANK']} args {sys.argv[1:]}", flush=True)
if rank == 0:
    srv = socket.create_server(("", port))
    peers = sorted(srv.accept()[0].recv(10).decode() for _ in range(world - 1))
    print("rank 0 heard", *peers, flush=True)
else:
    # A rank of Podman failed to reach rank 0 for 30 s here, twice in some 30 runs; why was
    # not seen (nothing was printed then). Its aardvark-dns (1.4) reloads as containers start
    # and may drop lookups meanwhile. Each failure is printed now.
    deadline = time.monotonic() + 50
    while True:
        try:
            socket.create_connection((addr, port), timeout=5).sendall(str(rank).encode())
            break
        except OSError as e:  # rank 0 not listening yet, or a lookup that failed once
            if time.monotonic() > deadline:
                raise
            print(f"rank {rank}: {addr}:{port}: {e!r}", file=sys.stderr, flush=True)
            time.sleep(0.1)
"""


async def test_the_ddp_component_runs_its_ranks_in_an_image_and_they_meet(
    engine: EngineUnderTest, tmp_path: Path
) -> None:
    """``ddp --image`` (TorchX's spelling): every rank runs in the image, and they find
    rank 0 at MASTER_ADDR:MASTER_PORT over the app's network, as torch would."""
    from supervisor.components import ddp

    (tmp_path / "ranks.py").write_text(DDP_RANKS)
    app = ddp("/job/ranks.py", "--lr", "0.1", j="3x1", image=IMAGE, interpreter="python3")
    (role,) = app.roles
    app = AppDef(app.name, [dataclasses.replace(role, mounts=[BindMount(str(tmp_path), "/job")])])
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(app, "docker", engine.cfg)
        status = await sv.wait(handle, timeout=100)
        if status.state is not AppState.SUCCEEDED:  # each rank's own words say why
            said = {
                k: [line async for line in sv.log_iter(handle, "ranks", k, streams="combined")]
                for k in range(3)
            }
            raise AssertionError(f"{status.state.name}: {status.msg}; the ranks said {said}")
        for k in range(3):
            lines = await stdout(sv, handle, "ranks", k)
            assert lines[0] == f"rank {k}/3 local_rank 0 args ['--lr', '0.1']\n", lines
        assert (await stdout(sv, handle, "ranks", 0))[1] == "rank 0 heard 1 2\n"


async def test_the_cli_runs_the_builtins_in_an_image_given_as_torchx_users_give_it(
    engine: EngineUnderTest, state_dir: Path
) -> None:
    """``asupervisor run -s docker sh --image IMAGE ...`` and ``echo --image``: TorchX's
    spelling of the backend and of the image, each replica's output in the log."""
    env = {
        **os.environ,
        "ASUPERVISOR_HOME": str(state_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    base = [sys.executable, "-m", "supervisor.cli.main", "--session", engine.session, "run"]
    cfg = f"host={engine.host}"
    runs = {
        "sh": ["-s", "docker", "--cfg", cfg, "--log", "sh", "--image", IMAGE,
               "--num_replicas", "2", "echo", "from", "'${replica_id}'"],
        "echo": ["--scheduler", "docker", "--cfg", cfg, "--log", "echo", "--image", IMAGE,
                 "--msg", "hi"],
    }  # fmt: skip
    expected = {"sh": {"sh/0 | from 0", "sh/1 | from 1"}, "echo": {"echo/0 | hi"}}
    for name, args in runs.items():
        with anyio.fail_after(120):
            done = await anyio.run_process([*base, *args], env=env, check=False)
        out = done.stdout.decode()
        assert done.returncode == 0, (out, done.stderr.decode())
        assert expected[name] <= set(out.splitlines()), out
