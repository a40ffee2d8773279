"""TorchX's docker run options and resource mapping, seen from inside the containers.

``copy_env``, ``env``, ``privileged``, ``network`` (joining a network the test
creates and removes itself), ``/dev/shm`` sized like ``memMB``, and container
names that stay resolvable DNS labels however long the app and role names
are. Every test runs on dockerd and on Podman and fails if it leaves a
container or network behind.

Not here, for want of the hardware on this machine: GPU device requests (the
``compute``/``utility`` capabilities) and EFA/Neuron named devices; the
create body the backend builds for them is checked in
tests/unit/test_docker_request.py.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import AppDef, AppState, Resource, Role, SubmitError, Supervisor
from supervisor.backends.docker.request import container_name

from .docker_engines import IMAGE, EngineUnderTest, api, labelled

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.docker]


def py(name: str, code: str, **kw: Any) -> Role:
    return Role(name=name, image=IMAGE, entrypoint="python3", args=["-c", code], **kw)


async def stdout(sv: Supervisor, handle: str, role: str, k: int = 0) -> list[str]:
    return [line async for line in sv.log_iter(handle, role, k, streams="stdout")]


async def run(engine: EngineUnderTest, app: AppDef, **cfg: object) -> tuple[str, list[str]]:
    """Run ``app`` to success; its handle and replica 0's output of its first role."""
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(app, "docker", {**engine.cfg, **cfg})
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        return handle, await stdout(sv, handle, app.roles[0].name)


ENV = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items()"
    " if k.startswith(('TXA_', 'TXB_', 'TXC_', 'TXD_'))}, sort_keys=True))"
)


async def test_copy_env_and_env_reach_the_container(
    engine: EngineUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXA_ONE", "from host 1")
    monkeypatch.setenv("TXA_TWO", "a;b,c=d")
    monkeypatch.setenv("TXB_NOT_COPIED", "no")
    monkeypatch.setenv("TXC_OVERRIDDEN", "host")
    role = py("w", ENV, env={"TXD_ROLE": "role", "TXC_OVERRIDDEN": "role"})
    _, lines = await run(
        engine,
        AppDef("copyenv", [role]),
        copy_env=["TXA_*", "TXC_OVERRIDDEN"],
        env=["TXD_OPT=opt", "TXD_ROLE=opt"],
    )
    assert json.loads(lines[0]) == {
        "TXA_ONE": "from host 1",
        "TXA_TWO": "a;b,c=d",
        "TXC_OVERRIDDEN": "role",  # a role's env wins over both options
        "TXD_OPT": "opt",
        "TXD_ROLE": "role",
    }


CAPS = """
import subprocess
for line in open("/proc/self/status"):
    if line.startswith("CapEff:"):
        print("CAP_SYS_ADMIN", int(line.split()[1], 16) >> 21 & 1)
done = subprocess.run(["ip", "link", "set", "lo", "mtu", "1400"], capture_output=True)
print("ip link set", "ok" if done.returncode == 0 else "refused")
"""


def _full_bounding_set() -> bool:
    """Whether this machine may hand out every capability (a sandbox may lack some)."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16) == (1 << (last + 1)) - 1
    return False


async def test_privileged_gives_every_capability(engine: EngineUnderTest) -> None:
    _, lines = await run(engine, AppDef("unpriv", [py("w", CAPS)]))
    assert lines == ["CAP_SYS_ADMIN 0\n", "ip link set refused\n"]
    app = AppDef("priv", [py("w", CAPS)])
    if engine.name == "docker" and not _full_bounding_set():
        # dockerd 20.10 grants a privileged container every capability the kernel
        # knows, and runc cannot apply one this machine's bounding set lacks (this
        # sandbox has no CAP_SYS_RESOURCE): the start fails in exactly that way, which
        # only a privileged request does (the unprivileged run above started).
        async with Supervisor(session=engine.session) as sv:
            handle = await sv.submit(app, "docker", {**engine.cfg, "privileged": True})
            status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.FAILED
        assert "unable to apply caps" in repr(status), status
        return
    _, lines = await run(engine, app, privileged=True)
    assert lines == ["CAP_SYS_ADMIN 1\n", "ip link set ok\n"]


SHM = """
import os, subprocess
st = os.statvfs("/dev/shm")
print("statvfs", st.f_blocks * st.f_frsize)
print("df", subprocess.run(["df", "-k", "/dev/shm"], capture_output=True, text=True)
      .stdout.splitlines()[-1].split()[1])
"""


async def test_dev_shm_is_sized_like_the_memory(engine: EngineUnderTest) -> None:
    role = py("w", SHM, resource=Resource(cpu=1, memMB=256))
    _, lines = await run(engine, AppDef("shm", [role]))
    assert lines == [f"statvfs {256 * 1024 * 1024}\n", f"df {256 * 1024}\n"]


RENDEZVOUS = """
import os, socket, time
rank0 = os.environ["TORCHX_RANK0_HOST"]
if os.environ["ASUPERVISOR_REPLICA_ID"] == "0":
    srv = socket.create_server(("", 5000))
    conn, _ = srv.accept()
    print("rank0 got", conn.recv(200).decode(), flush=True)
    conn.sendall(b"welcome")
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((rank0, 5000), timeout=5)
            break
        except OSError:  # not listening yet, or a name lookup that failed once (EAI_AGAIN)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(b"hello from " + socket.gethostname().encode())
    print("rank1 got", conn.recv(100).decode(), flush=True)
"""


async def test_long_names_stay_resolvable(engine: EngineUnderTest) -> None:
    """``{app_id}-{role}-0`` would be 84 characters here: no engine's DNS answers for it."""
    name = "a-forty-character-application-name-xxxxx"
    role = py("rendezvous_worker_role_name_long", RENDEZVOUS, num_replicas=2)
    assert len(name) == 40
    async with Supervisor(session=engine.session) as sv:
        handle = await sv.submit(AppDef(name, [role]), "docker", engine.cfg)
        status = await sv.wait(handle, timeout=120)
        assert status.state is AppState.SUCCEEDED, status
        app_id = handle.rsplit("/", 1)[1]
        assert len(f"{app_id}-{role.name}-0") == 84
        rank1 = container_name(app_id, role.name, 1)
        assert len(rank1) <= 63
        assert await stdout(sv, handle, role.name, 0) == [f"rank0 got hello from {rank1}\n"]
        assert await stdout(sv, handle, role.name, 1) == ["rank1 got welcome\n"]


@pytest.fixture
def shared_network(engine: EngineUnderTest) -> Iterator[str]:
    """A network this test makes and removes: the backend must only join it."""
    name = f"asv-joined-{secrets.token_hex(4)}"
    api(engine.host, "POST", "/networks/create", {"Name": name, "Driver": "bridge"})
    try:
        yield name
    finally:
        api(engine.host, "DELETE", f"/networks/{name}")


def _networks(engine: EngineUnderTest) -> list[str]:
    return [str(n["Name"]) for n in api(engine.host, "GET", "/networks")]


async def test_joining_an_existing_network(engine: EngineUnderTest, shared_network: str) -> None:
    role = py("w", RENDEZVOUS, num_replicas=2)
    handle, lines = await run(engine, AppDef("joined", [role]), network=shared_network)
    app_id = handle.rsplit("/", 1)[1]
    assert lines == [f"rank0 got hello from {app_id}-w-1\n"]
    # Joined, not created (no network of the app's own), and still there after the app.
    names = _networks(engine)
    assert shared_network in names
    assert f"asupervisor-{app_id}" not in names
    inspected = api(engine.host, "GET", f"/networks/{shared_network}")
    assert not inspected.get("Containers")  # the app's containers are gone from it


async def test_a_missing_network_fails_the_submit_before_any_container(
    engine: EngineUnderTest,
) -> None:
    missing = f"asv-missing-{secrets.token_hex(4)}"
    async with Supervisor(session=engine.session) as sv:
        with pytest.raises(SubmitError) as caught:
            await sv.submit(
                AppDef("nonet", [py("w", "print(1)")]),
                "docker",
                {
                    **engine.cfg,
                    "network": missing,
                },
            )
    assert "'network'" in str(caught.value) and missing in str(caught.value)
    assert caught.value.transient is False
    label = f"io.asupervisor.session={engine.session}"
    assert labelled(engine.host, "containers", label) == []
    assert missing not in _networks(engine)
