"""Typed run options: what a backend accepts besides the AppDef.

Follows TorchX's ``runopts`` (``add(name, type_, help, default, required)``,
``resolve(cfg)``, a ``k=v`` string form for the CLI) with these differences:

* everything is immutable: ``add`` returns a new ``RunOpts`` so a backend's
  declaration can be a module constant shared by every call;
* ``resolve`` reports every problem at once in one ``SpecError`` (TorchX stops
  at the first) and rejects unknown keys with a did-you-mean instead of
  silently dropping them, so a typo never turns into a default;
* type rules are explicit: ``bool`` is not an ``int`` (``True`` for a replica
  count is always a mistake), an ``int`` is accepted where a ``float`` is
  declared (and stored as a float), a list option takes a list or tuple of
  strings only (a bare string would otherwise be read as its characters);
* the resolved result is a read-only, hashable ``ResolvedCfg`` with typed
  getters, so backend code stays ``mypy --strict`` clean without casts and a
  frozen dry-run request can hold it;
* the string form separates options with ``,`` and list items with ``;``,
  which keeps the grammar unambiguous (TorchX lets ``,`` do both);
* a float option never takes ``nan`` or an infinity (a grace period of
  ``inf`` would make every cancel hang), and an int or float option may
  declare the ``minimum``/``maximum`` it accepts, checked by ``resolve``;
* a str option may declare its ``choices`` (checked by ``resolve``, shown in
  help), and a backend may name options it refuses with the reason
  (``RunOpts(..., refused={name: why})``), so a user who brings an option
  from another backend learns why it does not apply here.

Nothing here does I/O or reads the environment.
"""

from __future__ import annotations

import difflib
import enum
import math
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, overload

from supervisor.brief import brief as _brief
from supervisor.errors import Problem, SpecError

__all__ = [
    "OptType",
    "OptValue",
    "ResolvedCfg",
    "RunOpt",
    "RunOpts",
    "parse_cfg_string",
    "stop_grace_opt",
]

#: What a resolved option holds. Lists are stored as tuples so the result stays immutable.
OptValue = str | int | float | bool | tuple[str, ...] | None

_CONTEXT: Final = "invalid run options"
_DECLARATION_CONTEXT: Final = "invalid run option declaration"


class OptType(enum.Enum):
    """The five value types a run option may declare.

    An enum rather than Python type objects so the set is closed and each
    member knows how it is spelled in help output. ``OptType(str)``,
    ``OptType(list)``, ``OptType(list[str])`` and ``OptType(typing.List[str])``
    are accepted too, so TorchX-style declarations port unchanged.
    """

    STR = "str"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    LIST = "list[str]"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> OptType | None:
        simple: tuple[tuple[type, OptType], ...] = (
            (str, cls.STR),
            (int, cls.INT),
            (float, cls.FLOAT),
            (bool, cls.BOOL),
            (list, cls.LIST),
            (tuple, cls.LIST),
        )
        for py_type, member in simple:
            if value is py_type:
                return member
        try:
            origin, args = typing.get_origin(value), typing.get_args(value)
        except Exception:
            return None
        if origin in (list, tuple) and args in ((str,), (str, Ellipsis)):
            return cls.LIST
        return None


class _MismatchError(Exception):
    """A value that does not fit its option's type; the message is the user-facing text."""


def _coerce(kind: OptType, value: object) -> OptValue:
    """Check ``value`` against ``kind`` and return it in canonical form.

    Canonical means: ints stay ints, ints given for a float become floats,
    lists become tuples. Raises ``_MismatchError`` with a readable reason.
    """
    got = f"got {type(value).__name__} {_brief(value)}"
    if kind is OptType.STR:
        if isinstance(value, str):
            _refuse_nul(value, "")
            return str(value)
    elif kind is OptType.INT:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    elif kind is OptType.FLOAT:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                raise _MismatchError(f"expected float, {got} (too large)") from None
            if not math.isfinite(number):
                raise _MismatchError(f"expected a finite float, {got}")
            return number
    elif kind is OptType.BOOL:
        if isinstance(value, bool):
            return value
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise _MismatchError(
                    f"expected list[str], item {i} is {type(item).__name__} {_brief(item)}"
                )
            _refuse_nul(item, f"item {i} ")
        return tuple(str(item) for item in value)
    raise _MismatchError(f"expected {kind}, {got}")


def _refuse_nul(text: str, where: str) -> None:
    """No option's text may hold a NUL: every one ends up in a path, an argv or an
    environment, where the OS refuses it, and that refusal came mid-launch."""
    if "\0" in text:
        raise _MismatchError(f"{where}contains a NUL character")


_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True, slots=True)
class RunOpt:
    """One declared option.

    ``type`` also accepts the Python types ``str``, ``int``, ``float``, ``bool``
    and ``list``/``list[str]`` at runtime; they are normalized to ``OptType``.
    A list default is stored as a tuple. ``minimum`` and ``maximum`` (int and
    float options only) bound the values ``resolve`` accepts, both inclusive.
    A declaration that could never work (a default of the wrong type or out of
    range, a required option with a default, a name the ``k=v`` form cannot
    spell) raises ``SpecError`` here, when the backend module is imported,
    rather than on some user's first run.
    """

    name: str
    type: OptType
    default: OptValue = None
    help: str = ""
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        field = f"runopts.{self.name}" if isinstance(self.name, str) else "runopts"
        problems: list[Problem] = []
        if (
            not isinstance(self.name, str)
            or not self.name
            or not self.name[0].isalpha()
            or not set(self.name) <= _NAME_CHARS
        ):
            problems.append(
                Problem(
                    f"{field}.name",
                    f"{_brief(self.name)} is not a valid option name "
                    "(an ASCII letter, then ASCII letters, digits, '_', '.' or '-')",
                )
            )
        try:
            kind = OptType(self.type)
        except Exception:
            problems.append(
                Problem(
                    f"{field}.type",
                    f"{_brief(self.type)} is not one of str, int, float, bool, list[str]",
                )
            )
        else:
            object.__setattr__(self, "type", kind)
            if self.default is not None:
                try:
                    object.__setattr__(self, "default", _coerce(kind, self.default))
                except _MismatchError as exc:
                    problems.append(Problem(f"{field}.default", str(exc)))
            problems.extend(self._check_bounds(field, kind))
            problems.extend(self._check_choices(field, kind))
        if not isinstance(self.help, str):
            problems.append(Problem(f"{field}.help", "must be a string"))
        if not isinstance(self.required, bool):
            problems.append(Problem(f"{field}.required", "must be a bool"))
        elif self.required and self.default is not None:
            problems.append(Problem(f"{field}.default", "a required option cannot have a default"))
        if problems:
            raise SpecError(problems, context=_DECLARATION_CONTEXT)

    def _check_bounds(self, field: str, kind: OptType) -> list[Problem]:
        bounds = {"minimum": self.minimum, "maximum": self.maximum}
        if all(bound is None for bound in bounds.values()):
            return []
        if kind not in (OptType.INT, OptType.FLOAT):
            return [Problem(f"{field}.minimum", "bounds are only for int and float options")]
        problems = [
            Problem(f"{field}.{name}", f"must be a finite number, got {_brief(bound)}")
            for name, bound in bounds.items()
            if bound is not None
            and (
                isinstance(bound, bool)
                or not isinstance(bound, int | float)
                or not math.isfinite(bound)
            )
        ]
        if not problems and isinstance(self.default, int | float):
            message = self.out_of_range(self.default)
            if message:
                problems.append(Problem(f"{field}.default", message))
        return problems

    def _check_choices(self, field: str, kind: OptType) -> list[Problem]:
        if self.choices is None:
            return []
        if kind is not OptType.STR:
            return [Problem(f"{field}.choices", "choices are only for str options")]
        if (
            not isinstance(self.choices, tuple)
            or not self.choices
            or not all(isinstance(c, str) for c in self.choices)
        ):
            return [Problem(f"{field}.choices", "must be a non-empty tuple of strings")]
        if isinstance(self.default, str):
            message = self.not_a_choice(self.default)
            if message:
                return [Problem(f"{field}.default", message)]
        return []

    def refusal(self, value: object) -> str | None:
        """Why ``value`` (given, not None) is not one this option takes; None where it is."""
        try:
            coerced = _coerce(self.type, value)
        except _MismatchError as exc:
            return str(exc)
        if isinstance(coerced, int | float) and not isinstance(coerced, bool):
            return self.out_of_range(coerced)
        if isinstance(coerced, str):
            return self.not_a_choice(coerced)
        return None

    def not_a_choice(self, value: str) -> str | None:
        """Why ``value`` is not one of ``choices``, or None when it is (or any value goes)."""
        if self.choices is None or value in self.choices:
            return None
        return f"{value!r} is not one of {', '.join(self.choices)}"

    def out_of_range(self, value: float) -> str | None:
        """Why ``value`` is outside ``[minimum, maximum]``, or None when it is inside."""
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum:g}, got {value:g}"
        if self.maximum is not None and value > self.maximum:
            return f"must be <= {self.maximum:g}, got {value:g}"
        return None

    def range_text(self) -> str:
        """``0..3600``, ``>= 1``, or "" for an unbounded option; for help output."""
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"{low:g}..{high:g}"
        if low is not None:
            return f">= {low:g}"
        if high is not None:
            return f"<= {high:g}"
        return ""


def _unknown_message(key: str, names: tuple[str, ...]) -> str:
    """``unknown option; did you mean 'x'? valid options: ...``, matching case-insensitively."""
    if not names:
        return "unknown option; this backend takes no run options"
    lowered = {name.lower(): name for name in names}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
    hint = f" did you mean {lowered[close[0]]!r}?" if close else ""
    return f"unknown option;{hint} valid options: {', '.join(names)}"


def _help_text(opt: RunOpt) -> str:
    """The help on one line, with the accepted range or choices when the option declares one."""
    text = " ".join(opt.help.split())
    bounds = opt.range_text() or (" | ".join(opt.choices) if opt.choices else "")
    return f"{text} ({bounds})" if bounds else text


def _display_default(opt: RunOpt) -> str:
    """The default as a user would type it in the ``k=v`` form."""
    if opt.required:
        return "(required)"
    value = opt.default
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ";".join(value) if value else "(empty)"
    if isinstance(value, str) and not value:
        return '""'
    return str(value)


class RunOpts:
    """An ordered, immutable set of options a backend accepts.

    Build it in one go, ``RunOpts([RunOpt(...), ...])``, or TorchX-style by
    chaining ``add``; each ``add`` returns a new object, so a declaration can
    be a shared constant. Iteration yields ``RunOpt`` in declaration order.
    """

    __slots__ = ("_by_name", "_opts", "_refused")

    _opts: tuple[RunOpt, ...]
    _by_name: Mapping[str, RunOpt]
    _refused: Mapping[str, str]

    def __init__(
        self, opts: Iterable[RunOpt] = (), refused: Mapping[str, str] | None = None
    ) -> None:
        items = tuple(opts)
        problems: list[Problem] = []
        by_name: dict[str, RunOpt] = {}
        for i, opt in enumerate(items):
            if not isinstance(opt, RunOpt):
                problems.append(
                    Problem(f"runopts[{i}]", f"expected a RunOpt, got {type(opt).__name__}")
                )
            elif opt.name in by_name:
                problems.append(Problem(f"runopts.{opt.name}", "declared more than once"))
            else:
                by_name[opt.name] = opt
        refusals = dict(refused or {})
        for name in refusals:
            if name in by_name:
                problems.append(Problem(f"runopts.{name}", "both declared and refused"))
        if problems:
            raise SpecError(problems, context=_DECLARATION_CONTEXT)
        object.__setattr__(self, "_opts", items)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_refused", refusals)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RunOpts is immutable; use add() to get an extended copy ({name})")

    def add(
        self,
        name: str,
        type_: OptType | type[object],
        help: str,
        default: OptValue | list[str] = None,
        required: bool = False,
    ) -> RunOpts:
        """A copy with one more option; ``type_`` may be an ``OptType`` or a Python type."""
        kind = type_ if isinstance(type_, OptType) else typing.cast(OptType, type_)
        opt_default = tuple(default) if isinstance(default, list) else default
        return RunOpts(
            (*self._opts, RunOpt(name, kind, opt_default, help, required)), self._refused
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def get(self, name: str) -> RunOpt | None:
        return self._by_name.get(name) if isinstance(name, str) else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[RunOpt]:
        return iter(self._opts)

    def __len__(self) -> int:
        return len(self._opts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunOpts):
            return NotImplemented
        return self._opts == other._opts

    def __hash__(self) -> int:
        return hash(self._opts)

    def __repr__(self) -> str:
        return f"RunOpts({list(self._opts)!r})"

    def __str__(self) -> str:
        """A plain-text table for ``asupervisor runopts``: name, type, default, help."""
        if not self._opts:
            return "(this backend takes no run options)"
        header = ("name", "type", "default", "help")
        rows = [
            (opt.name, str(opt.type), _display_default(opt), _help_text(opt)) for opt in self._opts
        ]
        widths = [max(len(row[col]) for row in (header, *rows)) for col in range(3)]

        def line(row: tuple[str, str, str, str]) -> str:
            cells = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
            return "  ".join([*cells, row[3]]).rstrip()

        rule = ("-" * widths[0], "-" * widths[1], "-" * widths[2], "-" * len(header[3]))
        return "\n".join(line(row) for row in (header, rule, *rows))

    def _unknown(self, key: str) -> str:
        if key in self._refused:
            return f"not supported by this backend: {self._refused[key]}"
        return _unknown_message(key, self.names)

    def resolve(self, cfg: Mapping[str, object] | None) -> ResolvedCfg:
        """Check ``cfg`` against the declaration and fill in defaults.

        A key given as ``None`` counts as not given (TorchX's rule), so callers
        can pass optional CLI flags through unconditionally. Every unknown
        key, wrong type and missing required option is reported together in
        one ``SpecError`` with fields ``cfg.<key>``. The result has an entry
        for every declared option, in declaration order (unset ones are
        ``None``), so dry-run output does not depend on what the user typed.
        Resolving a ``ResolvedCfg`` again gives an equal one.
        """
        resolved, problems = self.resolve_partly(cfg)
        if problems:
            raise SpecError(problems, context=_CONTEXT)
        return resolved

    def resolve_partly(self, cfg: Mapping[str, object] | None) -> tuple[ResolvedCfg, list[Problem]]:
        """``resolve`` that returns its problems instead of raising them, with what did
        resolve: an option that did not is at its default and named in ``unresolved``.

        For a dry run that lists every problem at once: the checks a backend makes
        beyond each option's own (``Backend.check_cfg``), the app's limits under
        these options (``Backend.capabilities_for``) and its rules over the app
        under them (``Backend.check_app``) still run on the rest.
        """
        problems: list[Problem] = []
        given: dict[str, object] = {}
        if cfg is not None:
            if not isinstance(cfg, Mapping):
                problems.append(
                    Problem(
                        "cfg",
                        f"expected a mapping of option names to values, got {type(cfg).__name__}",
                    )
                )
                return ResolvedCfg({o.name: o.default for o in self._opts}, unresolved=()), problems
            for key, value in cfg.items():
                if not isinstance(key, str):
                    problems.append(Problem(f"cfg[{_brief(key)}]", "option names must be strings"))
                elif key not in self._by_name:
                    problems.append(Problem(f"cfg.{key}", self._unknown(key)))
                else:
                    given[key] = value
        resolved: dict[str, OptValue] = {}
        unresolved: list[str] = []
        for opt in self._opts:
            value = given.get(opt.name)
            resolved[opt.name] = opt.default
            if value is None:
                if opt.required:
                    detail = f" ({opt.help})" if opt.help else ""
                    problems.append(Problem(f"cfg.{opt.name}", f"required option missing{detail}"))
                    unresolved.append(opt.name)
                continue
            message = opt.refusal(value)
            if message:
                problems.append(Problem(f"cfg.{opt.name}", message))
                unresolved.append(opt.name)
                continue
            resolved[opt.name] = _coerce(opt.type, value)
        return ResolvedCfg(resolved, unresolved=unresolved), problems


_T = typing.TypeVar("_T")


class ResolvedCfg(Mapping[str, object]):
    """Run options after ``RunOpts.resolve``: read-only, hashable, with typed getters.

    The getters exist because backend code is checked with ``mypy --strict``
    and a ``Mapping[str, object]`` would force a cast at every use. Each
    getter raises ``KeyError`` for a name that was never declared (a typo in
    backend code, not a user error) and ``TypeError`` if the stored value has
    another type. An unset option (``None``) gives ``None``, or ``default``
    when one is passed.
    """

    __slots__ = ("_values", "unresolved")

    _values: dict[str, object]
    unresolved: frozenset[str]
    """Options given that did not resolve (``RunOpts.resolve_partly``): at their defaults
    here, so a rule over one of them is not checked (it would judge a value nobody gave)."""

    def __init__(
        self,
        values: Mapping[str, object] | Iterable[tuple[str, object]] = (),
        *,
        unresolved: Iterable[str] = (),
    ) -> None:
        frozen = {
            key: tuple(value) if isinstance(value, list) else value
            for key, value in dict(values).items()
        }
        object.__setattr__(self, "_values", frozen)
        object.__setattr__(self, "unresolved", frozenset(unresolved))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ResolvedCfg is read-only ({name})")

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(frozenset(self._values.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._values == dict(other.items())

    def __repr__(self) -> str:
        return f"ResolvedCfg({self._values!r})"

    def _typed(self, name: str, kind: type[_T], default: _T | None) -> _T | None:
        try:
            value = self._values[name]
        except KeyError:
            raise KeyError(f"no run option {name!r} (have: {', '.join(self._values)})") from None
        if value is None:
            return default
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        raise TypeError(f"run option {name!r} is {type(value).__name__}, not {kind.__name__}")

    @overload
    def get_str(self, name: str) -> str | None: ...
    @overload
    def get_str(self, name: str, default: str) -> str: ...
    def get_str(self, name: str, default: str | None = None) -> str | None:
        return self._typed(name, str, default)

    @overload
    def get_int(self, name: str) -> int | None: ...
    @overload
    def get_int(self, name: str, default: int) -> int: ...
    def get_int(self, name: str, default: int | None = None) -> int | None:
        return self._typed(name, int, default)

    @overload
    def get_float(self, name: str) -> float | None: ...
    @overload
    def get_float(self, name: str, default: float) -> float: ...
    def get_float(self, name: str, default: float | None = None) -> float | None:
        value = self._values.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            # Built directly rather than by resolve(); an int is a fine float.
            return float(value)
        return self._typed(name, float, default)

    @overload
    def get_bool(self, name: str) -> bool | None: ...
    @overload
    def get_bool(self, name: str, default: bool) -> bool: ...
    def get_bool(self, name: str, default: bool | None = None) -> bool | None:
        return self._typed(name, bool, default)

    @overload
    def get_list(self, name: str) -> tuple[str, ...] | None: ...
    @overload
    def get_list(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]: ...
    def get_list(self, name: str, default: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
        value = self._typed(name, tuple, default)
        if value is not None and not all(isinstance(item, str) for item in value):
            raise TypeError(f"run option {name!r} holds non-string items")
        return value


_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


def _convert(kind: OptType, raw: str) -> OptValue | list[str]:
    """Turn one ``k=v`` value into its declared type; raises ``_MismatchError``."""
    text = raw.strip()
    if kind is OptType.STR:
        return text
    if kind is OptType.LIST:
        return [item.strip() for item in raw.split(";") if item.strip()]
    if kind is OptType.BOOL:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise _MismatchError(f"expected bool (true/false/1/0/yes/no), got {text!r}")
    try:
        return int(text) if kind is OptType.INT else float(text)
    except ValueError:
        raise _MismatchError(f"expected {kind}, got {text!r}") from None


def parse_cfg_string(text: str, opts: RunOpts) -> dict[str, object]:
    """Parse the CLI form ``k=v,k2=a;b`` into a dict ready for ``resolve``.

    ``,`` separates options and ``;`` the items of a list option. Keys and
    values are stripped of surrounding whitespace (so ``a=1, b=2`` works) and
    empty pieces are skipped (so a trailing comma is harmless); empty list
    items are dropped and ``k=`` gives an empty list. A list option given
    more than once accumulates its items; a scalar given twice is an error.
    Values are split at the first ``=``, so they may contain ``=``. Every
    problem (unknown key, piece without ``=``, value that does not convert)
    is reported in one ``SpecError``, together with what ``resolve`` finds in
    the pieces that did parse (a bound, a choice, a required option missing):
    one round trip shows everything to fix. With no problem here, the result
    still goes through ``resolve`` where the options are used.
    """
    if not isinstance(text, str):
        raise SpecError(
            [Problem("cfg", f"expected a string, got {type(text).__name__}")], context=_CONTEXT
        )
    problems: list[Problem] = []
    out: dict[str, object] = {}
    previous: RunOpt | None = None
    for piece in text.split(","):
        if not piece.strip():
            continue
        key, sep, raw = piece.partition("=")
        key = key.strip()
        if not sep:
            hint = (
                f"; separate the items of list option {previous.name!r} with ';'"
                if previous is not None and previous.type is OptType.LIST
                else ""
            )
            problems.append(Problem(f"cfg.{key}", f"expected key=value, got {key!r}{hint}"))
            continue
        if not key:
            problems.append(Problem("cfg", f"{piece.strip()!r}: missing option name before '='"))
            continue
        opt = opts.get(key)
        previous = opt
        if opt is None:
            problems.append(Problem(f"cfg.{key}", opts._unknown(key)))
            continue
        try:
            value = _convert(opt.type, raw)
        except _MismatchError as exc:
            problems.append(Problem(f"cfg.{key}", str(exc)))
            continue
        if key in out:
            existing = out[key]
            if isinstance(existing, list) and isinstance(value, list):
                existing.extend(value)
            else:
                problems.append(Problem(f"cfg.{key}", "given more than once"))
            continue
        out[key] = value
    if problems:
        try:
            opts.resolve(out)
        except SpecError as e:
            problems.extend(e.problems)
        raise SpecError(problems, context=_CONTEXT)
    return out


DEFAULT_STOP_GRACE: Final = 5.0
MAX_STOP_GRACE: Final = 3600.0
"""An hour: a stop that takes longer is a misconfiguration (1e9 would never SIGKILL)."""


def stop_grace_opt(default: float = DEFAULT_STOP_GRACE) -> RunOpt:
    """The one declaration of ``stop_grace``, with its bounds, for every backend that stops
    replicas with SIGTERM then SIGKILL."""
    return RunOpt(
        name="stop_grace",
        type=OptType.FLOAT,
        default=default,
        help="seconds between SIGTERM and SIGKILL when stopping a replica",
        minimum=0.0,
        maximum=MAX_STOP_GRACE,
    )
