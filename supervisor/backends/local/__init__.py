"""The ``local`` backend: replicas as process groups on this machine."""

from supervisor.backends.local.backend import LocalBackend
from supervisor.backends.local.request import LocalRequest, ReplicaLaunch

__all__ = ["LocalBackend", "LocalRequest", "ReplicaLaunch"]
