"""The ``docker`` backend: each replica a container on a Docker-API engine (dockerd, Podman)."""

from supervisor.backends.docker.backend import DockerBackend

__all__ = ["DockerBackend"]
