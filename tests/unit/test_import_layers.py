"""The import direction of the package, as pyproject.toml's [tool.importlinter] declares it.

Higher layers import lower ones only, no backend imports another, and no two
siblings (modules or packages, at any depth) import each other, even for the
type checker. import-linter checks the real import graph of ``supervisor``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys, importlinter.cli as c; "
        "sys.exit(c.lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_import_contract_is_kept() -> None:
    done = _lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_reversed_layer_is_caught(tmp_path: Path) -> None:
    """The check sees real imports: the Supervisor does import the actors, so a
    contract that puts the actors above it must break."""
    config = tmp_path / "reversed.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "supervisor"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "reversed"\ntype = "layers"\ncontainers = ["supervisor"]\n'
        'layers = ["actor", "supervisor"]\n'
    )
    done = _lint(config)
    assert done.returncode != 0
    assert "supervisor.supervisor -> supervisor.actor" in done.stdout
