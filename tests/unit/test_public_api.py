"""Pins the public surface: adding or removing a name is a deliberate change here."""

from __future__ import annotations

import inspect
import subprocess
import sys

import supervisor

EXPECTED = {
    "NULL_RESOURCE", "AppDef", "AppEvent", "AppHandle", "AppState", "AppStatus", "AppTimes",
    "BackendError",
    "BindMount", "ClusterInfo", "ClusterJob", "DamagedRecordError", "DescribeAppResponse",
    "DeviceMount", "DryRunInfo", "EventStream", "EventsOverflowError",
    "DuplicateAppError", "InvalidHandleError", "ListAppResponse", "MissingExtraError",
    "NodeInfo", "NotEnteredError", "OptType", "PartitionInfo", "Problem", "ReplicaState",
    "ReplicaStatus", "Retention",
    "ResolvedCfg", "Resource", "RetryPolicy", "Role", "RoleStatus", "RunOpt", "RunOpts",
    "ShuttingDown", "SpecError", "Stream", "SubmitError", "Supervisor", "SupervisorError",
    "Transition",
    "UnknownAppError", "UnknownBackendError", "UnsupportedAsyncLibraryError", "VolumeMount",
    "WaitTimeout", "__version__", "macros", "make_handle", "parse_handle",
}  # fmt: skip

SUPERVISOR_METHODS = {
    "dryrun", "schedule", "submit", "status", "describe", "exists", "list", "cancel",
    "wait", "watch", "events", "log_iter", "close", "run_opts", "hold", "release",
    "cluster", "cluster_jobs", "matching", "cancel_matching",
    "begin_shutdown", "gc", "followed",
}  # fmt: skip


BACKEND_CONTRACT = {
    "CANCELLED_ELSEWHERE", "Adoption", "AppCancelRequested", "AppNotice", "AppRuntime",
    "AppTasks", "Backend", "BackendContext", "BackendRegistry", "DryrunContext", "EventSink",
    "LogTarget", "Request",
}  # fmt: skip
# What a new backend must implement: changing it breaks every third-party backend.
# At most 6 methods (issue 15): the rest have defaults (no records, no run options).
BACKEND_ABSTRACT = {"dryrun", "launch"}
RUNTIME_ABSTRACT = {"stop", "restart", "log_target"}


def test_the_backend_contract_is_pinned() -> None:
    """``supervisor.backends.base`` is the public surface third-party backends build on."""
    from supervisor.backends import base

    assert set(base.__all__) == BACKEND_CONTRACT
    assert set(base.Backend.__abstractmethods__) == BACKEND_ABSTRACT
    assert set(base.AppRuntime.__abstractmethods__) == RUNTIME_ABSTRACT
    assert len(BACKEND_ABSTRACT) + len(RUNTIME_ABSTRACT) <= 6
    # ``launch`` is given where to post the app's events and the app's own task group.
    launch = inspect.signature(base.Backend.launch)
    assert list(launch.parameters) == ["self", "request", "sink", "tasks"]


def test_all_is_pinned_and_resolves() -> None:
    assert set(supervisor.__all__) == EXPECTED
    for name in supervisor.__all__:
        assert getattr(supervisor, name) is not None


def test_supervisor_verbs_exist() -> None:
    for name in SUPERVISOR_METHODS:
        assert callable(getattr(supervisor.Supervisor, name)), name


def test_torchx_state_values() -> None:
    values = {s.name: s.value for s in supervisor.AppState}
    assert values == {
        "UNSUBMITTED": 0, "SUBMITTED": 1, "PENDING": 2, "RUNNING": 3,
        "SUCCEEDED": 4, "FAILED": 5, "CANCELLED": 6, "UNKNOWN": 7,
    }  # fmt: skip
    assert {s.name: s.value for s in supervisor.ReplicaState} == values


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(supervisor.SpecError, ValueError)
    assert issubclass(supervisor.WaitTimeout, TimeoutError)


def test_import_pulls_in_no_optional_backend_library() -> None:
    code = (
        "import sys, supervisor; "
        "print(sorted(m for m in ('aiodocker', 'httpx', 'supervisor.backends.local') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
