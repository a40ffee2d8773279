"""Turning a run TARGET into an ``AppDef``: load a component, parse its options, call it.

A component is found by a built-in name (``echo``), ``package.module:function``
or ``path/to/file.py:function``. Its signature becomes a click command:

* a parameter that can only be given by position (positional-only, or one
  before ``*args``) is a positional argument, required unless defaulted;
* every other parameter is an option ``--name`` (also ``--na-me`` for
  ``na_me``, and ``-n`` for a one-letter name), required when it has no
  default; types come from annotations: ``str``, ``int``, ``float``,
  ``bool`` (a ``--x/--no-x`` flag), ``list[str]`` and friends (repeat the
  option), ``dict[str, str]`` (``k=v,k2=v2``; repeated, the pairs are merged);
  ``X | None`` is ``X``;
* ``*args`` takes every remaining argument, options included, so
  ``run ddp train.py --lr 0.1`` hands ``--lr 0.1`` to the script.

The docstring is the help; its ``Args:`` section gives each option's help.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from supervisor.components import BUILTINS, TORCHX_NAMES
from supervisor.specs import AppDef, Role

__all__ = [
    "Component",
    "KeyValue",
    "call_component",
    "command_app",
    "component_command",
    "load_component",
]

Component = Callable[..., AppDef]

_SCALARS: dict[Any, click.ParamType[Any]] = {
    str: click.STRING,
    int: click.INT,
    float: click.FLOAT,
}
_ROLE_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def load_component(target: str) -> Component:
    """The function ``target`` names; ``click.UsageError`` if there is none."""
    builtin = BUILTINS.get(target) or TORCHX_NAMES.get(target)
    if builtin is not None:
        return builtin
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise click.UsageError(
            f"unknown component {target!r}: use a built-in ({', '.join(BUILTINS)}), "
            "package.module:function, path/to/file.py:function, or -- COMMAND [ARGS...]"
        )
    module = _load_file(where) if where.endswith(".py") or "/" in where else _import(where)
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise click.UsageError(f"{where} has no function {attr!r}")
    return typing.cast(Component, fn)


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise click.UsageError(f"cannot import {name!r}: {exc}") from exc


def _load_file(path: str) -> types.ModuleType:
    file = Path(path)
    if not file.is_file():
        raise click.UsageError(f"no component file {path!r}")
    name = f"_asupervisor_component_{_ROLE_UNSAFE.sub('_', file.stem)}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise click.UsageError(f"cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise click.UsageError(f"cannot load {path!r}: {type(exc).__name__}: {exc}") from exc
    return module


def command_app(argv: Sequence[str]) -> AppDef:
    """``run -- PROGRAM ARGS...``: a one-role app named after the program."""
    if not argv:
        raise click.UsageError("expected a command after --")
    program = argv[0]
    base = _ROLE_UNSAFE.sub("-", Path(program).name).strip("-_")
    name = base if base[:1].isalpha() else f"cmd-{base}".rstrip("-")
    return AppDef(name=name, roles=[Role(name=name, entrypoint=program, args=list(argv[1:]))])


# ----------------------------------------------------------------- signatures
class KeyValue(click.ParamType[dict[str, str]]):
    """``k=v,k2=v2`` into a dict of strings."""

    name = "K=V,..."

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> dict[str, str]:
        if isinstance(value, Mapping):  # a default
            return dict(value)
        out: dict[str, str] = {}
        for piece in str(value).split(","):
            if not piece.strip():
                continue
            key, sep, item = piece.partition("=")
            if not sep or not key.strip():
                self.fail(f"expected key=value, got {piece!r}", param, ctx)
            out[key.strip()] = item
        return out


@dataclass(frozen=True)
class _Kind:
    type: click.ParamType[Any]
    multiple: bool = False
    flag: bool = False
    merged: bool = False  # repeatable, each one's pairs merged into one dict


def _kind_of(annotation: Any, default: Any, where: str) -> _Kind:
    if annotation is inspect.Parameter.empty:
        # No annotation: judge by the default, else take text.
        annotation = type(default) if default not in (inspect.Parameter.empty, None) else str
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _kind_of(rest[0], default, where)
    if annotation is bool:
        return _Kind(click.BOOL, flag=True)
    if annotation in _SCALARS:
        return _Kind(_SCALARS[annotation])
    homogeneous = origin is not tuple or len(args) == 1 or args[1:] == (Ellipsis,)
    if origin in (list, tuple, Sequence) and args and args[0] in _SCALARS and homogeneous:
        return _Kind(_SCALARS[args[0]], multiple=True)
    if origin in (dict, Mapping) and args == (str, str):
        # ``--env A=1 --env B=2`` is both, not the last one alone.
        return _Kind(KeyValue(), multiple=True, merged=True)
    raise click.UsageError(f"{where}: unsupported parameter type {annotation!r}")


def _arg_help(doc: str) -> dict[str, str]:
    """Parameter help from a Google-style ``Args:`` section."""
    helps: dict[str, str] = {}
    inside, current = False, ""
    for line in inspect.cleandoc(doc).splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break  # the next section
        found = re.match(r"\s+\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if found and len(line) - len(line.lstrip()) <= 4:
            current = found.group(1)
            helps[current] = found.group(2)
        elif current and line.strip():
            helps[current] += " " + line.strip()
    return helps


def _doc_without_args(doc: str) -> str:
    text = inspect.cleandoc(doc)
    return re.split(r"^(?:Args|Arguments|Parameters):\s*$", text, maxsplit=1, flags=re.M)[0]


@dataclass(frozen=True)
class _Binding:
    """How a click value goes back into the call."""

    name: str
    positional: bool
    default: Any = None
    variadic: bool = False
    multiple: bool = False
    merged: bool = False


def component_command(fn: Component, name: str) -> tuple[click.Command, list[_Binding]]:
    """A click command whose parameters mirror ``fn``'s; its callback is unused."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    doc = inspect.getdoc(fn) or ""
    helps = _arg_help(doc)
    params: list[click.Parameter] = []
    bindings: list[_Binding] = []
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    for p in sig.parameters.values():
        where = f"{name}: parameter {p.name!r}"
        if p.kind is p.VAR_KEYWORD:
            continue  # **kwargs cannot be spelled on a command line
        kind = _kind_of(hints.get(p.name, p.annotation), p.default, where)
        has_default = p.default is not p.empty
        if p.kind is p.VAR_POSITIONAL:
            params.append(click.Argument([p.name], nargs=-1, type=kind.type))
            bindings.append(_Binding(p.name, positional=True, variadic=True))
            continue
        by_position = p.kind is p.POSITIONAL_ONLY or (
            has_varargs and p.kind is p.POSITIONAL_OR_KEYWORD
        )
        if by_position and not kind.flag and not kind.multiple:
            params.append(click.Argument([p.name], type=kind.type, required=not has_default))
            bindings.append(_Binding(p.name, positional=True, default=p.default))
            continue
        params.append(_option(p, kind, has_default, helps.get(p.name, "")))
        bindings.append(
            _Binding(
                p.name,
                positional=by_position,
                default=p.default,
                multiple=kind.multiple,
                merged=kind.merged,
            )
        )
    command = click.Command(
        name,
        params=params,
        help=_doc_without_args(doc) or None,
        short_help=doc.splitlines()[0] if doc else None,
        context_settings={
            "allow_interspersed_args": not has_varargs,
            "help_option_names": ["-h", "--help"],
            "show_default": True,
        },
        add_help_option=True,
    )
    return command, bindings


# ``-h`` is help on every command; a parameter named ``h`` (ddp's TorchX-style named
# resource) is ``--h`` only.
_SHORT_RESERVED = frozenset({"h"})


def _option(p: inspect.Parameter, kind: _Kind, has_default: bool, help: str) -> click.Option:
    short = len(p.name) == 1 and p.name not in _SHORT_RESERVED
    spellings = [p.name]
    if "_" in p.name:
        spellings.append(p.name.replace("_", "-"))
    if kind.flag:
        decls = [f"--{s}/--no-{s}" for s in spellings]
        if short:
            decls.append(f"-{p.name}")
    else:
        decls = [f"--{s}" for s in spellings]
        if short:
            decls.insert(0, f"-{p.name}")
    extra: dict[str, Any] = {}
    if has_default:
        default = p.default
        if kind.merged:
            extra["default"] = None if default is None else (default,)
        else:
            extra["default"] = tuple(default) if kind.multiple and default is not None else default
        extra["show_default"] = default not in (None, ())
    elif kind.flag:
        extra["default"] = False
    return click.Option(
        [*decls, p.name],
        type=kind.type,
        multiple=kind.multiple,
        is_flag=kind.flag or None,
        required=not has_default and not kind.flag,
        help=help,
        **extra,
    )


def call_component(fn: Component, name: str, args: Sequence[str], parent: click.Context) -> AppDef:
    """Parse ``args`` against ``fn``'s signature and call it; ``--help`` exits there."""
    command, bindings = component_command(fn, name)
    with command.make_context(name, list(args), parent=parent) as ctx:
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for b in bindings:
            value = ctx.params.get(b.name)
            source = ctx.get_parameter_source(b.name)
            given = source is not None and source is not ParameterSource.DEFAULT
            # A parameter with no default of its own takes click's value even when not
            # given: click requires every such one but a flag, which is False when left
            # out, as --help says. Passing nothing failed on the missing argument, and
            # before *args passed Parameter.empty, which is true.
            use_value = given or b.default is inspect.Parameter.empty
            if b.variadic:
                positional.extend(value or ())
            elif b.positional:
                # Keep every slot before *args filled, defaults included.
                positional.append(_plain(value, b) if use_value else b.default)
            elif use_value:
                keywords[b.name] = _plain(value, b)
        try:
            app = fn(*positional, **keywords)
        except ValueError as exc:
            raise click.UsageError(str(exc), ctx) from exc
        except Exception as exc:
            # The component's own bug, not the user's input: said in one line, as a
            # component file that fails to load is.
            raise click.UsageError(
                f"component {name!r} raised {type(exc).__name__}: {exc}", ctx
            ) from exc
        if not isinstance(app, AppDef):
            raise click.UsageError(
                f"component {name!r} returned {type(app).__name__}, not an AppDef", ctx
            )
        return app


def _plain(value: Any, b: _Binding) -> Any:
    if b.merged:
        merged: dict[str, str] = {}
        for pairs in value:
            merged.update(pairs)
        return merged
    if b.multiple:
        return list(value)
    return value
