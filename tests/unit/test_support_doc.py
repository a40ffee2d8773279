"""docs/support.md is generated from the backends, so it cannot drift from them."""

from __future__ import annotations

from pathlib import Path

from supervisor.backends.base import Backend, BackendRegistry
from supervisor.backends.support import BUILTIN_ORDER, render_support_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "support.md"


def test_committed_support_table_matches_the_backends() -> None:
    assert DOC.read_text() == render_support_doc(), (
        "run: python -m supervisor.backends.support > docs/support.md"
    )


def test_every_builtin_backend_and_run_option_is_on_the_page() -> None:
    registry = BackendRegistry()
    page = render_support_doc()
    assert set(BUILTIN_ORDER) <= set(registry.names())
    for name in BUILTIN_ORDER:
        assert f"### `{name}`" in page
        cls = registry.factory(name)
        assert isinstance(cls, type) and issubclass(cls, Backend)
        for opt in cls.run_opts():
            assert f"| `{opt.name}` |" in page, (name, opt.name)


def test_slurm_retries_only_the_whole_app_and_local_all_policies() -> None:
    rows = {line.split(" | ")[0]: line for line in render_support_doc().splitlines()}
    retry = rows["| Retry policies (`Role.retry_policy`)"]
    assert retry.endswith(
        "| REPLICA, ROLE, APPLICATION | REPLICA, ROLE, APPLICATION | APPLICATION |"
    )
