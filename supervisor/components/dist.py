"""``ddp``: a torchrun-style data-parallel job, one process per rank."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from supervisor.specs import AppDef, Role, macros

__all__ = ["MASTER_PORT", "ddp", "parse_j"]

MASTER_PORT = 29500
"""torchrun's default rendezvous port."""

_J = re.compile(r"(?:(\d+)x)?(\d+)")


def parse_j(j: str) -> tuple[int, int]:
    """``"NxM"`` -> (N nodes, M processes per node); a bare ``"M"`` means one node."""
    found = _J.fullmatch(j.strip())
    if found is None:
        raise ValueError(f"-j {j!r}: expected NNODESxNPROC_PER_NODE (e.g. 2x4) or NPROC")
    nnodes, nproc = int(found.group(1) or 1), int(found.group(2))
    if nnodes < 1 or nproc < 1:
        raise ValueError(f"-j {j!r}: node and process counts must be at least 1")
    return nnodes, nproc


def ddp(
    script: str,
    *script_args: str,
    j: str = "1x2",
    name: str | None = None,
    max_retries: int = 0,
    master_port: int = MASTER_PORT,
) -> AppDef:
    """Run a Python script data-parallel, torchrun style: one replica per rank.

    One role, ``trainer``, with NNODES x NPROC replicas of ``python SCRIPT
    ARGS...`` (this interpreter). Each replica gets RANK (its replica id),
    WORLD_SIZE, LOCAL_WORLD_SIZE (NPROC), MASTER_PORT, and, computed by the
    shell when it starts, LOCAL_RANK (RANK mod NPROC), GROUP_RANK (RANK div
    NPROC) and MASTER_ADDR (the host of rank 0, read from the variable the
    backend names through ``${rank0_env}``). The script and its arguments
    are shell-quoted; macros in them are still substituted.

    Args:
        script: the Python script to run
        script_args: arguments passed to the script
        j: NNODESxNPROC_PER_NODE, e.g. 2x4, or just NPROC for one node
        name: the app's name (default: the script's name)
        max_retries: how many times the job may be restarted after a failure
        master_port: the port rank 0 listens on for the rendezvous
    """
    nnodes, nproc = parse_j(j)
    world = nnodes * nproc
    command = shlex.join([sys.executable, script, *script_args])
    # `$$` is a literal `$` for the shell; `$${rank0_env}` would stay literal
    # too, so the variable's name comes from a macro right after the escape.
    shell = (
        f'export MASTER_ADDR="$${macros.rank0_env}"'
        f" LOCAL_RANK=$$((RANK % {nproc})) GROUP_RANK=$$((RANK / {nproc}));"
        f" exec {command}"
    )
    return AppDef(
        name=name or Path(script).stem or "ddp",
        roles=[
            Role(
                name="trainer",
                entrypoint="sh",
                args=["-c", shell],
                env={
                    "RANK": macros.replica_id,
                    "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(nproc),
                    "MASTER_PORT": str(master_port),
                },
                num_replicas=world,
                max_retries=max_retries,
            )
        ],
    )
