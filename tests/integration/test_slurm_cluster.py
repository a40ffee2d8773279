"""The local Slurm cluster (scripts/slurm-cluster) the Slurm backend is tested against.

Brings the cluster up once per module when `status` says it is not usable (as root only; the first
bring-up on a fresh machine installs Debian packages and takes a minute or two), and skips with the
script's own words when that fails. Then checks what the backend will rely on: a two-component
heterogeneous job runs on two different nodes and completes, sacct sees it (or says accounting is
disabled when the cluster runs without it), and slurmrestd answers on its unix socket.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .slurm_cluster import skip_reason

# The first bring-up on a fresh machine installs packages: more than the suite's default timeout.
pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-cluster"
FACTS = Path("/run/asupervisor-slurm.json")
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}

HETJOB_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=asup-hetjob-test
#SBATCH --output={out}
#SBATCH --ntasks=1 --cpus-per-task=1
#SBATCH hetjob
#SBATCH --ntasks=1 --cpus-per-task=1
srun --het-group=0,1 bash -c 'echo "component $SLURM_PROCID on $SLURMD_NODENAME"'
"""


def _env() -> dict[str, str]:
    # A stray SLURM_JWT would switch the CLI from munge to JWT authentication.
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    env["SLURM_CONF"] = "/etc/slurm/slurm.conf"
    return env


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False, env=_env()
    )


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 8) -> str:
    return " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])


def _state(job: dict[str, Any]) -> str:
    """`job_state` is a string on Slurm 22.05 and a list of flags from 23.11 on."""
    state = job["job_state"]
    return str(state[0]) if isinstance(state, list) else str(state)


@dataclass(frozen=True)
class HetJob:
    job_id: int
    components: list[dict[str, Any]]
    output: str


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """The facts `scripts/slurm-cluster env` writes, once the cluster is usable."""
    reason = skip_reason()
    if reason is not None:  # conftest already skipped every test here; kept for direct use
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (it installs and starts system daemons)")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no Slurm and no apt-get to install it")
    status = subprocess.run(
        ["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60, check=False
    )
    if status.returncode != 0:
        up = subprocess.run(
            ["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=840, check=False
        )
        if up.returncode != 0:
            pytest.skip(f"could not bring up the local Slurm cluster: {_tail(up)}")
    env = _run("bash", str(SCRIPT), "env")
    assert env.returncode == 0, _tail(env)
    facts: dict[str, Any] = json.loads(FACTS.read_text())
    assert facts["up"] is True
    return facts


@pytest.fixture(scope="module")
def hetjob(cluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> HetJob:
    """A two-component hetjob, submitted with sbatch and followed with `squeue --json`."""
    work = tmp_path_factory.mktemp("slurm")
    out = work / "het-%j.out"
    script = work / "het.sh"
    script.write_text(HETJOB_SCRIPT.format(out=out))
    sub = _run("sbatch", "--parsable", f"--chdir={work}", str(script))
    assert sub.returncode == 0, _tail(sub)
    job_id = int(sub.stdout.strip().split(";")[0])

    # Alone on the cluster it is done in 1-4 s; other sessions' jobs on the same nodes can delay it.
    deadline = time.monotonic() + 90
    components: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        q = _run("squeue", "--json")
        assert q.returncode == 0, _tail(q)
        # squeue --json ignores -j on 22.05: filter here.
        components = [j for j in json.loads(q.stdout)["jobs"] if j["het_job_id"] == job_id]
        if len(components) == 2 and all(_state(j) in TERMINAL for j in components):
            break
        time.sleep(0.25)
    else:
        pytest.fail(f"hetjob {job_id} did not finish in 90 s: {[_state(j) for j in components]}")
    components.sort(key=lambda j: int(j["het_job_offset"]))
    output = Path(str(out).replace("%j", str(job_id))).read_text()
    return HetJob(job_id=job_id, components=components, output=output)


def test_hetjob_runs_on_two_nodes_and_completes(hetjob: HetJob) -> None:
    first, second = hetjob.components
    assert [_state(j) for j in hetjob.components] == ["COMPLETED", "COMPLETED"]
    assert first["job_id"] == hetjob.job_id
    assert [j["het_job_offset"] for j in hetjob.components] == [0, 1]
    assert first["nodes"] != second["nodes"]
    assert all(j["exit_code"] == 0 for j in hetjob.components)
    assert first["start_time"] == second["start_time"]  # one allocation, started together
    lines = sorted(line for line in hetjob.output.splitlines() if line.startswith("component"))
    assert lines == [f"component 0 on {first['nodes']}", f"component 1 on {second['nodes']}"]


def test_sacct_sees_the_hetjob(cluster: dict[str, Any], hetjob: HetJob) -> None:
    if not cluster["accounting"]:
        proc = _run("sacct", "--json", "-j", str(hetjob.job_id))
        assert proc.returncode != 0
        assert "accounting storage is disabled" in proc.stderr
        return
    deadline = time.monotonic() + 20
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        proc = _run("sacct", "--json", "-j", str(hetjob.job_id))
        assert proc.returncode == 0, _tail(proc)
        records = json.loads(proc.stdout)["jobs"]
        if len(records) == 2 and all(r["state"]["current"] == "COMPLETED" for r in records):
            break
        time.sleep(0.5)  # the controller hands finished jobs to slurmdbd asynchronously
    else:
        pytest.fail(f"sacct did not show hetjob {hetjob.job_id} completed: {records}")
    records.sort(key=lambda r: int(r["het"]["job_offset"]))
    assert [r["het"]["job_id"] for r in records] == [hetjob.job_id, hetjob.job_id]
    assert [r["het"]["job_offset"] for r in records] == [0, 1]
    assert [r["nodes"] for r in records] == [j["nodes"] for j in hetjob.components]
    assert all(r["cluster"] == cluster["cluster"] for r in records)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 10) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _get(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, json.loads(body) if body.strip().startswith(b"{") else body
    finally:
        conn.close()


def test_slurmrestd_answers_ping_on_its_socket(cluster: dict[str, Any]) -> None:
    rest = cluster["rest"]
    version = rest["api_version"]
    status, body = _get(_UnixHTTPConnection(rest["socket"]), f"/slurm/{version}/ping")
    assert status == 200, body
    assert body["meta"]["plugin"]["type"] == f"openapi/{version}"
    assert body["errors"] == []
    assert [p["ping"] for p in body["pings"]] == ["UP"]


def test_slurmrestd_answers_ping_with_jwt(cluster: dict[str, Any]) -> None:
    rest = cluster["rest"]
    if not rest["jwt_token"]:
        pytest.skip("the cluster has no JWT token")
    host, port = rest["jwt_url"].removeprefix("http://").split(":")
    headers = {"X-SLURM-USER-NAME": rest["jwt_user"], "X-SLURM-USER-TOKEN": rest["jwt_token"]}
    status, body = _get(
        http.client.HTTPConnection(host, int(port), timeout=10),
        f"/slurm/{rest['api_version']}/ping",
        headers,
    )
    assert status == 200, body
    assert [p["ping"] for p in body["pings"]] == ["UP"]
