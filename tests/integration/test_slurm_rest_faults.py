"""The slurm backend over a slurmrestd that goes away: a private one, stopped and restarted here.

Never the cluster's shared slurmrestd: each test starts its own (JWT auth, on a unix
socket in a directory of its own), as the user ``slurmrest`` like the shared one, and
stops it at the end. Jobs run as root (the JWT's user), as under sbatch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from supervisor import AppDef, AppState, Role, Supervisor
from supervisor.backends.slurm import SlurmBackend
from supervisor.backends.slurm.poller import PollerSettings
from supervisor.backends.slurm.rest import RestTransport
from supervisor.errors import BackendError

from .slurm_cluster import ensure_cluster, until, until_running

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slurm]

REST_USER = "slurmrest"


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return ensure_cluster(accounting=True)


@dataclass
class PrivateRestd:
    directory: Path
    token: str
    process: Process | None = None

    @property
    def socket(self) -> str:
        return str(self.directory / "slurmrestd.sock")

    def transport(self) -> RestTransport:
        return RestTransport(socket=self.socket, token=self.token, user="root", timeout=5.0)

    async def start(self) -> None:
        await anyio.Path(self.socket).unlink(missing_ok=True)
        log = await anyio.to_thread.run_sync(open, self.directory / "slurmrestd.log", "ab")
        with log:
            self.process = await anyio.open_process(
                ["setpriv", f"--reuid={REST_USER}", f"--regid={REST_USER}", "--init-groups",
                 "slurmrestd", "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38,openapi/dbv0.0.38",
                 f"unix:{self.socket}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env={**os.environ, "SLURM_JWT": "daemon"},
            )  # fmt: skip
        probe = self.transport()
        try:
            await until(self._answers(probe), bool, 30, "the private slurmrestd to answer")
        finally:
            await probe.aclose()

    @staticmethod
    def _answers(probe: RestTransport) -> Any:
        async def ping() -> bool:
            try:
                return bool(await probe.ping())
            except Exception:
                return False

        return ping

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await process.wait()


@pytest.fixture
async def restd(cluster: dict[str, Any]) -> AsyncIterator[PrivateRestd]:
    token = cluster["rest"].get("jwt_token")
    if not token or not shutil.which("slurmrestd"):
        pytest.skip("the cluster has no JWT for root or no slurmrestd")
    directory = Path(tempfile.mkdtemp(prefix="asup-restd-", dir="/tmp"))
    shutil.chown(directory, REST_USER, REST_USER)
    private = PrivateRestd(directory, str(token))
    await private.start()
    try:
        yield private
    finally:
        await private.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def _job_id(state_dir: Path, handle: str) -> int:
    app_dir = state_dir / "logs" / "svc" / handle.rsplit("/", 1)[1]
    return int(json.loads(await anyio.Path(app_dir / "app.json").read_text())["job_id"])


async def _slurm_state(job_id: int) -> str:
    done = await anyio.run_process(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False)
    return done.stdout.decode().strip()


@pytest.mark.timeout(180)
async def test_a_cancel_sent_while_slurmrestd_is_away_is_delivered_when_it_returns(
    restd: PrivateRestd, state_dir: Path
) -> None:
    """Issue 19 item 9: the cancel is recorded at once, retried while slurmrestd is down,
    and delivered once it is back; the app ends CANCELLED and the job is gone."""
    backend = partial(
        SlurmBackend, transport=restd.transport(), poller=PollerSettings(fast=0.5, slow=1.0)
    )
    role = Role(name="w", entrypoint="sleep", args=["300"])
    async with Supervisor(session="svc", backends={"slurm": backend}) as sv:
        handle = await sv.submit(AppDef(name="away", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        app_dir = state_dir / "logs" / "svc" / handle.rsplit("/", 1)[1]
        job_id = await _job_id(state_dir, handle)
        await restd.stop()
        await sv.cancel(handle)
        await until(lambda: anyio.Path(app_dir / "cancel.request").exists(), bool, 10, "the record")
        await anyio.sleep(6)  # several tries fail meanwhile
        assert await _slurm_state(job_id) == "RUNNING"  # nothing reached Slurm
        status = sv.status(handle)
        assert status is not None and "not delivered yet" in status.msg, status
        await restd.start()
        final = await sv.wait(handle, timeout=60)
    assert final.state is AppState.CANCELLED, final
    assert await _slurm_state(job_id) in ("", "CANCELLED", "COMPLETING")


async def test_a_socket_users_launch_failure_says_who_runs_the_job(
    cluster: dict[str, Any], state_dir: Path
) -> None:
    """Issue 17 item 7: over a rest_auth/local socket jobs run as slurmrestd's user, who cannot
    enter this test's root-only state directory: Slurm says only JobLaunchFailure, the app's
    status says why. (The cluster's own socket: only submitting to it, as any client does.)"""
    rest = cluster["rest"]
    transport = RestTransport(socket=str(rest["socket"]), api_version=str(rest["api_version"]))
    backend = partial(SlurmBackend, transport=transport)
    role = Role(name="w", entrypoint="true")
    async with Supervisor(session="svc", backends={"slurm": backend}) as sv:
        handle = await sv.submit(AppDef(name="denied", roles=[role]), "slurm")
        final = await sv.wait(handle, timeout=60)
    assert final.state is AppState.FAILED, final
    replica = final.replica("w", 0)
    assert replica is not None
    assert "JobLaunchFailure" in replica.msg and str(rest["socket_user"]) in replica.msg, final
    assert str(state_dir) in replica.msg, final


@pytest.mark.timeout(180)
async def test_another_process_s_cancel_while_slurmrestd_is_away_is_sent_again_later(
    restd: PrivateRestd, state_dir: Path
) -> None:
    """Issue 19 item 9, from another process: the cancel is recorded even though it cannot
    be sent, the caller is told so, and the next look at the app (once slurmrestd is back)
    sends it again."""

    def backend() -> Any:
        return partial(SlurmBackend, transport=restd.transport())

    role = Role(name="w", entrypoint="sleep", args=["300"])
    async with Supervisor(session="svc", backends={"slurm": backend()}) as sv:
        handle = await sv.submit(AppDef(name="later", roles=[role]), "slurm")
        with anyio.fail_after(60):
            await until_running(sv, handle)
        job_id = await _job_id(state_dir, handle)
    await restd.stop()
    async with Supervisor(session="svc", backends={"slurm": backend()}) as other:
        with pytest.raises(BackendError, match="the cancel is recorded"):
            await other.cancel(handle)
    assert await _slurm_state(job_id) == "RUNNING"
    await restd.start()
    async with Supervisor(session="svc", backends={"slurm": backend()}) as later:

        async def state() -> AppState | None:
            seen = await later.describe(handle)
            return seen.state if seen is not None else None

        await until(state, lambda s: s is AppState.CANCELLED, 60, "the recorded cancel")
    assert await _slurm_state(job_id) in ("", "CANCELLED", "COMPLETING")
