"""The local backend: replicas are processes of this machine."""

from __future__ import annotations

from .target import Target

__all__ = ["TARGETS"]


class LocalTarget(Target):
    id = "local"
    backend = "local"
    timeout = 30.0


TARGETS: list[Target] = [LocalTarget()]
