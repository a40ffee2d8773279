"""asupervisor: an asyncio-native job supervisor.

Launch multi-role, multi-replica apps (TorchX's data model) and follow them
through explicit state machines::

    async with Supervisor(session="svc") as sv:
        handle = await sv.submit(app, "local", cfg={"log_dir": "/tmp/x"})
        status = await sv.wait(handle)

Everything public is re-exported here; ``tests/unit/test_public_api.py`` pins it.
"""

from supervisor.clash import warn_if_mixed
from supervisor.cluster import ClusterInfo, ClusterJob, NodeInfo, PartitionInfo
from supervisor.errors import (
    BackendError,
    DamagedRecordError,
    DuplicateAppError,
    EventsOverflowError,
    InvalidHandleError,
    MissingExtraError,
    NotEnteredError,
    Problem,
    ShuttingDown,
    SpecError,
    SubmitError,
    SupervisorError,
    UnknownAppError,
    UnknownBackendError,
    UnsupportedAsyncLibraryError,
    WaitTimeout,
)
from supervisor.logs import Stream
from supervisor.observe import AppEvent, EventStream
from supervisor.retention import Retention
from supervisor.runopts import OptType, ResolvedCfg, RunOpt, RunOpts
from supervisor.specs import (
    NULL_RESOURCE,
    AppDef,
    AppHandle,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
    macros,
    make_handle,
    parse_handle,
)
from supervisor.states import AppState, ReplicaState
from supervisor.status import (
    AppStatus,
    AppTimes,
    DescribeAppResponse,
    ListAppResponse,
    ReplicaStatus,
    RoleStatus,
    Transition,
)
from supervisor.supervisor import DryRunInfo, Supervisor

__version__ = "0.1.0"

warn_if_mixed()  # supervisord's modules beside ours: say so before an uninstall breaks us

__all__ = [
    "NULL_RESOURCE",
    "AppDef",
    "AppEvent",
    "AppHandle",
    "AppState",
    "AppStatus",
    "AppTimes",
    "BackendError",
    "BindMount",
    "ClusterInfo",
    "ClusterJob",
    "DamagedRecordError",
    "DescribeAppResponse",
    "DeviceMount",
    "DryRunInfo",
    "DuplicateAppError",
    "EventStream",
    "EventsOverflowError",
    "InvalidHandleError",
    "ListAppResponse",
    "MissingExtraError",
    "NodeInfo",
    "NotEnteredError",
    "OptType",
    "PartitionInfo",
    "Problem",
    "ReplicaState",
    "ReplicaStatus",
    "ResolvedCfg",
    "Resource",
    "Retention",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "RunOpt",
    "RunOpts",
    "ShuttingDown",
    "SpecError",
    "Stream",
    "SubmitError",
    "Supervisor",
    "SupervisorError",
    "Transition",
    "UnknownAppError",
    "UnknownBackendError",
    "UnsupportedAsyncLibraryError",
    "VolumeMount",
    "WaitTimeout",
    "__version__",
    "macros",
    "make_handle",
    "parse_handle",
]
