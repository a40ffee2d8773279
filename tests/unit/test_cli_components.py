"""Run targets: loading components and turning their signatures into options."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import click
import pytest
from click.testing import CliRunner

from supervisor import AppDef, Role
from supervisor.cli.components import (
    call_component,
    command_app,
    component_command,
    load_component,
)
from supervisor.cli.main import cli
from supervisor.components import BUILTINS, echo, sh

CAPTURED: dict[str, Any] = {}


def _app(name: str = "t") -> AppDef:
    return AppDef(name=name, roles=[Role(name="r", entrypoint="true")])


def typed(
    count: int,
    ratio: float = 0.5,
    label: str = "x",
    verbose: bool = False,
    tags: list[str] | None = None,
    env: dict[str, str] | None = None,
    maybe: int | None = None,
    some_thing: str = "d",
) -> AppDef:
    """A component with one parameter of each kind.

    Args:
        count: how many
        ratio: a fraction
            spread over two lines
    """
    CAPTURED.clear()
    CAPTURED.update(
        count=count,
        ratio=ratio,
        label=label,
        verbose=verbose,
        tags=tags,
        env=env,
        maybe=maybe,
        some_thing=some_thing,
    )
    return _app()


def variadic(first: str, *rest: str, n: int = 1, on: bool = True) -> AppDef:
    """Positional first, then everything else."""
    CAPTURED.clear()
    CAPTURED.update(first=first, rest=rest, n=n, on=on)
    return _app()


def not_an_app() -> str:
    return "nope"


def bad_value(n: int = 1) -> AppDef:
    raise ValueError(f"n={n} is not allowed")


@pytest.fixture
def parent() -> Iterator[click.Context]:
    with click.Context(click.Command("run"), info_name="run") as ctx:
        yield ctx


def call(fn: Any, args: Sequence[str], parent: click.Context) -> Mapping[str, Any]:
    call_component(fn, "comp", list(args), parent)
    return dict(CAPTURED)


# ------------------------------------------------------------------- loading
def test_builtin_names_load_the_builtins() -> None:
    assert load_component("echo") is echo
    assert load_component("sh") is sh


def test_module_function_loads() -> None:
    assert load_component("supervisor.components.basic:echo") is echo
    assert load_component(f"{__name__}:typed") is typed


def test_file_function_loads(tmp_path: Path) -> None:
    path = tmp_path / "my_comp.py"
    path.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from supervisor import AppDef, Role

            @dataclass
            class Marker:
                value: int = 1

            def hello(who: str = "you") -> AppDef:
                '''Say hello.'''
                return AppDef(name="hello", roles=[Role(name="hi", entrypoint="echo", args=[who])])
            """
        )
    )
    fn = load_component(f"{path}:hello")
    assert fn(who="me").roles[0].args == ("me",)


@pytest.mark.parametrize(("torchx", "ours"), [("utils.echo", "echo"), ("dist.ddp", "ddp")])
def test_torchx_names_of_the_builtins_load_them(torchx: str, ours: str) -> None:
    """``torchx run utils.echo --msg hi`` ports as ``asupervisor run utils.echo --msg hi``
    (``utils.sh`` quotes its words as TorchX's does: see test_components)."""
    assert load_component(torchx) is BUILTINS[ours]


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("nope", "unknown component 'nope'"),
        ("utils.python", "unknown component 'utils.python'"),  # none of ours stands in
        (":echo", "unknown component"),
        ("supervisor.components:", "unknown component"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("supervisor.components:missing", "has no function 'missing'"),
        ("supervisor.components:__doc__", "has no function"),
        ("/no/such/file.py:f", "no component file"),
    ],
)
def test_bad_targets_are_usage_errors(target: str, match: str) -> None:
    with pytest.raises(click.UsageError, match=match):
        load_component(target)


def test_a_file_that_fails_to_import_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(click.UsageError, match="RuntimeError: boom"):
        load_component(f"{path}:f")
    assert not any(name.endswith("broken") for name in sys.modules)


def test_command_app_is_named_after_the_program() -> None:
    app = command_app(["/usr/bin/python3.11", "-c", "print(1)"])
    assert app.name == "python3-11"
    role = app.roles[0]
    assert (role.name, role.entrypoint, tuple(role.args)) == (
        "python3-11",
        "/usr/bin/python3.11",
        ("-c", "print(1)"),
    )
    assert command_app(["./9lives"]).name == "cmd-9lives"
    with pytest.raises(click.UsageError, match="expected a command"):
        command_app([])


# ---------------------------------------------------------------- signatures
def test_defaults_apply_when_options_are_omitted(parent: click.Context) -> None:
    assert call(typed, ["--count", "3"], parent) == {
        "count": 3,
        "ratio": 0.5,
        "label": "x",
        "verbose": False,
        "tags": None,
        "env": None,
        "maybe": None,
        "some_thing": "d",
    }


def test_every_type_converts(parent: click.Context) -> None:
    got = call(
        typed,
        [
            "--count=2",
            "--ratio",
            "1.5",
            "--label",
            "y z",
            "--verbose",
            "--tags",
            "a",
            "--tags",
            "b",
            "--env",
            "A=1,B=x=y",
            "--maybe",
            "7",
            "--some-thing",
            "dashed",
        ],
        parent,
    )
    assert got == {
        "count": 2,
        "ratio": 1.5,
        "label": "y z",
        "verbose": True,
        "tags": ["a", "b"],
        "env": {"A": "1", "B": "x=y"},
        "maybe": 7,
        "some_thing": "dashed",
    }
    assert call(typed, ["--count", "1", "--some_thing", "under"], parent)["some_thing"] == "under"


def test_a_repeated_mapping_option_merges_its_pairs(parent: click.Context) -> None:
    """``--env A=1 --env B=2`` kept only B=2, silently."""
    args = ["--count", "1", "--env", "A=1,B=x=y", "--env", "C=2", "--env", "A=3"]
    assert call(typed, args, parent)["env"] == {"A": "3", "B": "x=y", "C": "2"}

    def labelled(labels: Mapping[str, str] = MappingProxyType({"team": "ml"})) -> AppDef:
        CAPTURED["labels"] = labels
        return _app()

    assert call(labelled, [], parent)["labels"] == {"team": "ml"}
    assert call(labelled, ["--labels", "a=1", "--labels", "b=2"], parent)["labels"] == {
        "a": "1",
        "b": "2",
    }


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ([], "Missing option '--count'"),
        (["--count", "x"], "'x' is not a valid integer"),
        (["--count", "1", "--ratio", "half"], "'half' is not a valid float"),
        (["--count", "1", "--bogus"], "No such option '--bogus'"),
        (["--count", "1", "--env", "novalue"], "expected key=value, got 'novalue'"),
        (["--count", "1", "extra"], "unexpected extra argument (extra)"),
    ],
)
def test_bad_values_are_usage_errors(parent: click.Context, args: list[str], match: str) -> None:
    with pytest.raises(click.UsageError) as err:
        call(typed, args, parent)
    assert match in err.value.format_message()


def test_varargs_take_everything_after_the_first_positional(parent: click.Context) -> None:
    got = call(variadic, ["--n", "2", "--no-on", "script.py", "--lr", "0.1", "-x"], parent)
    assert got == {"first": "script.py", "rest": ("--lr", "0.1", "-x"), "n": 2, "on": False}
    assert call(variadic, ["only"], parent) == {"first": "only", "rest": (), "n": 1, "on": True}
    with pytest.raises(click.UsageError) as err:
        call(variadic, [], parent)
    assert "Missing argument 'FIRST'" in err.value.format_message()


def test_a_component_value_error_is_a_usage_error(parent: click.Context) -> None:
    with pytest.raises(click.UsageError, match="n=5 is not allowed"):
        call_component(bad_value, "bad", ["--n", "5"], parent)


def test_a_component_must_return_an_appdef(parent: click.Context) -> None:
    with pytest.raises(click.UsageError, match="returned str, not an AppDef"):
        call_component(not_an_app, "x", [], parent)  # type: ignore[arg-type]


def test_unsupported_parameter_types_are_reported() -> None:
    def odd(x: set[int]) -> AppDef:
        return _app()

    with pytest.raises(click.UsageError, match="parameter 'x': unsupported"):
        component_command(odd, "odd")


def test_unannotated_parameters_follow_their_defaults(parent: click.Context) -> None:
    def loose(a, b=2, c=False):  # type: ignore[no-untyped-def]
        CAPTURED.update(a=a, b=b, c=c)
        return _app()

    CAPTURED.clear()
    call_component(loose, "loose", ["--a", "text", "--b", "5", "--c"], parent)
    assert CAPTURED == {"a": "text", "b": 5, "c": True}


def test_help_shows_the_docstring_and_argument_help() -> None:
    command, _ = component_command(typed, "typed")
    with click.Context(command, info_name="typed") as ctx:
        text = command.get_help(ctx)
    assert "A component with one parameter of each kind." in text
    assert "how many" in text
    assert "a fraction spread over two lines" in text
    assert "--verbose / --no-verbose" in text
    assert "Args:" not in text


def test_run_component_help_through_the_cli() -> None:
    result = CliRunner().invoke(cli, ["run", "echo", "--help"], prog_name="asupervisor")
    assert result.exit_code == 0
    assert "Usage: asupervisor run echo [OPTIONS]" in result.output
    assert "Print a message from each replica" in result.output
    assert "--msg" in result.output and "--num_replicas" in result.output
    result = CliRunner().invoke(cli, ["run", "ddp", "--help"])
    assert result.exit_code == 0
    assert "[SCRIPT_ARGS]..." in result.output and "-j" in result.output
    assert "--script" in result.output and "--memMB" in result.output


def test_defaults_before_varargs_keep_their_slots(parent: click.Context) -> None:
    def slots(a: str, b: str = "B", c: bool = False, *rest: str) -> AppDef:
        CAPTURED.update(a=a, b=b, c=c, rest=rest)
        return _app()

    CAPTURED.clear()
    call_component(slots, "slots", ["--c", "A"], parent)
    assert CAPTURED == {"a": "A", "b": "B", "c": True, "rest": ()}
    call_component(slots, "slots", ["A", "b2", "r1", "--r2"], parent)
    assert CAPTURED == {"a": "A", "b": "b2", "c": False, "rest": ("r1", "--r2")}


def test_a_flag_without_a_default_is_false_when_left_out(parent: click.Context) -> None:
    """--help says ``[default: no-verbose]``; left out, the call failed with a missing
    argument, or before *args got ``Parameter.empty`` (true)."""

    def req_flag(verbose: bool) -> AppDef:
        CAPTURED.update(verbose=verbose)
        return _app()

    def flag_varargs(verbose: bool, *rest: str) -> AppDef:
        CAPTURED.update(verbose=verbose, rest=rest)
        return _app()

    def keyword_flag(*, verbose: bool) -> AppDef:
        CAPTURED.update(verbose=verbose)
        return _app()

    for fn in (req_flag, keyword_flag):
        for args, verbose in (([], False), (["--verbose"], True), (["--no-verbose"], False)):
            CAPTURED.clear()
            assert call(fn, args, parent) == {"verbose": verbose}, (fn.__name__, args)
    for args, expected in (
        ([], {"verbose": False, "rest": ()}),
        (["x", "y"], {"verbose": False, "rest": ("x", "y")}),
        (["--verbose", "x"], {"verbose": True, "rest": ("x",)}),
    ):
        CAPTURED.clear()
        assert call(flag_varargs, args, parent) == expected, args
    command, _ = component_command(req_flag, "f")
    with command.make_context("f", []) as ctx:  # --help as `run` shows it
        assert "[default: no-verbose]" in command.get_help(ctx)


def test_ddp_takes_script_and_args_after_a_double_dash_without_the_dash() -> None:
    result = CliRunner().invoke(
        cli, ["run", "--dryrun", "ddp", "-j", "1x2", "--script", "t.py", "--", "--lr", "0.1"]
    )
    assert result.exit_code == 0, result.output
    assert "exec python t.py --lr 0.1'" in result.output
    assert "-- --lr" not in result.output
