"""ASUPERVISOR_SLURM_CLUSTER=skip keeps every Slurm test off the cluster, saying so.

Runs pytest on every Slurm integration module in a child process with
``--setup-plan``, which executes no fixture and no test body: even if the
switch were broken, the child could not touch the shared cluster (and so needs
no lock). The child must report each of those tests skipped with the reason,
and print the reason once in its header.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM_MODULES = sorted(str(p) for p in (ROOT / "tests" / "integration").glob("test_slurm_*.py"))


def _pytest(*args: str, skip: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ASUPERVISOR_SLURM_CLUSTER"}
    if skip:
        env["ASUPERVISOR_SLURM_CLUSTER"] = "skip"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, *SLURM_MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a guard against a hang: under heavy load a child takes minutes
        check=False,
    )
    return done.stdout + done.stderr


@pytest.mark.timeout(660)  # its two children run pytest over every Slurm module
def test_every_slurm_test_is_skipped_with_the_reason() -> None:
    assert len(SLURM_MODULES) >= 6
    collected = _pytest("--collect-only", "-q", skip=False)
    count = int(re.search(r"(\d+) tests? collected", collected).group(1))  # type: ignore[union-attr]
    assert count > 20

    out = _pytest("--setup-plan", "-q", "-rs", skip=True)
    assert f"{count} skipped" in out, out[-3000:]
    assert "passed" not in out and "failed" not in out and "error" not in out.lower()
    reason = "ASUPERVISOR_SLURM_CLUSTER=skip: the Slurm tests do not use"
    assert f"({count} tests skipped)" in out  # the header line
    skipped_lines = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped_lines and all(reason in line for line in skipped_lines)
    for module in SLURM_MODULES:  # every module, not just the one that used to read it
        assert Path(module).name in out


@pytest.mark.timeout(330)
def test_without_the_switch_nothing_is_skipped_at_collection() -> None:
    out = _pytest("--setup-plan", "-q", skip=False)
    assert "ASUPERVISOR_SLURM_CLUSTER=skip" not in out
    assert "skipped" not in out
