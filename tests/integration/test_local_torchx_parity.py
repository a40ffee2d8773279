"""The local backend does what TorchX's local schedulers do (issue 17 item 9).

``local_cwd``: the image is ignored, the replica runs in the caller's working
directory and ``${img_root}`` is that directory. ``local_dir``: an image that
is a directory (written as a path) is the working directory and
``${img_root}``, so a relative entrypoint is found there. The working
directory goes last on ``PATH`` (first with ``prepend_cwd``), an environment
without ``PATH`` gets ``PATH={cwd}``, and ``TORCHX_JOB_ID`` is the handle.

Every check is made from inside a real replica, which prints what it sees.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from supervisor import AppDef, AppState, Resource, Role, Supervisor

from .helpers import PY, app, py_role

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SHOW = (
    "import json, os, sys; print(json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:], "
    "'path': os.environ.get('PATH'), 'job': os.environ.get('TORCHX_JOB_ID'), "
    "'root': os.environ.get('ROOT')}))"
)


async def _run(
    apps: AppDef, cfg: Mapping[str, object] | None = None
) -> tuple[str, dict[str, list[str]]]:
    """Run ``apps`` to success; its handle and each role's replica-0 output lines."""
    async with Supervisor(session="parity") as sv:
        handle = await sv.submit(apps, "local", cfg)
        status = await sv.wait(handle, timeout=60)
        out = {
            role.name: [line async for line in sv.log_iter(handle, role.name, 0)]
            for role in apps.roles
        }
        assert status.state is AppState.SUCCEEDED, (status, out)
    return handle, out


def _tool(where: Path, name: str, text: str) -> Path:
    """A shell script ``name`` in ``where`` that prints ``text``, its cwd and its argument."""
    where.mkdir(parents=True, exist_ok=True)
    tool = where / name
    tool.write_text(f'#!/bin/sh\necho {text}\npwd -P\necho "$1"\n')
    tool.chmod(0o755)
    return tool


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    here = (tmp_path / "work").resolve()
    here.mkdir()
    monkeypatch.chdir(here)
    return here


async def test_img_root_is_the_working_directory_and_the_image_is_ignored(
    state_dir: Path, workdir: Path
) -> None:
    role = Role(
        name="r",
        image="python:3.12-slim",  # not a directory: ignored, as local_cwd does
        entrypoint=PY,
        args=["-c", SHOW, "${img_root}/data"],
        env={"ROOT": "${img_root}"},
    )
    handle, out = await _run(app(role))
    seen = json.loads("".join(out["r"]))
    assert seen["cwd"] == str(workdir)
    assert seen["argv"] == [f"{workdir}/data"]
    assert seen["root"] == str(workdir)
    assert seen["job"] == handle


async def test_torchx_job_id_is_the_handle_in_every_replica(state_dir: Path, workdir: Path) -> None:
    role = py_role("r", "import os; print(os.environ['TORCHX_JOB_ID'])", num_replicas=2)
    async with Supervisor(session="parity") as sv:
        handle = await sv.submit(app(role), "local")
        assert (await sv.wait(handle, timeout=60)).state is AppState.SUCCEEDED
        for k in (0, 1):
            assert [line async for line in sv.log_iter(handle, "r", k)] == [f"{handle}\n"]
    assert handle.startswith("local://parity/")


async def test_a_directory_image_is_the_working_directory_with_its_entrypoints(
    state_dir: Path, workdir: Path, tmp_path: Path
) -> None:
    pkg = workdir / "pkg"
    _tool(pkg / "bin", "run", "nested")
    _tool(pkg, "parity-top", "top")
    elsewhere = (tmp_path / "elsewhere").resolve()
    _tool(elsewhere, "abs-tool", "absolute")
    roles = [
        # A relative path is resolved in the image directory, as TorchX's local_dir does.
        Role(name="nested", image="./pkg", entrypoint="bin/run", args=["${img_root}"]),
        # A bare name is found there too: the image directory is on PATH (last).
        Role(name="top", image=str(pkg), entrypoint="parity-top", args=["${img_root}"]),
        Role(name="shown", image="pkg/", entrypoint=PY, args=["-c", SHOW]),
    ]
    _, out = await _run(app(*roles))
    assert out["nested"] == ["nested\n", f"{pkg}\n", f"{pkg}\n"]
    assert out["top"] == ["top\n", f"{pkg}\n", f"{pkg}\n"]
    seen = json.loads("".join(out["shown"]))
    assert seen["cwd"] == str(pkg)
    assert seen["path"] == f"{os.environ['PATH']}{os.pathsep}{pkg}"


async def test_a_name_that_is_not_path_like_is_never_a_directory_image(
    state_dir: Path, workdir: Path
) -> None:
    (workdir / "busybox").mkdir()  # a directory named like the image, in the cwd
    role = Role(name="r", image="busybox", entrypoint=PY, args=["-c", SHOW, "${img_root}"])
    _, out = await _run(app(role))
    seen = json.loads("".join(out["r"]))
    assert (seen["cwd"], seen["argv"]) == (str(workdir), [str(workdir)])


async def test_cwd_goes_last_on_path_unless_prepend_cwd(
    state_dir: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = (tmp_path / "bin").resolve()
    _tool(bindir, "parity-which", "from-path")
    _tool(workdir, "parity-which", "from-cwd")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    roles = [
        Role(name="which", entrypoint="parity-which"),
        Role(name="path", entrypoint=PY, args=["-c", SHOW]),
    ]
    _, last = await _run(app(*roles))
    assert last["which"][0] == "from-path\n"  # binaries on PATH win
    assert json.loads("".join(last["path"]))["path"] == f"{os.environ['PATH']}{os.pathsep}{workdir}"
    _, first = await _run(app(*roles), {"prepend_cwd": True})
    assert first["which"][0] == "from-cwd\n"  # the working directory wins
    assert (
        json.loads("".join(first["path"]))["path"] == f"{workdir}{os.pathsep}{os.environ['PATH']}"
    )


async def test_an_environment_without_path_gets_path_cwd(
    state_dir: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(workdir, "parity-here", "found-in-cwd")
    monkeypatch.delenv("PATH", raising=False)
    roles = [
        Role(name="path", entrypoint=PY, args=["-c", SHOW]),
        Role(name="here", entrypoint="parity-here"),  # looked up on PATH=cwd
    ]
    _, out = await _run(app(*roles))
    assert json.loads("".join(out["path"]))["path"] == str(workdir)
    assert out["here"][0] == "found-in-cwd\n"


async def test_zero_cpu_and_memory_run_as_torchx_runs_them(state_dir: Path, workdir: Path) -> None:
    role = Role(
        name="r", entrypoint=PY, args=["-c", "print('ok')"], resource=Resource(cpu=0, memMB=0)
    )
    _, out = await _run(app(role))
    assert out["r"] == ["ok\n"]
