"""validate(): every rule, its exact field path, and collection of all problems."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from datetime import date
from typing import Any

import pytest

from supervisor.errors import Problem, SpecError
from supervisor.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
)
from supervisor.validate import Capabilities, validate

LOCAL = Capabilities(backend="local")
DOCKER = Capabilities(backend="docker", mounts=True, requires_image=True)
SLURM = Capabilities(
    backend="slurm",
    retry_policies=frozenset({RetryPolicy.APPLICATION}),
    max_replicas_per_role=4,
)


def as_any(value: object) -> Any:
    """Lets a test hand the constructors the wrong types on purpose."""
    return value


def trainer(**changes: Any) -> Role:
    role = Role(
        name="trainer",
        image="ghcr.io/x/trainer:1",
        entrypoint="python",
        args=["-m", "train", "--rank", "${replica_id}"],
        env={"LR": "0.1", "PATH_EXTRA": ""},
        num_replicas=2,
        min_replicas=1,
        max_retries=3,
        retry_policy=RetryPolicy.APPLICATION,
        resource=Resource(cpu=4, gpu=1, memMB=1024, devices={"vpc.amazonaws.com/efa": 1}),
        port_map={"tensorboard": 6006},
        metadata={"team": "ml", "nested": {"a": [1, 2]}},
    )
    return dataclasses.replace(role, **changes)


def app_of(*roles: Role, name: str = "train-job") -> AppDef:
    return AppDef(name=name, roles=roles)


def valid_app() -> AppDef:
    return AppDef(
        name="train-job",
        roles=[
            trainer(),
            Role(name="ps", entrypoint="ps-server", image="ps:2", num_replicas=1),
            Role(name="eval_2", entrypoint="/bin/sh", args=["-c", "echo $HOME"], image="img"),
        ],
        metadata={"owner": "me"},
    )


def problems(app: object, caps: Capabilities = LOCAL) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        validate(app, caps)
    fields = exc.value.fields
    return {p.field: p.message for p in exc.value.problems} | (
        {} if len(set(fields)) == len(fields) else {"__duplicates__": repr(fields)}
    )


def only_problem(app: object, caps: Capabilities = LOCAL) -> Problem:
    with pytest.raises(SpecError) as exc:
        validate(app, caps)
    assert len(exc.value.problems) == 1, exc.value
    return exc.value.problems[0]


# -- valid apps --------------------------------------------------------------


@pytest.mark.parametrize("caps", [LOCAL, DOCKER, SLURM], ids=lambda c: c.backend)
def test_valid_multi_role_app_passes(caps: Capabilities) -> None:
    validate(valid_app(), caps)


def test_unset_resource_and_defaults_pass() -> None:
    validate(app_of(Role(name="r", entrypoint="true")), LOCAL)


def test_mounts_pass_where_supported() -> None:
    role = trainer(
        mounts=[
            BindMount("/data", "/mnt/data", read_only=True),
            VolumeMount("vol", "/mnt/vol"),
            DeviceMount("/dev/fuse", "/dev/fuse", permissions="rw"),
        ]
    )
    validate(app_of(role), DOCKER)


# -- app level ---------------------------------------------------------------


@pytest.mark.parametrize("value", [None, 3, "app", {"name": "x"}, Role(name="r")])
def test_non_appdef(value: object) -> None:
    problem = only_problem(value)
    assert problem.field == "app"
    assert problem.message.startswith("expected an AppDef, got ")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must be a non-empty string"),
        ("a/b", "must not contain '/'"),
        ("a b", "must not contain whitespace"),
        ("tab\there", "must not contain whitespace"),
        (3, "must be a string, got int 3"),
        (None, "must be a string, got NoneType None"),
    ],
)
def test_app_name(name: Any, message: str) -> None:
    assert only_problem(AppDef(name=name, roles=[trainer()])) == Problem("name", message)


def test_context_names_the_app() -> None:
    with pytest.raises(SpecError) as exc:
        validate(AppDef(name="job", roles=[]), LOCAL)
    assert exc.value.context == "invalid app 'job'"
    assert str(exc.value).startswith("invalid app 'job': 1 problem(s)")


def test_no_roles() -> None:
    assert only_problem(AppDef(name="x")) == Problem("roles", "at least one role is required")


@pytest.mark.parametrize("roles", [None, "trainer", 3, {"a": 1}])
def test_roles_not_a_sequence(roles: Any) -> None:
    problem = only_problem(AppDef(name="x", roles=roles))
    assert problem.field == "roles"
    assert problem.message.startswith("must be a sequence of Role")


def test_role_not_a_role() -> None:
    problem = only_problem(AppDef(name="x", roles=[trainer(), as_any({"name": "r"})]))
    assert problem == Problem("roles[1]", "expected a Role, got dict")


def test_app_metadata_keys() -> None:
    assert only_problem(AppDef(name="x", roles=[trainer()], metadata=as_any({1: "a"}))) == Problem(
        "metadata[1]", "key must be a string, got int"
    )
    problem = only_problem(AppDef(name="x", roles=[trainer()], metadata=as_any([("a", 1)])))
    assert problem.field == "metadata"


# -- role fields -------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1st", "a b", "a.b", "-x", "a/b", "é", "x\n"])
def test_invalid_role_names(name: str) -> None:
    problem = only_problem(app_of(trainer(name=name)))
    assert problem.field == "roles[0].name"


def test_a_role_name_of_other_letters_is_told_the_letters_are_ascii() -> None:
    # 'ρόλος' is letters to Python (and to a user): the message must not say "a letter".
    problem = only_problem(app_of(trainer(name="ρόλος")))
    assert "ASCII letter" in problem.message, problem.message


@pytest.mark.parametrize("name", ["a", "Trainer", "a-b_c", "x9"])
def test_valid_role_names(name: str) -> None:
    validate(app_of(trainer(name=name)), LOCAL)


def test_role_name_not_a_string() -> None:
    assert only_problem(app_of(trainer(name=5))) == Problem(
        "roles[0].name", "must be a string, got int 5"
    )


def test_duplicate_role_name_points_at_first() -> None:
    app = app_of(trainer(), trainer(name="ps"), trainer())
    assert only_problem(app) == Problem(
        "roles[2].name", "duplicate role name 'trainer' (also roles[0])"
    )


@pytest.mark.parametrize("entrypoint", ["", None, 3, ["python"]])
def test_entrypoint(entrypoint: Any) -> None:
    assert only_problem(app_of(trainer(entrypoint=entrypoint))).field == "roles[0].entrypoint"


def test_image_required_by_container_backend() -> None:
    assert only_problem(app_of(trainer(image="")), DOCKER) == Problem(
        "roles[0].image", "required by backend 'docker'"
    )
    validate(app_of(trainer(image="")), LOCAL)
    assert only_problem(app_of(trainer(image=None))).field == "roles[0].image"


def test_args_must_be_strings() -> None:
    found = problems(app_of(trainer(args=["ok", 3, "fine", None])))
    assert set(found) == {"roles[0].args[1]", "roles[0].args[3]"}


def test_args_as_a_bare_string_gets_a_hint() -> None:
    problem = only_problem(app_of(trainer(args="--lr 0.1")))
    assert problem.field == "roles[0].args"
    assert problem.message.endswith("wrap it in a list")


def test_args_with_nul() -> None:
    assert only_problem(app_of(trainer(args=["a\0b"]))) == Problem(
        "roles[0].args[0]", "must not contain a NUL character"
    )


@pytest.mark.parametrize(
    ("env", "field", "message"),
    [
        ({"A=B": "1"}, "roles[0].env['A=B']", "not a valid environment variable name"),
        ({"": "1"}, "roles[0].env['']", "not a valid environment variable name"),
        ({"A\0": "1"}, "roles[0].env['A\\x00']", "not a valid environment variable name"),
        ({"A": 1}, "roles[0].env['A']", "value must be a string, got int 1"),
        ({"A": None}, "roles[0].env['A']", "value must be a string, got NoneType None"),
        ({"A": "x\0"}, "roles[0].env['A']", "value must not contain a NUL character"),
        ({1: "x"}, "roles[0].env[1]", "name must be a string, got int"),
        (["A=1"], "roles[0].env", "must be a mapping of str to str, got list ['A=1']"),
    ],
)
def test_env(env: Any, field: str, message: str) -> None:
    assert only_problem(app_of(trainer(env=env))) == Problem(field, message)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be >= 1"),
        (-1, "must be >= 1"),
        (True, "must be an int, got bool True"),
        (2.0, "must be an int, got float 2.0"),
        ("2", "must be an int, got str '2'"),
    ],
)
def test_num_replicas(value: Any, message: str) -> None:
    app = app_of(trainer(num_replicas=value, min_replicas=None))
    assert only_problem(app) == Problem("roles[0].num_replicas", message)


def test_num_replicas_capped_by_backend() -> None:
    validate(app_of(trainer(num_replicas=4)), SLURM)
    assert only_problem(app_of(trainer(num_replicas=5)), SLURM) == Problem(
        "roles[0].num_replicas", "must be <= 4 on backend 'slurm'"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be >= 1"),
        (3, "must be <= num_replicas (2)"),
        (False, "must be an int, got bool False"),
        ("1", "must be an int, got str '1'"),
    ],
)
def test_min_replicas(value: Any, message: str) -> None:
    assert only_problem(app_of(trainer(min_replicas=value))) == Problem(
        "roles[0].min_replicas", message
    )


def test_min_replicas_equal_to_num_replicas_is_fine() -> None:
    validate(app_of(trainer(min_replicas=2)), LOCAL)


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1, "must be >= 0"), (None, "must be an int, got NoneType None"), (1.5, "must be an int")],
)
def test_max_retries(value: Any, message: str) -> None:
    problem = only_problem(app_of(trainer(max_retries=value)))
    assert problem.field == "roles[0].max_retries"
    assert problem.message.startswith(message)


def test_unsupported_retry_policy() -> None:
    app = app_of(trainer(retry_policy=RetryPolicy.ROLE))
    assert only_problem(app, SLURM) == Problem(
        "roles[0].retry_policy",
        "ROLE is not supported by backend 'slurm' (supported: APPLICATION)",
    )
    validate(app, LOCAL)


def test_supported_policies_listed_in_declaration_order() -> None:
    caps = Capabilities(
        backend="b", retry_policies=frozenset({RetryPolicy.APPLICATION, RetryPolicy.REPLICA})
    )
    problem = only_problem(app_of(trainer(retry_policy=RetryPolicy.ROLE)), caps)
    assert problem.message.endswith("(supported: REPLICA, APPLICATION)")


def test_retry_policy_as_plain_string_gets_a_hint() -> None:
    problem = only_problem(app_of(trainer(retry_policy="role")))
    assert problem.field == "roles[0].retry_policy"
    assert problem.message == "must be a RetryPolicy, got str 'role'; use RetryPolicy.ROLE"


def test_backend_without_retries() -> None:
    caps = Capabilities(backend="once", retry_policies=frozenset())
    validate(app_of(trainer(max_retries=0)), caps)
    assert only_problem(app_of(trainer(max_retries=1)), caps) == Problem(
        "roles[0].max_retries", "backend 'once' cannot retry; must be 0"
    )


@pytest.mark.parametrize(
    ("resource", "field", "message"),
    [
        (Resource(cpu=-2), "roles[0].resource.cpu", "must be >= 0, or -1 for unset"),
        (Resource(memMB=-5), "roles[0].resource.memMB", "must be >= 0, or -1 for unset"),
        (Resource(gpu=-3), "roles[0].resource.gpu", "must be >= 0, or -1 for unset"),
        (Resource(cpu=1.5), "roles[0].resource.cpu", "must be an int, got float 1.5"),  # type: ignore[arg-type]
        (Resource(gpu=True), "roles[0].resource.gpu", "must be an int, got bool True"),
        (
            Resource(devices={"efa": -1}),
            "roles[0].resource.devices['efa']",
            "must be >= 0",
        ),
        (
            Resource(capabilities={1: "x"}),  # type: ignore[dict-item]
            "roles[0].resource.capabilities[1]",
            "key must be a string, got int",
        ),
    ],
)
def test_resource(resource: Resource, field: str, message: str) -> None:
    assert only_problem(app_of(trainer(resource=resource))) == Problem(field, message)


def test_resource_zero_gpu_is_fine() -> None:
    validate(app_of(trainer(resource=Resource(cpu=1, gpu=0, memMB=1))), LOCAL)


def test_resource_zero_cpu_and_memory_are_accepted_as_torchx_does() -> None:
    """TorchX takes cpu=0 / memMB=0 as "no request" (its schedulers set only what is > 0)."""
    zero = Resource(cpu=0, gpu=0, memMB=0)
    for caps in (LOCAL, DOCKER, SLURM):
        validate(app_of(trainer(resource=zero, image="img")), caps)


def test_resource_wrong_type() -> None:
    assert only_problem(app_of(trainer(resource={"cpu": 1}))) == Problem(
        "roles[0].resource", "expected a Resource, got dict"
    )


@pytest.mark.parametrize(
    ("port_map", "field"),
    [
        ({"http": 0}, "roles[0].port_map['http']"),
        ({"http": 65536}, "roles[0].port_map['http']"),
        ({"http": "80"}, "roles[0].port_map['http']"),
        ({"http": True}, "roles[0].port_map['http']"),
        ({8080: 8080}, "roles[0].port_map[8080]"),
        ([("http", 80)], "roles[0].port_map"),
    ],
)
def test_port_map(port_map: Any, field: str) -> None:
    assert only_problem(app_of(trainer(port_map=port_map))).field == field


def test_port_map_bounds_are_inclusive() -> None:
    validate(app_of(trainer(port_map={"a": 1, "b": 65535})), LOCAL)


def test_role_metadata_keys() -> None:
    assert only_problem(app_of(trainer(metadata={("t",): 1}))) == Problem(
        "roles[0].metadata[('t',)]", "key must be a string, got tuple"
    )


def test_values_kept_as_json_must_be_json() -> None:
    """Metadata and capabilities go into the app's records as JSON: a value that is not
    failed the submit with a bare TypeError, after its directories were made."""
    app = AppDef(
        name="x",
        roles=[
            trainer(
                metadata={"ok": {"a": [1, None]}, "s": {1, 2}},
                resource=Resource(capabilities=as_any({"d": date(2026, 1, 1)})),
            )
        ],
        metadata=as_any({"b": b"raw"}),
    )
    with pytest.raises(SpecError) as err:
        validate(app, LOCAL)
    assert set(err.value.fields) == {
        "metadata['b']",
        "roles[0].metadata['s']",
        "roles[0].resource.capabilities['d']",
    }
    assert "must be JSON data: Object of type set is not JSON serializable" in str(err.value)


def test_mounts_rejected_where_unsupported() -> None:
    app = app_of(trainer(mounts=[BindMount("/a", "/b")]))
    assert only_problem(app, LOCAL) == Problem(
        "roles[0].mounts", "mounts are not supported by backend 'local'"
    )
    validate(app, DOCKER)


@pytest.mark.parametrize(
    ("mount", "field"),
    [
        (BindMount(3, "/b"), "roles[0].mounts[0].src_path"),  # type: ignore[arg-type]
        (BindMount("/a", ""), "roles[0].mounts[0].dst_path"),
        (BindMount("/a", "/b", read_only="yes"), "roles[0].mounts[0].read_only"),  # type: ignore[arg-type]
        (VolumeMount(None, "/b"), "roles[0].mounts[0].src"),  # type: ignore[arg-type]
        (DeviceMount("/dev/x", "/dev/x", permissions="rwx"), "roles[0].mounts[0].permissions"),
        (DeviceMount("/dev/x", "/dev/x", permissions=""), "roles[0].mounts[0].permissions"),
        ("/a:/b", "roles[0].mounts[0]"),
        # Relative: dockerd refuses it at create, Podman took it from / ("statfs /data").
        (BindMount("data", "/b"), "roles[0].mounts[0].src_path"),
        (BindMount("/a", "b"), "roles[0].mounts[0].dst_path"),
        (VolumeMount("vol", "mnt"), "roles[0].mounts[0].dst_path"),
        (DeviceMount("dev/x", "/dev/x"), "roles[0].mounts[0].src_path"),
        (DeviceMount("/dev/x", "x"), "roles[0].mounts[0].dst_path"),
    ],
)
def test_bad_mounts(mount: Any, field: str) -> None:
    assert only_problem(app_of(trainer(mounts=[mount])), DOCKER).field == field


def test_mounts_not_a_sequence() -> None:
    problem = only_problem(app_of(trainer(mounts=BindMount("/a", "/b"))), DOCKER)
    assert problem.field == "roles[0].mounts"


def test_two_mounts_on_one_destination_are_refused_naming_the_second() -> None:
    """The engines refused it only when the container was created, naming no mount."""
    mounts = [BindMount("/a", "/x"), VolumeMount("v", "/y"), BindMount("/b", "/x")]
    problem = only_problem(app_of(trainer(mounts=mounts)), DOCKER)
    assert (problem.field, problem.message) == (
        "roles[0].mounts[2].dst_path",
        "'/x' is mounted already (roles[0].mounts[0])",
    )


def test_text_no_program_can_be_given_is_refused_before_the_launch() -> None:
    """A lone surrogate passed validation and failed only at the launch (exit 127, after
    the app's records were made); one of Python's undecodable bytes is text as any."""
    lone = "a\ud800b"
    found = problems(
        app_of(trainer(entrypoint="sh" + lone, args=["-c", lone], env={"X": lone, lone: "1"}))
    )
    assert found == {
        "roles[0].entrypoint": "holds a lone surrogate (U+D800) no program can be given",
        "roles[0].args[1]": "holds a lone surrogate (U+D800) no program can be given",
        "roles[0].env['X']": "value holds a lone surrogate (U+D800) no program can be given",
        f"roles[0].env[{lone!r}]": "not a valid environment variable name",
    }
    validate(app_of(trainer(args=["a\udcffb"], env={"X": "\udcff"})), LOCAL)  # a byte 0xff


# -- collection ----------------------------------------------------------------


def test_every_problem_collected_in_one_error() -> None:
    app = AppDef(
        name="bad name",
        roles=[
            trainer(env={"A=B": "x"}, retry_policy=RetryPolicy.ROLE),
            Role(name="ps", entrypoint="", num_replicas=0),
            Role(name="trainer", entrypoint="x", port_map={"p": 0}, mounts=[BindMount("/", "/")]),
            as_any("not a role"),
        ],
    )
    found = problems(app, SLURM)
    assert found == {
        "name": "must not contain whitespace",
        "roles[0].env['A=B']": "not a valid environment variable name",
        "roles[0].retry_policy": (
            "ROLE is not supported by backend 'slurm' (supported: APPLICATION)"
        ),
        "roles[1].entrypoint": "must be a non-empty string",
        "roles[1].num_replicas": "must be >= 1",
        "roles[2].name": "duplicate role name 'trainer' (also roles[0])",
        "roles[2].port_map['p']": "must be a port number in 1..65535, got int 0",
        "roles[2].mounts": "mounts are not supported by backend 'slurm'",
        "roles[3]": "expected a Role, got str",
    }


def test_problems_are_in_field_order() -> None:
    with pytest.raises(SpecError) as exc:
        validate(
            app_of(trainer(num_replicas=0, max_retries=-1), Role(name="", entrypoint="")), LOCAL
        )
    assert exc.value.fields == (
        "roles[0].num_replicas",
        "roles[0].max_retries",
        "roles[1].name",
        "roles[1].entrypoint",
    )


def test_error_is_a_value_error_with_readable_text() -> None:
    with pytest.raises(ValueError, match=r"roles\[1\]\.num_replicas: must be >= 1"):
        validate(app_of(trainer(), Role(name="b", entrypoint="x", num_replicas=0)), LOCAL)


# -- hostile inputs ----------------------------------------------------------


class ExplodingMapping(Mapping[str, str]):
    """A mapping whose every read fails, as a user-defined object might."""

    def __getitem__(self, key: str) -> str:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_hostile_objects_become_problems_not_crashes() -> None:
    role = trainer()
    object.__setattr__(role, "env", ExplodingMapping())
    other = trainer(name="other", args=[BadRepr()], metadata={BadRepr(): 1})
    found = problems(app_of(role, other))
    assert found["roles[0]"].startswith("could not be checked (RuntimeError")
    assert found["roles[1].args[0]"] == "must be a string, got BadRepr <BadRepr>"
    assert set(found) == {"roles[0]", "roles[1].args[0]", "roles[1].metadata[<BadRepr>]"}


def test_hostile_capabilities_become_problems() -> None:
    caps = Capabilities(backend="x", retry_policies=3)  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        validate(valid_app(), caps)
