"""The package as a user gets it: sdist and wheel built, the wheel installed into fresh
venvs outside the repository, the CLI and the Python example run from there.

Also supervisord (PyPI ``supervisor``, the same import package name) installed beside
it in both orders, and uninstalled again: each broken state is explained with the fix.
These venvs reach the package index (or pip's cache) for the dependencies.
"""

from __future__ import annotations

import email
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = Path("/")
SUPERVISORD = "supervisor==4.3.0"
BACKEND_EXTRAS = {"aiodocker", "aiohttp", "httpx"}
_SKIP = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis", "*.so"
)


def _run(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path = OUTSIDE
) -> subprocess.CompletedProcess[str]:
    """``args`` run from outside the repository, where ``import supervisor`` cannot find it
    (and without PYTHONPATH, which the suite may point at it)."""
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        env=_env(None) if env is None else env,
        cwd=cwd,
        timeout=600,
    )


def _ok(*args: str | Path, **kwargs: object) -> str:
    done = _run(*args, **kwargs)  # type: ignore[arg-type]
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel, built from a copy of the tree (the build leaves nothing here)."""
    src = tmp_path_factory.mktemp("src") / "asupervisor"
    shutil.copytree(ROOT, src, ignore=_SKIP)
    out = tmp_path_factory.mktemp("dist")
    _ok(sys.executable, "-m", "build", "--outdir", out, src)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("asupervisor-*.whl")
    return wheel


def _venv(where: Path, *install: str | Path) -> Path:
    """A fresh venv (no system site-packages) with ``install``; its bin directory."""
    _ok(sys.executable, "-m", "venv", where)
    if install:
        _ok(where / "bin" / "python", "-m", "pip", "install", "--quiet", *install)
    return where / "bin"


def _env(home: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if home is not None:
        env["ASUPERVISOR_HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def core(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel and no extra: the core install."""
    return _venv(tmp_path_factory.mktemp("core") / "venv", _wheel(dist))


def test_wheel_and_sdist_carry_the_license_and_the_metadata(dist: Path) -> None:
    wheel = _wheel(dist)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read("asupervisor-0.1.0.dist-info/METADATA"))
    assert "asupervisor-0.1.0.dist-info/licenses/LICENSE" in names
    assert {"supervisor/py.typed", "supervisor/__main__.py"} <= set(names)
    # The reaper's spawn into a cgroup, built from its C source (x86-64: see _cspawn.c).
    if platform.machine() == "x86_64":
        built = [n for n in names if n.startswith("supervisor/backends/local/_cspawn.")]
        assert any(n.endswith(".so") for n in built), built
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier") or []
    for expected in (
        "Operating System :: POSIX :: Linux",
        "Framework :: AsyncIO",
        "Typing :: Typed",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.13",
    ):
        assert expected in classifiers
    assert "to come" not in meta["Summary"] and "Slurm" in meta["Summary"]
    assert meta.get_all("Project-URL")
    core = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert not any(r.startswith(tuple(BACKEND_EXTRAS)) for r in core), core
    (sdist,) = dist.glob("asupervisor-*.tar.gz")
    with tarfile.open(sdist) as t:
        assert "asupervisor-0.1.0/LICENSE" in t.getnames()
        assert "asupervisor-0.1.0/supervisor/backends/local/_cspawn.c" in t.getnames()


def test_the_core_install_brings_no_backend_extra(core: Path) -> None:
    installed = {
        line.split("==")[0].lower() for line in _ok(core / "python", "-m", "pip", "freeze")
    }
    assert not installed & (BACKEND_EXTRAS | {"torch"}), installed
    probe = "import sys, supervisor; print(sorted(m for m in sys.modules if m in %r))"
    assert _ok(core / "python", "-c", probe % BACKEND_EXTRAS).strip() == "[]"


def test_the_cli_and_the_python_example_run_from_the_installed_wheel(
    core: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path / "home")
    assert "0.1.0" in _ok(core / "asupervisor", "--version", env=env)
    assert "Usage: asupervisor" in _ok(core / "python", "-m", "supervisor", "--help", env=env)
    done = _run(core / "asupervisor", "run", "--wait", "--", "echo", "from the wheel", env=env)
    assert done.returncode == 0, done.stderr
    assert "SUCCEEDED" in done.stdout
    for name in ("demo.py", "demo_app.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    demo = _run(core / "python", tmp_path / "demo.py", env=env, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "SUCCEEDED" in demo.stdout


def test_a_backend_without_its_extra_names_the_extra_to_install(core: Path, tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    done = _run(core / "asupervisor", "run", "--backend", "docker", "--", "true", env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: the docker backend needs the 'aiodocker' package, which is not installed: "
        "pip install 'asupervisor[docker]'"
    ]
    rest = (
        "import os\n"
        "os.environ.update(ASUPERVISOR_SLURM_TRANSPORT='rest', ASUPERVISOR_SLURMRESTD='unix:/x')\n"
        "from supervisor import MissingExtraError\n"
        "from supervisor.backends.slurm.backend import transport_from_env\n"
        "try:\n"
        "    transport_from_env()\n"
        "except MissingExtraError as e:\n"
        "    print(e.extra, '|', e)\n"
    )
    assert _ok(core / "python", "-c", rest, env=env).strip() == (
        "slurm-rest | Slurm over slurmrestd needs the 'httpx' package, which is not "
        "installed: pip install 'asupervisor[slurm-rest]'"
    )


@pytest.mark.parametrize("order", ["asupervisor-then-supervisord", "supervisord-then-asupervisor"])
def test_supervisord_in_the_same_venv_is_explained_with_the_fix(
    dist: Path, tmp_path: Path, order: str
) -> None:
    wheel = str(_wheel(dist))
    first, second = (wheel, SUPERVISORD) if order.startswith("asup") else (SUPERVISORD, wheel)
    bindir = _venv(tmp_path / "venv", first)
    _ok(bindir / "python", "-m", "pip", "install", "--quiet", second)
    env = _env(tmp_path / "home")
    imported = _run(bindir / "python", "-c", "from supervisor import Supervisor", env=env)
    cli = _run(bindir / "asupervisor", "list", env=env)
    module = _run(bindir / "python", "-m", "supervisor", "list", env=env)
    if order.startswith("asup"):
        # supervisord's __init__.py replaced ours: our code never runs on import, the
        # entry points explain.
        assert imported.returncode == 1 and "ImportError" in imported.stderr
        for done in (cli, module):
            assert done.returncode == 1
            assert "is supervisord's (PyPI 'supervisor')" in done.stderr
            assert "pip uninstall -y supervisor asupervisor" in done.stderr
    else:
        # Ours on top of supervisord's modules: it works, and says what an uninstall does.
        for done in (imported, cli, module):
            assert done.returncode == 0, done.stderr
            assert "RuntimeWarning: supervisord (PyPI 'supervisor') is installed" in done.stderr
            assert "uninstalling either breaks the other" in done.stderr
    # Uninstalling supervisord deletes our __init__.py in both orders.
    _ok(bindir / "python", "-m", "pip", "uninstall", "--quiet", "-y", "supervisor")
    cli = _run(bindir / "asupervisor", "list", env=env)
    assert cli.returncode == 1
    assert "__init__.py is missing" in cli.stderr and "pip install asupervisor" in cli.stderr
    # The fix the message gives works.
    _ok(bindir / "python", "-m", "pip", "uninstall", "--quiet", "-y", "supervisor", "asupervisor")
    _ok(bindir / "python", "-m", "pip", "install", "--quiet", wheel)
    fixed = _run(bindir / "asupervisor", "list", env=env)
    assert fixed.returncode == 0 and fixed.stderr == "", fixed.stderr
    _ok(bindir / "python", "-c", "from supervisor import Supervisor", env=env)
