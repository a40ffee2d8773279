"""Golden sbatch scripts: any change to what we send Slurm shows up as a diff here.

Regenerate with ``UPDATE_GOLDEN=1 pytest tests/unit/test_slurm_script.py``
and review the diff like code.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from supervisor import AppDef, Resource, RetryPolicy, Role, SpecError
from supervisor.backends.base import DryrunContext
from supervisor.backends.slurm.options import (
    check_slurm_cfg,
    expand_hostlist,
    slurm_run_opts,
    valid_time,
)
from supervisor.backends.slurm.script import (
    ClusterFacts,
    SlurmRequest,
    dependencies,
    group_keys,
    render,
    with_dependencies,
)
from supervisor.runopts import parse_cfg_string
from supervisor.specs import PROCS_PER_NODE

GOLDEN = Path(__file__).parent / "golden"
CTX = DryrunContext(session="svc", app_id="train-0001", cwd="/home/me/project")
FACTS = ClusterFacts(version=(22, 5), default_partition="debug", real_memory_mb={"debug": 4000})
HOSTILE_ARG = "$(touch /tmp/pwned) `id` ; rm -rf / 'quoted' \"double\""
HOSTILE_ENV = "a,b,c=d e;$(touch /tmp/pwned)\nline2"


def _app() -> AppDef:
    return AppDef(
        name="train",
        roles=[
            Role(
                name="trainer",
                entrypoint="python",
                args=[
                    "-m",
                    "train",
                    "--id",
                    "${replica_id}",
                    "--master",
                    "$${${rank0_env}}",
                    HOSTILE_ARG,
                ],
                env={"LR": "0.1", "TRICKY": HOSTILE_ENV},
                num_replicas=2,
                max_retries=2,
                resource=Resource(cpu=2, gpu=1, memMB=2048),
            ),
            Role(
                name="ps",
                entrypoint="python",
                args=["-m", "ps"],
                resource=Resource(cpu=1, memMB=512),
            ),
        ],
    )


def _script(
    name: str, cfg: dict[str, object], facts: ClusterFacts = FACTS, app: AppDef | None = None
) -> str:
    request = render(
        app or _app(),
        slurm_run_opts().resolve(cfg),
        CTX,
        facts=facts,
        default_log_dir=Path("/state/logs"),
        job_dir=None,
    )
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(request.script)
    return request.script


@pytest.mark.parametrize(
    ("name", "cfg", "facts"),
    [
        ("basic", {}, FACTS),
        (
            "all_options",
            {
                "partition": "debug",
                "time": "1-02:00:00",
                "comment": "nightly run",
                "constraint": "a100",
                "mail-user": "me@example.com",
                "mail-type": "END,FAIL",
                "qos": "high",
                "account": "ml",
            },
            FACTS,
        ),
        ("small_memory_new_slurm", {}, ClusterFacts((24, 11), "tiny", {"tiny": 1000})),
    ],
)
def test_scripts_match_golden_files(name: str, cfg: dict[str, object], facts: ClusterFacts) -> None:
    assert _script(name, cfg, facts) == (GOLDEN / f"{name}.sbatch").read_text()


def test_a_single_replica_is_a_plain_job() -> None:
    app = AppDef(name="one", roles=[Role(name="r", entrypoint="true")])
    cfg = slurm_run_opts().resolve({})
    script = render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None).script
    assert "hetjob" not in script and "--het-group" not in script
    assert "srun --kill-on-bad-exit=1" in script


def test_memory_and_gpu_rules() -> None:
    basic = _script("basic", {})
    assert "--mem=2048" in basic and "--gpus-per-task=1" in basic
    small = _script("small_memory_new_slurm", {}, ClusterFacts((24, 11), "tiny", {"tiny": 1000}))
    assert "--mem=" not in small and "--gpus-per-node=1" in small


def test_hostile_values_reach_the_program_literally() -> None:
    script = _script("basic", {})
    srun = script[script.index("srun ") :].split("exitcode=")[0]
    groups = srun.replace("\\\n", " ").split(" : ")
    words = shlex.split(groups[0])
    assert HOSTILE_ARG in words
    assert f"TRICKY={HOSTILE_ENV}" in words
    # $$ escapes a dollar, so the program sees a shell-style reference, unexpanded.
    assert "${TORCHX_RANK0_HOST}" in words


def test_request_is_not_mutated_and_is_deterministic() -> None:
    app = _app()
    cfg = slurm_run_opts().resolve({})
    one = render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    two = render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    assert one == two
    assert app == _app()


@pytest.mark.parametrize(
    "good", ["30", "1:30", "01:30:00", "2-0", "2-12:30", "2-12:30:00", "INFINITE"]
)
def test_valid_times(good: str) -> None:
    assert valid_time(good)


@pytest.mark.parametrize("bad", ["", "1h", "1:2:3:4", "-5", "2-", "a-1"])
def test_invalid_times(bad: str) -> None:
    assert not valid_time(bad)


def test_cfg_problems_name_the_fields() -> None:
    cfg = slurm_run_opts().resolve({"time": "1h", "mail-type": "END,BOGUS", "partition": "a b"})
    with pytest.raises(SpecError) as err:
        check_slurm_cfg(cfg)
    assert set(err.value.fields) == {"cfg.time", "cfg.mail-type", "cfg.partition"}


def test_a_newline_in_a_free_text_option_is_refused_naming_it() -> None:
    # Rendered into the batch script, it would end the #SBATCH line (issue 19, low).
    cfg = slurm_run_opts().resolve(
        {"comment": "run 1\n#SBATCH --exclusive", "mail-user": "me@example.com\n", "time": "5"}
    )
    with pytest.raises(SpecError) as err:
        check_slurm_cfg(cfg)
    assert set(err.value.fields) == {"cfg.comment", "cfg.mail-user"}
    check_slurm_cfg(slurm_run_opts().resolve({"comment": "two words", "mail-user": "a@b.c"}))


def test_retry_policies_other_than_application_are_not_whole_job() -> None:
    # Whole-job requeue is the only retry Slurm does: the backend's capabilities say so.
    from supervisor.backends.slurm.capabilities import SLURM_CAPABILITIES
    from supervisor.validate import validate

    app = AppDef(
        name="x",
        roles=[Role(name="r", entrypoint="e", max_retries=1, retry_policy=RetryPolicy.REPLICA)],
    )
    with pytest.raises(SpecError, match="REPLICA is not supported by backend 'slurm'"):
        validate(app, SLURM_CAPABILITIES)


def _grouped_app() -> AppDef:
    """A parameter server, then 2 nodes x 2 ranks (``ddp -j 2x2``'s placement)."""
    return AppDef(
        name="ddp",
        roles=[
            Role(name="ps", entrypoint="python", args=["-m", "ps"]),
            Role(
                name="trainer",
                entrypoint="python",
                args=["-m", "train", "--rank", "${replica_id}"],
                num_replicas=4,
                max_retries=1,
                resource=Resource(cpu=1, memMB=512),
                metadata={PROCS_PER_NODE: 2},
            ),
        ],
    )


def test_a_grouped_role_is_one_het_group_of_nodes_with_tasks_each() -> None:
    script = _script("grouped", {}, app=_grouped_app())
    assert script == (GOLDEN / "grouped.sbatch").read_text()
    trainer = script[script.index("#SBATCH --job-name=trainer") :].split("\n\n")[0]
    assert "--nodes=2" in trainer and "--ntasks-per-node=2" in trainer
    assert "--mem=1024" in trainer  # --mem is per node: two 512 MB ranks
    assert script.count("hetjob") == 1
    assert group_keys(_grouped_app()) == [[("ps", 0)], [("trainer", k) for k in range(4)]]


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_task_of_a_group_runs_its_own_replica(rank: int, tmp_path: Path) -> None:
    """Run group 1's command as Slurm would for each task (global ranks 1..4)."""
    script = _script("grouped", {}, app=_grouped_app())
    srun = script[script.index("srun ") :].split("exitcode=")[0]
    group = shlex.split(srun.replace("\\\n", " ").split(" : ")[1])
    launcher = "--output=/state/logs/svc/train-0001/trainer/launcher.log"
    assert group[:2] == ["--het-group=1", launcher]
    assert group[2:4] == ["sh", "-c"]
    fake_python = tmp_path / "py"
    fake_python.write_text('#!/bin/sh\nprintf "%s\\n" "$ASUPERVISOR_REPLICA_ID" "$@"\n')
    fake_python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "ASUP_PYTHON": str(fake_python), "SLURM_PROCID": str(rank + 1)}
    done = subprocess.run(["sh", "-c", group[4]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == str(rank)
    assert out[-2:] == ["--rank", str(rank)]
    assert f"/state/logs/svc/train-0001/trainer/{rank}" in out


def test_a_grouped_role_must_divide_into_nodes() -> None:
    role = Role(name="t", entrypoint="e", num_replicas=3, metadata={PROCS_PER_NODE: 2})
    with pytest.raises(SpecError, match="does not divide"):
        render(
            AppDef(name="x", roles=[role]),
            slurm_run_opts().resolve({}),
            CTX,
            facts=FACTS,
            default_log_dir=Path("/l"),
            job_dir=None,
        )


def test_retries_are_the_least_of_the_roles_and_the_job_is_always_requeueable() -> None:
    script = _script("basic", {})
    assert "-lt 0 ]" in script  # ps declares 0 retries, trainer 2: TorchX takes the minimum
    assert "--requeue" in script and "--no-requeue" not in script


def test_a_roles_error_file_is_kept_and_its_path_goes_before_the_nodes(tmp_path: Path) -> None:
    """As TorchX: the role's TORCHELASTIC_ERROR_FILE wins, its PATH is joined, not replaced."""
    role = Role(
        name="t",
        entrypoint="python",
        env={"TORCHELASTIC_ERROR_FILE": "errs/mine.json", "PATH": "/opt/tools:"},
    )
    request = render(
        AppDef(name="x", roles=[role]),
        slurm_run_opts().resolve({}),
        CTX,
        facts=FACTS,
        default_log_dir=Path("/l"),
        job_dir=None,
    )
    (replica,) = request.replicas
    assert "PATH" not in replica.env
    assert replica.error_file(request.workdir) == "/home/me/project/errs/mine.json"
    fake_python = tmp_path / "py"
    fake_python.write_text('#!/bin/sh\nprintf "%s\\n" "$PATH" "$TORCHELASTIC_ERROR_FILE"\n')
    fake_python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "ASUP_PYTHON": str(fake_python)}
    done = subprocess.run(
        ["sh", "-c", replica.command("pump.py")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["/opt/tools:/usr/bin:/bin", "errs/mine.json"]


PLACEMENT = {
    "nodelist": ["n[1-2]"],
    "exclude": ["n3"],
    "exclusive": True,
    "reservation": "maint",
    "gres": ["gpu:a100:2", "nvme:1"],
    "gpus_per_node": "a100:2",
    "hold": True,
    "afterok": ["slurm://svc/prep-0001", "slurm://svc/prep-0002"],
    "afterany": ["slurm://other/clean-0001"],
}


def test_node_choices_holds_and_dependencies_match_their_golden_file() -> None:
    cfg = slurm_run_opts().resolve(PLACEMENT)
    check_slurm_cfg(cfg)
    script = _script("placement", PLACEMENT)
    assert script == (GOLDEN / "placement.sbatch").read_text()
    header = script.split("\n\n")[0]
    groups = header.split("#SBATCH hetjob\n")
    # nodelist is shared out in group order, one node per single-replica group.
    assert "--nodelist=n1" in groups[0] and "--nodelist=n2" in groups[1]
    assert "--nodelist" not in groups[2]
    for group in groups:
        assert "--exclude=n3" in group and "--exclusive" in group
        assert "--reservation=maint" in group
        assert "--gres=gpu:a100:2,nvme:1" in group and "--gpus-per-node=a100:2" in group
        assert "--gpus-per-task" not in group  # the explicit request replaces Resource.gpu's
    assert "--hold" in groups[0]
    # A dry run names the apps waited for; launch turns them into job ids.
    assert dependencies(script) == [
        ("afterok", "slurm://svc/prep-0001"),
        ("afterok", "slurm://svc/prep-0002"),
        ("afterany", "slurm://other/clean-0001"),
    ]
    ids = {"slurm://svc/prep-0001": 11, "slurm://svc/prep-0002": 12, "slurm://other/clean-0001": 9}
    sent = with_dependencies(script, ids)
    assert "#SBATCH --dependency=afterok:11:12,afterany:9" in sent
    assert "#SBATCH --kill-on-invalid-dep=yes" in sent
    assert not dependencies(sent)
    assert sent.index("--dependency") < sent.index("#SBATCH hetjob")


def test_placement_directives_reach_the_rest_submission() -> None:
    """slurmrestd ignores #SBATCH lines: each new directive must become a job property."""
    from supervisor.backends.slurm.rest import parse_batch_script

    script = with_dependencies(
        _script("placement", PLACEMENT),
        {"slurm://svc/prep-0001": 11, "slurm://svc/prep-0002": 12, "slurm://other/clean-0001": 9},
    )
    first, second, third = parse_batch_script(script)
    assert first["nodelist"] == "n1" and second["nodelist"] == "n2" and "nodelist" not in third
    for component in (first, second, third):
        assert component["exclude_nodes"] == "n3"
        assert component["exclusive"] == "exclusive"
        assert component["reservation"] == "maint"
        assert component["gres"] == "gpu:a100:2,nvme:1"
        assert component["gpus_per_node"] == "a100:2"
        assert component["hold"] is True
        assert component["dependency"] == "afterok:11:12,afterany:9"
        assert component["kill_on_invalid_dependency"] == "yes"


def test_ntasks_per_node_groups_every_role_and_role_metadata_wins() -> None:
    app = AppDef(
        name="x",
        roles=[
            Role(name="a", entrypoint="e", num_replicas=4),
            Role(name="b", entrypoint="e", num_replicas=3, metadata={PROCS_PER_NODE: 3}),
        ],
    )
    cfg = slurm_run_opts().resolve({"ntasks_per_node": 2, "nodelist": ["n1", "n2", "n3"]})
    request = render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    a, b = request.groups
    assert "--nodes=2" in a.directives and "--ntasks-per-node=2" in a.directives
    assert "--nodelist=n1,n2" in a.directives
    assert "--nodes=1" in b.directives and "--ntasks-per-node=3" in b.directives
    assert "--nodelist=n3" in b.directives
    assert group_keys(app, 2) == [[("a", k) for k in range(4)], [("b", k) for k in range(3)]]
    groups = request.to_json()["groups"]
    assert groups == [[["a", k] for k in range(4)], [["b", k] for k in range(3)]]


def test_ntasks_per_node_must_divide_each_role_and_names_the_option() -> None:
    app = AppDef(name="x", roles=[Role(name="odd", entrypoint="e", num_replicas=3)])
    cfg = slurm_run_opts().resolve({"ntasks_per_node": 2})
    with pytest.raises(SpecError) as err:
        render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    assert err.value.fields == ("cfg.ntasks_per_node",)
    assert "role 'odd': 2 does not divide num_replicas=3" in str(err.value)
    with pytest.raises(SpecError) as err:
        slurm_run_opts().resolve({"ntasks_per_node": 0})
    assert err.value.fields == ("cfg.ntasks_per_node",)


def test_more_nodes_named_than_the_app_uses_is_an_error_naming_nodelist() -> None:
    cfg = slurm_run_opts().resolve({"nodelist": ["n[1-4]"]})
    with pytest.raises(SpecError) as err:
        render(_app(), cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    assert err.value.fields == ("cfg.nodelist",)
    assert "4 nodes named, but the app runs on 3" in str(err.value)


def test_placement_problems_name_their_fields() -> None:
    cfg = slurm_run_opts().resolve(
        {
            "nodelist": ["n1", "n[1-2]"],
            "exclude": ["bad name"],
            "reservation": "a b",
            "gres": ["gpu:a100:2", ":2"],
            "gpus_per_node": "a100:0",
            "afterok": ["local://s/a"],
            "after": ["nonsense"],
        }
    )
    with pytest.raises(SpecError) as err:
        check_slurm_cfg(cfg)
    assert set(err.value.fields) == {
        "cfg.nodelist",
        "cfg.exclude",
        "cfg.reservation",
        "cfg.gres",
        "cfg.gpus_per_node",
        "cfg.afterok",
        "cfg.after",
    }
    assert "names n1 more than once" in str(err.value)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1,3-4]x", ["n1x", "n3x", "n4x"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[3-1]", None),
        ("n[a]", None),
        ("", None),
    ],
)
def test_hostlist_expansion(text: str, names: list[str] | None) -> None:
    assert expand_hostlist(text) == names


def test_cli_form_takes_lists_and_handles() -> None:
    from supervisor.runopts import parse_cfg_string

    opts = slurm_run_opts()
    given = parse_cfg_string(
        "nodelist=n1;n2,exclusive=true,gres=gpu:a100:2,afterok=slurm://s/a;slurm://s/b,hold=1",
        opts,
    )
    cfg = opts.resolve(given)
    assert cfg.get_list("nodelist") == ("n1", "n2")
    assert cfg.get_list("afterok") == ("slurm://s/a", "slurm://s/b")
    assert cfg.get_bool("exclusive") is True and cfg.get_bool("hold") is True


def test_the_recorded_request_gives_back_what_following_the_job_needs() -> None:
    """``attach``: a process that takes the app over rebuilds the request from its record.
    The replicas' environments (which may hold secrets) are not in the record."""
    app = AppDef(
        name="x",
        roles=[
            Role(name="a", entrypoint="e", num_replicas=4, max_retries=1),
            Role(
                name="b", entrypoint="e", num_replicas=2, env={"TORCHELASTIC_ERROR_FILE": "e.json"}
            ),
        ],
    )
    cfg = slurm_run_opts().resolve({"ntasks_per_node": 2})
    request = render(app, cfg, CTX, facts=FACTS, default_log_dir=Path("/l"), job_dir=None)
    recorded = request.to_json()
    assert "TRICKY" not in str(recorded) and all("env" not in r for r in recorded["replicas"])
    again = SlurmRequest.from_json(recorded, app)
    assert (again.app_id, again.session) == ("train-0001", "svc")
    assert (again.max_retries, again.workdir) == (request.max_retries, request.workdir)
    assert again.job_names == request.job_names
    assert [[(r.role, r.replica_id) for r in g.replicas] for g in again.groups] == [
        [(r.role, r.replica_id) for r in g.replicas] for g in request.groups
    ]
    for before, after in zip(request.replicas, again.replicas, strict=True):
        assert (after.role, after.replica_id, after.group, after.log_dir) == (
            before.role,
            before.replica_id,
            before.group,
            before.log_dir,
        )
        assert after.error_file(again.workdir) == before.error_file(request.workdir)
    older = {k: v for k, v in recorded.items() if k != "replicas"}
    with pytest.raises(KeyError):
        SlurmRequest.from_json(older, app)


def test_mail_types_from_the_command_line_are_separated_by_semicolons() -> None:
    """On the command line ``,`` separates run options, so ``mail-type=END,FAIL`` read
    ``FAIL`` as an option of its own and nothing named two events; ``;`` does, as for
    the items of list options. Both render as sbatch takes them."""
    given = parse_cfg_string("mail-type=END;FAIL,time=5", slurm_run_opts())
    cfg = slurm_run_opts().resolve(given)
    check_slurm_cfg(cfg)
    assert "#SBATCH --mail-type=END,FAIL\n" in _script("m", dict(given), FACTS)
    assert "#SBATCH --mail-type=END,FAIL\n" in _script("m", {"mail-type": "END, FAIL"}, FACTS)
    bogus = slurm_run_opts().resolve(parse_cfg_string("mail-type=END;BOGUS", slurm_run_opts()))
    with pytest.raises(SpecError) as err:
        check_slurm_cfg(bogus)
    assert err.value.fields == ("cfg.mail-type",) and "'BOGUS'" in str(err.value)
