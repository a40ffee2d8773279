"""The slurm backend on the real local cluster, through its commands and through slurmrestd."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from supervisor.backends.base import BackendContext
from supervisor.backends.slurm import PollerSettings, SlurmBackend
from supervisor.backends.slurm.rest import RestTransport

from ..integration.slurm_cluster import ensure_cluster
from .target import Target

__all__ = ["TARGETS"]

# Ticking fast keeps short cases short, and a requeued run is seen even when its
# second attempt ends quickly (Slurm 22.05 leaves restart_cnt at 0 for het jobs).
FAST = PollerSettings(fast=0.5, slow=1.0, running=0.5)


class SlurmCliTarget(Target):
    """sbatch/squeue/sacct/scancel/scontrol."""

    id = "slurm-cli"
    backend = "slurm"
    marks = (pytest.mark.slurm,)
    timeout = 90.0

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def ensure(self) -> None:
        if not self.facts:
            self.facts = ensure_cluster(accounting=True)

    def backends(self) -> Mapping[str, Any] | None:
        return {"slurm": partial(SlurmBackend, poller=FAST)}

    def cli_env(self) -> dict[str, str]:
        return {"ASUPERVISOR_SLURM_TRANSPORT": "cli"}

    def cfg(self, workdir: Path) -> dict[str, object]:
        # A time limit bounds what a broken case could leave on the shared cluster.
        return {**super().cfg(workdir), "time": "5"}


class SlurmRestTarget(SlurmCliTarget):
    """slurmrestd over HTTP with a root JWT (jobs run as root, as with sbatch here)."""

    id = "slurm-rest"

    def ensure(self) -> None:
        super().ensure()
        rest = self.facts.get("rest") or {}
        if not rest.get("jwt_token") or not rest.get("jwt_url"):
            message = "slurmrestd has no JWT endpoint on the local cluster"
            print(message)
            pytest.skip(message)

    @property
    def _rest(self) -> dict[str, str]:
        rest: dict[str, str] = self.facts["rest"]
        return rest

    def backends(self) -> Mapping[str, Any] | None:
        rest = self._rest

        def factory(context: BackendContext) -> SlurmBackend:
            transport = RestTransport(
                url=rest["jwt_url"],
                token=rest["jwt_token"],
                user=rest.get("jwt_user", "root"),
                api_version=rest.get("api_version", "v0.0.38"),
            )
            return SlurmBackend(context, transport=transport, poller=FAST)

        return {"slurm": factory}

    def cli_env(self) -> dict[str, str]:
        rest = self._rest
        return {
            "ASUPERVISOR_SLURM_TRANSPORT": "rest",
            "ASUPERVISOR_SLURMRESTD": rest["jwt_url"],
            "ASUPERVISOR_SLURMRESTD_USER": rest.get("jwt_user", "root"),
            "SLURM_JWT": rest["jwt_token"],
        }


TARGETS: list[Target] = [SlurmCliTarget(), SlurmRestTarget()]
