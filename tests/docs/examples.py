"""The code blocks of the documentation (README.md, CONTRIBUTING.md, CHANGELOG.md and
docs/**/*.md), found by their fences.

A fenced block whose language is ``python``, ``sh`` or ``bash`` is an example and
is run by ``tests/docs/test_examples.py``. An HTML comment on the line before the
fence (invisible on the site) may say more:

* ``<!-- docs-test: needs=docker -->``: run on each local engine (dockerd, Podman)
  with ``DOCKER_HOST`` and ``IMAGE`` set; skipped as the docker tests are;
* ``<!-- docs-test: needs=slurm -->``: run against the local Slurm cluster, once
  through the Slurm commands and once through slurmrestd; skipped as the Slurm
  tests are (``ASUPERVISOR_SLURM_CLUSTER=skip``);
* ``<!-- docs-test: skip reason=KEY -->``: not run, for one of the reasons in
  ``SKIP_REASONS`` (a test fails on any other).

Other languages (``text``, ``toml``, ``mermaid``, ...) show output or files, not
commands, and must be one of ``NOT_CODE``; a fence without a language fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = frozenset({"python", "sh", "bash"})
NOT_CODE = frozenset({"text", "toml", "mermaid", "json", "yaml"})
NEEDS = frozenset({"docker", "slurm"})

SKIP_REASONS: dict[str, str] = {
    "slow": "runs for minutes (the whole test suite, the benchmarks, the demo's install)",
    "installs": "installs packages into a virtual environment (network, minutes)",
    "root-setup": "starts or stops system daemons (the Slurm cluster, the container engines)",
    "serves": "runs until interrupted (a development server)",
    "recursive": "is a step of scripts/test itself",
}

_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- docs-test: (.*) -->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    directive: str  # the text of a docs-test comment right before the fence, or ""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        m = re.fullmatch(r"skip reason=(\S+)", self.directive)
        return m.group(1) if m else None

    @property
    def needs(self) -> str | None:
        m = re.fullmatch(r"needs=(\S+)", self.directive)
        return m.group(1) if m else None


def documents() -> list[Path]:
    top = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
    return [*top, *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        before = lines[start - 1] if start > 0 else ""
        d = _DIRECTIVE.match(before)
        found.append(
            Block(
                path=path,
                line=start + 1,
                lang=m.group(1),
                code="\n".join(lines[start + 1 : j]) + "\n",
                directive=d.group(1) if d else "",
            )
        )
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in blocks(path)]
