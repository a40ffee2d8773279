"""validate() on generated apps: garbage only ever gives SpecError; valid apps pass."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.errors import SpecError
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

# -- arbitrary values of arbitrary types ---------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-2, max_value=70000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.text(alphabet="=\0/ \t\nAZaz09_-", max_size=6),
    st.binary(max_size=4),
    st.sampled_from(list(RetryPolicy)),
    st.sampled_from(["ROLE", "replica", ""]),
)

_ANY: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none()), inner, max_size=2),
        st.frozensets(st.integers(), max_size=2),
    ),
    max_leaves=6,
)


def _mounts_of(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(BindMount, values, values, values),
        st.builds(VolumeMount, values, values, values),
        st.builds(DeviceMount, values, values, values),
        values,
    )


_RESOURCES = st.one_of(
    st.builds(Resource, _ANY, _ANY, _ANY, _ANY, _ANY),
    st.builds(Resource, st.integers(-3, 8), st.integers(-3, 8), st.integers(-3, 4096)),
    _ANY,
)


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly garbage, sometimes a plausible value, so deeper checks get exercised."""
    return st.one_of(valid, _ANY)


_ARBITRARY_ROLES = st.builds(
    Role,
    name=_maybe(st.sampled_from(["a", "b", "trainer", "a b", ""])),
    image=_ANY,
    entrypoint=_maybe(st.just("python")),
    args=_maybe(st.lists(_ANY, max_size=3)),
    env=_maybe(st.dictionaries(_ANY.filter(lambda k: _hashable(k)), _ANY, max_size=3)),
    num_replicas=_maybe(st.integers(-1, 6)),
    min_replicas=_ANY,
    max_retries=_maybe(st.integers(-1, 3)),
    retry_policy=_maybe(st.sampled_from(list(RetryPolicy))),
    resource=_RESOURCES,
    port_map=_maybe(st.dictionaries(_ANY.filter(lambda k: _hashable(k)), _ANY, max_size=3)),
    metadata=_ANY,
    mounts=_maybe(st.lists(_mounts_of(_ANY), max_size=3)),
)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
"""What metadata and capabilities may hold: they are kept in the app's records as JSON."""


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_ARBITRARY_APPS = st.one_of(
    st.builds(
        AppDef,
        name=_maybe(st.just("job")),
        roles=_maybe(st.lists(st.one_of(_ARBITRARY_ROLES, _ANY), max_size=4)),
        metadata=_ANY,
    ),
    _ANY,
)

_CAPS = st.builds(
    Capabilities,
    backend=st.sampled_from(["local", "docker", "slurm"]),
    retry_policies=st.frozensets(st.sampled_from(list(RetryPolicy))),
    mounts=st.booleans(),
    max_replicas_per_role=st.one_of(st.none(), st.integers(1, 8)),
    requires_image=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(app=_ARBITRARY_APPS, caps=_CAPS)
def test_arbitrary_apps_give_none_or_spec_error(app: Any, caps: Capabilities) -> None:
    try:
        result = validate(app, caps)  # type: ignore[func-returns-value]
    except SpecError as exc:
        error: SpecError | None = exc
    else:
        error = None
        assert result is None
    if error is not None:
        assert error.problems, "a SpecError always says what is wrong"
        str(error)  # the message renders


# -- valid apps -----------------------------------------------------------------

_ROLE_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,10}", fullmatch=True)
# No surrogates: a lone one is text no program can be given (refused, tested on its own).
_SAFE_TEXT = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=10
)
# Not the names that make a role look like a torch.distributed job: with REPLICA retries
# validation then warns (legal, and tested on its own), which the test suite makes an error.
_ENV_NAMES = st.text(
    st.characters(blacklist_characters="=\0", blacklist_categories=["Cs"]), min_size=1, max_size=10
).filter(lambda name: name not in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
_PATHS = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), min_size=1, max_size=10
)
_MOUNT_PATHS = _PATHS.map(lambda text: "/" + text)  # a mount's paths are absolute
_UNSET_OR = st.one_of(st.just(-1), st.integers(1, 256))


@st.composite
def _valid_roles(draw: st.DrawFn, caps: Capabilities, name: str) -> Role:
    num = draw(st.integers(1, caps.max_replicas_per_role or 16))
    policies = sorted(caps.retry_policies, key=list(RetryPolicy).index)
    policy = draw(st.sampled_from(policies)) if policies else RetryPolicy.APPLICATION
    mounts: list[Any] = []
    if caps.mounts:
        mounts = draw(
            st.lists(
                st.one_of(
                    st.builds(BindMount, _MOUNT_PATHS, _MOUNT_PATHS, st.booleans()),
                    st.builds(VolumeMount, _PATHS, _MOUNT_PATHS, st.booleans()),
                    st.builds(
                        DeviceMount,
                        _MOUNT_PATHS,
                        _MOUNT_PATHS,
                        st.sets(st.sampled_from("rwm"), min_size=1).map("".join),
                    ),
                ),
                max_size=2,
                unique_by=lambda mount: str(mount.dst_path),  # one mount per destination
            )
        )
    return Role(
        name=name,
        image=draw(_PATHS if caps.requires_image else _SAFE_TEXT),
        entrypoint=draw(_PATHS),
        args=draw(st.lists(_SAFE_TEXT, max_size=4)),
        env=draw(st.dictionaries(_ENV_NAMES, _SAFE_TEXT, max_size=3)),
        num_replicas=num,
        min_replicas=draw(st.one_of(st.none(), st.integers(1, num))),
        max_retries=draw(st.integers(0, 5)) if policies else 0,
        retry_policy=policy,
        resource=Resource(
            cpu=draw(_UNSET_OR),
            gpu=draw(st.integers(-1, 8)),
            memMB=draw(_UNSET_OR),
            capabilities=draw(st.dictionaries(st.text(max_size=5), _JSON, max_size=2)),
            devices=draw(st.dictionaries(st.text(min_size=1, max_size=5), st.integers(0, 4))),
        ),
        port_map=draw(st.dictionaries(st.text(max_size=5), st.integers(1, 65535), max_size=3)),
        metadata=draw(st.dictionaries(st.text(max_size=5), _JSON, max_size=3)),
        mounts=mounts,
    )


@st.composite
def _valid_apps(draw: st.DrawFn) -> tuple[AppDef, Capabilities]:
    caps = draw(_CAPS)
    names = draw(st.lists(_ROLE_NAMES, min_size=1, max_size=4, unique=True))
    roles = [draw(_valid_roles(caps, name)) for name in names]
    app_name = draw(
        st.text(
            st.characters(blacklist_categories=("Zs", "Cc", "Cs"), blacklist_characters="/\0"),
            min_size=1,
            max_size=12,
        ).filter(lambda s: not any(c.isspace() for c in s))
    )
    metadata = draw(st.dictionaries(st.text(max_size=5), _JSON, max_size=2))
    return AppDef(name=app_name, roles=roles, metadata=metadata), caps


@settings(max_examples=200, deadline=None)
@given(_valid_apps())
def test_generated_valid_apps_pass(app_and_caps: tuple[AppDef, Capabilities]) -> None:
    app, caps = app_and_caps
    validate(app, caps)  # raises SpecError, failing the test, if anything is flagged


@settings(max_examples=200, deadline=None)
@given(_valid_apps(), st.data())
def test_one_broken_field_is_reported_at_its_path(
    app_and_caps: tuple[AppDef, Capabilities], data: st.DataObject
) -> None:
    """Breaking one field of a valid app yields problems only under that field."""
    app, caps = app_and_caps
    index = data.draw(st.integers(0, len(app.roles) - 1))
    field, bad = data.draw(
        st.sampled_from(
            [
                ("num_replicas", 0),
                ("num_replicas", True),
                ("max_retries", -1),
                ("entrypoint", ""),
                ("args", "not-a-list"),
                ("env", {"A=B": "x"}),
                ("port_map", {"p": 0}),
                ("resource", None),
                ("retry_policy", "APPLICATION"),
                ("min_replicas", 0),
            ]
        )
    )
    roles = list(app.roles)
    replaced = {field: bad}
    if field == "num_replicas":
        replaced["min_replicas"] = None
    roles[index] = Role(**{**_fields(roles[index]), **replaced})
    try:
        validate(AppDef(name=app.name, roles=roles, metadata=app.metadata), caps)
    except SpecError as exc:
        error: SpecError | None = exc
    else:
        error = None
    assert error is not None
    prefix = f"roles[{index}].{field}"
    assert all(f.startswith(prefix) for f in error.fields), error.fields


def _fields(role: Role) -> dict[str, Any]:
    return {name: getattr(role, name) for name in Role.__dataclass_fields__}
