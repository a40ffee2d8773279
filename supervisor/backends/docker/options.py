"""Run options and capabilities of the ``docker`` backend."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.runopts import DEFAULT_STOP_GRACE, OptType, RunOpt, RunOpts, stop_grace_opt
from supervisor.specs import RetryPolicy
from supervisor.validate import Capabilities

__all__ = [
    "DEFAULT_STOP_GRACE",
    "DOCKER_CAPABILITIES",
    "default_host",
    "docker_run_opts",
]

_STANDARD_SOCKETS = (Path("/var/run/docker.sock"), Path("/run/podman/podman.sock"))

DOCKER_CAPABILITIES = Capabilities(
    backend="docker",
    # Each replica is its own container: one replica, one role or the whole app can be redone.
    retry_policies=frozenset(RetryPolicy),
    mounts=True,
    max_replicas_per_role=None,
    # A container needs an image; an empty one cannot mean "the host" here.
    requires_image=True,
)


def default_host() -> str:
    """The engine the docker CLI would reach: $DOCKER_HOST, else the standard socket."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host
    for sock in _STANDARD_SOCKETS:
        if sock.is_socket():
            return f"unix://{sock}"
    return f"unix://{_STANDARD_SOCKETS[0]}"


def docker_run_opts() -> RunOpts:
    return RunOpts(
        [
            RunOpt(
                name="host",
                type=OptType.STR,
                default=None,
                help="engine address, unix:///path.sock or tcp://host:port "
                "(default: $DOCKER_HOST, else the standard docker socket)",
            ),
            RunOpt(
                name="log_dir",
                type=OptType.STR,
                default=None,
                help="directory for logs and state; apps go to {log_dir}/{session}/{app_id} "
                "(default: <state dir>/logs)",
            ),
            stop_grace_opt(),
            RunOpt(
                name="internal_network",
                type=OptType.BOOL,
                default=True,
                help="put the app's containers on an internal network (no traffic leaves the "
                "machine); false lets them reach outside (the network this backend creates "
                "only: not one joined with 'network')",
            ),
            RunOpt(
                name="network",
                type=OptType.STR,
                default=None,
                help="join this existing engine network instead of creating one per app; "
                "it is neither created nor removed here (default: a network of the app's own)",
            ),
            RunOpt(
                name="copy_env",
                type=OptType.LIST,
                default=None,
                help="variables of the submitting process copied into every container, by name "
                "or shell glob (e.g. AWS_*;HF_TOKEN), read at dryrun",
            ),
            RunOpt(
                name="env",
                type=OptType.LIST,
                default=None,
                help="variables set in every container, NAME=VALUE items (e.g. A=1;B=2); "
                "over copy_env, under each role's own env",
            ),
            RunOpt(
                name="privileged",
                type=OptType.BOOL,
                default=False,
                help="run the containers privileged (every capability, every host device)",
            ),
        ],
        refused=_REFUSED,
    )


_NO_HOST_ENV = (
    "a container never inherits this process's environment: it sees its image's ENV, "
    "the variables named by copy_env and env, and its role's env"
)
#: Options of the local backend that mean nothing here, with why (see docs/backends/docker.md).
_REFUSED = {"env_policy": _NO_HOST_ENV, "env_allow": _NO_HOST_ENV}
