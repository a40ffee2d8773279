"""The docker backend on both local engines: dockerd and Podman's Docker-compatible API.

Replicas are containers of the offline test image (busybox ``sh``); the
case's exchange directory is bind-mounted at the same path, so ``$CONF_DIR``
means the same inside and outside. Both engines come from
``scripts/docker-engines`` (``tests/integration/docker_engines.py`` brings them
up, or skips saying why).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from supervisor import BindMount
from supervisor.backends.docker import DockerBackend
from supervisor.specs import Mount

from ..integration.docker_engines import IMAGE, ensure_engines
from .target import Target

__all__ = ["TARGETS"]


class DockerTarget(Target):
    backend = "docker"
    marks = (pytest.mark.docker,)
    timeout = 60.0
    image = IMAGE

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.id = f"docker-{engine}"
        self.host = ""

    def ensure(self) -> None:
        if not self.host:
            facts = ensure_engines()
            info = facts["engines"][self.engine]
            if not info.get("up"):
                message = f"the {self.engine} engine did not come up"
                print(message)
                pytest.skip(message)
            self.host = str(info["host"])

    def backends(self) -> Mapping[str, Any] | None:
        return {"docker": partial(DockerBackend, host=self.host)}

    def cli_env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.host}

    def cfg(self, workdir: Path) -> dict[str, object]:
        return {**super().cfg(workdir), "host": self.host, "stop_grace": 2.0}

    def mounts(self, exchange: Path) -> list[Mount]:
        """The exchange directory at the same path inside: ``$CONF_DIR`` means the same there."""
        return [BindMount(str(exchange), str(exchange))]


TARGETS: list[Target] = [DockerTarget("docker"), DockerTarget("podman")]
