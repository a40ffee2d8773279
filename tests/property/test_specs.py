"""Macros and handles: the string forms users and other processes rely on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import InvalidHandleError, Role, macros, make_handle, parse_handle

VALUES = macros.Values(img_root="/img", app_id="app-1", replica_id="3", rank0_env="RANK0")
plain_text = st.text(alphabet=st.characters(blacklist_characters="$"), max_size=30)


@given(plain_text)
def test_text_without_dollars_is_unchanged(text: str) -> None:
    assert VALUES.substitute(text) == text


@given(
    st.lists(st.sampled_from(["app_id", "replica_id", "img_root", "rank0_env"]), max_size=5),
    plain_text,
)
def test_known_macros_are_replaced(names: list[str], sep: str) -> None:
    text = sep.join("${" + n + "}" for n in names)
    expected = sep.join(getattr(VALUES, n) for n in names)
    assert VALUES.substitute(text) == expected


@given(plain_text)
def test_double_dollar_escapes_and_unknown_names_stay(text: str) -> None:
    assert VALUES.substitute("$$" + text) == "$" + text
    assert VALUES.substitute("${not_a_macro}" + text) == "${not_a_macro}" + text
    assert VALUES.substitute("$HOME") == "$HOME"


def test_apply_touches_args_env_values_and_metadata_only() -> None:
    role = Role(
        name="r",
        entrypoint="${app_id}",
        args=["--id=${replica_id}", "$${rank0_env}"],
        env={"${app_id}": "${app_id}"},
        metadata={"k": "${img_root}", "n": 1},
    )
    out = VALUES.apply(role)
    assert out.entrypoint == "${app_id}"
    assert tuple(out.args) == ("--id=3", "${rank0_env}")
    assert dict(out.env) == {"${app_id}": "app-1"}
    assert dict(out.metadata) == {"k": "/img", "n": 1}
    assert tuple(role.args) == ("--id=${replica_id}", "$${rank0_env}")  # the original is untouched


@given(st.lists(plain_text, max_size=4), st.dictionaries(plain_text, plain_text, max_size=4))
def test_apply_gives_a_role_without_macros_back(args: list[str], env: dict[str, str]) -> None:
    role = Role(name="r", entrypoint="e", args=args, env=env)
    assert VALUES.apply(role) is role  # frozen: nothing to copy for (a dry run's hot path)
    escaped = Role(name="r", entrypoint="e", args=[*args, "$$"], env=env)
    out = VALUES.apply(escaped)
    assert tuple(out.args) == (*args, "$")
    assert tuple(escaped.args) == (*args, "$$")
    with_metadata = Role(name="r", entrypoint="e", args=args, env=env, metadata={"k": ["v"]})
    copied = VALUES.apply(with_metadata)
    assert copied.metadata == {"k": ["v"]}
    assert copied.metadata["k"] is not with_metadata.metadata["k"]  # new containers


backends = st.from_regex(r"[A-Za-z][A-Za-z0-9_.+-]{0,10}", fullmatch=True)
# "." and ".." would name a directory, not an app (issue 8), and NUL ends a path: refused.
sessions = st.text(min_size=1, max_size=20).filter(
    lambda s: "/" not in s and "\0" not in s and s not in (".", "..")
)
app_ids = st.text(min_size=1, max_size=40).filter(lambda s: "\0" not in s and s not in (".", ".."))


@given(backends, sessions, app_ids)
def test_handles_round_trip(backend: str, session: str, app_id: str) -> None:
    handle = make_handle(backend, session, app_id)
    parsed = parse_handle(handle)
    assert (parsed.backend, parsed.session, parsed.app_id) == (backend, session, app_id)
    assert str(parsed) == handle


@pytest.mark.parametrize(
    "bad",
    ["", "local", "local://", "local://svc", "local://svc/", "://svc/x", "1x://s/a", "local:/s/a"],
)
def test_malformed_handles_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidHandleError):
        parse_handle(bad)


def test_app_ids_with_slashes_round_trip() -> None:
    assert parse_handle("slurm://svc/a/b/c").app_id == "a/b/c"
