"""The "what each backend supports" page, generated from the backends themselves.

``docs/support.md`` is this module's output (``python -m supervisor.backends.support
> docs/support.md``) and ``tests/unit/test_support_doc.py`` checks that the
committed page matches, so the table can never drift from the run options and
capabilities that ``validate`` and ``RunOpts.resolve`` actually enforce.
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.backends.base import Backend, BackendRegistry
from supervisor.backends.docker.options import DOCKER_CAPABILITIES
from supervisor.backends.local.backend import LOCAL_CAPABILITIES
from supervisor.backends.slurm.capabilities import SLURM_CAPABILITIES
from supervisor.runopts import RunOpt
from supervisor.specs import RetryPolicy
from supervisor.validate import Capabilities

__all__ = ["BUILTIN_ORDER", "render_support_doc"]

#: The built-in backends in the order the page shows them.
BUILTIN_ORDER: tuple[str, ...] = ("local", "docker", "slurm")

_CAPABILITIES: dict[str, Capabilities] = {
    "local": LOCAL_CAPABILITIES,
    "docker": DOCKER_CAPABILITIES,
    "slurm": SLURM_CAPABILITIES,
}

_HEADER = """\
# What each backend supports

Generated from the backends' capabilities and run options by
`python -m supervisor.backends.support > docs/support.md`; do not edit by hand
(`tests/unit/test_support_doc.py` fails when it no longer matches the code).
An app that asks for more than its backend supports is refused by `dryrun` and
`submit` with a `SpecError` naming the field, before anything starts.
"""


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _overrides(cls: type[Backend], name: str) -> bool:
    return getattr(cls, name) is not getattr(Backend, name)


def _feature_rows(classes: dict[str, type[Backend]]) -> list[tuple[str, dict[str, str]]]:
    caps = _CAPABILITIES

    def replicas(c: Capabilities) -> str:
        if c.max_replicas_per_role is None:
            return "no limit"
        return f"{c.max_replicas_per_role} by default ({c.replicas_hint})"

    return [
        (
            "Apps outlive the Supervisor (closing stops following, not the app)",
            {n: _yes(cls.durable) for n, cls in classes.items()},
        ),
        (
            "Retry policies (`Role.retry_policy`)",
            {
                n: ", ".join(p.name for p in RetryPolicy if p in c.retry_policies) or "none"
                for n, c in caps.items()
            },
        ),
        (
            "Mounts (bind, volume, device)",
            {
                n: _yes(c.mounts) + (f" ({c.mounts_note})" if c.mounts_note else "")
                for n, c in caps.items()
            },
        ),
        (
            "`Role.image`",
            {
                n: c.image_note or ("required" if c.requires_image else "not used")
                for n, c in caps.items()
            },
        ),
        ("Replicas per role", {n: replicas(c) for n, c in caps.items()}),
        (
            "`wait` on an app another process follows",
            {
                n: "event-driven" if _overrides(cls, "wait_foreign") else "re-reads its records"
                for n, cls in classes.items()
            },
        ),
        (
            "`attach` takes over an app whose owner is gone (retries go on)",
            {n: _yes(_overrides(cls, "adopt")) for n, cls in classes.items()},
        ),
        (
            "Asks the system before `dryrun` (`Supervisor.prepare`)",
            {n: _yes(_overrides(cls, "prepare")) for n, cls in classes.items()},
        ),
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(opt: RunOpt) -> str:
    if opt.required:
        return "required"
    if opt.default is None:
        return "-"
    if isinstance(opt.default, bool):
        return f"`{str(opt.default).lower()}`"
    if isinstance(opt.default, tuple):
        return f"`{';'.join(opt.default)}`" if opt.default else "-"
    return f"`{opt.default}`"


def _meaning(opt: RunOpt) -> str:
    def num(x: float) -> str:
        return f"{x:g}"

    if opt.minimum is not None and opt.maximum is not None:
        return f"{opt.help} ({num(opt.minimum)}..{num(opt.maximum)})"
    if opt.minimum is not None:
        return f"{opt.help} (>= {num(opt.minimum)})"
    if opt.maximum is not None:
        return f"{opt.help} (<= {num(opt.maximum)})"
    return opt.help


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_support_doc() -> str:
    """The Markdown of ``docs/support.md``."""
    registry = BackendRegistry()
    classes: dict[str, type[Backend]] = {}
    for name in BUILTIN_ORDER:
        factory = registry.factory(name)
        if not (isinstance(factory, type) and issubclass(factory, Backend)):
            raise TypeError(f"built-in backend {name!r} is not a Backend class")
        classes[name] = factory
    out = [_HEADER, "## Features", ""]
    rows = [[what, *(by[n] for n in BUILTIN_ORDER)] for what, by in _feature_rows(classes)]
    out += _table(["", *(f"`{n}`" for n in BUILTIN_ORDER)], rows)
    out += [
        "",
        "## Run options",
        "",
        "What `cfg` (Python) or `--cfg k=v,k2=a;b` (the CLI) accepts; an unknown",
        "key is an error with a did-you-mean. `asupervisor runopts BACKEND` prints",
        "the same.",
    ]
    for name in BUILTIN_ORDER:
        out += ["", f"### `{name}`", ""]
        opt_rows = [
            [f"`{o.name}`", f"`{o.type}`", _default(o), _meaning(o)]
            for o in classes[name].run_opts()
        ]
        out += _table(["option", "type", "default", "meaning"], opt_rows)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render_support_doc(), end="")
