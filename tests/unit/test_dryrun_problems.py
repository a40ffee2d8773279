"""A dry run lists every problem at once: the run options' types and bounds, each
backend's rules over its options, and the app's, none hiding another, none false.

The backends' own rules ran only once every option had resolved and the app was
valid, so one round trip showed the first layer of problems only; and where an
option did not resolve, the app was judged under the default limits, not the
ones the options given right had raised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import AppDef, BindMount, Resource, Role, SpecError, Supervisor, VolumeMount
from supervisor.backends.local.request import local_run_opts
from supervisor.specs import MPI

pytestmark = pytest.mark.anyio


def _problems(sv: Supervisor, app: AppDef, backend: str, cfg: dict[str, object]) -> list[str]:
    with pytest.raises(SpecError) as err:
        sv.dryrun(app, backend, cfg)
    return sorted(err.value.fields)


async def test_the_local_rules_over_options_are_listed_with_the_apps_problems(
    state_dir: Path,
) -> None:
    bad_app = AppDef(name="a", roles=[Role(name="r", entrypoint="", num_replicas=0)])
    cfg: dict[str, object] = {"env_policy": "allow", "env_allow": ["HOME", "A B"]}
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, bad_app, "local", cfg) == [
            "cfg.env_allow[1]",
            "roles[0].entrypoint",
            "roles[0].num_replicas",
        ]
        # A rule over an option that did not resolve is not judged on its default.
        cfg = {"env_policy": "dirty", "env_allow": ["HOME"]}
        assert _problems(sv, bad_app, "local", cfg) == [
            "cfg.env_policy",
            "roles[0].entrypoint",
            "roles[0].num_replicas",
        ]


async def test_env_allow_patterns_are_judged_whatever_env_policy_is(state_dir: Path) -> None:
    """The patterns are env_allow's own rule: a bad policy beside them (which leaves
    how the two go together unjudged), or one they do not go with, hid them."""
    app = AppDef(name="a", roles=[Role(name="r", entrypoint="true")])
    async with Supervisor(session="svc") as sv:
        cfg: dict[str, object] = {"env_policy": "dirty", "env_allow": ["HOME", "A B"]}
        assert _problems(sv, app, "local", cfg) == ["cfg.env_allow[1]", "cfg.env_policy"]
        cfg = {"env_policy": "inherit", "env_allow": ["A B"]}
        assert _problems(sv, app, "local", cfg) == ["cfg.env_allow", "cfg.env_allow[0]"]


async def test_a_limit_raised_by_an_option_given_right_counts_beside_a_bad_one(
    state_dir: Path,
) -> None:
    big = AppDef(name="a", roles=[Role(name="r", entrypoint="true", num_replicas=2000)])
    cfg: dict[str, object] = {"max_replicas_per_role": 5000, "stop_grace": -1}
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, big, "local", cfg) == ["cfg.stop_grace"]
        assert _problems(sv, big, "local", {"stop_grace": -1}) == [
            "cfg.stop_grace",
            "roles[0].num_replicas",
        ]


async def test_slurm_and_docker_rules_over_options_are_listed_with_type_errors_and_the_app(
    state_dir: Path,
) -> None:
    sized = AppDef(name="a", roles=[Role(name="r", entrypoint="true", resource=Resource(memMB=-5))])
    no_image = AppDef(name="a", roles=[Role(name="r", entrypoint="true", image="")])
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, sized, "slurm", {"time": "abc", "hold": "maybe"}) == [
            "cfg.hold",
            "cfg.time",
            "roles[0].resource.memMB",
        ]
        cfg: dict[str, object] = {"host": "bogus://x", "privileged": "maybe", "env": ["NOEQ"]}
        assert _problems(sv, no_image, "docker", cfg) == [
            "cfg.env[0]",
            "cfg.host",
            "cfg.privileged",
            "roles[0].image",
        ]


async def test_slurm_rules_over_the_app_and_its_options_are_listed_with_the_options(
    state_dir: Path,
) -> None:
    """Where the app and the options meet (nodes named against the nodes the app runs
    on, tasks per node against replicas, MPI, container mounts), Slurm's rules ran only
    in its ``render``, after every other problem was gone: a second dry run found them."""
    one = AppDef(name="a", roles=[Role(name="r", entrypoint="true")])
    three = AppDef(name="a", roles=[Role(name="r", entrypoint="true", num_replicas=3)])
    mixed = AppDef(
        name="a",
        roles=[
            Role(name="m", entrypoint="true", metadata={MPI: "nope"}),
            Role(name="b", entrypoint="true", mounts=[BindMount("/data", "/data")]),
        ],
    )
    mpirun = AppDef(name="a", roles=[Role(name="m", entrypoint="true", metadata={MPI: "mpirun"})])
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, one, "slurm", {"nodelist": ["n[1-4]"], "time": "abc"}) == [
            "cfg.nodelist",
            "cfg.time",
        ]
        assert _problems(sv, three, "slurm", {"ntasks_per_node": 2, "time": "abc"}) == [
            "cfg.ntasks_per_node",
            "cfg.time",
        ]
        assert _problems(sv, mixed, "slurm", {"time": "abc"}) == [
            "cfg.time",
            f"roles[0].metadata[{MPI!r}]",
            "roles[1].mounts",
        ]
        # mpirun runs in a batch script, which steps of an allocation have not.
        with pytest.raises(SpecError) as err:
            sv.dryrun(mpirun, "slurm", {"allocation": "1234", "hold": "maybe"})
        assert {p.field for p in err.value.problems} == {"cfg.allocation", "cfg.hold"}
        assert any("mpirun" in p.message for p in err.value.problems)


async def test_rules_over_the_app_skip_options_that_did_not_resolve(state_dir: Path) -> None:
    """An option that did not resolve is at its default: nothing is judged on it."""
    one = AppDef(name="a", roles=[Role(name="r", entrypoint="true")])
    tagged = AppDef(
        name="a",
        roles=[Role(name="r", entrypoint="true", image="x", mounts=[BindMount("/d", "/d")])],
    )
    async with Supervisor(session="svc") as sv:
        # ntasks_per_node=0 is refused by its bounds: how many nodes the app runs on
        # is not known, so the nodes named are not counted against it.
        cfg: dict[str, object] = {"nodelist": ["n[1-4]"], "ntasks_per_node": 0}
        assert _problems(sv, one, "slurm", cfg) == ["cfg.ntasks_per_node"]
        assert _problems(sv, tagged, "slurm", {"image_is_tag": "maybe"}) == ["cfg.image_is_tag"]


async def test_rules_over_the_app_are_not_made_on_an_invalid_app(state_dir: Path) -> None:
    """An invalid app is named by its own problems: none of a rule that assumed it valid
    (no replica runs on any of the nodes named)."""
    empty = AppDef(name="a", roles=[Role(name="r", entrypoint="true", num_replicas=0)])
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, empty, "slurm", {"nodelist": ["n1"], "time": "abc"}) == [
            "cfg.time",
            "roles[0].num_replicas",
        ]


async def test_docker_rules_over_the_app_are_listed_with_the_options(
    state_dir: Path, tmp_path: Path
) -> None:
    """A volume's name, a named device, a bind source missing on this machine: found by
    Docker's ``render`` only once the options were right."""
    app = AppDef(
        name="a",
        roles=[
            Role(
                name="r",
                entrypoint="true",
                image="img",
                resource=Resource(devices={"nope": 1}),
                mounts=[VolumeMount("-bad", "/v"), BindMount(str(tmp_path / "absent"), "/d")],
            )
        ],
    )
    local = f"unix://{tmp_path}/engine.sock"  # no engine is asked
    async with Supervisor(session="svc") as sv:
        assert _problems(sv, app, "docker", {"host": local, "env": ["NOEQ"]}) == [
            "cfg.env[0]",
            "roles[0].mounts[0].src",
            "roles[0].mounts[1].src_path",
            "roles[0].resource.devices",
        ]
        # A host that did not resolve says nothing of where the sources must exist.
        assert _problems(sv, app, "docker", {"host": 5}) == [
            "cfg.host",
            "roles[0].mounts[0].src",
            "roles[0].resource.devices",
        ]


def test_resolving_partly_keeps_what_resolved_and_names_what_did_not() -> None:
    resolved, problems = local_run_opts().resolve_partly(
        {"stop_grace": -1, "max_replicas_per_role": 5000, "nope": 1}
    )
    assert sorted(p.field for p in problems) == ["cfg.nope", "cfg.stop_grace"]
    assert resolved.unresolved == frozenset({"stop_grace"})
    assert resolved["max_replicas_per_role"] == 5000
    assert resolved["stop_grace"] == local_run_opts().resolve({})["stop_grace"]  # its default
