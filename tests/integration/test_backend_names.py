"""A backend registered under another name makes handles under that name, everywhere.

``Supervisor(backends={"alias": LocalBackend})`` submits ``alias://...``; ``list``,
the app's record, ``describe`` and the replica's ``TORCHX_JOB_ID`` must say the same
handle, not the built-in's ``local://``. (Before, the backends built handles from
hard-coded names: ``list("alias")`` gave ``local://`` handles.)
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from supervisor import AppState, Role, Supervisor, parse_handle
from supervisor.backends.local import LocalBackend
from supervisor.backends.slurm.cluster import jobs_from_json

from .helpers import PY, app

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SHOW_JOB_ID = "import os; print(os.environ['TORCHX_JOB_ID'])"


async def test_a_backend_under_another_name_makes_its_handles_under_that_name(
    state_dir: Path,
) -> None:
    job = app(Role(name="show", entrypoint=PY, args=["-c", SHOW_JOB_ID]), name="named")
    async with Supervisor(session="names", backends={"alias": LocalBackend}) as sv:
        handle = await sv.submit(job, "alias")
        status = await sv.wait(handle, timeout=60)
        assert status.state is AppState.SUCCEEDED, status
        assert parse_handle(handle).backend == "alias"
        assert [line async for line in sv.log_iter(handle, "show", 0)] == [f"{handle}\n"]
        listed = await sv.list("alias")
        assert [a.app_handle for a in listed] == [handle]
        described = await sv.describe(handle)
        assert described is not None and described.state is AppState.SUCCEEDED
    app_id = parse_handle(handle).app_id
    [record] = [p async for p in anyio.Path(state_dir).glob(f"**/names/{app_id}/app.json")]
    assert json.loads(await record.read_text())["handle"] == handle


def test_the_cluster_view_names_our_jobs_under_the_backends_name() -> None:
    jobs = jobs_from_json(
        [{"job_id": 7, "job_state": "RUNNING", "comment": "asupervisor:svc/app-1"}], "hpc"
    )
    assert [j.handle for j in jobs] == ["hpc://svc/app-1"]
