"""Run options: declaration, resolution, the CLI string form and the help table."""

from __future__ import annotations

import typing
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.errors import Problem, SpecError
from supervisor.runopts import OptType, ResolvedCfg, RunOpt, RunOpts, parse_cfg_string

OPTS = (
    RunOpts()
    .add("log_dir", str, "directory for replica logs", default="/tmp/logs")
    .add("prepend_cwd", bool, "put the cwd first on PATH", default=False)
    .add("max_procs", int, "process limit", default=8)
    .add("poll_interval", float, "seconds between polls", default=0.5)
    .add("mounts", list, "extra mounts", default=["a", "b"])
    .add("partition", str, "slurm partition", required=True)
    .add("comment", str, "free text")
)


def problems_of(exc: pytest.ExceptionInfo[SpecError]) -> dict[str, str]:
    return {p.field: p.message for p in exc.value.problems}


# -- declaration ---------------------------------------------------------


def test_add_returns_a_new_object_and_keeps_order() -> None:
    base = RunOpts().add("a", str, "first")
    extended = base.add("b", int, "second")
    assert base.names == ("a",)
    assert extended.names == ("a", "b")
    assert [opt.name for opt in extended] == ["a", "b"]
    assert len(extended) == 2


def test_python_types_are_normalized_to_opttype() -> None:
    opts = (
        RunOpts()
        .add("s", str, "")
        .add("i", int, "")
        .add("f", float, "")
        .add("b", bool, "")
        .add("l1", list, "")
        .add("l2", list[str], "")
        .add("l3", OptType.LIST, "")
    )
    kinds = {opt.name: opt.type for opt in opts}
    assert kinds == {
        "s": OptType.STR,
        "i": OptType.INT,
        "f": OptType.FLOAT,
        "b": OptType.BOOL,
        "l1": OptType.LIST,
        "l2": OptType.LIST,
        "l3": OptType.LIST,
    }
    assert OptType(typing.List[str]) is OptType.LIST  # noqa: UP006 - TorchX spells it so


def test_constructor_form_equals_builder_form() -> None:
    built = RunOpts([RunOpt("a", OptType.INT, 3, "help a"), RunOpt("b", OptType.STR, None, "b")])
    chained = RunOpts().add("a", int, "help a", default=3).add("b", str, "b")
    assert built == chained
    assert hash(built) == hash(chained)


def test_contains_and_get() -> None:
    assert "log_dir" in OPTS
    assert "nope" not in OPTS
    assert 3 not in OPTS
    opt = OPTS.get("max_procs")
    assert opt is not None
    assert (opt.type, opt.default, opt.required) == (OptType.INT, 8, False)
    assert OPTS.get("nope") is None


def test_list_default_is_stored_as_a_tuple() -> None:
    opt = OPTS.get("mounts")
    assert opt is not None
    assert opt.default == ("a", "b")


def test_int_default_for_float_option_becomes_float() -> None:
    opt = RunOpt("x", OptType.FLOAT, 2)
    assert opt.default == 2.0
    assert isinstance(opt.default, float)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RunOpt("x", OptType.INT, "3"), "runopts.x.default"),
        (lambda: RunOpt("x", OptType.INT, True), "runopts.x.default"),
        (lambda: RunOpt("x", OptType.STR, "d", required=True), "runopts.x.default"),
        (lambda: RunOpt("has space", OptType.STR), "runopts.has space.name"),
        (lambda: RunOpt("a=b", OptType.STR), "runopts.a=b.name"),
        (lambda: RunOpt("", OptType.STR), "runopts..name"),
        (lambda: RunOpt("x", typing.cast(OptType, dict)), "runopts.x.type"),
    ],
)
def test_bad_declarations_are_rejected_at_declaration(
    make: typing.Callable[[], RunOpt], field: str
) -> None:
    with pytest.raises(SpecError) as exc:
        make()
    assert field in exc.value.fields
    assert exc.value.context == "invalid run option declaration"


def test_duplicate_declaration_is_rejected() -> None:
    with pytest.raises(SpecError) as exc:
        RunOpts().add("a", str, "").add("a", int, "")
    assert exc.value.problems == (Problem("runopts.a", "declared more than once"),)


def test_runopts_is_immutable() -> None:
    with pytest.raises(AttributeError):
        OPTS._opts = ()


# -- resolve ---------------------------------------------------------------


def test_defaults_filled_for_every_declared_option_in_order() -> None:
    cfg = OPTS.resolve({"partition": "gpu"})
    assert list(cfg) == list(OPTS.names)
    assert dict(cfg) == {
        "log_dir": "/tmp/logs",
        "prepend_cwd": False,
        "max_procs": 8,
        "poll_interval": 0.5,
        "mounts": ("a", "b"),
        "partition": "gpu",
        "comment": None,
    }


def test_given_values_override_defaults() -> None:
    cfg = OPTS.resolve(
        {"partition": "p", "max_procs": 2, "mounts": ["x"], "prepend_cwd": True, "comment": "c"}
    )
    assert cfg["max_procs"] == 2
    assert cfg["mounts"] == ("x",)
    assert cfg["prepend_cwd"] is True
    assert cfg["comment"] == "c"


def test_none_means_not_given() -> None:
    cfg = OPTS.resolve({"partition": "p", "log_dir": None})
    assert cfg["log_dir"] == "/tmp/logs"
    with pytest.raises(SpecError) as exc:
        OPTS.resolve({"partition": None})
    assert exc.value.fields == ("cfg.partition",)


def test_none_cfg_on_options_without_required_ones() -> None:
    opts = RunOpts().add("a", int, "", default=1)
    assert dict(opts.resolve(None)) == {"a": 1}
    assert dict(RunOpts().resolve(None)) == {}
    assert dict(RunOpts().resolve({})) == {}


def test_every_kind_of_problem_reported_together() -> None:
    with pytest.raises(SpecError) as exc:
        OPTS.resolve({"log_dri": "/x", "max_procs": "8", "prepend_cwd": 1, "mounts": "a;b"})
    problems = problems_of(exc)
    assert set(problems) == {
        "cfg.log_dri",
        "cfg.max_procs",
        "cfg.prepend_cwd",
        "cfg.mounts",
        "cfg.partition",
    }
    assert exc.value.context == "invalid run options"
    assert problems["cfg.partition"].startswith("required option missing")
    assert problems["cfg.max_procs"] == "expected int, got str '8'"
    assert problems["cfg.prepend_cwd"] == "expected bool, got int 1"
    assert problems["cfg.mounts"].startswith("expected list[str], got str")


def test_unknown_key_did_you_mean_and_valid_names() -> None:
    with pytest.raises(SpecError) as exc:
        OPTS.resolve({"partition": "p", "log_dri": "/x"})
    (problem,) = exc.value.problems
    assert problem.field == "cfg.log_dri"
    assert problem.message.startswith("unknown option; did you mean 'log_dir'?")
    for name in OPTS.names:
        assert name in problem.message
    assert "cfg.log_dri: unknown option; did you mean 'log_dir'?" in str(exc.value)


def test_did_you_mean_ignores_case() -> None:
    with pytest.raises(SpecError) as exc:
        OPTS.resolve({"partition": "p", "LOG_DIR": "/x"})
    assert "did you mean 'log_dir'?" in exc.value.problems[0].message


def test_unknown_key_without_close_match_lists_valid_names_only() -> None:
    with pytest.raises(SpecError) as exc:
        OPTS.resolve({"partition": "p", "zzzzzz": 1})
    message = exc.value.problems[0].message
    assert "did you mean" not in message
    assert message.startswith("unknown option; valid options: log_dir, prepend_cwd")


def test_unknown_key_on_backend_without_options() -> None:
    with pytest.raises(SpecError) as exc:
        RunOpts().resolve({"x": 1})
    assert exc.value.problems == (
        Problem("cfg.x", "unknown option; this backend takes no run options"),
    )


@pytest.mark.parametrize(
    ("kind", "value", "resolved"),
    [
        (int, 3, 3),
        (float, 3, 3.0),
        (float, 2.5, 2.5),
        (bool, False, False),
        (str, "", ""),
        (list, [], ()),
        (list, ("a",), ("a",)),
    ],
)
def test_accepted_types(kind: type[object], value: object, resolved: object) -> None:
    cfg = RunOpts().add("x", kind, "").resolve({"x": value})
    assert cfg["x"] == resolved
    assert type(cfg["x"]) is type(resolved)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (int, True),
        (int, 1.0),
        (int, "1"),
        (float, True),
        (float, "1.5"),
        (float, 10**400),
        (bool, 1),
        (bool, "true"),
        (str, 3),
        (str, b"bytes"),
        (list, "a"),
        (list, ["a", 1]),
        (list, {"a": 1}),
        (str, "/tmp/a\0b"),  # the OS refuses it in a path, argv or environment, mid-launch
        (list, ["a", "b\0"]),
    ],
)
def test_rejected_types(kind: type[object], value: object) -> None:
    with pytest.raises(SpecError) as exc:
        RunOpts().add("x", kind, "").resolve({"x": value})
    assert exc.value.fields == ("cfg.x",)


def test_non_mapping_cfg_and_non_str_keys() -> None:
    with pytest.raises(SpecError) as exc:
        OPTS.resolve(typing.cast(Mapping[str, object], ["partition"]))
    assert exc.value.fields == ("cfg",)
    with pytest.raises(SpecError) as exc:
        OPTS.resolve(typing.cast(Mapping[str, object], {"partition": "p", 3: "x"}))
    assert exc.value.fields == ("cfg[3]",)


def test_resolve_is_idempotent() -> None:
    once = OPTS.resolve({"partition": "p", "mounts": ["z"]})
    assert OPTS.resolve(once) == once


# -- ResolvedCfg -----------------------------------------------------------


def test_resolved_cfg_is_read_only_and_hashable() -> None:
    cfg = OPTS.resolve({"partition": "p"})
    assert isinstance(cfg, Mapping)
    with pytest.raises(TypeError):
        cfg["x"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        cfg._values = {}
    assert hash(cfg) == hash(OPTS.resolve({"partition": "p"}))
    assert cfg == dict(cfg)
    assert "ResolvedCfg(" in repr(cfg)


def test_typed_getters() -> None:
    cfg = OPTS.resolve({"partition": "p"})
    assert cfg.get_str("log_dir") == "/tmp/logs"
    assert cfg.get_bool("prepend_cwd") is False
    assert cfg.get_int("max_procs") == 8
    assert cfg.get_float("poll_interval") == 0.5
    assert cfg.get_list("mounts") == ("a", "b")
    assert cfg.get_str("comment") is None
    assert cfg.get_str("comment", "fallback") == "fallback"


def test_typed_getter_errors_are_programming_errors() -> None:
    cfg = OPTS.resolve({"partition": "p"})
    with pytest.raises(KeyError):
        cfg.get_str("log_dri")
    with pytest.raises(TypeError):
        cfg.get_int("log_dir")
    with pytest.raises(TypeError):
        cfg.get_int("prepend_cwd")  # bool is not an int here either
    with pytest.raises(TypeError):
        cfg.get_bool("max_procs")


def test_get_float_accepts_int_in_directly_built_cfg() -> None:
    cfg = ResolvedCfg({"x": 2, "items": ["a"]})
    assert cfg.get_float("x") == 2.0
    assert cfg.get_list("items") == ("a",)


# -- parse_cfg_string --------------------------------------------------------


def test_parse_empty_string() -> None:
    assert parse_cfg_string("", OPTS) == {}
    assert parse_cfg_string("  ", OPTS) == {}


def test_parse_converts_per_declared_type() -> None:
    parsed = parse_cfg_string(
        "log_dir=/var/x,prepend_cwd=yes,max_procs=4,poll_interval=1.5,mounts=a;b;c", OPTS
    )
    assert parsed == {
        "log_dir": "/var/x",
        "prepend_cwd": True,
        "max_procs": 4,
        "poll_interval": 1.5,
        "mounts": ["a", "b", "c"],
    }


def test_parse_single_list_value_gives_one_item_list() -> None:
    assert parse_cfg_string("mounts=a", OPTS) == {"mounts": ["a"]}


def test_parse_repeated_list_option_accumulates() -> None:
    assert parse_cfg_string("mounts=a,mounts=b;c", OPTS) == {"mounts": ["a", "b", "c"]}


def test_parse_empty_list_value() -> None:
    assert parse_cfg_string("mounts=", OPTS) == {"mounts": []}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("Yes", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("NO", False),
    ],
)
def test_parse_bools(text: str, expected: bool) -> None:
    assert parse_cfg_string(f"prepend_cwd={text}", OPTS) == {"prepend_cwd": expected}


def test_parse_trims_whitespace_and_skips_empty_pieces() -> None:
    parsed = parse_cfg_string(" log_dir = /x , max_procs= 3,,", OPTS)
    assert parsed == {"log_dir": "/x", "max_procs": 3}


def test_parse_value_may_contain_equals() -> None:
    assert parse_cfg_string("comment=a=b", OPTS) == {"comment": "a=b"}


def test_parse_collects_every_problem() -> None:
    with pytest.raises(SpecError) as exc:
        parse_cfg_string(
            "log_dri=/x,prepend_cwd=maybe,max_procs=four,poll_interval=fast,orphan,=v", OPTS
        )
    problems = problems_of(exc)
    assert set(problems) == {
        "cfg.log_dri",
        "cfg.prepend_cwd",
        "cfg.max_procs",
        "cfg.poll_interval",
        "cfg.orphan",
        "cfg",
        "cfg.partition",
    }
    assert problems["cfg.log_dri"].startswith("unknown option; did you mean 'log_dir'?")
    assert problems["cfg.prepend_cwd"] == "expected bool (true/false/1/0/yes/no), got 'maybe'"
    assert problems["cfg.max_procs"] == "expected int, got 'four'"
    assert problems["cfg.poll_interval"] == "expected float, got 'fast'"
    assert problems["cfg.orphan"].startswith("expected key=value")
    assert problems["cfg.partition"].startswith("required option missing")
    assert exc.value.context == "invalid run options"


def test_parse_problems_come_with_what_resolve_finds_in_the_rest() -> None:
    """An unknown key used to hide a bound or a choice broken beside it (the CLI's
    ``--cfg stop_grace=-5,foo=1`` named only ``foo``): the user fixed one, ran
    again and only then heard of the other."""
    opts = RunOpts(
        [
            RunOpt("grace", OptType.FLOAT, 5.0, "seconds", minimum=0.0),
            RunOpt("mode", OptType.STR, "a", "how", choices=("a", "b")),
            RunOpt("count", OptType.INT, 1, "how many"),
        ]
    )
    with pytest.raises(SpecError) as exc:
        parse_cfg_string("grace=-5,mode=z,count=2,foo=1", opts)
    problems = problems_of(exc)
    assert set(problems) == {"cfg.foo", "cfg.grace", "cfg.mode"}
    assert problems["cfg.grace"] == "must be >= 0, got -5"
    assert problems["cfg.foo"].startswith("unknown option")
    # Each field once, the parse's problems first.
    assert exc.value.fields == ("cfg.foo", "cfg.grace", "cfg.mode")


def test_parse_hints_at_semicolon_after_a_list_option() -> None:
    with pytest.raises(SpecError) as exc:
        parse_cfg_string("partition=p,mounts=a,b", OPTS)
    (problem,) = exc.value.problems
    assert problem.field == "cfg.b"
    assert "separate the items of list option 'mounts' with ';'" in problem.message


def test_parse_scalar_given_twice() -> None:
    with pytest.raises(SpecError) as exc:
        parse_cfg_string("partition=p,max_procs=1,max_procs=2", OPTS)
    assert exc.value.problems == (Problem("cfg.max_procs", "given more than once"),)


def test_parse_then_resolve() -> None:
    cfg = OPTS.resolve(parse_cfg_string("partition=gpu,mounts=m", OPTS))
    assert cfg.get_str("partition") == "gpu"
    assert cfg.get_list("mounts") == ("m",)


# -- the help table ----------------------------------------------------------


def test_str_table_has_names_types_defaults_and_help() -> None:
    table = str(OPTS)
    lines = table.splitlines()
    assert lines[0].split() == ["name", "type", "default", "help"]
    for opt in OPTS:
        assert opt.name in table
        assert opt.help in table
    row = next(line for line in lines if line.startswith("mounts"))
    assert row.split()[:3] == ["mounts", "list[str]", "a;b"]
    row = next(line for line in lines if line.startswith("partition"))
    assert "(required)" in row
    row = next(line for line in lines if line.startswith("prepend_cwd"))
    assert row.split()[:3] == ["prepend_cwd", "bool", "false"]
    # help starts in the same column on every row
    column = lines[0].index("help")
    assert all(line[column:] for line in lines[2:])
    assert lines[2][column:] == "directory for replica logs"


def test_str_of_empty_runopts() -> None:
    assert "no run options" in str(RunOpts())


# -- never anything but SpecError -------------------------------------------

_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*OPTS.names, "x", "log_dri"]), _ANY, max_size=6))
def test_resolve_raises_only_spec_error(cfg: dict[str, object]) -> None:
    try:
        resolved = OPTS.resolve(cfg)
    except SpecError as exc:
        error: SpecError | None = exc
    else:
        error = None
        assert OPTS.resolve(resolved) == resolved
    if error is not None:
        assert error.problems
        assert all(f.startswith("cfg") for f in error.fields)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("=,; ab_1tTmounts")), max_size=30))
def test_parse_raises_only_spec_error(text: str) -> None:
    try:
        parsed = parse_cfg_string(text, OPTS)
    except SpecError as exc:
        error: SpecError | None = exc
    else:
        error = None
        assert set(parsed) <= set(OPTS.names)
    if error is not None:
        assert error.problems


def test_a_str_option_with_choices_refuses_others_naming_the_field() -> None:
    opts = RunOpts([RunOpt("mode", OptType.STR, "a", "how", choices=("a", "b"))])
    assert opts.resolve({"mode": "b"})["mode"] == "b"
    with pytest.raises(SpecError) as bad:
        opts.resolve({"mode": "c"})
    assert [p.field for p in bad.value.problems] == ["cfg.mode"]
    assert "'c' is not one of a, b" in str(bad.value)
    assert "a | b" in str(opts)  # the help shows the choices


def test_choices_are_checked_at_declaration() -> None:
    with pytest.raises(SpecError, match=r"runopts\.mode\.default"):
        RunOpt("mode", OptType.STR, "z", choices=("a", "b"))
    with pytest.raises(SpecError, match=r"runopts\.n\.choices"):
        RunOpt("n", OptType.INT, 1, choices=("1",))


def test_a_refused_option_says_why_instead_of_unknown() -> None:
    opts = RunOpts([RunOpt("x", OptType.STR)], refused={"colour": "this backend has none"})
    with pytest.raises(SpecError) as bad:
        opts.resolve({"colour": "red"})
    assert [p.field for p in bad.value.problems] == ["cfg.colour"]
    assert "not supported by this backend: this backend has none" in str(bad.value)
    # Kept through add(), and never both declared and refused.
    assert "this backend has none" in opts.add("y", str, "help")._unknown("colour")
    with pytest.raises(SpecError, match="both declared and refused"):
        RunOpts([RunOpt("x", OptType.STR)], refused={"x": "no"})
