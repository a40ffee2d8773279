"""Parsing the cluster view from every shape Slurm answers in, and the CLI's refusals.

The real cluster is in tests/integration/test_slurm_cluster_view.py; these are
the shapes it cannot give (other Slurm releases, several partitions, het jobs)
and the commands' usage errors, which launch nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from supervisor import AppState, AppStatus, DescribeAppResponse
from supervisor.backends.slurm.cluster import (
    cluster_info,
    handle_of_comment,
    jobs_from_json,
    node_from_json,
    partition_from_json,
    partitions_from_scontrol,
)
from supervisor.cli.main import cli

NODE_2205: dict[str, Any] = {
    "name": "n1", "state": "mixed", "state_flags": ["DRAIN"], "cpus": 2, "alloc_cpus": 1,
    "real_memory": 4000, "alloc_memory": 512, "gres": "gpu:a100:2", "partitions": ["debug"],
    "reason": "maintenance",
}  # fmt: skip
NODE_2311: dict[str, Any] = {
    "name": "g1", "state": ["IDLE", "DRAIN"], "cpus": 64,
    "alloc_cpus": {"set": True, "infinite": False, "number": 0},
    "real_memory": {"set": True, "infinite": False, "number": 256000}, "alloc_memory": 0,
    "gres": "(null)", "partitions": ["gpu", "all"],
}  # fmt: skip
SCONTROL = (
    "PartitionName=debug AllowGroups=ALL Default=YES Nodes=n[1-3] State=UP TotalCPUs=6 "
    "TotalNodes=3 TRES=cpu=6,mem=12000M,node=3,billing=6\n"
    "PartitionName=long Default=NO Nodes=(null) State=DOWN TotalCPUs=0 TotalNodes=0\n"
)


def test_nodes_of_22_05_and_23_11() -> None:
    old = node_from_json(NODE_2205)
    assert (old.state, old.cpus, old.alloc_cpus, old.memory_mb, old.alloc_memory_mb) == (
        "mixed+drain", 2, 1, 4000, 512,
    )  # fmt: skip
    assert old.gres == "gpu:a100:2" and list(old.partitions) == ["debug"]
    assert old.reason == "maintenance"
    new = node_from_json(NODE_2311)
    assert (new.state, new.cpus, new.alloc_cpus, new.memory_mb, new.gres) == (
        "idle+drain", 64, 0, 256000, "",
    )  # fmt: skip


def test_partitions_from_scontrol_and_from_slurmrestd() -> None:
    debug, long = partitions_from_scontrol(SCONTROL)
    assert debug.to_json() == {
        "name": "debug", "state": "UP", "nodes": "n[1-3]", "total_nodes": 3,
        "total_cpus": 6, "default": True,
    }  # fmt: skip
    assert (long.name, long.state, long.nodes, long.default) == ("long", "DOWN", "", False)
    rest = partition_from_json(
        {"flags": ["default"], "name": "debug", "nodes": "n[1-3]", "state": "UP",
         "total_cpus": 6, "total_nodes": 3}
    )  # fmt: skip
    assert rest == debug


def test_one_partition_keeps_its_nodes_only() -> None:
    parts = partitions_from_scontrol(SCONTROL)
    info = cluster_info("23.11.1", parts, [NODE_2311, NODE_2205], only_partition="debug")
    assert [p.name for p in info.partitions] == ["debug"]
    assert [n.name for n in info.nodes] == ["n1"]
    assert [n.name for n in cluster_info("x", parts, [NODE_2311, NODE_2205]).nodes] == ["g1", "n1"]


@pytest.mark.parametrize(
    ("comment", "handle"),
    [
        ("asupervisor:svc/train-1a2b", "slurm://svc/train-1a2b"),
        ("asupervisor:svc/train-1a2b the user's own comment", "slurm://svc/train-1a2b"),
        ("", None),
        ("asupervisor:", None),
        ("asupervisor:svc", None),
        ("someone else's comment asupervisor:svc/x", None),
    ],
)
def test_our_jobs_are_told_by_their_comment(comment: str, handle: str | None) -> None:
    assert handle_of_comment(comment) == handle


def test_a_het_job_is_one_job_with_its_components() -> None:
    tag = "asupervisor:svc/app-1"
    jobs = jobs_from_json(
        [
            {"job_id": 11, "het_job_id": 10, "het_job_offset": 1, "job_state": ["RUNNING"],
             "nodes": "n2", "comment": tag, "name": "app-1", "user_name": "alice",
             "partition": "debug"},
            {"job_id": 10, "het_job_id": 10, "het_job_offset": 0, "job_state": ["RUNNING"],
             "nodes": "n1", "comment": tag, "name": "app-1", "user_name": "alice",
             "partition": "debug", "state_reason": "None"},
            {"job_id": 12, "het_job_id": 0, "job_state": "PENDING", "nodes": "",
             "state_reason": "Resources", "name": "theirs", "user_name": "bob",
             "partition": "long", "comment": ""},
        ]
    )  # fmt: skip
    ours, theirs = jobs
    assert ours.to_json() == {
        "job_id": 10, "name": "app-1", "user": "alice", "state": "RUNNING",
        "partition": "debug", "nodes": "n1,n2", "reason": "", "handle": "slurm://svc/app-1",
        "components": 2,
    }  # fmt: skip
    assert (theirs.job_id, theirs.state, theirs.reason, theirs.handle) == (
        12, "PENDING", "Resources", None,
    )  # fmt: skip


def test_metadata_goes_through_json_and_describe() -> None:
    status = AppStatus(AppState.RUNNING, metadata={"slurm_job_id": "42"})
    assert status.to_json()["metadata"] == {"slurm_job_id": "42"}
    assert AppStatus.from_json(status.to_json()) == status
    assert AppStatus.from_json({"state": "RUNNING"}).metadata == {}  # records written before
    described = DescribeAppResponse.from_status("a", status, ())
    assert described.metadata == {"slurm_job_id": "42"}
    assert described.to_status() == status


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="asupervisor", input=stdin)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel"], "give HANDLE, or choose apps with --state, --partition or --all"),
        (["cancel", "local://me/x", "--all"], "not both"),
        (["cancel", "--state", "BOGUS"], "BOGUS: not app states"),
        (["list", "--user", "alice"], "add --cluster"),
        (["list", "--partition", "debug"], "add --cluster"),
        (["cluster", "--backend", "local"], "'local' has no cluster to show"),
        (["list", "--cluster"], "'local' has no cluster to list"),
    ],
)
def test_usage_errors_exit_2(state_dir: Path, args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_cancel_by_filter_with_nothing_matching_exits_0(state_dir: Path) -> None:
    result = invoke("cancel", "--all")
    assert result.exit_code == 0, result.output
    assert "nothing to cancel" in result.stderr
