"""What the slurm backend can honour, checked by ``validate`` before any script is rendered."""

from __future__ import annotations

from supervisor.specs import RetryPolicy
from supervisor.validate import Capabilities

__all__ = ["SLURM_CAPABILITIES"]

SLURM_CAPABILITIES = Capabilities(
    backend="slurm",
    # Slurm retries by requeueing the whole job; it cannot restart one replica or role.
    retry_policies=frozenset({RetryPolicy.APPLICATION}),
    # Container mounts, rendered by pyxis (--container-mounts) for a role with an image.
    mounts=True,
    max_replicas_per_role=None,
    requires_image=False,
    mounts_note="bind and device, as pyxis container mounts of a role with an image",
    image_note="run with pyxis (srun --container-image); a tag only with image_is_tag",
)
