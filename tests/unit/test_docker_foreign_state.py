"""An unfollowed docker app's state, derived from its containers as the engines list them."""

from __future__ import annotations

from typing import Any

from supervisor import AppDef, AppState, ReplicaState, Role
from supervisor.backends.docker.foreign import ForeignApps
from supervisor.backends.docker.request import LABEL
from supervisor.backends.store import AppRecord, Owner
from supervisor.status import AppStatus, ReplicaStatus, RoleStatus

APP = AppRecord(
    handle="docker://s/a",
    app=AppDef("a", [Role("w", image="i", entrypoint="e", num_replicas=2)]),
    owner=Owner(1, None, "elsewhere"),
)


def container(k: int, state: str, status: str = "", attempt: int = 0) -> dict[str, Any]:
    return {
        "Id": f"c{k}{attempt}",
        "Names": [f"/a-w-{k}"],
        "State": state,
        "Status": status,
        "Labels": {LABEL.ROLE: "w", LABEL.REPLICA_ID: str(k), LABEL.ATTEMPT: str(attempt)},
    }


def test_running_and_exited_containers() -> None:
    status = ForeignApps._from_containers(
        APP,
        [container(0, "running", "Up 3 seconds"), container(1, "exited", "Exited (3) 1s ago")],
        None,
    )
    assert status.state is AppState.RUNNING
    r0, r1 = status.roles[0].replicas
    assert (r0.state, r0.hostname) == (ReplicaState.RUNNING, "a-w-0")
    assert (r1.state, r1.exit_code) == (ReplicaState.FAILED, 3)


def test_the_latest_attempt_speaks_for_the_replica() -> None:
    listed = [
        container(0, "exited", "Exited (5) 9s ago", attempt=0),
        container(0, "exited", "Exited (0) 1s ago", attempt=1),
        container(1, "exited", "Exited (0) 1s ago"),
    ]
    status = ForeignApps._from_containers(APP, listed, None)
    assert status.state is AppState.SUCCEEDED


def test_signal_deaths_are_named_and_missing_containers_fall_back_to_records() -> None:
    recorded = AppStatus(
        AppState.RUNNING,
        num_restarts=2,
        roles=(
            RoleStatus(
                "w",
                (
                    ReplicaStatus(id=0, state=ReplicaState.RUNNING, role="w"),
                    ReplicaStatus(id=1, state=ReplicaState.SUCCEEDED, role="w", exit_code=0),
                ),
            ),
        ),
    )
    status = ForeignApps._from_containers(
        APP,
        [container(0, "exited", "Exited (137) 2s ago")],
        (recorded, Owner.current()),
    )
    r0, r1 = status.roles[0].replicas
    assert (r0.state, r0.exit_code, r0.signal) == (ReplicaState.FAILED, 137, "SIGKILL")
    assert r1.state is ReplicaState.SUCCEEDED
    assert status.state is AppState.FAILED and status.num_restarts == 2


def test_no_containers_at_all_is_unknown() -> None:
    status = ForeignApps._from_containers(APP, [], None)
    assert status.state is AppState.UNKNOWN
    assert "gone" in status.msg
