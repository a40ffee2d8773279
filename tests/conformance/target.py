"""What the conformance cases need to know about one way of running a backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from supervisor import RetryPolicy, Role, Supervisor
from supervisor.specs import Mount

__all__ = ["Target"]


class Target:
    """A backend as the conformance suite runs it; see the package docstring.

    The defaults suit a backend whose replicas are host processes that see the
    test's file system (local, Slurm on this machine); container backends
    override ``role`` to add an image and a bind mount.
    """

    id: str = ""
    backend: str = ""
    marks: Sequence[pytest.MarkDecorator] = ()
    timeout: float = 30.0
    image: str = ""

    def ensure(self) -> None:
        """Bring the component up or check it; ``pytest.skip`` (printing why) if it cannot start."""

    def backends(self) -> Mapping[str, Any] | None:
        """``Supervisor(backends=...)`` for this target; None keeps the built-in factories."""
        return None

    def cli_env(self) -> dict[str, str]:
        """Variables an ``asupervisor`` subprocess needs to talk to the same backend."""
        return {}

    def cfg(self, workdir: Path) -> dict[str, object]:
        """Run options every case submits with."""
        return {"log_dir": str(workdir / "logs")}

    def supervisor(self, session: str = "conf") -> Supervisor:
        """A Supervisor for this target (state directory from ``$ASUPERVISOR_HOME``)."""
        return Supervisor(session=session, backends=self.backends())

    def role(
        self,
        name: str,
        script: str,
        *,
        exchange: Path,
        num_replicas: int = 1,
        max_retries: int = 0,
        retry_policy: RetryPolicy = RetryPolicy.APPLICATION,
    ) -> Role:
        """A role whose replicas run ``sh -c script`` with ``$CONF_DIR`` set to ``exchange``."""
        return Role(
            name=name,
            image=self.image,
            entrypoint="sh",
            args=["-c", script],
            env={"CONF_DIR": str(exchange)},
            num_replicas=num_replicas,
            max_retries=max_retries,
            retry_policy=retry_policy,
            mounts=self.mounts(exchange),
        )

    def mounts(self, exchange: Path) -> list[Mount]:
        """What a replica needs mounted to see ``exchange`` (none: it shares the host files)."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"
