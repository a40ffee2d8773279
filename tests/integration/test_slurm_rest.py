"""RestTransport against the real slurmrestd of the local cluster, over both of its endpoints.

``socket``: the unix socket with ``rest_auth/local``; slurmrestd acts as the
user it runs as (``slurmrest``), so jobs run as that user and every directory
they use must be theirs. ``jwt``: HTTP on 127.0.0.1:6820 with a root JWT;
jobs run as root, as they do under sbatch here. Each test compares what
RestTransport sees with what CliTransport (squeue/sacct) sees for the same
job. The cluster is brought up when needed; the tests skip, saying why, only
if it cannot start.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from supervisor import AppDef, Resource, Role
from supervisor.backends.base import DryrunContext
from supervisor.backends.slurm.options import slurm_run_opts
from supervisor.backends.slurm.records import JobRecord, latest_per_component
from supervisor.backends.slurm.rest import RestTransport
from supervisor.backends.slurm.script import ClusterFacts, SlurmRequest, pump_path, render
from supervisor.backends.slurm.ship import ship_pump
from supervisor.backends.slurm.transport import CliTransport
from supervisor.errors import BackendError, SubmitError

from .slurm_cluster import ensure_cluster, until

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
COMPARED = ("job_id", "het_job_id", "het_offset", "state", "exit_code", "nodes")
REPORT = 'echo "replica $ASUPERVISOR_REPLICA_ID on $SLURMD_NODENAME as $(id -un)"'


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return ensure_cluster(accounting=True)


def _token(cluster: dict[str, Any]) -> str | None:
    token = cluster["rest"].get("jwt_token")
    if token:
        return str(token)
    done = subprocess.run(  # the facts are written without one while the controller is away
        ["scontrol", "token", "username=root", "lifespan=3600"],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "SLURM_JWT"},
    )
    for line in done.stdout.splitlines():
        if line.startswith("SLURM_JWT="):
            return line.partition("=")[2]
    return None


@dataclass
class Endpoint:
    name: str
    transport: RestTransport
    job_user: str  # who the jobs run as


@pytest.fixture(params=["socket", "jwt"])
async def endpoint(
    request: pytest.FixtureRequest, cluster: dict[str, Any]
) -> AsyncIterator[Endpoint]:
    rest = cluster["rest"]
    if request.param == "socket":
        transport = RestTransport(socket=rest["socket"], api_version=rest["api_version"])
        found = Endpoint("socket", transport, str(rest["socket_user"]))
    else:
        token = _token(cluster)
        if token is None:
            pytest.skip("no JWT for root: `scontrol token` gave none")
        transport = RestTransport(
            url=rest["jwt_url"], token=token, user="root", api_version=rest["api_version"]
        )
        found = Endpoint("jwt", transport, "root")
    try:
        yield found
    finally:
        await transport.aclose()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory on the file system the nodes share, outside pytest's root-only tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="asup-rest-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _give(root: Path, user: str) -> None:
    """Make ``root`` and everything in it ``user``'s, as a backend running as them would have."""
    entry = pwd.getpwnam(user)
    for place in [root, *root.rglob("*")]:
        os.chown(place, entry.pw_uid, entry.pw_gid)


def _prepare(
    app: AppDef, root: Path, user: str, cfg: dict[str, Any] | None = None, app_id: str = "a-1"
) -> SlurmRequest:
    """Render the app's script and lay out what the backend's launch would, owned by ``user``."""
    request = render(
        app,
        slurm_run_opts().resolve(cfg or {}),
        DryrunContext(session="rest", app_id=app_id, cwd=str(root)),
        facts=ClusterFacts(version=(22, 5), default_partition="debug"),
        default_log_dir=root / "logs",
        job_dir=None,
    )
    for replica in request.replicas:
        Path(replica.log_dir).mkdir(parents=True)
    ship_pump(Path(pump_path(request.app_dir)))
    _give(root, user)
    return request


def _log_text(directory: str) -> str:
    """Every file under ``directory``, with its name: the pump's logs, the batch log."""
    return "".join(
        f"{p}:\n{p.read_text(errors='replace')}" for p in Path(directory).rglob("*") if p.is_file()
    )


def _names(directory: str) -> list[str]:
    return [p.name for p in Path(directory).rglob("*")]


def _components(records: list[JobRecord], job_id: int) -> list[JobRecord]:
    return sorted((r for r in records if r.het_job_id == job_id), key=lambda r: r.het_offset)


def _same(records: list[JobRecord]) -> list[tuple[Any, ...]]:
    return [tuple(getattr(r, name) for name in COMPARED) for r in records]


def _in_queue(transport: Any, job_id: int) -> Callable[[], Awaitable[list[JobRecord]]]:
    async def probe() -> list[JobRecord]:
        return _components(await transport.queue(), job_id)

    return probe


def _in_accounting(transport: Any, job_id: int) -> Callable[[], Awaitable[list[JobRecord]]]:
    async def probe() -> list[JobRecord]:
        return _components(latest_per_component(await transport.accounting([job_id])), job_id)

    return probe


def _ended(records: list[JobRecord]) -> bool:
    return bool(records) and all(r.state in TERMINAL for r in records)


async def test_ping_and_facts_agree_with_the_cli(endpoint: Endpoint) -> None:
    rest = endpoint.transport
    pings = await rest.ping()
    assert pings and all(p.get("ping") == "UP" for p in pings), pings
    facts = await rest.facts()
    assert facts == await CliTransport().facts()
    assert facts.version == (22, 5) and facts.default_partition == "debug"
    assert facts.real_memory_mb == {"debug": 4000}
    assert rest.calls == {"ping": 1, "partitions": 1, "nodes": 1}


def _open_sockets() -> int:
    """How many sockets this process holds open."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return found


async def test_a_closed_transport_still_answers_and_keeps_no_connection(
    endpoint: Endpoint,
) -> None:
    """A closed Supervisor still answers ``status`` and ``describe`` of its Slurm apps:
    after its close the transport made a client anew, kept open for good."""
    rest = endpoint.transport
    await rest.ping()
    held = _open_sockets()
    await rest.aclose()
    closed = _open_sockets()
    assert closed < held, "the close left the kept connection open"
    for _ in range(3):
        pings = await rest.ping()
        assert pings and all(p.get("ping") == "UP" for p in pings), pings
        assert _open_sockets() == closed
    assert rest.calls["ping"] == 4


async def test_a_het_job_runs_to_completion_seen_like_the_cli_sees_it(
    endpoint: Endpoint, shared_dir: Path
) -> None:
    rest, cli = endpoint.transport, CliTransport()
    where = Role(name="where", entrypoint="bash", args=["-c", REPORT], num_replicas=2)
    request = _prepare(AppDef(name="where", roles=[where]), shared_dir, endpoint.job_user)
    assert "#SBATCH hetjob" in request.script
    job_id = await rest.submit(request.script, request.workdir)

    ended = await until(_in_queue(rest, job_id), _ended, 120, f"job {job_id} to end")
    assert [(r.het_offset, r.het_job_id, r.state, r.exit_code) for r in ended] == [
        (0, job_id, "COMPLETED", 0),
        (1, job_id, "COMPLETED", 0),
    ]
    assert ended[0].job_id == job_id and ended[1].job_id != job_id
    assert len({r.nodes for r in ended}) == 2  # one node per het group
    assert [r.name for r in ended] == ["where-0", "where-1"]
    assert all(r.comment == "asupervisor:rest/a-1" for r in ended)  # carried to component 1
    assert _same(_components(await cli.queue(), job_id)) == _same(ended)

    for replica, record in zip(request.replicas, ended, strict=True):
        text = _log_text(replica.log_dir)
        expected = f"replica {replica.replica_id} on {record.nodes} as {endpoint.job_user}"
        assert expected in text, text

    accounted = await until(
        _in_accounting(rest, job_id),
        lambda rs: len(rs) == 2 and all(r.state == "COMPLETED" for r in rs),
        60,
        f"slurmdbd to record job {job_id}",
    )
    assert _same(accounted) == _same(ended)
    assert _same(await _in_accounting(cli, job_id)()) == _same(accounted)
    assert set(rest.calls) == {"submit", "jobs", "slurmdb_jobs"} and rest.calls["submit"] == 1


async def test_cancelling_a_sleeping_job(endpoint: Endpoint, shared_dir: Path) -> None:
    rest, cli = endpoint.transport, CliTransport()
    sleeper = Role(name="sleeper", entrypoint="sleep", args=["300"], num_replicas=2)
    request = _prepare(AppDef(name="sleepy", roles=[sleeper]), shared_dir, endpoint.job_user)
    job_id = await rest.submit(request.script, request.workdir)
    await until(
        _in_queue(rest, job_id),
        lambda rs: len(rs) == 2 and all(r.state == "RUNNING" for r in rs),
        90,
        f"job {job_id} to run",
    )
    await rest.cancel(job_id)
    ended = await until(_in_queue(rest, job_id), _ended, 60, f"job {job_id} to be cancelled")
    assert [r.state for r in ended] == ["CANCELLED", "CANCELLED"]
    assert _same(_components(await cli.queue(), job_id)) == _same(ended)
    await rest.cancel(job_id)  # an ended job: Slurm says it is already done, which is fine
    assert rest.calls["cancel"] == 2


async def _squeue_json(job_id: int) -> list[dict[str, Any]]:
    done = await anyio.run_process(["squeue", "--json"], check=True)
    jobs = json.loads(done.stdout)["jobs"]
    return sorted((j for j in jobs if j["het_job_id"] == job_id), key=lambda j: j["het_job_offset"])


@pytest.mark.parametrize("endpoint", ["jwt"], indirect=True)
async def test_the_same_script_makes_the_same_job_as_sbatch(
    endpoint: Endpoint, shared_dir: Path
) -> None:
    """Held, so nothing runs: every job property the script sets is compared with sbatch's."""
    roles = [
        Role(name="big", entrypoint="true", resource=Resource(cpu=2, memMB=300), num_replicas=2),
        Role(name="small", entrypoint="true", resource=Resource(cpu=1)),  # no --mem of its own
    ]
    cfg = {"time": "0:10:00", "comment": "nightly run", "mail-user": "me@example.com"}
    request = _prepare(AppDef(name="same", roles=roles), shared_dir, "root", cfg)
    script = request.script.replace("#!/bin/bash\n", "#!/bin/bash\n#SBATCH --hold\n", 1)
    rest_id = await endpoint.transport.submit(script, request.workdir)
    done = await anyio.run_process(
        ["sbatch", "--parsable", f"--chdir={request.workdir}"], input=script.encode(), check=True
    )
    cli_id = int(done.stdout.decode().strip().split(";")[0])
    try:
        by_rest, by_cli = await _squeue_json(rest_id), await _squeue_json(cli_id)
    finally:
        await endpoint.transport.cancel(rest_id)
        await CliTransport().cancel(cli_id)
    fields = (
        "het_job_offset", "name", "comment", "time_limit", "requeue", "partition", "account",
        "memory_per_node", "memory_per_cpu", "cpus", "tasks", "node_count", "standard_output",
        "standard_error", "current_working_directory", "user_name", "job_state", "state_reason",
        "shared", "nice", "tres_req_str",
    )  # fmt: skip
    assert len(by_rest) == len(by_cli) == 3
    for mine, theirs in zip(by_rest, by_cli, strict=True):
        ours = {f: mine.get(f) for f in fields}
        assert ours == {f: theirs.get(f) for f in fields}
        assert ours["comment"] == "asupervisor:rest/a-1 nightly run" and ours["time_limit"] == 10
    assert by_rest[2]["memory_per_node"] == 300  # sbatch carries --mem into the next component


async def test_slurmrestd_ignores_the_scripts_sbatch_lines(cluster: dict[str, Any]) -> None:
    """Why RestTransport translates ``#SBATCH`` lines itself: v0.0.38 reads only the JSON."""
    token = _token(cluster)
    if token is None:
        pytest.skip("no JWT for root: `scontrol token` gave none")
    rest = cluster["rest"]
    script = "#!/bin/bash\n#SBATCH --job-name=from-the-script\n#SBATCH --comment=c\ntrue\n"
    body = {
        "script": script,
        "job": {"environment": {"PATH": "/bin"}, "current_working_directory": "/", "hold": True},
    }
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token}
    async with httpx.AsyncClient(base_url=rest["jwt_url"], headers=headers) as client:
        submitted = (
            await client.post(f"/slurm/{rest['api_version']}/job/submit", json=body)
        ).json()
        job_id = submitted["job_id"]
        assert isinstance(job_id, int), submitted
        try:
            answer = (await client.get(f"/slurm/{rest['api_version']}/job/{job_id}")).json()
        finally:
            await client.delete(f"/slurm/{rest['api_version']}/job/{job_id}")
    (job,) = answer["jobs"]
    assert (job["name"], job["comment"]) == ("", "")


async def test_what_the_real_server_refuses(endpoint: Endpoint, shared_dir: Path) -> None:
    rest = endpoint.transport
    app = AppDef(name="nowhere", roles=[Role(name="r", entrypoint="true")])
    request = _prepare(app, shared_dir, endpoint.job_user, {"partition": "nosuch"})
    with pytest.raises(SubmitError) as submit_err:  # HTTP 500 with Slurm error 2000
        await rest.submit(request.script, request.workdir)
    assert not submit_err.value.transient
    assert "Invalid partition name specified" in str(submit_err.value)
    with pytest.raises(BackendError) as cancel_err:
        await rest.cancel(2_000_000_000)
    assert not cancel_err.value.transient and "Invalid job id" in str(cancel_err.value)
    assert await rest.accounting([2_000_000_000]) == []  # "Nothing found": no error
    with pytest.raises(BackendError) as requeue_err:
        await rest.requeue(1)
    assert not requeue_err.value.transient
    assert rest.calls == {"submit": 1, "cancel": 1, "slurmdb_jobs": 1}


async def test_tokens_the_server_refuses(cluster: dict[str, Any]) -> None:
    url = cluster["rest"]["jwt_url"]
    missing = RestTransport(url=url)
    with pytest.raises(BackendError) as err:  # HTTP 401, plain text
        await missing.queue()
    assert not err.value.transient and "Authentication failure" in str(err.value)
    await missing.aclose()
    wrong = RestTransport(url=url, token="not-a-jwt", user="root")
    with pytest.raises(BackendError) as acct_err:  # HTTP 200, with Slurm error 1007
        await wrong.accounting([1])
    assert not acct_err.value.transient
    assert "Protocol authentication error" in str(acct_err.value)
    with pytest.raises(SubmitError) as submit_err:  # slurmctld just hangs up: error 5005
        await wrong.submit("#!/bin/bash\n#SBATCH --hold\ntrue\n", "/tmp")
    assert "check the JWT" in str(submit_err.value)
    await wrong.aclose()


@pytest.mark.parametrize("endpoint", ["socket"], indirect=True)
async def test_socket_jobs_run_as_its_user_who_needs_their_directories(
    endpoint: Endpoint, shared_dir: Path
) -> None:
    """A backend running as root (0700 state directory) cannot host socket users' jobs."""
    app = AppDef(name="denied", roles=[Role(name="r", entrypoint="true")])
    request = _prepare(app, shared_dir, "root")  # laid out as root, as the backend would
    os.chmod(shared_dir, 0o700)
    job_id = await endpoint.transport.submit(request.script, request.workdir)
    ended = await until(_in_queue(endpoint.transport, job_id), _ended, 60, f"job {job_id}")
    assert [(r.state, r.reason) for r in ended] == [("FAILED", "JobLaunchFailure")]
    assert not [n for n in _names(request.app_dir) if n.startswith("slurm-")]  # no batch log
