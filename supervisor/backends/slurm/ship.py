"""Shipping the log pump to the nodes, inside the app directory they share.

The pump needs only four standard-library-only modules of ``supervisor.logs``;
they are copied under a package of the same name with empty ``__init__``
files, so the node's Python imports them without the package's dependencies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import supervisor.logs

__all__ = ["ship_pump"]

_MODULES = ("lines.py", "timestamps.py", "files.py", "pump.py")

_RUNNER = """\\
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from supervisor.logs.pump import main
main(sys.argv[1:])
"""


def ship_pump(runner: Path) -> None:
    """Write ``runner`` (see ``script.pump_path``) and the modules it imports. Blocks."""
    source = Path(supervisor.logs.__file__).parent
    package = runner.parent / "supervisor"
    (package / "logs").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "logs" / "__init__.py").write_text("")
    for name in _MODULES:
        shutil.copyfile(source / name, package / "logs" / name)
    runner.write_text(_RUNNER)
