"""Every code example of the README and the documentation site runs, for real.

Python examples run as scripts and shell examples under ``bash -euo pipefail``,
each in a fresh directory with its own state directory (``ASUPERVISOR_HOME``), the
``asupervisor`` command of this venv on PATH and this checkout first on
PYTHONPATH. Local examples start real processes; docker examples run on dockerd
and on Podman, Slurm examples on the local cluster through the CLI and REST
transports, skipped the way the rest of the suite skips them. An example passes
when it exits 0: examples check what they show with ``assert`` (Python) or their
exit code (shell). ``tests/docs/examples.py`` says how blocks are marked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.examples import (
    NEEDS,
    NOT_CODE,
    ROOT,
    RUNNABLE,
    SKIP_REASONS,
    Block,
    all_blocks,
    documents,
)
from tests.integration.docker_engines import ENGINES, ensure_engines
from tests.integration.slurm_cluster import ensure_cluster

pytestmark = pytest.mark.integration

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.lang in RUNNABLE and b.skip_reason is None]
TIMEOUT = 150.0


def _params(needs: str | None) -> list[object]:
    chosen = [b for b in RUN if b.needs == needs]
    marks = [pytest.mark.slurm] if needs == "slurm" else []
    return [pytest.param(b, id=b.id, marks=marks) for b in chosen]


def _run(block: Block, tmp_path: Path, extra_env: dict[str, str] | None = None) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["ASUPERVISOR_HOME"] = str(tmp_path / "state")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["ASUPERVISOR_REPO"] = str(ROOT)
    env.update(extra_env or {})
    suffix = ".py" if block.lang == "python" else ".sh"
    script = tmp_path / f"example{suffix}"
    script.write_text(block.code)
    argv = (
        [sys.executable, str(script)]
        if block.lang == "python"
        else ["bash", "-euo", "pipefail", str(script)]
    )
    try:
        done = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{block.id} ran past {TIMEOUT:.0f} s:\n{e.stdout!r}\n{e.stderr!r}")
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )
    return done.stdout


@pytest.mark.parametrize("block", _params(None))
def test_local_example_runs(block: Block, tmp_path: Path) -> None:
    _run(block, tmp_path)


@pytest.mark.docker
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block", _params("docker"))
def test_docker_example_runs(block: Block, engine: str, tmp_path: Path) -> None:
    facts = ensure_engines()
    info = facts["engines"][engine]
    if not info.get("up"):
        pytest.skip(f"the {engine} engine did not come up (see /var/log/asupervisor-docker)")
    _run(block, tmp_path, {"DOCKER_HOST": str(info["host"]), "IMAGE": str(facts["image"])})


@pytest.mark.parametrize("transport", ["cli", "rest"])
@pytest.mark.parametrize("block", _params("slurm"))
def test_slurm_example_runs(block: Block, transport: str, tmp_path: Path) -> None:
    facts = ensure_cluster()
    env = {"ASUPERVISOR_SLURM_TRANSPORT": transport}
    if transport == "rest":
        rest = facts["rest"]
        assert isinstance(rest, dict)
        if not rest.get("jwt_token"):
            pytest.skip("slurmrestd has no JWT endpoint here")
        # JWT as root, as tests/integration/test_slurm_backend.py does: over the unix
        # socket jobs would run as the socket's user, who cannot write this test's logs.
        env["ASUPERVISOR_SLURMRESTD"] = str(rest["jwt_url"])
        env["ASUPERVISOR_SLURMRESTD_USER"] = "root"
        env["SLURM_JWT"] = str(rest["jwt_token"])
    _run(block, tmp_path, env)


def test_every_fence_is_an_example_or_says_what_it_is() -> None:
    """A fence with no language, or a language the runner does not know, would go unrun."""
    unknown = [b.id for b in BLOCKS if b.lang not in RUNNABLE | NOT_CODE]
    assert not unknown, f"fences with no or an unknown language ({sorted(NOT_CODE)}): {unknown}"


def test_every_marker_is_justified() -> None:
    """A skip names a known reason; a marker sits on a runnable block and says something."""
    wrong = []
    for b in BLOCKS:
        if not b.directive:
            continue
        if b.lang not in RUNNABLE:
            wrong.append(f"{b.id}: a docs-test marker on a {b.lang or 'bare'} block")
        elif b.skip_reason is not None and b.skip_reason not in SKIP_REASONS:
            wrong.append(f"{b.id}: skip reason {b.skip_reason!r} is not one of {SKIP_REASONS}")
        elif b.skip_reason is None and b.needs not in NEEDS:
            wrong.append(f"{b.id}: unknown docs-test marker {b.directive!r}")
    assert not wrong, "\n".join(wrong)


def test_the_examples_are_found() -> None:
    """The collector sees the README's example and every page's; none is silently dropped."""
    names = {b.path.name for b in RUN}
    assert "README.md" in names
    for page in ("getting-started.md", "concepts.md", "embedding.md", "local.md"):
        assert page in names, page
    assert any(b.needs == "docker" for b in RUN)
    assert any(b.needs == "slurm" for b in RUN)
    assert (ROOT / "README.md") in documents()
    counts = {lang: sum(b.lang == lang for b in RUN) for lang in ("python", "sh")}
    assert all(counts.values()), json.dumps(counts)


# What a Python example imports of the reader's own code (a module of the service it
# shows), typed as the example uses it: mypy checks the example, not the service.
READER_MODULES = {
    "jobs_api": "from starlette.applications import Starlette\n\napp: Starlette\n",
}


def test_python_examples_pass_mypy_strict(tmp_path: Path) -> None:
    """The examples are code users copy: typed as the library is (``mypy --strict``), every
    one, run or not. Each is checked as a module of its own, with the project's settings."""
    examples = tmp_path / "examples"
    examples.mkdir()
    for name, text in READER_MODULES.items():
        (examples / f"{name}.py").write_text(text)
    where: dict[str, str] = {}
    for n, block in enumerate(b for b in BLOCKS if b.lang == "python"):
        module = examples / f"example_{n}.py"
        module.write_text(block.code)
        where[module.name] = block.id
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(examples)],
        cwd=ROOT,  # the project's settings (pyproject.toml) and its cache
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    report = done.stdout
    for name, block_id in where.items():
        report = report.replace(f"{examples / name}:", f"{block_id}, the block's line ")
    assert done.returncode == 0, report + done.stderr
